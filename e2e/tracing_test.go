package e2e

import (
	"bufio"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/timing-sidecar/timing-sidecar/e2e/emulator"
)

// tracedRequest is what a test client saw of one request.
type tracedRequest struct {
	status  int
	metrics metrics
	output  string // the generated text, concatenated
}

const (
	promptMarker = "zebra-umbrella-prompt-that-must-not-be-exported"
	apiKey       = "sk-credential-that-must-not-be-exported"
)

// send posts a chat request with the given headers and reads it to its
// end: the metrics object (on the event that finishes the stream, or at
// the top of a body) and the generated text.
func send(t *testing.T, base string, stream bool, maxTokens int, headers map[string]string) tracedRequest {
	t.Helper()
	body := fmt.Sprintf(`{"model":"m","stream":%v,"include_metrics":true,"max_tokens":%d,"temperature":0.3,"messages":[{"role":"user","content":"%s"}]}`,
		stream, maxTokens, promptMarker)
	req, err := http.NewRequest("POST", base+"/v1/chat/completions", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+apiKey)
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	out := tracedRequest{status: resp.StatusCode}
	type chunk struct {
		Choices []struct {
			Delta   struct{ Content string } `json:"delta"`
			Message struct{ Content string } `json:"message"`
		} `json:"choices"`
		Metrics json.RawMessage `json:"metrics"`
	}
	read := func(data []byte) {
		var c chunk
		if json.Unmarshal(data, &c) != nil {
			return
		}
		for _, ch := range c.Choices {
			out.output += ch.Delta.Content + ch.Message.Content
		}
		if len(c.Metrics) > 0 && string(c.Metrics) != "null" {
			out.metrics = parseMetrics(t, string(c.Metrics))
		}
	}
	if !stream || resp.StatusCode != 200 {
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		read(b)
		return out
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if data, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
			read([]byte(data))
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

func randomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b) //nolint:errcheck
	return hex.EncodeToString(b)
}

// sameMs checks a figure from two of the sidecar's marks as the collector
// holds them (ns since the epoch) against the metrics object's (three
// decimals): the same marks, so they differ by the object's rounding
// (under 1 µs) and any slewing of the wall clock the spans carry; 2.5 µs
// is allowed.
func sameMs(t *testing.T, name string, fromNs, toNs int64, field *float64) {
	t.Helper()
	if fromNs == 0 || toNs == 0 || field == nil {
		t.Errorf("%s: marks %d, %d; metrics %v", name, fromNs, toNs, field)
		return
	}
	if got := float64(toNs-fromNs) / 1e6; math.Abs(got-*field) > 0.0025 {
		t.Errorf("%s: %.3f ms between the span's marks, %.3f ms in the metrics object", name, got, *field)
	}
}

func TestTracesInACollector(t *testing.T) {
	t.Parallel() // its own processes: beside the other long tests, not after them
	c := startCollector(t)
	engine := startEngine(t, emulator.Config{Model: "m", Timing: emulator.Timing{TTFT: 30 * time.Millisecond, ITL: 5 * time.Millisecond, TokensPerEvent: 1, OutputTokens: 16}})
	t.Run("grpc, set by the OTEL variables alone", func(t *testing.T) { testTracesOverGRPC(t, c, engine) })
	t.Run("http/protobuf by flag, flushed at SIGTERM", func(t *testing.T) { testTracesFlushedAtSIGTERM(t, c, engine) })
	t.Run("a collector that hangs or is down costs requests nothing", func(t *testing.T) {
		hang := listenAndNeverAnswer(t)
		down := freePorts(t, 1)[0] // nothing listens there
		for _, tc := range []badCollector{
			// Each export hangs for a minute: the small queue fills.
			{"hangs", hang, "queue_full", []string{"OTEL_BSP_MAX_QUEUE_SIZE=4", "OTEL_BSP_MAX_EXPORT_BATCH_SIZE=2",
				"OTEL_BSP_EXPORT_TIMEOUT=60000", "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT=60000"}},
			// Each export is refused, retried for 300 ms, and given up.
			{"down", down, "export_failed", []string{"OTEL_EXPORTER_OTLP_TRACES_TIMEOUT=300"}},
		} {
			t.Run(tc.name, func(t *testing.T) { testBadCollectorCostsNothing(t, engine, tc) })
		}
	})
}

