package proxy

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/timing-sidecar/timing-sidecar/e2e/emulator"
)

// TestPromptCacheIsAttributed: an engine that reports its cached prompt
// tokens, in each API's shape, gets them into the access log, the counter
// and the TTFT histogram's cache class; the client's metrics object counts
// the whole prompt and carries no cache field of its own.
func TestPromptCacheIsAttributed(t *testing.T) {
	engine := startEmulator(t, emulator.Config{PromptTokensDetails: true,
		Timing: emulator.Timing{TTFT: 20 * time.Millisecond, ITL: 5 * time.Millisecond, OutputTokens: 3}})
	var log syncBuffer
	p, base := startSidecar(t, engine.URL(), nil, &log)
	prompt := strings.TrimSpace(strings.Repeat("word ", 60)) // 60 prompt tokens, as the emulator counts
	type call struct {
		name, path, body string
		cached           string // X-Emulator-Cached-Tokens
		wantCached       int    // what the engine serves of it: all but the last token at most
		class            string
	}
	chat := `{"model":"m","stream":%s,"messages":[{"role":"user","content":"` + prompt + `"}]}`
	calls := []call{
		{"chat stream, nothing cached", "/v1/chat/completions", fmt.Sprintf(chat, "true"), "0", 0, "none"},
		{"chat stream, half cached", "/v1/chat/completions", fmt.Sprintf(chat, "true"), "30", 30, "partial"},
		{"chat stream, all but the last cached", "/v1/chat/completions", fmt.Sprintf(chat, "true"), "100", 59, "full"},
		{"chat body", "/v1/chat/completions", fmt.Sprintf(chat, "false"), "30", 30, "partial"},
		{"completions stream", "/v1/completions", `{"model":"m","stream":true,"prompt":"` + prompt + `"}`, "50", 50, "full"},
		{"responses stream", "/v1/responses", `{"model":"m","stream":true,"input":"` + prompt + `"}`, "30", 30, "partial"},
		{"messages stream", "/v1/messages", `{"model":"m","max_tokens":3,"stream":true,"messages":[{"role":"user","content":"` + prompt + `"}]}`, "30", 30, "partial"},
		{"messages body", "/v1/messages", `{"model":"m","max_tokens":3,"messages":[{"role":"user","content":"` + prompt + `"}]}`, "0", 0, "none"},
	}
	want := map[string]float64{}
	for _, c := range calls {
		resp := post(t, base+c.path, strings.Replace(c.body, `{"model":"m",`, `{"model":"m","include_metrics":true,`, 1),
			map[string]string{emulator.HeaderCachedTokens: c.cached})
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		rec, err := engine.Last(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode != 200 {
			t.Fatalf("%s: %d %s", c.name, resp.StatusCode, body)
		}
		endpoint := routeOf([]byte(c.path)).label
		want[endpoint] += float64(rec.CachedTokens)
		// The metrics object: the whole prompt, no cache field.
		i := strings.LastIndex(string(body), `"metrics":{`)
		if i < 0 {
			t.Fatalf("%s: no metrics in %s", c.name, body)
		}
		var m map[string]any
		if err := json.NewDecoder(strings.NewReader(string(body[i+len(`"metrics":`):]))).Decode(&m); err != nil {
			t.Fatal(err)
		}
		if m["prompt_tokens"] != float64(rec.PromptTokens) {
			t.Errorf("%s: metrics prompt_tokens %v, want the whole prompt, %d", c.name, m["prompt_tokens"], rec.PromptTokens)
		}
		for k := range m {
			if strings.Contains(k, "cache") || strings.Contains(k, "prefill") {
				t.Errorf("%s: the metrics object carries %s", c.name, k)
			}
		}
	}
	p.telemetry.Flush()
	lines := log.lines()
	if len(lines) != len(calls) {
		t.Fatalf("%d access-log lines for %d requests", len(lines), len(calls))
	}
	classes := map[[2]string]uint64{}
	for i, l := range lines {
		var e struct {
			Path    string   `json:"path"`
			Stream  bool     `json:"stream"`
			Cached  *int     `json:"cached_tokens"`
			Cache   string   `json:"cache"`
			Prefill *float64 `json:"prefill_tokens_per_second"`
			Prompt  int      `json:"prompt_tokens"`
		}
		if err := json.Unmarshal([]byte(l), &e); err != nil {
			t.Fatal(err)
		}
		c := calls[i]
		if e.Cached == nil || *e.Cached != c.wantCached {
			t.Errorf("%s: cached_tokens %v, want %d", c.name, e.Cached, c.wantCached)
		}
		if e.Cache != c.class {
			t.Errorf("%s: cache %q, want %q", c.name, e.Cache, c.class)
		}
		// Prefill speed needs a first token: streams only.
		if (e.Prefill != nil) != e.Stream || e.Prefill != nil && *e.Prefill <= 0 {
			t.Errorf("%s: prefill_tokens_per_second %v", c.name, e.Prefill)
		}
		if e.Stream {
			classes[[2]string{routeOf([]byte(c.path)).label, c.class}]++
		}
	}
	for endpoint, n := range want {
		if got := counterValue(t, p, "timing_sidecar_cached_prompt_tokens_total", map[string]string{"endpoint": endpoint, "model": "m"}); got != n {
			t.Errorf("cached_prompt_tokens_total{%s} = %v, want %v", endpoint, got, n)
		}
	}
	for k, n := range classes {
		l := map[string]string{"endpoint": k[0], "model": "m", "cache": k[1]}
		if got, _ := histogramCount(t, p, "timing_sidecar_time_to_first_token_seconds", l); got != n {
			t.Errorf("TTFT count%v = %d, want %d", l, got, n)
		}
		if got, _ := histogramCount(t, p, "timing_sidecar_prefill_tokens_per_second", map[string]string{"endpoint": k[0], "model": "m"}); got == 0 {
			t.Errorf("no prefill speed observed for %s", k[0])
		}
	}
}

// TestLlamaCppCacheTimings: llama.cpp's server reports its cached prompt
// tokens as timings.cache_n beside the usage.
func TestLlamaCppCacheTimings(t *testing.T) {
	engine := newFakeEngine(t)
	var log syncBuffer
	p, base := startSidecar(t, engine.URL(), nil, &log)
	body := `{"id":"chatcmpl-1","object":"chat.completion","model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}],` +
		`"usage":{"prompt_tokens":300,"completion_tokens":2,"total_tokens":302},"timings":{"cache_n":256,"prompt_n":44,"prompt_ms":12.5,"predicted_n":2,"predicted_ms":8.1}}`
	resp := post(t, base+"/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"x"}]}`, map[string]string{"X-Fake-Body": body})
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	<-engine.next(t).Finished
	p.telemetry.Flush()
	lines := log.lines()
	if len(lines) != 1 || !strings.Contains(lines[0], `"cached_tokens":256,"cache":"partial"`) {
		t.Errorf("access log: %v", lines)
	}
	if got := counterValue(t, p, "timing_sidecar_cached_prompt_tokens_total", map[string]string{"endpoint": "chat_completions", "model": "m"}); got != 256 {
		t.Errorf("cached_prompt_tokens_total = %v, want 256", got)
	}
}
