package telemetry

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/timing-sidecar/timing-sidecar/timing"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// blockingExporter holds every export until released, or fails them.
type blockingExporter struct {
	release chan struct{}
	fail    error
	mu      sync.Mutex
	got     int
}

func (e *blockingExporter) ExportSpans(ctx context.Context, spans []sdktrace.ReadOnlySpan) error {
	if e.release != nil {
		select {
		case <-e.release:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	if e.fail != nil {
		return e.fail
	}
	e.mu.Lock()
	e.got += len(spans)
	e.mu.Unlock()
	return nil
}

func (e *blockingExporter) Shutdown(context.Context) error { return nil }

func (e *blockingExporter) exported() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.got
}

// endSpans ends n sampled spans through a provider on q.
func endSpans(q sdktrace.SpanProcessor, n int) {
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(q))
	for range n {
		_, s := tp.Tracer("test").Start(context.Background(), "s")
		s.End()
	}
}

func TestSpanQueueDropsWhenFullAndNeverBlocks(t *testing.T) {
	t.Setenv("OTEL_BSP_MAX_QUEUE_SIZE", "2")
	t.Setenv("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "1")
	t.Setenv("OTEL_BSP_SCHEDULE_DELAY", "600000")
	exp := &blockingExporter{release: make(chan struct{})}
	reg := prometheus.NewRegistry()
	q := newSpanQueue(exp, reg, quiet)
	// The exporter is stuck; ending spans must not be.
	ended := make(chan struct{})
	go func() {
		endSpans(q, 10)
		close(ended)
	}()
	select {
	case <-ended:
	case <-time.After(10 * time.Second):
		t.Fatal("ending spans blocked on a stuck exporter")
	}
	// At most one span is in the stuck export and two are queued.
	full := testutil.ToFloat64(q.queueFull)
	if full < 7 {
		t.Errorf("dropped (queue full) = %v, want ≥ 7 of 10", full)
	}
	close(exp.release)
	if err := q.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := float64(exp.exported()) + full; got != 10 {
		t.Errorf("exported %d + dropped %v = %v, want 10", exp.exported(), full, got)
	}
	if got := testutil.ToFloat64(q.exported); got != float64(exp.exported()) {
		t.Errorf("exported counter %v, exporter got %d", got, exp.exported())
	}
}

func TestSpanQueueCountsFailedExports(t *testing.T) {
	t.Setenv("OTEL_BSP_SCHEDULE_DELAY", "600000")
	exp := &blockingExporter{fail: errors.New("connection refused")}
	q := newSpanQueue(exp, prometheus.NewRegistry(), quiet)
	endSpans(q, 5)
	if err := q.ForceFlush(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := testutil.ToFloat64(q.failed); got != 5 {
		t.Errorf("dropped (export failed) = %v, want 5", got)
	}
	q.Shutdown(context.Background()) //nolint:errcheck
}

func TestShutdownExportsWhatIsQueued(t *testing.T) {
	t.Setenv("OTEL_BSP_SCHEDULE_DELAY", "600000") // nothing would go before shutdown otherwise
	exp := &blockingExporter{}
	q := newSpanQueue(exp, prometheus.NewRegistry(), quiet)
	endSpans(q, 3)
	if err := q.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if exp.exported() != 3 {
		t.Errorf("exported %d at shutdown, want 3", exp.exported())
	}
	endSpans(q, 1) // after shutdown: dropped, not blocked
	if got := testutil.ToFloat64(q.queueFull); got != 1 {
		t.Errorf("a span ended after shutdown: dropped = %v, want 1", got)
	}
}

// tracedRecord runs one record's spans through a tracer with an in-memory
// exporter and returns the SERVER and CLIENT spans.
func tracedRecord(t *testing.T, rec *Record, parent string) (server, client tracetest.SpanStub) {
	t.Helper()
	exp := tracetest.NewInMemoryExporter()
	tr, err := NewTracer(OTLP{Traces: Signal{On: true}, SpanExporter: exp}, prometheus.NewRegistry(), quiet)
	if err != nil {
		t.Fatal(err)
	}
	in := propagation.MapCarrier{}
	if parent != "" {
		in["traceparent"] = parent
	}
	arrival := rec.Trace.Clock.Arrival
	tr.Begin(&rec.Trace, in, arrival, rec.Endpoint, rec.Model)
	out := propagation.MapCarrier{}
	tr.Send(&rec.Trace, out, arrival.Add(time.Millisecond), "POST", rec.Path)
	tr.End(rec, rec.Trace.Clock.Done.Add(time.Millisecond))
	// Flushed, not shut down: the in-memory exporter forgets at shutdown.
	if err := tr.ForceFlush(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tr.Shutdown(context.Background()) }) //nolint:errcheck
	for _, s := range exp.GetSpans() {
		switch s.SpanKind {
		case trace.SpanKindServer:
			server = s
		case trace.SpanKindClient:
			client = s
		}
	}
	if !server.SpanContext.IsValid() || !client.SpanContext.IsValid() {
		t.Fatalf("spans %+v", exp.GetSpans())
	}
	if want := "00-" + client.SpanContext.TraceID().String() + "-" + client.SpanContext.SpanID().String() + "-01"; out["traceparent"] != want {
		t.Errorf("traceparent to the engine %q, want the CLIENT span's %q", out["traceparent"], want)
	}
	return server, client
}

func attrs(kvs []attribute.KeyValue) map[string]attribute.Value {
	m := map[string]attribute.Value{}
	for _, kv := range kvs {
		m[string(kv.Key)] = kv.Value
	}
	return m
}

var t0 = time.Date(2026, 12, 3, 14, 2, 0, 0, time.UTC)

func after(ms float64) time.Time { return t0.Add(time.Duration(ms * float64(time.Millisecond))) }

// reasoningRecord is a finished reasoning stream with the engine's own
// timing beside the sidecar's.
func reasoningRecord() Record {
	clock := timing.Clock{Arrival: t0, Accepted: after(20), Done: after(410)}
	clock.MarkOutput(after(100), timing.OutputReasoning)
	clock.MarkOutput(after(250), timing.OutputReasoning)
	clock.MarkOutput(after(260), timing.OutputContent)
	clock.MarkOutput(after(400), timing.OutputContent)
	m := timing.Compute(&clock, timing.Usage{PromptTokens: timing.Count{Value: 12, Set: true},
		CompletionTokens: timing.Count{Value: 30, Set: true}, ReasoningTokens: timing.Count{Value: 10, Set: true},
		CachedTokens: timing.Count{Value: 8, Set: true}}, true, timing.EngineTiming{Reported: true, Source: "vllm", Total: timing.Number{Value: 380, Set: true},
		QueueTime: timing.Number{Value: 15, Set: true}})
	return Record{ID: "req-1", Method: "POST", Path: "/v1/chat/completions", Endpoint: EndpointChat, Model: "qwen3",
		Tenant: "acme", Variant: "canary", Stream: true, Status: 200, Measured: true, Metrics: m,
		Trace: Trace{Clock: clock, EngineStatus: 200, EngineAddress: "127.0.0.1", EnginePort: 8000, Address: "llm.internal", Port: 8001,
			Sampling: Sampling{MaxTokens: 64, HasMaxTokens: true, Temperature: 0.7, HasTemperature: true},
			Answer:   Answer{ID: "chatcmpl-9", Model: "qwen3", FinishReasons: []string{"stop"}}}}
}

func TestSpansCarryTheRequestAndEveryMetric(t *testing.T) {
	rec := reasoningRecord()
	parent := "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	server, client := tracedRecord(t, &rec, parent)

	checkSpanNamesParentsAndTimes(t, server, client)
	a := attrs(server.Attributes)
	checkServerAttributes(t, a)
	checkMetricsAreAttributes(t, rec.Metrics, a)

	var names []string
	for _, e := range server.Events {
		names = append(names, e.Name+"@"+e.Time.Sub(t0).String())
	}
	if got, want := strings.Join(names, " "), "timing_sidecar.engine_accepted@20ms timing_sidecar.first_token@100ms timing_sidecar.first_content_token@260ms timing_sidecar.last_token@400ms"; got != want {
		t.Errorf("events %s, want %s", got, want)
	}
	c := attrs(client.Attributes)
	if c["server.address"].AsString() != "127.0.0.1" || c["server.port"].AsInt64() != 8000 || c["http.response.status_code"].AsInt64() != 200 {
		t.Errorf("CLIENT attributes %v", c)
	}
}

// checkSpanNamesParentsAndTimes checks reasoningRecord's two spans: their
// names, the SERVER span under the client's traceparent and the CLIENT
// span under it, and when each starts and ends.
func checkSpanNamesParentsAndTimes(t *testing.T, server, client tracetest.SpanStub) {
	t.Helper()
	if server.Name != "chat qwen3" || client.Name != "POST /v1/chat/completions" {
		t.Errorf("names %q, %q", server.Name, client.Name)
	}
	if server.Parent.SpanID().String() != "00f067aa0ba902b7" || server.SpanContext.TraceID().String() != "4bf92f3577b34da6a3ce929d0e0e4736" {
		t.Errorf("SERVER span's parent %v in trace %v, want the client's", server.Parent.SpanID(), server.SpanContext.TraceID())
	}
	if client.Parent.SpanID() != server.SpanContext.SpanID() {
		t.Errorf("CLIENT span's parent %v, want the SERVER span %v", client.Parent.SpanID(), server.SpanContext.SpanID())
	}
	if !server.StartTime.Equal(t0) || !server.EndTime.Equal(after(411)) || !client.StartTime.Equal(after(1)) || !client.EndTime.Equal(after(410)) {
		t.Errorf("SERVER %v–%v, CLIENT %v–%v", server.StartTime, server.EndTime, client.StartTime, client.EndTime)
	}
}

// checkServerAttributes checks the SERVER span's attributes for
// reasoningRecord: the request, the answer, the usage and the cache, and
// none for what was not sent or did not fail.
func checkServerAttributes(t *testing.T, a map[string]attribute.Value) {
	t.Helper()
	want := map[string]any{
		"gen_ai.operation.name": "chat", "gen_ai.provider.name": "openai", "gen_ai.request.model": "qwen3",
		"gen_ai.response.model": "qwen3", "gen_ai.response.id": "chatcmpl-9", "gen_ai.request.max_tokens": int64(64),
		"gen_ai.request.temperature": 0.7, "gen_ai.usage.input_tokens": int64(12), "gen_ai.usage.output_tokens": int64(30),
		"gen_ai.request.id": "req-1", "gen_ai.latency.time_in_queue": 0.02, "gen_ai.latency.time_to_first_token": 0.1,
		"gen_ai.latency.e2e": 0.41, "http.response.status_code": int64(200), "server.address": "llm.internal",
		"server.port": int64(8001), "timing_sidecar.tenant": "acme", "timing_sidecar.variant": "canary", "url.path": "/v1/chat/completions",
		// 8 of 12 prompt tokens cached: a full hit, whose 4 computed
		// tokens give no prefill speed (checked below).
		"gen_ai.usage.cache_read.input_tokens": int64(8), "timing_sidecar.cache": "full",
	}
	if _, ok := a["timing_sidecar.prefill_tokens_per_second"]; ok {
		t.Error("a full hit has a prefill speed")
	}
	for k, v := range want {
		if got, ok := a[k]; !ok || got.AsInterface() != v {
			t.Errorf("SERVER %s = %v, want %v", k, got.AsInterface(), v)
		}
	}
	if got := a["gen_ai.response.finish_reasons"].AsStringSlice(); len(got) != 1 || got[0] != "stop" {
		t.Errorf("finish reasons %v", got)
	}
	if _, ok := a["gen_ai.request.top_p"]; ok {
		t.Error("top_p was not sent but is an attribute")
	}
	if _, ok := a["error.type"]; ok {
		t.Error("a served request has error.type")
	}
}

// checkMetricsAreAttributes checks that every non-null field of the
// metrics object is an attribute of the same name and value under
// timing_sidecar.
func checkMetricsAreAttributes(t *testing.T, m timing.Metrics, a map[string]attribute.Value) {
	t.Helper()
	var obj map[string]any
	if err := json.Unmarshal(m.AppendJSON(nil), &obj); err != nil {
		t.Fatal(err)
	}
	fields := flatten("timing_sidecar.", obj)
	if len(fields) < 23 {
		t.Fatalf("only %d fields in %v", len(fields), obj)
	}
	for k, v := range fields {
		got, ok := a[k]
		if !ok {
			t.Errorf("metrics field %s = %v is not an attribute", k, v)
			continue
		}
		switch want := v.(type) {
		case float64:
			if f := toFloat(got); f-want > 0.0005 || want-f > 0.0005 {
				t.Errorf("%s = %v, metrics object says %v", k, f, want)
			}
		case string:
			if got.AsString() != want {
				t.Errorf("%s = %q, metrics object says %q", k, got.AsString(), want)
			}
		}
	}
}

// flatten names every non-null leaf of a JSON object by its dotted path.
func flatten(prefix string, obj map[string]any) map[string]any {
	out := map[string]any{}
	for k, v := range obj {
		switch v := v.(type) {
		case map[string]any:
			for k2, v2 := range flatten(prefix+k+".", v) {
				out[k2] = v2
			}
		case nil:
		default:
			out[prefix+k] = v
		}
	}
	return out
}

func toFloat(v attribute.Value) float64 {
	if v.Type() == attribute.INT64 {
		return float64(v.AsInt64())
	}
	return v.AsFloat64()
}

func TestFailedRequestsMarkTheirSpans(t *testing.T) {
	for _, tc := range []struct {
		name                           string
		rec                            Record
		serverStatus, clientStatus     bool
		serverError, clientError, code string
	}{
		{"engine 400", Record{Status: 400, Trace: Trace{EngineStatus: 400}}, false, true, "400", "400", "Unset"},
		{"engine 503", Record{Status: 503, Trace: Trace{EngineStatus: 503}}, true, true, "503", "503", "Error"},
		{"engine down", Record{Status: 502, UpstreamError: ErrorConnect}, true, true, "connect", "connect", "Error"},
		{"client left mid-stream", Record{Status: 200, ClientGone: true, Trace: Trace{EngineStatus: 200}}, true, false, "client_disconnected", "", "Error"},
		{"client left while queued", Record{Status: StatusClientGone, ClientGone: true}, true, true, "client_disconnected", "client_disconnected", "Error"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := tc.rec
			rec.Endpoint, rec.Method, rec.Path, rec.Model = EndpointChat, "POST", "/v1/chat/completions", "m"
			rec.Trace.Clock = timing.Clock{Arrival: t0}
			server, client := tracedRecord(t, &rec, "")
			if got := attrs(server.Attributes)["error.type"].AsString(); got != tc.serverError {
				t.Errorf("SERVER error.type %q, want %q", got, tc.serverError)
			}
			if got := attrs(client.Attributes)["error.type"].AsString(); got != tc.clientError {
				t.Errorf("CLIENT error.type %q, want %q", got, tc.clientError)
			}
			if got := server.Status.Code.String(); got != tc.code {
				t.Errorf("SERVER status %s, want %s", got, tc.code)
			}
			if (client.Status.Code.String() == "Error") != tc.clientStatus {
				t.Errorf("CLIENT status %s", client.Status.Code)
			}
			if server.Parent.IsValid() {
				t.Error("a request without traceparent got a parent")
			}
		})
	}
}