// testTracesOverGRPC sends a stream, a unary request, an engine error and a
// client that leaves through a sidecar set up by the OTEL variables alone,
// and checks the spans the collector received for each.
func testTracesOverGRPC(t *testing.T, c *collector, engine *emulator.Server) {
	const service = "sidecar-grpc"
	s := startSidecar(t, []string{"--upstream", engine.URL()},
		"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=http://"+c.grpc, "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=grpc",
		"OTEL_SERVICE_NAME="+service, "OTEL_RESOURCE_ATTRIBUTES=k8s.pod.name=pod-1", "OTEL_BSP_SCHEDULE_DELAY=50")

	traceID, parentID := randomHex(16), randomHex(8)
	streamed := send(t, s.base, true, 12, map[string]string{"X-Request-Id": "grpc-stream", "Traceparent": "00-" + traceID + "-" + parentID + "-01"})
	if streamed.status != 200 || streamed.metrics == nil || streamed.output == "" {
		t.Fatalf("stream: %+v", streamed)
	}
	tr := c.awaitTrace(t, traceID, 2)
	server, client := serverAndClient(t, tr)
	checkStreamSpanIdentity(t, engine, service, server, client, traceID, parentID)
	checkStreamSpanTimes(t, server, client, streamed.metrics)
	checkStreamSpanAttributes(t, engine, server, client, streamed.metrics)

	// A request without traceparent starts its own trace; an engine
	// error and a client that leaves are marked.
	unary := checkUnaryStartsATrace(t, c, s, service)
	checkEngineErrorSpans(t, c, s, service)
	checkCancelledStreamSpan(t, c, s, service)

	// Nothing the client or the model wrote, and no credential, in
	// anything the collector received.
	checkNothingSecretExported(t, c, service, streamed.output, unary.output)
}

// checkStreamSpanIdentity checks the parentage (the client's span → SERVER
// → CLIENT → the engine), the resource and the names of a stream's spans.
func checkStreamSpanIdentity(t *testing.T, engine *emulator.Server, service string, server, client otlpSpan, traceID, parentID string) {
	t.Helper()
	if server.parent() != parentID || client.parent() != server.SpanID || client.TraceID != traceID {
		t.Errorf("SERVER's parent %s (want the client's %s), CLIENT's parent %s (want %s)", server.parent(), parentID, client.parent(), server.SpanID)
	}
	if got, want := record(t, engine, "chatcmpl-grpc-stream").Header.Get("Traceparent"), "00-"+traceID+"-"+client.SpanID+"-01"; got != want {
		t.Errorf("the engine received traceparent %q, want %q (the CLIENT span)", got, want)
	}
	for _, s := range []otlpSpan{server, client} {
		if r := s.Resource; r["service.name"] != service || r["k8s.pod.name"] != "pod-1" {
			t.Errorf("%s's resource %v", s.Name, r)
		}
	}
	if server.Name != "chat m" || client.Name != "POST /v1/chat/completions" {
		t.Errorf("span names %q, %q", server.Name, client.Name)
	}
}

// checkStreamSpanTimes checks a stream's span times and events against its
// metrics object.
func checkStreamSpanTimes(t *testing.T, server, client otlpSpan, m metrics) {
	t.Helper()
	accepted, first, last := server.event("timing_sidecar.engine_accepted"), server.event("timing_sidecar.first_token"), server.event("timing_sidecar.last_token")
	sameMs(t, "queue", server.Start, accepted, m["queue_time_ms"])
	sameMs(t, "ttft", accepted, first, m["time_to_first_token_ms"])
	sameMs(t, "generation", first, last, m["generation_time_ms"])
	if server.event("timing_sidecar.first_content_token") != first {
		t.Error("no first content token event at the first token")
	}
	if client.Start < server.Start || client.Start > accepted || client.End < last || server.End < client.End {
		t.Errorf("SERVER %d–%d, CLIENT %d–%d, accepted %d, last token %d", server.Start, server.End, client.Start, client.End, accepted, last)
	}
	if float64(server.End-server.Start)/1e6 < *m["e2e_latency_ms"]-0.002 {
		t.Errorf("SERVER span %d ns, shorter than e2e_latency_ms %v", server.End-server.Start, *m["e2e_latency_ms"])
	}
}

// checkStreamSpanAttributes checks the GenAI attributes and the metrics,
// each of its OTLP type, on a stream's spans.
func checkStreamSpanAttributes(t *testing.T, engine *emulator.Server, server, client otlpSpan, m metrics) {
	t.Helper()
	for k, want := range map[string]any{
		"gen_ai.operation.name": "chat", "gen_ai.provider.name": "openai", "gen_ai.request.model": "m",
		"gen_ai.response.model": "m", "gen_ai.request.max_tokens": int64(12), "gen_ai.request.temperature": 0.3,
		"gen_ai.usage.output_tokens": int64(12), "gen_ai.request.id": "grpc-stream", "http.response.status_code": int64(200),
		"timing_sidecar.time_to_first_token_ms": *m["time_to_first_token_ms"], "timing_sidecar.max_itl_ms": *m["max_itl_ms"],
		"timing_sidecar.completion_tokens": int64(*m["completion_tokens"]), "gen_ai.usage.input_tokens": int64(*m["prompt_tokens"]),
	} {
		if got := server.tag(k); got != want {
			t.Errorf("SERVER %s = %v (%T), want %v (%T)", k, got, got, want, want)
		}
	}
	if id, _ := server.tag("gen_ai.response.id").(string); id != "chatcmpl-grpc-stream" {
		t.Errorf("gen_ai.response.id %v", server.tag("gen_ai.response.id"))
	}
	if got := fmt.Sprint(server.tag("gen_ai.latency.time_to_first_token")); got == "<nil>" {
		t.Error("no gen_ai.latency.time_to_first_token")
	}
	if reasons, _ := server.tag("gen_ai.response.finish_reasons").([]any); !slices.Contains(reasons, any("length")) {
		t.Errorf("finish reasons %#v", server.tag("gen_ai.response.finish_reasons"))
	}
	if port, _ := client.tag("server.port").(int64); strconv.FormatInt(port, 10) != engine.URL()[strings.LastIndex(engine.URL(), ":")+1:] {
		t.Errorf("CLIENT server.port %v, engine %s", client.tag("server.port"), engine.URL())
	}
}

