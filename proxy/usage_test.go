package proxy

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/timing-sidecar/timing-sidecar/telemetry/spool"
	"github.com/timing-sidecar/timing-sidecar/telemetry/usage"
)

// ceReceiver is a CloudEvents batch endpoint: it keeps every copy of every
// record it acknowledges, by id, and answers as fail says (0: 200).
type ceReceiver struct {
	srv *httptest.Server

	mu     sync.Mutex
	copies map[string][]string // id -> each copy acknowledged, as sent
	fail   func(batch int) int // the status for the nth batch (from 0)
	hold   chan struct{}       // when set, each batch waits for it or the client
	reject string              // a request_id whose batch is answered 400
	batch  int
	got    chan struct{} // signalled on each acknowledged batch
}

func newCEReceiver(t *testing.T) *ceReceiver {
	r := &ceReceiver{copies: map[string][]string{}, got: make(chan struct{}, 1)}
	r.srv = httptest.NewServer(http.HandlerFunc(r.serve))
	t.Cleanup(r.srv.Close)
	return r
}

func (r *ceReceiver) serve(w http.ResponseWriter, req *http.Request) {
	body, _ := io.ReadAll(req.Body)
	r.mu.Lock()
	n := r.batch
	r.batch++
	fail, hold := r.fail, r.hold
	r.mu.Unlock()
	if hold != nil {
		select {
		case <-hold:
		case <-req.Context().Done():
			return
		}
	}
	if fail != nil {
		if status := fail(n); status != 0 {
			w.WriteHeader(status)
			return
		}
	}
	if req.Header.Get("Content-Type") != "application/cloudevents-batch+json" || req.Header.Get("Authorization") != "Bearer t0ken" {
		w.WriteHeader(http.StatusUnsupportedMediaType)
		return
	}
	var events []json.RawMessage
	if err := json.Unmarshal(body, &events); err != nil || r.reject != "" && strings.Contains(string(body), `"request_id":"`+r.reject+`"`) {
		w.WriteHeader(http.StatusBadRequest)
		return
	}
	r.mu.Lock()
	for _, e := range events {
		var head struct{ ID string }
		json.Unmarshal(e, &head)
		r.copies[head.ID] = append(r.copies[head.ID], string(e))
	}
	r.mu.Unlock()
	w.WriteHeader(http.StatusAccepted)
	select {
	case r.got <- struct{}{}:
	default:
	}
}

// await waits until the receiver holds n distinct records.
func (r *ceReceiver) await(t *testing.T, n int) {
	t.Helper()
	timeout := time.After(20 * time.Second)
	for {
		r.mu.Lock()
		have := len(r.copies)
		r.mu.Unlock()
		if have >= n {
			return
		}
		select {
		case <-r.got:
		case <-timeout:
			t.Fatalf("the receiver has %d records, want %d", have, n)
		}
	}
}

// usageRecord is a record's CloudEvent, as the receiver got it.
type usageRecord struct {
	ID, Source, Type, Subject, Time, SpecVersion string
	Data                                         map[string]any
}

// byRequest returns each record by its request_id, checking that every
// copy of an id is the same bytes.
func (r *ceReceiver) byRequest(t *testing.T) map[string]usageRecord {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	out := map[string]usageRecord{}
	for id, copies := range r.copies {
		for _, c := range copies[1:] {
			if c != copies[0] {
				t.Errorf("record %s delivered twice with different content:\n%s\n%s", id, copies[0], c)
			}
		}
		var rec usageRecord
		if err := json.Unmarshal([]byte(copies[0]), &rec); err != nil {
			t.Fatal(err)
		}
		out[rec.Data["request_id"].(string)] = rec
	}
	return out
}

func usageConfig(dir, url string) func(*Config) {
	return func(c *Config) {
		c.Usage.SpoolDir, c.Usage.CloudEventsURL = dir, url
		c.Usage.CloudEventsHeaders = []string{"Authorization: Bearer t0ken"}
		c.Usage.Timeout = 2 * time.Second
		c.TenantHeader = "X-Tenant"
	}
}

// streamAndLeave posts a stream, reads tokens token events and leaves.
func streamAndLeave(t *testing.T, url string, headers map[string]string, tokens int) {
	t.Helper()
	resp := post(t, url+"/v1/chat/completions", `{"model":"m","stream":true,"messages":[]}`, headers)
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	seen := 0
	for seen < tokens && sc.Scan() {
		if strings.Contains(sc.Text(), `"content":" t`) {
			seen++
		}
	}
	if seen != tokens {
		t.Fatalf("read %d token events, want %d", seen, tokens)
	}
}