func TestMessagesAndCompletionsNames(t *testing.T) {
	for _, tc := range []struct{ endpoint, name, provider string }{
		{EndpointMessages, "chat claude", "anthropic"},
		{EndpointCompletions, "text_completion claude", "openai"},
		{EndpointResponses, "chat claude", "openai"},
	} {
		rec := Record{Endpoint: tc.endpoint, Model: "claude", Method: "POST", Path: "/p", Status: 200, Trace: Trace{Clock: timing.Clock{Arrival: t0}}}
		server, _ := tracedRecord(t, &rec, "")
		if server.Name != tc.name || attrs(server.Attributes)["gen_ai.provider.name"].AsString() != tc.provider {
			t.Errorf("%s: %q, provider %v", tc.endpoint, server.Name, attrs(server.Attributes)["gen_ai.provider.name"].AsString())
		}
	}
}

func TestSampledOutRequestsPropagateButRecordNothing(t *testing.T) {
	t.Setenv("OTEL_TRACES_SAMPLER", "parentbased_always_on")
	rec := Record{Endpoint: EndpointChat, Model: "m", Method: "POST", Path: "/v1/chat/completions", Status: 200,
		Trace: Trace{Clock: timing.Clock{Arrival: t0}}}
	exp := tracetest.NewInMemoryExporter()
	tr, err := NewTracer(OTLP{Traces: Signal{On: true}, SpanExporter: exp}, prometheus.NewRegistry(), quiet)
	if err != nil {
		t.Fatal(err)
	}
	// The client's trace is not sampled: the parent-based sampler follows.
	in := propagation.MapCarrier{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00"}
	tr.Begin(&rec.Trace, in, t0, rec.Endpoint, rec.Model)
	out := propagation.MapCarrier{}
	tr.Send(&rec.Trace, out, t0, "POST", rec.Path)
	tr.End(&rec, t0)
	tr.ForceFlush(context.Background()) //nolint:errcheck
	if len(exp.GetSpans()) != 0 {
		t.Errorf("exported %d spans of an unsampled trace", len(exp.GetSpans()))
	}
	if p := out["traceparent"]; !strings.HasPrefix(p, "00-4bf92f3577b34da6a3ce929d0e0e4736-") || !strings.HasSuffix(p, "-00") {
		t.Errorf("traceparent to the engine %q: want the client's trace, unsampled", p)
	}
}

func TestClientStringsAreCleanedInSpans(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	tr, err := NewTracer(OTLP{Traces: Signal{On: true}, SpanExporter: exp}, prometheus.NewRegistry(), quiet)
	if err != nil {
		t.Fatal(err)
	}
	r := NewRecorder(prometheus.NewRegistry(), Options{MaxModels: 4, MaxTenants: 4, Tracer: tr})
	rec := Record{Endpoint: EndpointChat, Model: strings.Repeat("m", 1000) + "\xff", Tenant: strings.Repeat("t", 1000), Variant: strings.Repeat("v", 1000) + "\xfe",
		ID: strings.Repeat("i", 1000), Method: "POST", Path: "/v1/chat/completions", Status: 200,
		Trace: Trace{Address: "host\xfe\xff" + strings.Repeat("h", 1000), Answer: Answer{ID: strings.Repeat("a", 1000), FinishReasons: []string{strings.Repeat("f", 1000)}}}}
	r.Begin()
	tr.Begin(&rec.Trace, propagation.MapCarrier{}, time.Now(), rec.Endpoint, rec.Model)
	r.Finish(&rec)                      // the recorder ends the spans, with the record's strings cleaned
	tr.ForceFlush(context.Background()) //nolint:errcheck
	spans := exp.GetSpans()
	if len(spans) != 1 {
		t.Fatalf("%d spans", len(spans))
	}
	if len(spans[0].Name) > 300 {
		t.Errorf("span name of %d bytes", len(spans[0].Name))
	}
	var long []string
	for _, kv := range spans[0].Attributes {
		if s := kv.Value.String(); len(s) > 300 || !utf8.ValidString(s) {
			long = append(long, string(kv.Key))
		}
	}
	sort.Strings(long)
	if len(long) > 0 {
		t.Errorf("attributes over 300 bytes or not UTF-8 (which fails a whole OTLP batch): %v", long)
	}
}

// BenchmarkTraceRequest is what tracing adds to one request on its own
// goroutines: both spans begun, the trace context written for the
// engine, the attributes and events built and the spans ended and
// queued (the export runs on the queue's goroutine; the exporter here
// discards, so OTLP encoding is not counted: e2e/bench/tracecost.sh
// measures the whole process).
func BenchmarkTraceRequest(b *testing.B) {
	exp := tracetest.NewNoopExporter()
	tr, err := NewTracer(OTLP{Traces: Signal{On: true}, SpanExporter: exp}, prometheus.NewRegistry(), quiet)
	if err != nil {
		b.Fatal(err)
	}
	defer tr.Shutdown(context.Background()) //nolint:errcheck
	template := reasoningRecord()
	in := propagation.MapCarrier{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}
	out := propagation.MapCarrier{}
	b.ReportAllocs()
	for b.Loop() {
		rec := template
		tr.Begin(&rec.Trace, in, t0, rec.Endpoint, rec.Model)
		tr.Send(&rec.Trace, out, after(1), "POST", rec.Path)
		tr.End(&rec, after(411))
	}
}

// deafExporter blocks every export and ignores its context.
type deafExporter struct{ block chan struct{} }

func (e deafExporter) ExportSpans(context.Context, []sdktrace.ReadOnlySpan) error {
	<-e.block
	return nil
}
func (e deafExporter) Shutdown(context.Context) error { return nil }

func TestShutdownIsBoundedByItsContext(t *testing.T) {
	t.Setenv("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "1")
	exp := deafExporter{block: make(chan struct{})}
	defer close(exp.block)
	q := newSpanQueue(exp, prometheus.NewRegistry(), quiet)
	endSpans(q, 3) // the first export never returns
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	returned := make(chan error, 1)
	go func() { returned <- q.Shutdown(ctx) }()
	select {
	case err := <-returned:
		if err == nil {
			t.Error("a shutdown cut short reported no error")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Shutdown outlived its context by 10 s against an exporter that ignores its own")
	}
}

// TestSpanCarriesTheVariant: the SERVER span names the request's arm, and
// has no such attribute without one.
func TestSpanCarriesTheVariant(t *testing.T) {
	for _, tc := range []struct{ name, variant string }{{"an arm", "canary"}, {"none", ""}} {
		t.Run(tc.name, func(t *testing.T) {
			rec := reasoningRecord()
			rec.Variant = tc.variant
			server, _ := tracedRecord(t, &rec, "")
			v, ok := attrs(server.Attributes)[string(attrVariant)]
			if ok != (tc.variant != "") || ok && v.AsString() != tc.variant {
				t.Errorf("timing_sidecar.variant %v (present %v), want %q", v.AsInterface(), ok, tc.variant)
			}
		})
	}
}
