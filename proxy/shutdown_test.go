package proxy

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/timing-sidecar/timing-sidecar/proxy/tlsserve/testpki"
	"github.com/timing-sidecar/timing-sidecar/telemetry"
	"github.com/timing-sidecar/timing-sidecar/timing"
)

// streamAtShutdown starts a stream of tokens events, ITL apart, on a raw
// connection in the given protocol version, and returns its body once the
// first event has arrived (chunked or close-delimited, as the version
// has it).
func streamAtShutdown(t *testing.T, base string, v shutdownCase, tokens int, itl time.Duration) *bufio.Reader {
	t.Helper()
	addr := strings.TrimPrefix(base, "http://")
	var c net.Conn
	var err error
	if v.pki != nil {
		c, err = tls.Dial("tcp", addr, &tls.Config{RootCAs: v.pki.Pool})
	} else {
		c, err = net.Dial("tcp", addr)
	}
	if err != nil {
		t.Fatal(err)
	}
	proto := v.proto
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(20 * time.Second)) //nolint:errcheck // a hang fails, not stalls
	req := `{"model":"m","stream":true,"include_metrics":true,"messages":[]}`
	fmt.Fprintf(c, "POST /v1/chat/completions %s\r\nHost: x\r\nContent-Type: application/json\r\nX-Fake-Tokens: %d\r\nX-Fake-ITL: %d\r\nContent-Length: %d\r\n\r\n%s",
		proto, tokens, itl.Milliseconds(), len(req), req)
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	body := bufio.NewReader(resp.Body)
	if _, err := body.ReadString('\n'); err != nil { // the first event's data line
		t.Fatal(err)
	}
	return body
}

// shutdownCase is a protocol version, over TLS or not.
type shutdownCase struct {
	proto string
	pki   *testpki.PKI // nil: plain TCP
}

func (v shutdownCase) name() string {
	if v.pki != nil {
		return v.proto + " TLS"
	}
	return v.proto
}

// shutdownCases are every protocol version the sidecar serves, over TLS
// and not.
func shutdownCases(t *testing.T) []shutdownCase {
	pki := testpki.New(t)
	return []shutdownCase{{"HTTP/1.1", nil}, {"HTTP/1.0", nil}, {"HTTP/1.1", pki}, {"HTTP/1.0", pki}}
}

// startShutdownSidecar starts a sidecar for v, its access log to log.
func startShutdownSidecar(t *testing.T, engine string, v shutdownCase, log *syncBuffer) (*Proxy, string) {
	return startSidecar(t, engine, func(c *Config) {
		if v.pki != nil {
			c.TLSCertFile, c.TLSKeyFile = v.pki.CertFile, v.pki.KeyFile
		}
	}, log)
}

// accessLogLines is the access log's request lines, decoded.
func accessLogLines(t *testing.T, log *syncBuffer) []map[string]any {
	t.Helper()
	var lines []map[string]any
	for _, l := range log.lines() {
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("access log line %q: %v", l, err)
		}
		if m["msg"] == "request" {
			lines = append(lines, m)
		}
	}
	return lines
}

// TestShutdownDrainsEveryStream: a stream open at shutdown, on HTTP/1.1
// (chunked) or HTTP/1.0 (close-delimited, on a connection fasthttp has
// handed over), over TLS or not, runs to its end within the grace, is logged once with
// its status and the bytes its client got, and the shutdown is clean.
func TestShutdownDrainsEveryStream(t *testing.T) {
	for _, v := range shutdownCases(t) {
		t.Run(v.name(), func(t *testing.T) {
			engine := newFakeEngine(t)
			var log syncBuffer
			p, base := startShutdownSidecar(t, engine.URL(), v, &log)
			body := streamAtShutdown(t, base, v, 8, 40*time.Millisecond)
			shut := make(chan error, 1)
			go func() {
				ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
				defer cancel()
				shut <- p.Shutdown(ctx)
			}()
			rest, _ := io.ReadAll(body)
			if got := string(rest); !strings.Contains(got, "data: [DONE]") {
				t.Fatalf("the stream was cut:\n%s", rest)
			}
			if err := <-shut; err != nil {
				t.Fatalf("shutdown: %v", err)
			}
			lines := accessLogLines(t, &log)
			if len(lines) != 1 || lines[0]["status"] != 200.0 || lines[0]["cut_at_shutdown"] != false || lines[0]["client_gone"] != false {
				t.Fatalf("access log: %v", lines)
			}
		})
	}
}

