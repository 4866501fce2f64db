package proxy

import (
	"bytes"
	"io"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/tidwall/gjson"

	"github.com/timing-sidecar/timing-sidecar/e2e/emulator"
)

// The clients that read per-request metrics, each reader written from its
// published source (neither can be built here: llama-swap is not on the
// module proxy, guidellm is Python and CI reaches no PyPI).

// llamaSwapEntry is what llama-swap's activity log takes of a response
// (internal/server/metrics.go at 0bdb3720199f, processStreamingResponse
// and buildMetrics): every data line is read with gjson, the last
// top-level "metrics" and "usage" win; the prompt rate is (input −
// cached) / time_to_first_token_ms and the decode rate 1000 /
// mean_itl_ms, each only when above 0; -1 is unknown.
type llamaSwapEntry struct {
	input, output, cached            int64
	promptPerSecond, tokensPerSecond float64
}

func llamaSwapReads(body []byte, stream bool) llamaSwapEntry {
	var usage, metrics gjson.Result
	if !stream {
		parsed := gjson.ParseBytes(body)
		usage, metrics = parsed.Get("usage"), parsed.Get("metrics")
	}
	e := llamaSwapEntry{cached: -1, promptPerSecond: -1, tokensPerSecond: -1}
	for _, line := range bytes.Split(body, []byte("\n")) {
		data, ok := bytes.CutPrefix(bytes.TrimSpace(line), []byte("data:"))
		data = bytes.TrimSpace(data)
		if !stream || !ok || len(data) == 0 || string(data) == "[DONE]" || !gjson.ValidBytes(data) {
			continue
		}
		parsed := gjson.ParseBytes(data)
		if u := parsed.Get("usage"); u.Exists() {
			usage = u
		}
		if m := parsed.Get("metrics"); m.Exists() {
			metrics = m
		}
	}
	if v := usage.Get("prompt_tokens"); v.Exists() {
		e.input = v.Int()
	}
	if v := usage.Get("completion_tokens"); v.Exists() {
		e.output = v.Int()
	}
	if v := usage.Get("prompt_tokens_details.cached_tokens"); v.Exists() {
		e.cached = v.Int()
	}
	if ttft := metrics.Get("time_to_first_token_ms"); ttft.Exists() && ttft.Float() > 0 {
		e.promptPerSecond = float64(e.input-max(e.cached, 0)) / (ttft.Float() / 1000)
	}
	if itl := metrics.Get("mean_itl_ms"); itl.Exists() && itl.Float() > 0 {
		e.tokensPerSecond = 1000 / itl.Float()
	}
	return e
}

// TestLlamaSwapReadsTheMetrics: llama-swap in front of the sidecar, set up
// as its guide sets up vLLM (--enable-force-include-usage; here the
// sidecar's --force-include-usage, mode vllm), logs the sidecar's figures:
// for a stream whose client asked no usage, its prompt and decode rates
// come from the metrics on the usage event; not streamed, the decode rate
// is unknown, as from vLLM.
func TestLlamaSwapReadsTheMetrics(t *testing.T) {
	engine := startEmulator(t, emulator.Config{PromptTokensDetails: true, Timing: emulator.Timing{TTFT: 10 * time.Millisecond, ITL: 4 * time.Millisecond, OutputTokens: 6}})
	base := startProxy(t, engine.URL(), func(c *Config) { c.ForceIncludeUsage = true })
	for _, stream := range []bool{true, false} {
		body := `{"model":"m","messages":[{"role":"user","content":"one two three four"}]}`
		if stream {
			body = `{"model":"m","stream":true,"messages":[{"role":"user","content":"one two three four"}]}`
		}
		resp := post(t, base+"/v1/chat/completions", body, nil)
		got, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		e := llamaSwapReads(got, stream)
		var m gjson.Result
		for _, line := range strings.Split(string(got), "\n") {
			if r := gjson.Get(strings.TrimPrefix(line, "data: "), "metrics"); r.IsObject() {
				m = r
			}
		}
		if e.input != 4 || e.output != 6 || e.cached != 0 || !m.Exists() {
			t.Fatalf("stream %v: llama-swap read %+v from %s", stream, e, got)
		}
		wantPrompt, wantDecode := 4/(m.Get("time_to_first_token_ms").Num/1000), 1000/m.Get("mean_itl_ms").Num
		if !stream {
			wantPrompt, wantDecode = -1, -1 // vLLM's non-streaming TTFT and ITL are null here too
		}
		if math.Abs(e.promptPerSecond-wantPrompt) > 1e-6 || math.Abs(e.tokensPerSecond-wantDecode) > 1e-6 {
			t.Errorf("stream %v: llama-swap's rates %v, %v; want %v, %v from %s", stream, e.promptPerSecond, e.tokensPerSecond, wantPrompt, wantDecode, m.Raw)
		}
	}
}

// guidellmReads is what guidellm takes of a stream
// (src/guidellm/backends/openai/request_handlers.py at ee7a77457ba6): it
// reads no "metrics"; every data line's non-empty "usage" replaces the
// one before, and it stops at [DONE]. It asks for
// {"include_usage": true, "continuous_usage_stats": true}.
func guidellmReads(body []byte) (prompt, completion int64, done bool) {
	for _, line := range bytes.Split(body, []byte("\n")) {
		data, ok := bytes.CutPrefix(bytes.TrimSpace(line), []byte("data:"))
		data = bytes.TrimSpace(data)
		if !ok || len(data) == 0 {
			continue
		}
		if string(data) == "[DONE]" {
			return prompt, completion, true
		}
		if u := gjson.GetBytes(data, "usage"); u.IsObject() && len(u.Map()) > 0 {
			prompt, completion = u.Get("prompt_tokens").Int(), u.Get("completion_tokens").Int()
		}
	}
	return prompt, completion, false
}

// TestGuidellmReadsTheStream: guidellm's request through the sidecar in
// mode vllm: the running usage it asked for comes on every event as the
// engine sent it, its counts end at the engine's, and the metrics ride on
// the usage event without disturbing them.
func TestGuidellmReadsTheStream(t *testing.T) {
	engine := startEmulator(t, emulator.Config{Timing: emulator.Timing{ITL: time.Millisecond, TokensPerEvent: 2, OutputTokens: 8}})
	base := startProxy(t, engine.URL(), nil)
	body := `{"model":"m","stream":true,"stream_options":{"include_usage":true,"continuous_usage_stats":true},"max_completion_tokens":8,"ignore_eos":true,` +
		`"messages":[{"role":"user","content":[{"type":"text","text":"one two three"}]}]}`
	resp := post(t, base+"/v1/chat/completions", body, nil)
	got, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	prompt, completion, done := guidellmReads(got)
	if !done || prompt == 0 || completion != 8 || strings.Count(string(got), `"usage":{`) < 5 || !strings.Contains(string(got), `"metrics":{`) {
		t.Fatalf("guidellm read prompt %d, completion %d, done %v from %s", prompt, completion, done, got)
	}
}
