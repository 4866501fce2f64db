package proxy

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/timing-sidecar/timing-sidecar/e2e/emulator"
	"github.com/timing-sidecar/timing-sidecar/rewrite"
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
	prompt := strings.TrimSpace(strings.Repeat("word ", 600)) // 600 prompt tokens, as the emulator counts
	type call struct {
		name, path, body string
		cached           string // X-Emulator-Cached-Tokens
		wantCached       int    // what the engine serves of it: all but the last token at most
		class            string
		written          string // what the engine wrote to its cache, as the log says it
		prefill          bool   // a prefill speed: a stream with timing.MinPrefillTokens computed
	}
	chat := `{"model":"m","stream":%s,"messages":[{"role":"user","content":"` + prompt + `"}]}`
	calls := []call{
		{"chat stream, nothing cached", "/v1/chat/completions", fmt.Sprintf(chat, "true"), "0", 0, "none", "592", true},
		{"chat stream, half cached", "/v1/chat/completions", fmt.Sprintf(chat, "true"), "300", 300, "partial", "288", true},
		{"chat stream, 100 computed", "/v1/chat/completions", fmt.Sprintf(chat, "true"), "500", 500, "partial", "96", false},
		{"chat stream, all but the last cached", "/v1/chat/completions", fmt.Sprintf(chat, "true"), "1000", 599, "full", "0", false},
		{"chat body", "/v1/chat/completions", fmt.Sprintf(chat, "false"), "300", 300, "partial", "288", false},
		{"completions stream", "/v1/completions", `{"model":"m","stream":true,"prompt":"` + prompt + `"}`, "50", 50, "partial", "544", true},
		{"responses stream", "/v1/responses", `{"model":"m","stream":true,"input":"` + prompt + `"}`, "300", 300, "partial", "null", true},
		{"messages stream", "/v1/messages", `{"model":"m","max_tokens":3,"stream":true,"messages":[{"role":"user","content":"` + prompt + `"}]}`, "599", 599, "full", "0", false},
		{"messages body", "/v1/messages", `{"model":"m","max_tokens":3,"messages":[{"role":"user","content":"` + prompt + `"}]}`, "0", 0, "none", "0", false},
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
		checkMetricsCountWholePrompt(t, c.name, body, rec.PromptTokens)
	}
	p.telemetry.Flush()
	lines := log.lines()
	if len(lines) != len(calls) {
		t.Fatalf("%d access-log lines for %d requests", len(lines), len(calls))
	}
	classes := map[[2]string]uint64{}
	prefills := map[string]uint64{}
	for i, l := range lines {
		c := calls[i]
		if !strings.Contains(l, `"cache_write_tokens":`+c.written+`,`) {
			t.Errorf("%s: want cache_write_tokens %s in %s", c.name, c.written, l)
		}
		endpoint := routeOf([]byte(c.path)).label
		if stream := checkCacheLogLine(t, c.name, l, c.wantCached, c.class, c.prefill); stream {
			classes[[2]string{endpoint, c.class}]++
		}
		if c.prefill {
			prefills[endpoint]++
		} else if _, ok := prefills[endpoint]; !ok {
			prefills[endpoint] = 0
		}
	}
	checkCacheSeries(t, p, want, classes, prefills)
}

// checkMetricsCountWholePrompt checks the metrics object in the response
// body of the call named name: it counts the whole prompt, promptTokens,
// and carries no cache field of its own.
func checkMetricsCountWholePrompt(t *testing.T, name string, body []byte, promptTokens int) {
	t.Helper()
	i := strings.LastIndex(string(body), `"metrics":{`)
	if i < 0 {
		t.Fatalf("%s: no metrics in %s", name, body)
	}
	var m map[string]any
	if err := json.NewDecoder(strings.NewReader(string(body[i+len(`"metrics":`):]))).Decode(&m); err != nil {
		t.Fatal(err)
	}
	if m["prompt_tokens"] != float64(promptTokens) {
		t.Errorf("%s: metrics prompt_tokens %v, want the whole prompt, %d", name, m["prompt_tokens"], promptTokens)
	}
	for k := range m {
		if strings.Contains(k, "cache") || strings.Contains(k, "prefill") {
			t.Errorf("%s: the metrics object carries %s", name, k)
		}
	}
}