// checkUnaryStartsATrace sends a unary request without traceparent and
// checks its SERVER span is a root carrying the body's e2e latency.
func checkUnaryStartsATrace(t *testing.T, c *collector, s *sidecar, service string) tracedRequest {
	t.Helper()
	unary := send(t, s.base, false, 4, map[string]string{"X-Request-Id": "grpc-unary"})
	if unary.status != 200 || unary.metrics == nil {
		t.Fatalf("unary: %+v", unary)
	}
	us, _ := serverAndClient(t, c.awaitRequest(t, service, "grpc-unary"))
	if us.parent() != "" || us.tag("timing_sidecar.e2e_latency_ms") != *unary.metrics["e2e_latency_ms"] {
		t.Errorf("unary SERVER span: parent %q, e2e %v (body %v)", us.parent(), us.tag("timing_sidecar.e2e_latency_ms"), *unary.metrics["e2e_latency_ms"])
	}
	return unary
}

// checkEngineErrorSpans checks that an engine's 400 marks both spans.
func checkEngineErrorSpans(t *testing.T, c *collector, s *sidecar, service string) {
	t.Helper()
	if failed := send(t, s.base, true, 1_000_000, map[string]string{"X-Request-Id": "grpc-error"}); failed.status != 400 {
		t.Fatalf("an impossible max_tokens got %d", failed.status)
	}
	es, ec := serverAndClient(t, c.awaitRequest(t, service, "grpc-error"))
	if es.tag("error.type") != "400" || ec.tag("error.type") != "400" || ec.Status.Code != statusCodeError || es.tag("http.response.status_code") != int64(400) {
		t.Errorf("engine error: SERVER %v / CLIENT %v, status %d", es.Attributes, ec.Attributes, ec.Status.Code)
	}
}

// checkCancelledStreamSpan checks that a client leaving mid-stream marks
// the SERVER span.
func checkCancelledStreamSpan(t *testing.T, c *collector, s *sidecar, service string) {
	t.Helper()
	if n := rawStream(t, s.base, "grpc-cancel", 2000, 3, false); n != 3 {
		t.Fatalf("the cancelling client read %d events", n)
	}
	cs, _ := serverAndClient(t, c.awaitRequest(t, service, "grpc-cancel"))
	if cs.tag("error.type") != "client_disconnected" || cs.tag("timing_sidecar.client_gone") != true || cs.event("timing_sidecar.first_token") == 0 {
		t.Errorf("cancelled stream: %v", cs.Attributes)
	}
}

// checkNothingSecretExported checks that service sent its traces and that
// no prompt, output or credential is in anything the collector received.
func checkNothingSecretExported(t *testing.T, c *collector, service string, outputs ...string) {
	t.Helper()
	traces := map[string]bool{}
	for _, s := range c.spans(t) {
		if s.Resource["service.name"] == service {
			traces[s.TraceID] = true
		}
	}
	if len(traces) < 4 {
		t.Errorf("%d traces of %s", len(traces), service)
	}
	raw, err := os.ReadFile(c.traces)
	if err != nil {
		t.Fatal(err)
	}
	for _, secret := range append([]string{promptMarker, apiKey}, outputs...) {
		if strings.Contains(string(raw), secret) {
			t.Errorf("the collector received %q", secret)
		}
	}
}

