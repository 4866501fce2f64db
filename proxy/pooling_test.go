package proxy

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/timing-sidecar/timing-sidecar/e2e/emulator"
	"github.com/timing-sidecar/timing-sidecar/rewrite"
)

// TestPoolingEndpointsAreMeasured: embeddings, pooling, classify, score
// and rerank, as the emulated vLLM serves them, are logged with their
// model, latency and tokens, counted and timed by endpoint and model,
// judged against --slo-e2e, and passed through byte for byte: no metrics
// object, include_metrics left in the request as it came.
func TestPoolingEndpointsAreMeasured(t *testing.T) {
	engine := startEmulator(t, emulator.Config{Model: "bge", Timing: emulator.Timing{HeaderDelay: 5 * time.Millisecond, TTFT: 10 * time.Millisecond}})
	var log syncBuffer
	p, base := startSidecar(t, engine.URL(), func(c *Config) { c.Mode, c.SLOE2E = rewrite.ModeAlways, time.Hour }, &log)
	for _, tc := range []struct {
		path, body, label string
	}{
		{"/v1/embeddings", `{"model":"bge","input":["a b c","d e"],"include_metrics":true}`, "embeddings"},
		{"/pooling", `{"model":"bge","input":"a b c"}`, "pooling"},
		{"/classify", `{"model":"bge","input":["a b","c"]}`, "classify"},
		{"/score", `{"model":"bge","text_1":"q r","text_2":["a b","c d e"]}`, "score"},
		{"/v1/score", `{"model":"bge","text_1":"q","text_2":"a"}`, "score"},
		{"/rerank", `{"model":"bge","query":"q r","documents":["a b","c"]}`, "rerank"},
		{"/v1/rerank", `{"model":"bge","query":"q","documents":["a"]}`, "rerank"},
		{"/v2/rerank", `{"model":"bge","query":"q","documents":["a","b c"]}`, "rerank"},
	} {
		id := map[string]string{"X-Request-Id": strings.ReplaceAll(tc.path, "/", "-")}
		direct := post(t, engine.URL()+tc.path, tc.body, id)
		want, _ := io.ReadAll(direct.Body)
		direct.Body.Close()
		resp := post(t, base+tc.path, tc.body, id)
		got, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		rec, err := engine.Last(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode != 200 || string(got) != string(want) {
			t.Errorf("%s: %d, answer changed:\n got %s\nwant %s", tc.path, resp.StatusCode, got, want)
		}
		if st := resp.Header.Get("Server-Timing"); !strings.HasPrefix(st, "ttfb;dur=") {
			t.Errorf("%s: Server-Timing %q", tc.path, st)
		}
		if string(rec.Body) != tc.body {
			t.Errorf("%s: the engine got %s, not the request as sent", tc.path, rec.Body)
		}
		p.telemetry.Flush()
		lines := log.lines()
		checkPoolingLogLine(t, tc.path, lines[len(lines)-1], rec.PromptTokens)
	}
	checkPoolingSeries(t, p, map[string]uint64{"embeddings": 1, "pooling": 1, "classify": 1, "score": 2, "rerank": 3})
}

// checkPoolingLogLine checks the access-log line of a pooling request to
// path: the model, a latency, a time to first byte within it and no
// shorter than the engine's delays, the engine's prompt tokens, and the
// --slo-e2e objective met.
func checkPoolingLogLine(t *testing.T, path, line string, promptTokens int) {
	t.Helper()
	var e struct {
		Model  string   `json:"model"`
		E2E    *float64 `json:"e2e_latency_ms"`
		TTFB   *float64 `json:"time_to_first_byte_ms"`
		Prompt *int     `json:"prompt_tokens"`
		SLO    string   `json:"slo"`
	}
	if err := json.Unmarshal([]byte(line), &e); err != nil {
		t.Fatal(err)
	}
	if e.Model != "bge" || e.E2E == nil || *e.E2E <= 0 || e.TTFB == nil || *e.TTFB > *e.E2E ||
		*e.TTFB < 15 || // the engine's 5 + 10 ms, between its reading the request and its answer
		e.Prompt == nil || *e.Prompt != promptTokens || e.SLO != "met" {
		t.Errorf("%s: logged %s", path, line)
	}
}

// checkPoolingSeries checks, for each endpoint label of model bge, that
// its requests were timed and counted requests times, and its prompt
// tokens counted.
func checkPoolingSeries(t *testing.T, p *Proxy, requests map[string]uint64) {
	t.Helper()
	for label, n := range requests {
		l := map[string]string{"endpoint": label, "model": "bge"}
		if got, _ := histogramCount(t, p, "timing_sidecar_e2e_request_latency_seconds", l); got != n {
			t.Errorf("e2e latency count%v = %d, want %d", l, got, n)
		}
		if got := counterValue(t, p, "timing_sidecar_prompt_tokens_total", l); got == 0 {
			t.Errorf("no prompt tokens counted for %s", label)
		}
		if got := counterValue(t, p, "timing_sidecar_requests_total", map[string]string{"endpoint": label, "model": "bge", "status": "200", "stream": "false"}); got != float64(n) {
			t.Errorf("requests_total{%s} = %v, want %d", label, got, n)
		}
	}
}

// TestPoolingAgainstAMisbehavingEngine: an answer without usage, a
// request without a model, an upload larger than the memory budget and an
// answer cut halfway are each logged with what could be measured, and the
// client gets what the engine sent.
func TestPoolingAgainstAMisbehavingEngine(t *testing.T) {
	engine := newFakeEngine(t)
	var log syncBuffer
	p, base := startSidecar(t, engine.URL(), func(c *Config) { c.MaxBodyMemory = 32 << 10 }, &log)
	noUsage := `{"id":"embd-1","object":"list","model":"bge","data":[{"index":0,"object":"embedding","embedding":[0.1]}]}`
	huge := `{"model":"bge","input":"` + strings.Repeat("a ", 50<<10) + `"}`
	for _, tc := range []struct {
		name, body string
		headers    map[string]string
		model      string
		unread     string
	}{
		{"no usage", `{"model":"bge","input":"x"}`, map[string]string{"X-Fake-Body": noUsage}, "bge", ""},
		{"no model", `{"input":"x"}`, map[string]string{"X-Fake-Body": noUsage}, "", ""},
		{"larger than the memory budget", huge, map[string]string{"X-Fake-Body": noUsage}, "", "no_memory"},
	} {
		resp := post(t, base+"/v1/embeddings", tc.body, tc.headers)
		got, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		fr := engine.next(t)
		<-fr.Finished
		if resp.StatusCode != 200 || string(got) != noUsage || string(fr.Body) != tc.body {
			t.Errorf("%s: %d %s; the engine got %d bytes of %d", tc.name, resp.StatusCode, got, len(fr.Body), len(tc.body))
		}
		p.telemetry.Flush()
		lines := log.lines()
		var e struct {
			Model  string   `json:"model"`
			E2E    *float64 `json:"e2e_latency_ms"`
			Prompt *int     `json:"prompt_tokens"`
		}
		last := lines[len(lines)-1]
		if err := json.Unmarshal([]byte(last), &e); err != nil {
			t.Fatal(err)
		}
		if e.Model != tc.model || e.E2E == nil || e.Prompt != nil {
			t.Errorf("%s: logged %s", tc.name, last)
		}
		if tc.unread != "" && counterValue(t, p, "timing_sidecar_unread_requests_total", map[string]string{"reason": tc.unread}) != 1 {
			t.Errorf("%s: not counted as unread (%s)", tc.name, tc.unread)
		}
		if used := p.bodies.Used(); used != 0 {
			t.Errorf("%s: %d bytes of the budget still held", tc.name, used)
		}
	}
}

// TestPoolingAnswerCutHalfway: an engine that closes before its declared
// length is an interrupted request, logged and counted, and the client
// gets what came and then a close.
func TestPoolingAnswerCutHalfway(t *testing.T) {
	engine := newScriptedEngine(t, func(c net.Conn, _ *http.Request, _ []byte) {
		io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"id\":\"embd-1\",\"data\":[")
		c.Close()
	})
	log := &notifyingBuffer{wrote: make(chan struct{}, 1)}
	p, base := startSidecar(t, engine.URL(), nil, log)
	resp := post(t, base+"/v1/rerank", `{"model":"bge","query":"q","documents":["a"]}`, nil)
	got, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err == nil || !strings.HasPrefix(string(got), `{"id":"embd-1"`) {
		t.Errorf("the client read %q, %v: want what came, then an error", got, err)
	}
	// The record is made as the relay ends, after the client's read; the
	// access log writes it out on its own within its flush interval.
	select {
	case <-log.wrote:
	case <-time.After(10 * time.Second):
		t.Fatal("no access-log line")
	}
	lines := log.lines()
	if len(lines) != 1 || !strings.Contains(lines[0], `"upstream_error":"interrupted"`) || !strings.Contains(lines[0], `"model":"bge"`) {
		t.Errorf("logged %v", lines)
	}
	if got := counterValue(t, p, "timing_sidecar_upstream_errors_total", map[string]string{"kind": "interrupted"}); got != 1 {
		t.Errorf("interrupted %v", got)
	}
}

