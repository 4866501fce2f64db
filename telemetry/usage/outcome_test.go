package usage

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/exporters/otlp/otlplog/otlploggrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlplog/otlploghttp"
	sdklog "go.opentelemetry.io/otel/sdk/log"
	collogpb "go.opentelemetry.io/proto/otlp/collector/logs/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/timing-sidecar/timing-sidecar/telemetry/spool"
)

// collector is an OTLP logs endpoint on loopback, over HTTP and gRPC,
// answering each export as answer says: the records are the exported
// records' request ids.
type collector struct {
	mu     sync.Mutex
	answer func(ids []string) (code int, partial *collogpb.ExportLogsPartialSuccess)
	// got is every export's ids, in order.
	got [][]string
}

func requestIDs(req *collogpb.ExportLogsServiceRequest) []string {
	var ids []string
	for _, rl := range req.GetResourceLogs() {
		for _, sl := range rl.GetScopeLogs() {
			for _, lr := range sl.GetLogRecords() {
				for _, kv := range lr.GetAttributes() {
					if kv.GetKey() == "request_id" {
						ids = append(ids, kv.GetValue().GetStringValue())
					}
				}
			}
		}
	}
	return ids
}

func (c *collector) export(req *collogpb.ExportLogsServiceRequest) (int, *collogpb.ExportLogsPartialSuccess) {
	ids := requestIDs(req)
	c.mu.Lock()
	defer c.mu.Unlock()
	c.got = append(c.got, ids)
	return c.answer(ids)
}

func (c *collector) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	var req collogpb.ExportLogsServiceRequest
	if err := proto.Unmarshal(body, &req); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	code, partial := c.export(&req)
	if code != http.StatusOK {
		http.Error(w, "refused", code)
		return
	}
	b, _ := proto.Marshal(&collogpb.ExportLogsServiceResponse{PartialSuccess: partial})
	w.Header().Set("Content-Type", "application/x-protobuf")
	w.Write(b) //nolint:errcheck // the exporter reads it or fails
}

// grpcLogs is the collector's gRPC face: the code is a gRPC code.
type grpcLogs struct {
	collogpb.UnimplementedLogsServiceServer
	c *collector
}

func (g grpcLogs) Export(_ context.Context, req *collogpb.ExportLogsServiceRequest) (*collogpb.ExportLogsServiceResponse, error) {
	code, partial := g.c.export(req)
	if code != 0 {
		return nil, status.Error(codes.Code(code), "refused")
	}
	return &collogpb.ExportLogsServiceResponse{PartialSuccess: partial}, nil
}

// exporters starts the collector on loopback and returns the real OTLP
// exporters pointed at it, as telemetry.NewLogExporter builds them.
func exporters(t *testing.T, c *collector) map[string]sdklog.Exporter {
	srv := httptest.NewServer(c)
	t.Cleanup(srv.Close)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer()
	collogpb.RegisterLogsServiceServer(g, grpcLogs{c: c})
	go g.Serve(ln) //nolint:errcheck // stopped below
	t.Cleanup(g.Stop)
	ctx := context.Background()
	h, err := otlploghttp.New(ctx, otlploghttp.WithEndpointURL(srv.URL+"/v1/logs"), otlploghttp.WithRetry(otlploghttp.RetryConfig{Enabled: false}))
	if err != nil {
		t.Fatal(err)
	}
	gr, err := otlploggrpc.New(ctx, otlploggrpc.WithEndpointURL("http://"+ln.Addr().String()), otlploggrpc.WithRetry(otlploggrpc.RetryConfig{Enabled: false}))
	if err != nil {
		t.Fatal(err)
	}
	return map[string]sdklog.Exporter{"http": h, "grpc": gr}
}

func records(ids ...string) []spool.Record {
	var out []spool.Record
	for _, id := range ids {
		out = append(out, spool.Record{ID: []byte(id), Data: []byte(strings.Replace(event, `"request_id":"r1"`, `"request_id":"`+id+`"`, 1))})
	}
	return out
}

