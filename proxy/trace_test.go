package proxy

import (
	"context"
	"io"
	"math"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
)

// tracedSidecar runs a sidecar whose spans go to an in-memory exporter.
func tracedSidecar(t *testing.T, engine string, configure func(*Config)) (*Proxy, string, *tracetest.InMemoryExporter) {
	t.Helper()
	exp := tracetest.NewInMemoryExporter()
	p, base := startSidecar(t, engine, func(c *Config) {
		c.OTLP.SpanExporter = exp
		if configure != nil {
			configure(c)
		}
	}, nil)
	return p, base, exp
}

// spansOf waits until the request with X-Request-Id id has ended its
// spans (the relay finishes a stream after the client has read its end)
// and returns its SERVER and CLIENT spans.
func spansOf(t *testing.T, p *Proxy, exp *tracetest.InMemoryExporter, id string) (server, client tracetest.SpanStub) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if err := p.tracer.ForceFlush(context.Background()); err != nil {
			t.Fatal(err)
		}
		for _, s := range exp.GetSpans() {
			if s.SpanKind == trace.SpanKindServer && attrOf(s, "gen_ai.request.id").AsString() == id {
				server = s
			}
		}
		for _, s := range exp.GetSpans() {
			if s.SpanKind == trace.SpanKindClient && s.Parent.SpanID() == server.SpanContext.SpanID() {
				client = s
			}
		}
		if server.SpanContext.IsValid() && client.SpanContext.IsValid() {
			return server, client
		}
		if time.Now().After(deadline) {
			t.Fatalf("no SERVER and CLIENT spans for %s among %d", id, len(exp.GetSpans()))
		}
		time.Sleep(5 * time.Millisecond) // polling for the relay's end, which has no event to await
	}
}

func attrOf(s tracetest.SpanStub, key string) attribute.Value {
	for _, kv := range s.Attributes {
		if string(kv.Key) == key {
			return kv.Value
		}
	}
	return attribute.Value{}
}

func eventAt(t *testing.T, s tracetest.SpanStub, name string) time.Time {
	t.Helper()
	for _, e := range s.Events {
		if e.Name == name {
			return e.Time
		}
	}
	t.Fatalf("no %s event in %v", name, s.Events)
	return time.Time{}
}

// equalMs checks a duration between two marks against a metrics field,
// which has three decimals: the same marks, so no wall-clock tolerance.
func equalMs(t *testing.T, name string, d time.Duration, field *float64) {
	t.Helper()
	if field == nil || math.Abs(ms(d)-*field) > 0.0006 {
		t.Errorf("%s: span marks give %.4f ms, the metrics object %v", name, ms(d), field)
	}
}

func TestTracedStreamJoinsClientSidecarAndEngine(t *testing.T) {
	engine := newFakeEngine(t)
	p, base, exp := tracedSidecar(t, engine.URL(), nil)
	const traceID, parentID = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
	secret, prompt := "Bearer sk-do-not-export", "the prompt must never be exported"
	resp := post(t, base+"/v1/chat/completions",
		`{"model":"m","stream":true,"include_metrics":true,"max_tokens":40,"temperature":0.5,"messages":[{"role":"user","content":"`+prompt+`"}]}`,
		map[string]string{"X-Request-Id": "traced-1", "Traceparent": "00-" + traceID + "-" + parentID + "-01", "Tracestate": "vendor=kept",
			"Authorization": secret, "X-Fake-TTFT": "20", "X-Fake-ITL": "5", "X-Fake-Tokens": "4"})
	events, err := readEvents(t, resp.Body)
	resp.Body.Close()
	if err != io.EOF {
		t.Fatal(err)
	}
	var m map[string]*float64
	for _, e := range events {
		if strings.Contains(e.data, `"metrics"`) {
			m = metricsOf(t, e.data)
		}
	}
	fr := engine.next(t)
	server, client := spansOf(t, p, exp, "traced-1")

	checkTraceParentage(t, server, client, fr, traceID, parentID)
	checkSpanMarks(t, server, client, fr, m)
	checkTracedStreamAttributes(t, server, client, m)
	// Nothing the client or the model wrote, and no credential.
	for _, s := range exp.GetSpans() {
		if got := spanText(s); strings.Contains(got, "prompt must never") || strings.Contains(got, "sk-do-not") || strings.Contains(got, " t1") {
			t.Errorf("span %s exports request or response text: %s", s.Name, got)
		}
	}
}