// notifyingBuffer is an access log that says when a line was written.
type notifyingBuffer struct {
	syncBuffer
	wrote chan struct{}
}

func (b *notifyingBuffer) Write(p []byte) (int, error) {
	n, err := b.syncBuffer.Write(p)
	select {
	case b.wrote <- struct{}{}:
	default:
	}
	return n, err
}

// TestPoolingAndAudioAreTraced: their SERVER spans are named by the
// conventions' operation (embeddings) or the endpoint's own, with the
// model and the prompt tokens.
func TestPoolingAndAudioAreTraced(t *testing.T) {
	engine := startEmulator(t, emulator.Config{Model: "bge", Timing: emulator.Timing{TTFT: 5 * time.Millisecond, OutputTokens: 2}})
	p, base, exp := tracedSidecar(t, engine.URL(), nil)
	for _, tc := range []struct{ path, body, name, op string }{
		{"/v1/embeddings", `{"model":"bge","input":"a b"}`, "embeddings bge", "embeddings"},
		{"/v1/rerank", `{"model":"bge","query":"q","documents":["a"]}`, "rerank bge", "rerank"},
	} {
		id := strings.ReplaceAll(tc.path, "/", "-")
		resp := post(t, base+tc.path, tc.body, map[string]string{"X-Request-Id": id})
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		server, _ := spansOf(t, p, exp, id)
		a := map[string]any{}
		for _, kv := range server.Attributes {
			a[string(kv.Key)] = kv.Value.AsInterface()
		}
		if server.Name != tc.name || a["gen_ai.operation.name"] != tc.op || a["gen_ai.request.model"] != "bge" || a["gen_ai.usage.input_tokens"] == nil {
			t.Errorf("%s: span %q %v", tc.path, server.Name, a)
		}
	}
	ct, body := audioForm(t, 4<<10, "model", "bge")
	resp := postForm(t, base+"/v1/audio/transcriptions", ct, "audio", body)
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if server, _ := spansOf(t, p, exp, "audio"); server.Name != "transcriptions bge" {
		t.Errorf("audio span %q", server.Name)
	}
}