// TestOTLPOutcomesFromTheRealExporters: what the real exporters return
// for each answer an OTLP collector can give is read as the outcome the
// delivery acts on.
func TestOTLPOutcomesFromTheRealExporters(t *testing.T) {
	for _, tc := range []struct {
		name       string
		http, grpc int // the answer's status; 0 for gRPC is OK
		partial    *collogpb.ExportLogsPartialSuccess
		want       string // "ok", "partial", "rejected", "retry"
	}{
		{"accepted", 200, 0, nil, "ok"},
		{"partial success", 200, 0, &collogpb.ExportLogsPartialSuccess{RejectedLogRecords: 1, ErrorMessage: "attribute too long"}, "partial"},
		{"a warning", 200, 0, &collogpb.ExportLogsPartialSuccess{ErrorMessage: "deprecated field"}, "partial"},
		{"malformed", 400, int(codes.InvalidArgument), nil, "rejected"},
		{"unauthenticated", 401, int(codes.Unauthenticated), nil, "rejected"},
		{"overloaded", 503, int(codes.Unavailable), nil, "retry"},
		{"throttled", 429, int(codes.ResourceExhausted), nil, "retry"},
	} {
		c := &collector{}
		exps := exporters(t, c)
		for proto, exp := range exps {
			t.Run(tc.name+"/"+proto, func(t *testing.T) {
				code := tc.http
				if proto == "grpc" {
					code = tc.grpc
				}
				c.mu.Lock()
				c.answer = func([]string) (int, *collogpb.ExportLogsPartialSuccess) { return code, tc.partial }
				c.mu.Unlock()
				err := NewOTLPLogs(exp, nil).Send(context.Background(), records("a", "b"))
				var p *Partial
				var rej *Rejected
				got := "retry"
				switch {
				case err == nil:
					got = "ok"
				case errors.As(err, &p):
					got = "partial"
					if p.Rejected != int(tc.partial.GetRejectedLogRecords()) || p.Message != tc.partial.GetErrorMessage() {
						t.Errorf("partial success read as %+v, want %v", p, tc.partial)
					}
				case errors.As(err, &rej):
					got = "rejected"
				}
				if got != tc.want {
					t.Errorf("the exporter's %v read as %s, want %s", err, got, tc.want)
				}
			})
		}
	}
}

// openRecords opens records delivered to sinks, with a spool of bound max.
func openRecords(t *testing.T, max int64, sinks ...Sink) (*Records, *prometheus.Registry) {
	reg := prometheus.NewRegistry()
	r, err := Open(Options{Spool: spool.Options{Dir: t.TempDir(), MaxSize: max, SegmentSize: 4 << 10, Sync: 10 * time.Millisecond},
		Sinks: sinks, Log: slog.New(slog.DiscardHandler)}, reg)
	if err != nil {
		t.Fatal(err)
	}
	return r, reg
}

// counter is the value in reg of the counter with every one of labels'
// values.
func counter(reg *prometheus.Registry, name string, labels ...string) float64 {
	families, _ := reg.Gather()
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			var values []string
			for _, l := range m.GetLabel() {
				values = append(values, l.GetValue())
			}
			if !slices.ContainsFunc(labels, func(v string) bool { return !slices.Contains(values, v) }) {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}

// eventually waits for cond, failing after 30 s.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 30 s", what)
		}
	}
}