// checkCacheLogLine checks the access-log line l of the call named name
// for its cached tokens, cache class and prefill speed, and returns
// whether it logged a stream.
func checkCacheLogLine(t *testing.T, name, l string, wantCached int, class string, prefill bool) (stream bool) {
	t.Helper()
	var e struct {
		Path      string   `json:"path"`
		Stream    bool     `json:"stream"`
		Cached    *int     `json:"cached_tokens"`
		Cache     string   `json:"cache"`
		Prefill   *float64 `json:"prefill_tokens_per_second"`
		PrefillMs *float64 `json:"prefill_ms"`
		Prompt    int      `json:"prompt_tokens"`
	}
	if err := json.Unmarshal([]byte(l), &e); err != nil {
		t.Fatal(err)
	}
	if e.Cached == nil || *e.Cached != wantCached {
		t.Errorf("%s: cached_tokens %v, want %d", name, e.Cached, wantCached)
	}
	if e.Cache != class {
		t.Errorf("%s: cache %q, want %q", name, e.Cache, class)
	}
	// Prefill speed needs a first token, and enough tokens computed that
	// what comes before the prefill is small beside it; its interval is
	// logged with it.
	if (e.Prefill != nil) != prefill || e.Prefill != nil && *e.Prefill <= 0 || (e.PrefillMs != nil) != prefill ||
		e.Prefill != nil && math.Abs(float64(e.Prompt-wantCached)/(*e.PrefillMs/1000)-*e.Prefill) > 0.01**e.Prefill {
		t.Errorf("%s: prefill_tokens_per_second %v over prefill_ms %v, want one: %v", name, e.Prefill, e.PrefillMs, prefill)
	}
	return e.Stream
}

// checkCacheSeries checks the cached prompt tokens counted per endpoint,
// want, and the TTFT histogram's count per endpoint and cache class,
// classes, and the prefill speeds observed per endpoint: none for a full
// hit, or too few tokens computed.
func checkCacheSeries(t *testing.T, p *Proxy, want map[string]float64, classes map[[2]string]uint64, prefills map[string]uint64) {
	t.Helper()
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
	}
	for endpoint, n := range prefills {
		if got, _ := histogramCount(t, p, "timing_sidecar_prefill_tokens_per_second", map[string]string{"endpoint": endpoint, "model": "m"}); got != n {
			t.Errorf("%d prefill speeds observed for %s, want %d", got, endpoint, n)
		}
	}
}

// TestLlamaCppCacheTimings: llama.cpp's server reports its cached prompt
// tokens as timings.cache_n beside the usage.
func TestLlamaCppCacheTimings(t *testing.T) {
	engine := newFakeEngine(t)
	var log syncBuffer
	p, base := startSidecar(t, engine.URL(), func(c *Config) { c.Mode = rewrite.ModeOptIn }, &log)
	body := `{"id":"chatcmpl-1","object":"chat.completion","model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}],` +
		`"usage":{"prompt_tokens":300,"completion_tokens":2,"total_tokens":302},"timings":{"cache_n":256,"prompt_n":44,"prompt_ms":12.5,"predicted_n":2,"predicted_ms":8.1}}`
	// Passed on as it came, and spliced into (include_metrics).
	for _, req := range []string{`{"model":"m","messages":[{"role":"user","content":"x"}]}`,
		`{"model":"m","include_metrics":true,"messages":[{"role":"user","content":"x"}]}`} {
		resp := post(t, base+"/v1/chat/completions", req, map[string]string{"X-Fake-Body": body})
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		<-engine.next(t).Finished
	}
	p.telemetry.Flush()
	lines := log.lines()
	if len(lines) != 2 || !strings.Contains(lines[0], `"cached_tokens":256,"cache_write_tokens":null,"cache":"partial"`) || !strings.Contains(lines[1], `"cached_tokens":256,"cache_write_tokens":null,"cache":"partial"`) {
		t.Errorf("access log: %v", lines)
	}
	if got := counterValue(t, p, "timing_sidecar_cached_prompt_tokens_total", map[string]string{"endpoint": "chat_completions", "model": "m"}); got != 512 {
		t.Errorf("cached_prompt_tokens_total = %v, want 512", got)
	}
}