// testTracesFlushedAtSIGTERM: a sidecar exporting over http/protobuf with a
// schedule too long to export before shutdown flushes its spans at SIGTERM.
func testTracesFlushedAtSIGTERM(t *testing.T, c *collector, engine *emulator.Server) {
	const service = "sidecar-http"
	// Nothing is exported before shutdown but by the shutdown itself.
	s := startSidecar(t, []string{"--upstream", engine.URL(), "--otlp-traces-endpoint", "http://" + c.http + "/v1/traces",
		"--otlp-traces-protocol", "http/protobuf"}, "OTEL_SERVICE_NAME="+service, "OTEL_BSP_SCHEDULE_DELAY=600000")
	traceID := randomHex(16)
	r := send(t, s.base, true, 6, map[string]string{"X-Request-Id": "http-stream", "Traceparent": "00-" + traceID + "-" + randomHex(8) + "-01"})
	if r.status != 200 || r.metrics == nil {
		t.Fatalf("stream: %+v", r)
	}
	// The access log line is written when the stream has finished,
	// so its spans have ended before the signal.
	awaitLogLine(t, s, "http-stream")
	s.cmd.Process.Signal(syscall.SIGTERM)
	if err := s.wait(t, 20*time.Second); err != nil {
		t.Fatalf("sidecar exited with %v", err)
	}
	// The sidecar has exited: whatever of it reaches the file now, it
	// sent before it did.
	if !await(func() bool { return len(c.trace(t, traceID)) >= 2 }) {
		t.Fatal("the spans had not reached the collector when the sidecar exited: SIGTERM did not flush them")
	}
	server, client := serverAndClient(t, c.trace(t, traceID))
	if client.parent() != server.SpanID || record(t, engine, "chatcmpl-http-stream").Header.Get("Traceparent") != "00-"+traceID+"-"+client.SpanID+"-01" {
		t.Error("http/protobuf: parentage broken")
	}
}

// badCollector is a collector endpoint that cannot take spans, and the
// reason the sidecar counts them dropped.
type badCollector struct {
	name, endpoint, reason string
	env                    []string
}

// listenAndNeverAnswer is a collector that accepts connections and never
// answers; it returns its address.
func listenAndNeverAnswer(t *testing.T) string {
	t.Helper()
	hang, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { hang.Close() })
	go func() {
		for {
			c, err := hang.Accept()
			if err != nil {
				return
			}
			defer c.Close()
		}
	}()
	return hang.Addr().String()
}

// testBadCollectorCostsNothing: requests through a sidecar exporting to bc
// do not wait on it, the spans are counted dropped, and a hung export is
// what the shutdown grace cuts.
func testBadCollectorCostsNothing(t *testing.T, engine *emulator.Server, bc badCollector) {
	// The shutdown grace bounds how long the last export may hold the
	// exit.
	s := startSidecar(t, []string{"--upstream", engine.URL(), "--otlp-traces-endpoint", "http://" + bc.endpoint, "--shutdown-grace", "3s"},
		append(bc.env, "OTEL_BSP_SCHEDULE_DELAY=20")...)
	for i := range 12 {
		start := time.Now()
		r := send(t, s.base, true, 8, map[string]string{"X-Request-Id": fmt.Sprintf("%s-%d", bc.name, i)})
		// An export stuck for a minute, or retried for 300 ms, would
		// show here if a request waited on it.
		if took := time.Since(start); r.status != 200 || r.metrics == nil || took > 5*time.Second {
			t.Fatalf("request %d: status %d in %v with the collector %s", i, r.status, took, bc.name)
		}
	}
	awaitSpansDropped(t, s.admin, bc.reason)
	if bc.name != "hangs" {
		return
	}
	// At SIGTERM no request is in flight; the hung export is what the
	// grace cuts, and the log says so.
	s.cmd.Process.Signal(syscall.SIGTERM)
	logs := strings.Join(s.logLines(t), "\n")
	if err := s.wait(t, 20*time.Second); err != nil {
		t.Fatalf("sidecar exited with %v", err)
	}
	if strings.Contains(logs, "requests still in flight") || !strings.Contains(logs, "before the last spans reached the collector") {
		t.Errorf("the shutdown log misnames a hung collector:\n%s", logs)
	}
}

// awaitSpansDropped waits up to 20 s for a span counted dropped for reason.
func awaitSpansDropped(t *testing.T, admin, reason string) {
	t.Helper()
	if !await(func() bool {
		return scrape(t, admin, `timing_sidecar_trace_spans_dropped_total{reason="`+reason+`"}`) > 0
	}) {
		t.Fatalf("no span counted as dropped (%s) within 20s", reason)
	}
}

// awaitLogLine waits for the access-log line of request id.
func awaitLogLine(t *testing.T, s *sidecar, id string) {
	t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		select {
		case line := <-s.accessLog:
			if strings.Contains(line, `"request_id":"`+id+`"`) {
				return
			}
		case <-timeout:
			t.Fatalf("no access-log line for %s", id)
		}
	}
}

// scrape reads one sample from the sidecar's /metrics; 0 if it is absent.
func scrape(t *testing.T, admin, series string) float64 {
	t.Helper()
	resp, err := http.Get(admin + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), series+" "); ok {
			f, _ := strconv.ParseFloat(v, 64)
			return f
		}
	}
	return 0
}