// checkTraceParentage checks the chain the client's span → SERVER →
// CLIENT → the engine, and the spans' names.
func checkTraceParentage(t *testing.T, server, client tracetest.SpanStub, fr *fakeRequest, traceID, parentID string) {
	t.Helper()
	if server.SpanContext.TraceID().String() != traceID || server.Parent.SpanID().String() != parentID || !server.Parent.IsRemote() {
		t.Errorf("SERVER span in trace %s under %s, want %s under %s", server.SpanContext.TraceID(), server.Parent.SpanID(), traceID, parentID)
	}
	if client.Parent.SpanID() != server.SpanContext.SpanID() || client.SpanContext.TraceID().String() != traceID {
		t.Error("CLIENT span is not the SERVER span's child")
	}
	if got, want := fr.Header.Get("Traceparent"), "00-"+traceID+"-"+client.SpanContext.SpanID().String()+"-01"; got != want {
		t.Errorf("engine got traceparent %q, want the CLIENT span's %q", got, want)
	}
	if got := fr.Header.Get("Tracestate"); got != "vendor=kept" {
		t.Errorf("engine got tracestate %q", got)
	}
	if server.Name != "chat m" || client.Name != "POST /v1/chat/completions" {
		t.Errorf("span names %q, %q", server.Name, client.Name)
	}
}

// checkSpanMarks checks that the span times and events are the marks the
// metrics object m was computed from, and that they nest causally.
func checkSpanMarks(t *testing.T, server, client tracetest.SpanStub, fr *fakeRequest, m map[string]*float64) {
	t.Helper()
	accepted, first, last := eventAt(t, server, "timing_sidecar.engine_accepted"), eventAt(t, server, "timing_sidecar.first_token"), eventAt(t, server, "timing_sidecar.last_token")
	equalMs(t, "queue", accepted.Sub(server.StartTime), m["queue_time_ms"])
	equalMs(t, "ttft", first.Sub(accepted), m["time_to_first_token_ms"])
	equalMs(t, "generation", last.Sub(first), m["generation_time_ms"])
	if !eventAt(t, server, "timing_sidecar.first_content_token").Equal(first) {
		t.Error("without reasoning, the first content token is the first token")
	}
	if client.StartTime.Before(server.StartTime) || client.StartTime.After(accepted) || client.EndTime.Before(last) || server.EndTime.Before(client.EndTime) {
		t.Errorf("SERVER %v–%v, CLIENT %v–%v, accepted %v, last token %v", server.StartTime, server.EndTime, client.StartTime, client.EndTime, accepted, last)
	}
	if !fr.Received.After(client.StartTime) {
		t.Error("the engine received the request before the CLIENT span began")
	}
}

// checkTracedStreamAttributes checks the SERVER and CLIENT spans'
// attributes for the streamed chat request of
// TestTracedStreamJoinsClientSidecarAndEngine, against its metrics object m.
func checkTracedStreamAttributes(t *testing.T, server, client tracetest.SpanStub, m map[string]*float64) {
	t.Helper()
	for k, want := range map[string]any{
		"gen_ai.operation.name": "chat", "gen_ai.provider.name": "openai", "gen_ai.request.model": "m", "gen_ai.response.model": "m",
		"gen_ai.response.id": "c", "gen_ai.usage.input_tokens": int64(7), "gen_ai.usage.output_tokens": int64(4),
		"gen_ai.request.max_tokens": int64(40), "gen_ai.request.temperature": 0.5, "http.response.status_code": int64(200),
		"timing_sidecar.stream": true,
	} {
		if got := attrOf(server, k).AsInterface(); got != want {
			t.Errorf("SERVER %s = %v, want %v", k, got, want)
		}
	}
	if got := attrOf(server, "gen_ai.response.finish_reasons").AsStringSlice(); len(got) != 1 || got[0] != "stop" {
		t.Errorf("finish reasons %v", got)
	}
	if got := attrOf(server, "timing_sidecar.time_to_first_token_ms").AsFloat64(); m["time_to_first_token_ms"] == nil || got != *m["time_to_first_token_ms"] {
		t.Errorf("timing_sidecar.time_to_first_token_ms = %v, metrics object %v", got, m["time_to_first_token_ms"])
	}
	if got := attrOf(client, "server.port").AsInt64(); got == 0 || attrOf(client, "http.response.status_code").AsInt64() != 200 {
		t.Errorf("CLIENT span's engine port %d", got)
	}
}

