package proxy

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/valyala/fasthttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/timing-sidecar/timing-sidecar/proxy/netclock"
	"github.com/timing-sidecar/timing-sidecar/proxy/upstream"
	"github.com/timing-sidecar/timing-sidecar/rewrite"
	"github.com/timing-sidecar/timing-sidecar/telemetry"
	"github.com/timing-sidecar/timing-sidecar/timing"
)

// event300 is a 300-byte vLLM content event.
var event300 = func() string {
	head := `data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1767225600,"model":"meta-llama/Llama-3.1-8B-Instruct","choices":[{"index":0,"delta":{"content":" Hello`
	tail := `"},"logprobs":null,"finish_reason":null}]}` + "\n\n"
	return head + strings.Repeat("o", 300-len(head)-len(tail)) + tail
}()

const usageEvent = `data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1767225600,"model":"m","choices":[],"usage":{"prompt_tokens":17,"total_tokens":117,"completion_tokens":100}}` + "\n\n"

// loopReader replays a stream forever, as a stream of streams.
type loopReader struct {
	data []byte
	off  int
}

func (l *loopReader) Read(p []byte) (int, error) {
	if l.off == len(l.data) {
		l.off = 0
	}
	n := copy(p, l.data[l.off:])
	l.off += n
	return n, nil
}

func newBenchRelay(stream string) *eventRelay {
	r := newPools(DefaultMaxEventSize).relay.Get().(*eventRelay)
	r.events.Reset(&loopReader{data: []byte(stream)})
	r.f = &flight{clock: timing.Clock{Arrival: time.Now(), Accepted: time.Now()}, plan: rewrite.Plan{WantMetrics: true}, measured: true, route: chatRoute}
	r.hold = rewrite.FinishHold{Plan: r.f.plan}
	// The reads' arrival as a connection would record it; the recorder
	// takes each event's relay delay.
	r.x = &upstream.Exchange{Recv: &netclock.Conn{Received: time.Now()}}
	reg := prometheus.NewRegistry()
	r.p = &Proxy{registry: reg, telemetry: telemetry.NewRecorder(reg, telemetry.Options{})}
	return r
}

// eventWriter stands for fasthttp's chunk writer: it takes left more
// events, then stops the relay's WriteTo as a client that left would.
type eventWriter struct{ left int }

var errEnough = errors.New("enough events")

func (w *eventWriter) Write(p []byte) (int, error) {
	if w.left--; w.left == 0 {
		return len(p), errEnough
	}
	return len(p), nil
}

// writeEvents hands n events through the relay to w, as fasthttp takes
// them.
func writeEvents(b testing.TB, r *eventRelay, w *eventWriter, n int) {
	w.left = n
	if _, err := r.WriteTo(w); err != errEnough {
		b.Fatalf("relay stopped with %v", err)
	}
}

// BenchmarkRelayEvent300B is the per-event hot path: frame, classify, mark
// the clock and hand one 300-byte event to the client writer.
func BenchmarkRelayEvent300B(b *testing.B) {
	r := newBenchRelay(event300)
	var w eventWriter
	b.SetBytes(int64(len(event300)))
	b.ReportAllocs()
	for b.Loop() {
		writeEvents(b, r, &w, 1)
	}
}

// BenchmarkRelayEvent300BPageOn is the same with /debug/requests on: each
// event's arrival and write kept in the request's timeline (its cost is
// this less BenchmarkRelayEvent300B).
func BenchmarkRelayEvent300BPageOn(b *testing.B) {
	r := newBenchRelay(event300)
	r.f.liveOn = true
	var w eventWriter
	b.SetBytes(int64(len(event300)))
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		if i%1000 == 0 {
			r.f.timeline.Reset() // a new request's, as begin resets it
		}
		writeEvents(b, r, &w, 1)
	}
}

// BenchmarkRelayStream100 relays a whole stream: 100 content events and the
// usage event with the metrics spliced in.
func BenchmarkRelayStream100(b *testing.B) {
	stream := strings.Repeat(event300, 100) + usageEvent
	r := newBenchRelay(stream)
	var w eventWriter
	b.SetBytes(int64(len(stream)))
	b.ReportAllocs()
	for b.Loop() {
		r.hold, r.f.computed = rewrite.FinishHold{Plan: r.f.plan}, false // a new stream: its usage event takes the metrics
		writeEvents(b, r, &w, 101)
	}
}