// TestOTLPSinkDeliversThroughPartialSuccess: a collector that answers a
// partial success has the batch: it is not sent again, what it refused is
// counted rejected, and the records after it keep flowing. A collector
// that then refuses everything is a configuration error: nothing is
// dropped, and once it takes records again, only the one it refuses alone
// is.
func TestOTLPSinkDeliversThroughPartialSuccess(t *testing.T) {
	c := &collector{answer: func(ids []string) (int, *collogpb.ExportLogsPartialSuccess) {
		return 200, &collogpb.ExportLogsPartialSuccess{RejectedLogRecords: 1, ErrorMessage: "attribute value too long"}
	}}
	r, reg := openRecords(t, 1<<20, NewOTLPLogs(exporters(t, c)["http"], nil))
	end := func(ids ...string) {
		for _, rec := range records(ids...) {
			r.Start(string(rec.ID), rec.Data)
			r.End(string(rec.ID), rec.Data)
		}
	}
	end("a", "b", "c")
	eventually(t, "the partial success acknowledged", func() bool {
		return counter(reg, "timing_sidecar_usage_records_delivered_total", SinkOTLP)+counter(reg, "timing_sidecar_usage_records_refused_total", SinkOTLP, RefusedRejected) == 3
	})
	if rej := counter(reg, "timing_sidecar_usage_records_refused_total", SinkOTLP, RefusedRejected); rej < 1 {
		t.Errorf("the collector refused records in its partial successes; %v counted rejected", rej)
	}
	// Everything refused: the endpoint, not a record.
	c.mu.Lock()
	c.answer = func([]string) (int, *collogpb.ExportLogsPartialSuccess) { return 400, nil }
	c.mu.Unlock()
	rejectedBefore := counter(reg, "timing_sidecar_usage_records_refused_total", SinkOTLP, RefusedRejected)
	end("d", "e", "f", "g")
	eventually(t, "the refusals retried", func() bool { return counter(reg, "timing_sidecar_usage_records_retried_total", SinkOTLP) >= 4 })
	if rej := counter(reg, "timing_sidecar_usage_records_refused_total", SinkOTLP, RefusedRejected); rej != rejectedBefore {
		t.Errorf("an endpoint refusing everything had %v records dropped as rejected", rej-rejectedBefore)
	}
	// The endpoint takes records again, but refuses f.
	c.mu.Lock()
	c.answer = func(ids []string) (int, *collogpb.ExportLogsPartialSuccess) {
		if slices.Contains(ids, "f") {
			return 400, nil
		}
		return 200, nil
	}
	c.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if left := r.Close(ctx); len(left) != 0 {
		t.Fatalf("left %v", left)
	}
	if rej := counter(reg, "timing_sidecar_usage_records_refused_total", SinkOTLP, RefusedRejected); rej != rejectedBefore+1 {
		t.Errorf("%v records dropped as rejected, want f alone", rej-rejectedBefore)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	var delivered []string
	for _, ids := range c.got {
		if !slices.Contains(ids, "f") || len(ids) == 1 {
			delivered = append(delivered, ids...)
		}
	}
	for _, id := range []string{"a", "b", "c", "d", "e", "g"} {
		if n := strings.Count(strings.Join(delivered, " "), id); n < 1 {
			t.Errorf("record %s never reached the collector in a batch it took", id)
		}
	}
	t.Logf("exports: %v", c.got)
}

// downSink is a receiver that never answers well.
type downSink struct{}

func (downSink) Name() string                               { return SinkCloudEvents }
func (downSink) Send(context.Context, []spool.Record) error { return errors.New("receiver down") }
func (downSink) Close(context.Context) error                { return nil }

// TestASinkThatIsDownHoldsOnlyItsOwnRecords: a sink that cannot deliver
// for long does not stop the other's records: past three quarters of the
// spool's bound, its oldest records are given back, counted sink_behind,
// and every record still reaches the sink that is up.
func TestASinkThatIsDownHoldsOnlyItsOwnRecords(t *testing.T) {
	exp := &logExporter{}
	const max = 96 << 10
	r, reg := openRecords(t, max, downSink{}, NewOTLPLogs(exp, nil))
	const n = 300
	recs := records(ids(n)...)
	for i, rec := range recs {
		r.Start(string(rec.ID), rec.Data)
		r.End(string(rec.ID), rec.Data)
		if i%4 == 3 {
			// Causal, not timed: the next records go once the sink
			// that is up has these, and the one down has given back
			// enough for them.
			eventually(t, "the sink that is up delivered, and room made", func() bool {
				exp.mu.Lock()
				defer exp.mu.Unlock()
				return len(exp.records) == i+1 && r.spool.Size() < max-24<<10
			})
		}
	}
	full := counter(reg, "timing_sidecar_usage_records_refused_total", SinkOTLP, RefusedFull)
	behind := counter(reg, "timing_sidecar_usage_records_refused_total", SinkCloudEvents, RefusedBehind)
	spooled := 0.0
	families, _ := reg.Gather()
	for _, f := range families {
		if f.GetName() == "timing_sidecar_usage_records_spooled" {
			for _, m := range f.GetMetric() {
				if m.GetLabel()[0].GetValue() == SinkCloudEvents {
					spooled = m.GetGauge().GetValue()
				}
			}
		}
	}
	t.Logf("otlp refused %v for a full spool; cloudevents: %v given back, %v spooled; spool %d bytes of %d", full, behind, spooled, r.spool.Size(), max)
	if full != 0 || behind == 0 {
		t.Errorf("the sink that is up had %v records refused for a full spool, and the one down %v given back", full, behind)
	}
	if produced := counter(reg, "timing_sidecar_usage_records_produced_total", SinkCloudEvents); produced != behind+spooled {
		t.Errorf("the sink that is down: produced %v, given back %v + spooled %v", produced, behind, spooled)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	r.Close(ctx)
}

func ids(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("req-%04d", i)
	}
	return out
}

// TestAGatewayThatRefusesEverythingDropsNothing: a CloudEvents gateway
// that answers 400 to every batch (a wrong path, a schema it does not
// take) refuses the endpoint's way, not a record's: nothing is dropped
// as rejected, and the records wait in the spool for it to be put right.
func TestAGatewayThatRefusesEverythingDropsNothing(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body) //nolint:errcheck // refused whatever it holds
		http.Error(w, "no such route", http.StatusBadRequest)
	}))
	defer srv.Close()
	ce, err := NewCloudEvents(srv.URL, nil, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	r, reg := openRecords(t, 1<<20, ce)
	for _, rec := range records(ids(10)...) {
		r.Start(string(rec.ID), rec.Data)
		r.End(string(rec.ID), rec.Data)
	}
	eventually(t, "the refusal retried", func() bool { return counter(reg, "timing_sidecar_usage_records_retried_total", SinkCloudEvents) > 0 })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	left := r.Close(ctx)
	if rej := counter(reg, "timing_sidecar_usage_records_refused_total", SinkCloudEvents, RefusedRejected); rej != 0 || left[SinkCloudEvents] != 10 {
		t.Errorf("a gateway refusing everything: %v records dropped as rejected, %d left in the spool; want none dropped, 10 left", rej, left[SinkCloudEvents])
	}
}