// TestStreamedTranscriptionCutHalfway: an engine that drops a streamed
// transcription after two deltas is an interrupted request; the client
// has the deltas that came.
func TestStreamedTranscriptionCutHalfway(t *testing.T) {
	engine := newScriptedEngine(t, func(c net.Conn, _ *http.Request, _ []byte) {
		io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
		for range 2 {
			ev := `data: {"id":"trsc-1","object":"transcription.chunk","model":"whisper","choices":[{"delta":{"content":" hi"},"finish_reason":null}]}` + "\n\n"
			fmt.Fprintf(c, "%x\r\n%s\r\n", len(ev), ev)
		}
		c.Close()
	})
	log := &notifyingBuffer{wrote: make(chan struct{}, 1)}
	p, base := startSidecar(t, engine.URL(), nil, log)
	ct, body := audioForm(t, 4<<10, "model", "whisper", "stream", "true")
	resp := postForm(t, base+"/v1/audio/transcriptions", ct, "cut", body)
	got, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if strings.Count(string(got), `"content":" hi"`) != 2 {
		t.Errorf("the client got %q", got)
	}
	select {
	case <-log.wrote:
	case <-time.After(10 * time.Second):
		t.Fatal("no access-log line")
	}
	line := log.lines()[0]
	if !strings.Contains(line, `"upstream_error":"interrupted"`) || !strings.Contains(line, `"model":"whisper"`) || strings.Contains(line, `"time_to_first_token_ms":null`) {
		t.Errorf("logged %s", line)
	}
	if got := counterValue(t, p, "timing_sidecar_upstream_errors_total", map[string]string{"kind": "interrupted"}); got != 1 {
		t.Errorf("interrupted %v", got)
	}
}