// TestUsageRecords: every request forwarded gets one record, whoever ended
// it, with each count's source; a stream its client cut has the tokens the
// client received, counted; the counters reconcile.
func TestUsageRecords(t *testing.T) {
	engine := newFakeEngine(t)
	recv := newCEReceiver(t)
	p, base := startSidecar(t, engine.URL(), usageConfig(t.TempDir(), recv.srv.URL), nil)
	h := func(id string, more ...string) map[string]string {
		m := map[string]string{"X-Request-Id": id, "X-Tenant": "acme"}
		for i := 0; i+1 < len(more); i += 2 {
			m[more[i]] = more[i+1]
		}
		return m
	}
	// Whole stream, with usage.
	resp := post(t, base+"/v1/chat/completions", `{"model":"m","stream":true,"stream_options":{"include_usage":true},"messages":[]}`, h("whole"))
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	// Cut by its client after three tokens, the engine waiting for more.
	streamAndLeave(t, base, h("client-cut", "X-Fake-Tokens", "10", "X-Fake-Pause-After", "3"), 3)
	// Cut by the engine after two.
	resp = post(t, base+"/v1/chat/completions", `{"model":"m","stream":true,"messages":[]}`, h("engine-cut", "X-Fake-Tokens", "6", "X-Fake-Cut-After", "2"))
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	// Not streamed; and refused by the engine.
	for _, r := range []map[string]string{h("unary"), h("refused", "X-Fake-Status", "400")} {
		resp = post(t, base+"/v1/chat/completions", `{"model":"m","messages":[]}`, r)
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	// Not forwarded to an engine's work: no record.
	resp, err := http.Get(base + "/v1/models")
	if err == nil {
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	recv.await(t, 5)
	got := recv.byRequest(t)
	type counts struct {
		prompt, completion              any
		promptFrom, completionFrom, end string
		status                          any
	}
	for id, want := range map[string]counts{
		"whole":      {7.0, 4.0, "usage", "usage", "completed", 200.0},
		"client-cut": {nil, 3.0, "unknown", "counted", "client_gone", 200.0},
		"engine-cut": {nil, 2.0, "unknown", "counted", "engine_error", 200.0},
		"unary":      {7.0, 4.0, "usage", "usage", "completed", 200.0},
		"refused":    {nil, nil, "unknown", "unknown", "completed", 400.0},
	} {
		rec, ok := got[id]
		if !ok {
			t.Errorf("%s: no record", id)
			continue
		}
		d := rec.Data
		if d["prompt_tokens"] != want.prompt || d["completion_tokens"] != want.completion || d["prompt_tokens_from"] != want.promptFrom ||
			d["completion_tokens_from"] != want.completionFrom || d["end"] != want.end || d["status"] != want.status {
			t.Errorf("%s: record %v, want %+v", id, d, want)
		}
		if rec.SpecVersion != "1.0" || rec.Type != usage.DefaultEventType || rec.Subject != "acme" || d["tenant"] != "acme" ||
			!strings.HasPrefix(rec.Source, "timing-sidecar/") || len(rec.ID) != 36 || d["model"] != "m" || d["endpoint"] != "chat_completions" {
			t.Errorf("%s: envelope %+v", id, rec)
		}
		if _, err := time.Parse(time.RFC3339Nano, rec.Time); err != nil {
			t.Errorf("%s: time %q", id, rec.Time)
		}
	}
	if len(got) != 5 {
		t.Errorf("%d records, want 5: %v", len(got), got)
	}
	checkReconciled(t, p, usage.SinkCloudEvents, 5)
}

// checkReconciled checks produced = delivered + spooled + refused for sink,
// and that produced is want.
func checkReconciled(t *testing.T, p *Proxy, sink string, want float64) {
	t.Helper()
	// Quiet: the receiver acknowledged the last batch a moment before the
	// sidecar took it off its spool. A gather is no snapshot (collectors
	// run side by side), so the figures are read once more after the one
	// that found the spool empty: what was counted before it emptied is
	// in them.
	for deadline := time.Now().Add(10 * time.Second); usageCounters(t, p, sink)["spooled"] > 0 && time.Now().Before(deadline); {
		time.Sleep(5 * time.Millisecond)
	}
	sum := usageCounters(t, p, sink)
	if sum["produced_total"] != want || sum["produced_total"] != sum["delivered_total"]+sum["spooled"]+sum["refused_total"] {
		t.Errorf("%s: %v: want %v produced = delivered + spooled + refused", sink, sum, want)
	}
}

// usageCounters is the usage records' series for sink, by name.
func usageCounters(t *testing.T, p *Proxy, sink string) map[string]float64 {
	t.Helper()
	families, err := p.registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	sum := map[string]float64{}
	for _, f := range families {
		for _, m := range f.GetMetric() {
			forSink := false
			for _, l := range m.GetLabel() {
				forSink = forSink || l.GetName() == "sink" && l.GetValue() == sink
			}
			if !forSink {
				continue
			}
			v := m.GetCounter().GetValue() + m.GetGauge().GetValue()
			sum[strings.TrimPrefix(f.GetName(), "timing_sidecar_usage_records_")] += v
		}
	}
	return sum
}

// TestUsageDeliveryRetries: a receiver that fails, hangs past the timeout
// and comes back gets every record, each copy of an id the same bytes.
func TestUsageDeliveryRetries(t *testing.T) {
	engine := newFakeEngine(t)
	recv := newCEReceiver(t)
	recv.fail = func(n int) int {
		if n < 3 {
			return http.StatusServiceUnavailable
		}
		return 0
	}
	p, base := startSidecar(t, engine.URL(), usageConfig(t.TempDir(), recv.srv.URL), nil)
	for i := range 20 {
		resp := post(t, base+"/v1/chat/completions", `{"model":"m","messages":[]}`, map[string]string{"X-Request-Id": "r" + string(rune('a'+i))})
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	recv.await(t, 20)
	if n := counterValue(t, p, "timing_sidecar_usage_records_retried_total", map[string]string{"sink": usage.SinkCloudEvents}); n == 0 {
		t.Error("no record counted as retried")
	}
	recv.byRequest(t)
	checkReconciled(t, p, usage.SinkCloudEvents, 20)
}

// TestUsageSpoolOutlivesTheProcess: records no sink had at shutdown are
// delivered by the next sidecar on the same spool, unchanged.
func TestUsageSpoolOutlivesTheProcess(t *testing.T) {
	engine := newFakeEngine(t)
	recv := newCEReceiver(t)
	recv.fail = func(int) int { return http.StatusInternalServerError }
	dir := t.TempDir()
	p, base := startSidecar(t, engine.URL(), usageConfig(dir, recv.srv.URL), nil)
	for _, id := range []string{"one", "two", "three"} {
		resp := post(t, base+"/v1/chat/completions", `{"model":"m","messages":[]}`, map[string]string{"X-Request-Id": id})
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	p.Shutdown(ctx) //nolint:errcheck
	recv.mu.Lock()
	recv.fail = nil
	recv.mu.Unlock()
	p2, _ := startSidecar(t, engine.URL(), usageConfig(dir, recv.srv.URL), nil)
	recv.await(t, 3)
	if got := recv.byRequest(t); len(got) != 3 || got["two"].Data["end"] != "completed" {
		t.Errorf("after the restart: %v", got)
	}
	checkReconciled(t, p2, usage.SinkCloudEvents, 3)
}

// TestUsageSettings: a sink needs a spool; a spool alone is records off;
// every problem is said at once.
func TestUsageSettings(t *testing.T) {
	for _, k := range []string{"OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_LOGS_ENDPOINT", "OTEL_SDK_DISABLED", "OTEL_LOGS_EXPORTER"} {
		t.Setenv(k, "")
	}
	dir := t.TempDir()
	for _, tc := range []struct {
		name  string
		set   func(*Config)
		env   string // OTEL_EXPORTER_OTLP_ENDPOINT
		bad   []string
		sinks []string
	}{
		{name: "off", set: func(*Config) {}},
		{name: "a spool alone is off", set: func(c *Config) { c.Usage.SpoolDir = dir }},
		{name: "CloudEvents without a spool", set: func(c *Config) { c.Usage.CloudEventsURL = "http://127.0.0.1:1/events" },
			bad: []string{"need a spool"}},
		{name: "OTLP logs named without a spool", set: func(c *Config) { c.OTLP.Logs.Endpoint = "http://127.0.0.1:1" },
			bad: []string{"need a spool"}},
		{name: "the shared OTLP endpoint without a spool is no record", set: func(*Config) {}, env: "http://127.0.0.1:1"},
		{name: "the shared OTLP endpoint is not a sink", set: func(c *Config) { c.Usage.SpoolDir = dir }, env: "http://127.0.0.1:1"},
		{name: "a logs endpoint is", set: func(c *Config) {
			c.Usage.SpoolDir = dir
			t.Setenv("OTEL_EXPORTER_OTLP_LOGS_ENDPOINT", "http://127.0.0.1:1")
		},
			sinks: []string{usage.SinkOTLP}},
		{name: "both sinks", set: func(c *Config) {
			c.Usage.SpoolDir, c.Usage.CloudEventsURL, c.OTLP.Logs.Endpoint = dir, "https://openmeter.example/api/v1/events", "http://127.0.0.1:1"
		}, sinks: []string{usage.SinkCloudEvents, usage.SinkOTLP}},
		{name: "every problem at once", set: func(c *Config) {
			c.Usage.SpoolDir, c.Usage.CloudEventsURL, c.Usage.CloudEventsHeaders = dir, "ftp://x", []string{"no colon"}
			c.Usage.SpoolMaxSize, c.Usage.Timeout = 1000, 0
		}, bad: []string{`"ftp://x": want an http or https URL`, `header "no colon: …"`, "max size 1000", "usage timeout 0s"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", tc.env)
			cfg := DefaultConfig()
			cfg.Upstream, cfg.Listen = "http://127.0.0.1:1", "127.0.0.1:0"
			tc.set(&cfg)
			p, err := New(cfg, slog.New(slog.DiscardHandler), nil)
			for _, want := range tc.bad {
				if err == nil || !strings.Contains(err.Error(), want) {
					t.Errorf("err = %v, want %q", err, want)
				}
			}
			if len(tc.bad) > 0 {
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer func() {
				// No collector: the other signals' last exports are given up.
				ctx, cancel := context.WithCancel(context.Background())
				cancel()
				p.Shutdown(ctx) //nolint:errcheck
			}()
			if got := p.usageSinks(); !slices.Equal(got, append([]string{}, tc.sinks...)) {
				t.Errorf("sinks %v, want %v", got, tc.sinks)
			}
		})
	}
}

// TestUsageRecordRejectedAlone: a record the receiver refuses as malformed
// is found by splitting its batch and dropped, counted; the rest arrive.
func TestUsageRecordRejectedAlone(t *testing.T) {
	engine := newFakeEngine(t)
	recv := newCEReceiver(t)
	recv.hold = make(chan struct{}) // the first batch waits: the rest queue behind it
	recv.reject = "poison"
	p, base := startSidecar(t, engine.URL(), usageConfig(t.TempDir(), recv.srv.URL), nil)
	for _, id := range []string{"first", "a", "b", "poison", "c", "d"} {
		resp := post(t, base+"/v1/chat/completions", `{"model":"m","messages":[]}`, map[string]string{"X-Request-Id": id})
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	close(recv.hold)
	recv.await(t, 5)
	got := recv.byRequest(t)
	if _, ok := got["poison"]; ok || len(got) != 5 {
		t.Errorf("records %v", got)
	}
	checkReconciled(t, p, usage.SinkCloudEvents, 6)
	if n := counterValue(t, p, "timing_sidecar_usage_records_refused_total", map[string]string{"sink": usage.SinkCloudEvents, "reason": usage.RefusedRejected}); n != 1 {
		t.Errorf("rejected %v, want 1", n)
	}
}

// TestASecondSidecarIsRefusedTheSpool: a second sidecar given a spool
// directory another holds does not start, and says which directory; the
// first keeps taking and delivering records.
func TestASecondSidecarIsRefusedTheSpool(t *testing.T) {
	engine := newFakeEngine(t)
	recv := newCEReceiver(t)
	dir := t.TempDir()
	_, base := startSidecar(t, engine.URL(), usageConfig(dir, recv.srv.URL), nil)

	cfg := DefaultConfig()
	cfg.Upstream, cfg.Listen = engine.URL(), "127.0.0.1:0"
	usageConfig(dir, recv.srv.URL)(&cfg)
	second, err := New(cfg, slog.New(slog.DiscardHandler), nil)
	if !errors.Is(err, spool.ErrInUse) || !strings.Contains(err.Error(), dir) {
		if second != nil {
			second.Shutdown(context.Background())
		}
		t.Fatalf("a second sidecar on a held spool: %v, want a refusal naming %s", err, dir)
	}

	resp := post(t, base+"/v1/chat/completions", `{"model":"m","messages":[]}`, map[string]string{"X-Request-Id": "after"})
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	recv.await(t, 1)
	if rec, ok := recv.byRequest(t)["after"]; !ok || rec.Data["end"] != "completed" {
		t.Fatalf("the first sidecar's record after the refusal: %+v", rec)
	}
}