// TestShutdownCutsStreamsAtTheGrace: a stream still open when the grace
// runs out is cut, on either protocol version, over TLS or not: its client's connection
// ends, it is logged once with its status, the bytes it sent and that it
// was cut, and the shutdown says how many it cut.
func TestShutdownCutsStreamsAtTheGrace(t *testing.T) {
	for _, v := range shutdownCases(t) {
		t.Run(v.name(), func(t *testing.T) {
			engine := newFakeEngine(t)
			var log syncBuffer
			p, base := startShutdownSidecar(t, engine.URL(), v, &log)
			body := streamAtShutdown(t, base, v, 400, 50*time.Millisecond) // 20 s
			ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
			defer cancel()
			err := p.Shutdown(ctx)
			var cut streamsCut
			if !errors.As(err, &cut) || cut.n != 1 || !errors.Is(err, errInFlightAtGrace) {
				t.Fatalf("shutdown: %v, want one stream cut", err)
			}
			rest, _ := io.ReadAll(body)
			if strings.Contains(string(rest), "[DONE]") {
				t.Fatal("the stream ran to its end")
			}
			lines := accessLogLines(t, &log)
			if len(lines) != 1 || lines[0]["status"] != 200.0 || lines[0]["cut_at_shutdown"] != true || lines[0]["client_gone"] != false ||
				lines[0]["upstream_error"] != "" || lines[0]["bytes_out"].(float64) == 0 {
				t.Fatalf("access log: %v", lines)
			}
		})
	}
}

// hangingTraceCollector takes each export and never answers: the export
// holds until its context ends.
type hangingTraceCollector struct{ exporting chan struct{} }

func (c *hangingTraceCollector) ExportSpans(ctx context.Context, _ []sdktrace.ReadOnlySpan) error {
	select {
	case c.exporting <- struct{}{}:
	default:
	}
	<-ctx.Done()
	return ctx.Err()
}

func (c *hangingTraceCollector) Shutdown(context.Context) error { return nil }

// metricsCollector takes each export at once and says, on exports, whether
// its context was still live and how many request durations it held.
type metricsCollector struct{ exports chan metricsExport }

type metricsExport struct {
	live      bool
	durations uint64
}

func (c *metricsCollector) Export(ctx context.Context, rm *metricdata.ResourceMetrics) error {
	e := metricsExport{live: ctx.Err() == nil}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if h, ok := m.Data.(metricdata.Histogram[float64]); ok && m.Name == "gen_ai.server.request.duration" {
				for _, p := range h.DataPoints {
					e.durations += p.Count
				}
			}
		}
	}
	c.exports <- e
	return nil
}

func (c *metricsCollector) Temporality(k sdkmetric.InstrumentKind) metricdata.Temporality {
	return sdkmetric.DefaultTemporalitySelector(k)
}

func (c *metricsCollector) Aggregation(k sdkmetric.InstrumentKind) sdkmetric.Aggregation {
	return sdkmetric.DefaultAggregationSelector(k)
}
func (c *metricsCollector) ForceFlush(context.Context) error { return nil }
func (c *metricsCollector) Shutdown(context.Context) error   { return nil }

// TestAHangingTraceCollectorLeavesTheLastMetricsExport: at shutdown, a
// trace collector that never answers holds its own export to the grace's
// end, and the last GenAI metrics export goes out meanwhile, within the
// grace, with the last request in it; the spans lost are still reported.
// In a synctest bubble: the grace is fake time, and synctest.Wait is the
// moment every goroutine waits, the trace export's included.
func TestAHangingTraceCollectorLeavesTheLastMetricsExport(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		traces := &hangingTraceCollector{exporting: make(chan struct{}, 1)}
		metrics := &metricsCollector{exports: make(chan metricsExport, 4)}
		cfg := DefaultConfig()
		cfg.Upstream = "http://127.0.0.1:1" // never dialled
		cfg.OTLP.SpanExporter, cfg.OTLP.MetricExporter = traces, metrics
		p, err := New(cfg, slog.New(slog.DiscardHandler), nil)
		if err != nil {
			t.Fatal(err)
		}
		// A traced request ends: a span queued, a duration recorded.
		rec := telemetry.Record{Endpoint: telemetry.EndpointChat, Model: "m", Status: 200, Measured: true,
			Metrics: timing.Metrics{E2ELatency: timing.Number{Value: 120, Set: true}}}
		p.tracer.Begin(&rec.Trace, propagation.MapCarrier{}, time.Now(), rec.Endpoint, rec.Model)
		p.telemetry.Begin()
		p.telemetry.Finish(&rec)

		// Shorter than the span export's own timeout (30 s): the grace
		// alone ends the hanging export.
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		shut := make(chan error, 1)
		go func() { shut <- p.Shutdown(ctx) }()
		synctest.Wait()
		select {
		case <-traces.exporting:
		default:
			t.Fatal("the spans' last export did not reach the trace collector")
		}
		select {
		case e := <-metrics.exports:
			if !e.live || e.durations != 1 {
				t.Errorf("the last metrics export: context live %v, %d request durations; want live, 1", e.live, e.durations)
			}
		default:
			t.Error("the last metrics export waits behind the hanging trace collector")
		}
		if err := <-shut; !errors.Is(err, errSpansAtGrace) {
			t.Errorf("shutdown: %v, want the spans lost at the grace's end", err)
		}
	})
}