// TestEngineTimingHeaders: an engine that answers with vLLM's request
// stats headers gets them into metrics.engine under the body's names,
// with its own total in the overhead; the headers reach the client as
// the engine sent them; the body's own report, when there is one, comes
// first.
func TestEngineTimingHeaders(t *testing.T) {
	for _, tc := range []struct {
		name       string
		bodyReport bool // the engine's body carries its own metrics too
	}{{"headers alone", false}, {"headers beside the body's metrics", true}} {
		t.Run(tc.name, func(t *testing.T) {
			engine := startEmulator(t, emulator.Config{RequestStatsHeaders: true, PerRequestMetrics: tc.bodyReport,
				Timing: emulator.Timing{HeaderDelay: 10 * time.Millisecond, TTFT: 30 * time.Millisecond, ITL: 10 * time.Millisecond, OutputTokens: 4}})
			var log syncBuffer
			p, base := startSidecar(t, engine.URL(), func(c *Config) { c.ForwardIncludeMetrics = tc.bodyReport }, &log)
			body := `{"model":"m","include_metrics":true,"messages":[{"role":"user","content":"a b c d e f"}]}`
			resp := post(t, base+"/v1/chat/completions", body, map[string]string{emulator.HeaderCachedTokens: "4"})
			doc := engineReportOf(t, resp)
			for _, h := range []string{"x-vllm-total-time", "x-vllm-queue-time", "x-vllm-prefill-time", "x-vllm-decode-time",
				"x-vllm-inference-time", "x-vllm-time-per-output-token", "x-vllm-prompt-tokens", "x-vllm-completion-tokens", "x-vllm-cached-tokens"} {
				if resp.Header.Get(h) == "" {
					t.Errorf("%s did not reach the client", h)
				}
			}
			header := func(name string) float64 {
				v, err := strconv.ParseFloat(resp.Header.Get(name), 64)
				if err != nil {
					t.Fatalf("%s: %v", name, err)
				}
				return v
			}
			e := doc.Metrics.Engine
			if e["source"] != "vllm" {
				t.Errorf("engine.source %v", e["source"])
			}
			// The emulator's body and headers give the same marks, the
			// body to three decimals and the headers to two.
			for field, h := range map[string]string{"queue_time_ms": "x-vllm-queue-time", "time_to_first_token_ms": "x-vllm-prefill-time",
				"generation_time_ms": "x-vllm-decode-time", "mean_itl_ms": "x-vllm-time-per-output-token",
				"inference_time_ms": "x-vllm-inference-time", "total_ms": "x-vllm-total-time"} {
				if v, ok := e[field].(float64); !ok || math.Abs(v-header(h)) > 0.006 {
					t.Errorf("engine.%s = %v (present %v), %s says %v", field, v, ok, h, header(h))
				}
			}
			if doc.Metrics.Overhead == nil || math.Abs(*doc.Metrics.Overhead-(doc.Metrics.E2E-header("x-vllm-total-time"))) > 0.002 {
				t.Errorf("overhead_ms %v, want e2e %v − total %v", doc.Metrics.Overhead, doc.Metrics.E2E, header("x-vllm-total-time"))
			}
			// The cached tokens come from the header: the usage has none.
			p.telemetry.Flush()
			if l := log.lines(); len(l) != 1 || !strings.Contains(l[0], `"cached_tokens":4,`) {
				t.Errorf("access log %v", l)
			}
		})
	}
}