func TestRelayAllocatesNothingPerEvent(t *testing.T) {
	t.Run("untraced", func(t *testing.T) { relayAllocations(t, nil) })
	t.Run("debug page", func(t *testing.T) { relayAllocations(t, nil, func(f *flight) { f.liveOn = true }) })
	t.Run("traced", func(t *testing.T) {
		tracer, err := telemetry.NewTracer(telemetry.OTLP{Traces: telemetry.Signal{On: true}, SpanExporter: tracetest.NewNoopExporter()}, prometheus.NewRegistry(), slog.New(slog.DiscardHandler))
		if err != nil {
			t.Fatal(err)
		}
		defer tracer.Shutdown(context.Background()) //nolint:errcheck
		relayAllocations(t, tracer)
	})
}

// relayAllocations checks that a stream's events cost no allocation in
// steady state, with tracing on when tracer is not nil, and the flight as
// set.
func relayAllocations(t *testing.T, tracer *telemetry.Tracer, set ...func(*flight)) {
	stream := strings.Repeat(event300, 10) + usageEvent
	r := newBenchRelay(stream)
	for _, s := range set {
		s(r.f)
	}
	tracer.Begin(&r.f.rec.Trace, propagation.MapCarrier{}, time.Now(), telemetry.EndpointChat, "m")
	if (tracer != nil) != r.f.rec.Trace.On() {
		t.Fatal("the trace did not begin")
	}
	var w eventWriter
	writeEvents(t, r, &w, 11) // warm up: buffers reach their steady size
	allocs := testing.AllocsPerRun(20, func() {
		r.hold, r.f.computed = rewrite.FinishHold{Plan: r.f.plan}, false // each stream's usage event is spliced
		r.f.timeline.Reset()                                             // each stream's timeline, in the room of the last
		writeEvents(t, r, &w, 11)
	})
	if allocs != 0 {
		t.Fatalf("relaying a stream allocates %v times, want 0", allocs)
	}
}

func TestRelaySplicesTheUsageEventOnly(t *testing.T) {
	stream := event300 + usageEvent
	r := newBenchRelay(stream)
	r.events.Reset(strings.NewReader(stream))
	out, err := io.ReadAll(readerFunc(r.Read))
	if err != nil {
		t.Fatal(err)
	}
	parts := bytes.SplitAfter(out, []byte("\n\n"))
	if string(parts[0]) != event300 {
		t.Errorf("content event changed: %q", parts[0])
	}
	if !bytes.Contains(parts[1], []byte(`"usage":{"prompt_tokens":17,"total_tokens":117,"completion_tokens":100},"metrics":{"time_to_first_token_ms":`)) ||
		!bytes.HasSuffix(parts[1], []byte(`"completion_tokens":100}}`+"\n\n")) {
		t.Errorf("usage event = %q", parts[1])
	}
}

type readerFunc func([]byte) (int, error)

func (f readerFunc) Read(p []byte) (int, error) { return f(p) }

type panicReader struct{}

func (panicReader) Read([]byte) (int, error) { panic("relay bug") }

// BenchmarkCheckRequest is the framing check every request pays: one pass
// over a typical client's header block.
func BenchmarkCheckRequest(b *testing.B) {
	var h fasthttp.RequestHeader
	raw := "POST /v1/chat/completions HTTP/1.1\r\nHost: vllm.default.svc:8001\r\nUser-Agent: OpenAI/Python 1.99.9\r\n" +
		"Accept: application/json\r\nAccept-Encoding: gzip, deflate\r\nAuthorization: Bearer sk-0123456789abcdef\r\n" +
		"Content-Type: application/json\r\nX-Stainless-Lang: python\r\nX-Stainless-Retry-Count: 0\r\nContent-Length: 120\r\n\r\n"
	if err := h.Read(bufio.NewReader(strings.NewReader(raw))); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if checkRequest(&h) != nil {
			b.Fatal("refused")
		}
	}
}