// spanText is every string a span exports: its name, its attributes',
// its events' names and attributes', and its resource's attributes.
func spanText(s tracetest.SpanStub) string {
	var all strings.Builder
	all.WriteString(s.Name)
	for _, kv := range s.Attributes {
		all.WriteString(" " + kv.Value.String())
	}
	for _, e := range s.Events {
		all.WriteString(" " + e.Name)
		for _, kv := range e.Attributes {
			all.WriteString(" " + kv.Value.String())
		}
	}
	for _, kv := range s.Resource.Attributes() {
		all.WriteString(" " + kv.Value.String())
	}
	return all.String()
}

func TestTracingLeavesOtherRequestsAlone(t *testing.T) {
	engine := newFakeEngine(t)
	const parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	t.Run("off", func(t *testing.T) {
		base := startProxy(t, engine.URL(), nil)
		resp := post(t, base+"/v1/chat/completions", `{"model":"m","messages":[]}`, map[string]string{"Traceparent": parent})
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if got := engine.next(t).Header.Get("Traceparent"); got != parent {
			t.Errorf("tracing off: engine got traceparent %q, want the client's", got)
		}
	})
	t.Run("unmeasured path", func(t *testing.T) {
		p, base, exp := tracedSidecar(t, engine.URL(), nil)
		resp := post(t, base+"/tokenize", `{"model":"m","prompt":"x"}`, map[string]string{"Traceparent": parent})
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if got := engine.next(t).Header.Get("Traceparent"); got != parent {
			t.Errorf("unmeasured path: engine got traceparent %q, want the client's", got)
		}
		p.tracer.ForceFlush(context.Background()) //nolint:errcheck
		if n := len(exp.GetSpans()); n != 0 {
			t.Errorf("unmeasured path made %d spans", n)
		}
	})
}

func TestTracedEngineErrorAndNonStreamingRequest(t *testing.T) {
	engine := newFakeEngine(t)
	p, base, exp := tracedSidecar(t, engine.URL(), nil)
	resp := post(t, base+"/v1/chat/completions", `{"model":"m","messages":[]}`, map[string]string{"X-Request-Id": "fails", "X-Fake-Status": "503"})
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	server, client := spansOf(t, p, exp, "fails")
	if attrOf(server, "error.type").AsString() != "503" || server.Status.Code.String() != "Error" ||
		attrOf(client, "http.response.status_code").AsInt64() != 503 || client.Status.Code.String() != "Error" {
		t.Errorf("engine 503: SERVER %v %v, CLIENT %v %v", server.Attributes, server.Status, client.Attributes, client.Status)
	}

	resp = post(t, base+"/v1/chat/completions", `{"model":"m","messages":[],"include_metrics":true,"top_p":0.9}`, map[string]string{"X-Request-Id": "unary"})
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	server, _ = spansOf(t, p, exp, "unary")
	if attrOf(server, "gen_ai.response.id").AsString() != "cmpl-1" || attrOf(server, "gen_ai.request.top_p").AsFloat64() != 0.9 ||
		attrOf(server, "timing_sidecar.e2e_latency_ms").Type() != attribute.FLOAT64 || attrOf(server, "error.type").AsString() != "" {
		t.Errorf("non-streaming span attributes %v", server.Attributes)
	}

	// Passed through without metrics: the body is still read for the span.
	resp = post(t, base+"/v1/chat/completions", `{"model":"m","messages":[]}`, map[string]string{"X-Request-Id": "plain"})
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	server, _ = spansOf(t, p, exp, "plain")
	if attrOf(server, "gen_ai.response.id").AsString() != "cmpl-1" || len(attrOf(server, "gen_ai.response.finish_reasons").AsStringSlice()) != 1 {
		t.Errorf("pass-through span attributes %v", server.Attributes)
	}
}