// TestTGITimingHeaders: an engine that reports its timing in TGI's
// headers gets it into metrics.engine under the body's names (queue,
// inference, total), its total in the overhead; the same names without
// TGI's x-compute-type are another server's, and left alone.
func TestTGITimingHeaders(t *testing.T) {
	engine := startEmulator(t, emulator.Config{TGIHeaders: true,
		Timing: emulator.Timing{HeaderDelay: 20 * time.Millisecond, TTFT: 30 * time.Millisecond, ITL: 10 * time.Millisecond, OutputTokens: 4}})
	base := startProxy(t, engine.URL(), nil)
	resp := post(t, base+"/v1/chat/completions", `{"model":"m","include_metrics":true,"messages":[{"role":"user","content":"a b"}]}`, nil)
	doc := engineReportOf(t, resp)
	e := doc.Metrics.Engine
	for field, h := range map[string]string{"queue_time_ms": "x-queue-time", "inference_time_ms": "x-inference-time", "total_ms": "x-total-time"} {
		want, _ := strconv.ParseFloat(resp.Header.Get(h), 64)
		if v, ok := e[field].(float64); !ok || v != want {
			t.Errorf("engine.%s = %v, %s says %v", field, e[field], h, want)
		}
	}
	if e["source"] != "tgi" || e["time_to_first_token_ms"] != nil || e["mean_itl_ms"] != nil {
		t.Errorf("engine %v", e)
	}
	if q := e["queue_time_ms"]; q == nil || q.(float64) < 20 {
		t.Errorf("engine.queue_time_ms %v under the 20 ms the engine waited", q)
	}
	if doc.Metrics.Overhead == nil {
		t.Error("no overhead_ms beside the engine's total")
	}

	// Without x-compute-type the same names are not TGI's.
	var h rewrite.TGIHeaders
	h.Header([]byte("x-queue-time"), []byte("12"))
	h.Header([]byte("X-Total-Time"), []byte("40"))
	if _, ok := h.Timing(); ok {
		t.Error("timing headers without x-compute-type read as TGI's")
	}
	h.Header([]byte("X-Compute-Type"), []byte("gpu"))
	if e, ok := h.Timing(); !ok || e.QueueTime.Value != 12 || e.Total.Value != 40 || e.Source != "tgi" {
		t.Errorf("TGI's headers read as %+v", e)
	}
}

// engineReport is what a non-streaming answer's metrics say of the
// engine's own report.
type engineReport struct {
	Metrics struct {
		E2E      float64        `json:"e2e_latency_ms"`
		Overhead *float64       `json:"overhead_ms"`
		Engine   map[string]any `json:"engine"`
	} `json:"metrics"`
}

// engineReportOf reads a 200 non-streaming answer's engine report.
func engineReportOf(t *testing.T, resp *http.Response) engineReport {
	t.Helper()
	got, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var doc engineReport
	if err := json.Unmarshal(got, &doc); err != nil || resp.StatusCode != 200 {
		t.Fatalf("%d %s: %v", resp.StatusCode, got, err)
	}
	return doc
}

