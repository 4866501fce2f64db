package proxy

import (
	"encoding/json"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/timing-sidecar/timing-sidecar/e2e/emulator"
)

// TestPoolingEndpointsAreMeasured: embeddings, pooling, classify, score
// and rerank, as the emulated vLLM serves them, are logged with their
// model, latency and tokens, counted and timed by endpoint and model,
// judged against --slo-e2e, and passed through byte for byte: no metrics
// object, include_metrics left in the request as it came.
func TestPoolingEndpointsAreMeasured(t *testing.T) {
	engine := startEmulator(t, emulator.Config{Model: "bge", Timing: emulator.Timing{HeaderDelay: 5 * time.Millisecond, TTFT: 10 * time.Millisecond}})
	var log syncBuffer
	p, base := startSidecar(t, engine.URL(), func(c *Config) { c.Mode, c.SLOE2E = ModeAlways, time.Hour }, &log)
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
		var e struct {
			Model  string   `json:"model"`
			E2E    *float64 `json:"e2e_latency_ms"`
			TTFB   *float64 `json:"time_to_first_byte_ms"`
			Prompt *int     `json:"prompt_tokens"`
			SLO    string   `json:"slo"`
		}
		if err := json.Unmarshal([]byte(lines[len(lines)-1]), &e); err != nil {
			t.Fatal(err)
		}
		if e.Model != "bge" || e.E2E == nil || *e.E2E <= 0 || e.TTFB == nil || *e.TTFB > *e.E2E ||
			*e.TTFB < 15 || // the engine's 5 + 10 ms, between its reading the request and its answer
			e.Prompt == nil || *e.Prompt != rec.PromptTokens || e.SLO != "met" {
			t.Errorf("%s: logged %s", tc.path, lines[len(lines)-1])
		}
	}
	for label, n := range map[string]uint64{"embeddings": 1, "pooling": 1, "classify": 1, "score": 2, "rerank": 3} {
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