// TestBadRecordsSpreadOverABatchAreFound: two records the receiver
// refuses, one in each half of a batch, make the batch and both halves
// refused, as an endpoint that refuses everything would; the probe that
// follows splits a small batch down and finds them, and the rest is
// delivered.
func TestBadRecordsSpreadOverABatchAreFound(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if strings.Contains(string(body), `"request_id":"bad`) {
			http.Error(w, "malformed", http.StatusBadRequest)
		}
	}))
	defer srv.Close()
	ce, err := NewCloudEvents(srv.URL, nil, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	r, reg := openRecords(t, 1<<20, ce)
	for _, rec := range records("bad-1", "good-1", "bad-2", "good-2") {
		r.Start(string(rec.ID), rec.Data)
		r.End(string(rec.ID), rec.Data)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if left := r.Close(ctx); len(left) != 0 {
		t.Fatalf("left %v: the bad records held the rest", left)
	}
	if rej := counter(reg, "timing_sidecar_usage_records_refused_total", SinkCloudEvents, RefusedRejected); rej != 2 {
		t.Errorf("%v records dropped as rejected, want the 2 bad ones", rej)
	}
	if got := counter(reg, "timing_sidecar_usage_records_delivered_total", SinkCloudEvents); got != 2 {
		t.Errorf("%v records delivered, want the 2 good ones", got)
	}
}