// TestPrefillSpeedBesideTheEngines: beside an engine that reports its own
// prefill (vLLM's per-request metrics) and spends time before its clock
// starts (the template, the tokenizer), a new prompt and a partial hit
// with enough tokens computed get a speed: never above the engine's, as
// the sidecar's interval holds the engine's prefill, and within a factor
// of two of it, as the prefill is long beside the time before it; a full
// hit and a few tokens computed get none, and are not observed; the log
// says both speeds and both intervals.
func TestPrefillSpeedBesideTheEngines(t *testing.T) {
	engine := startEmulator(t, emulator.Config{PromptTokensDetails: true, PerRequestMetrics: true,
		Timing: emulator.Timing{ITL: time.Millisecond, OutputTokens: 2}})
	var log syncBuffer
	p, base := startSidecar(t, engine.URL(), nil, &log)
	type call struct {
		name           string
		prompt, cached int
		prefill        time.Duration // the whole prompt's, at the engine's pace
		preprocess     time.Duration
		measured       bool
	}
	// Paced so that the prefill of the tokens computed (the emulator's TTFT
	// shrinks to their share) lasts 100 ms or more where measured, beside
	// 10 ms before the engine's clock starts.
	calls := []call{
		{"a new prompt", 400, 0, 100 * time.Millisecond, 10 * time.Millisecond, true},
		{"a partial hit, 300 computed", 1200, 900, 400 * time.Millisecond, 10 * time.Millisecond, true},
		{"38 computed after a cached prefix", 463, 425, 100 * time.Millisecond, 10 * time.Millisecond, false},
		{"a full hit", 461, 460, 100 * time.Millisecond, 10 * time.Millisecond, false},
	}
	for _, c := range calls {
		prompt := strings.TrimSpace(strings.Repeat("word ", c.prompt))
		resp := post(t, base+"/v1/chat/completions", `{"model":"m","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"`+prompt+`"}]}`,
			map[string]string{emulator.HeaderCachedTokens: strconv.Itoa(c.cached), emulator.HeaderTTFT: c.prefill.String(), emulator.HeaderPreprocess: c.preprocess.String()})
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	p.telemetry.Flush()
	lines := log.lines()
	if len(lines) != len(calls) {
		t.Fatalf("%d access-log lines for %d requests", len(lines), len(calls))
	}
	measured := uint64(0)
	for i, l := range lines {
		c := calls[i]
		var e struct {
			Prompt, Cached     int
			Prefill, PrefillMs *float64
			Engine, EngineMs   *float64
		}
		var raw map[string]json.RawMessage
		if err := json.Unmarshal([]byte(l), &raw); err != nil {
			t.Fatal(err)
		}
		for k, dst := range map[string]any{"prompt_tokens": &e.Prompt, "cached_tokens": &e.Cached, "prefill_tokens_per_second": &e.Prefill,
			"prefill_ms": &e.PrefillMs, "engine_prefill_tokens_per_second": &e.Engine, "engine_prefill_ms": &e.EngineMs} {
			json.Unmarshal(raw[k], dst)
		}
		computed := float64(e.Prompt - e.Cached)
		if e.Engine == nil || e.EngineMs == nil || math.Abs(computed/(*e.EngineMs/1000)-*e.Engine) > 0.01**e.Engine {
			t.Errorf("%s: the engine's speed %v over %v ms, want its prefill's", c.name, e.Engine, e.EngineMs)
			continue
		}
		if (e.Prefill != nil) != c.measured || (e.PrefillMs != nil) != c.measured {
			t.Errorf("%s: prefill_tokens_per_second %v over %v ms, want one: %v", c.name, e.Prefill, e.PrefillMs, c.measured)
			continue
		}
		if !c.measured {
			continue
		}
		measured++
		// The sidecar's interval holds the engine's prefill and the time
		// before the engine's clock: never a higher speed. The prefill is
		// ten times that time: within a factor of two.
		if *e.PrefillMs < *e.EngineMs+ms(c.preprocess)-0.01 || *e.Prefill < *e.Engine/2 {
			t.Errorf("%s: %.0f tokens/s over %.1f ms, the engine's %.0f over %.1f ms: want within a factor of two below",
				c.name, *e.Prefill, *e.PrefillMs, *e.Engine, *e.EngineMs)
		}
		t.Logf("%s: %.0f tokens/s over %.1f ms, the engine's %.0f over %.1f ms", c.name, *e.Prefill, *e.PrefillMs, *e.Engine, *e.EngineMs)
	}
	if got, _ := histogramCount(t, p, "timing_sidecar_prefill_tokens_per_second", map[string]string{"endpoint": "chat_completions", "model": "m"}); got != measured {
		t.Errorf("%d prefill speeds observed, want %d: no full hit, nor too few tokens computed", got, measured)
	}
}
