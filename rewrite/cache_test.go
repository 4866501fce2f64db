package rewrite

import (
	"testing"

	"github.com/timing-sidecar/timing-sidecar/timing"
)

// TestCachedPromptTokensOfEveryShape reads the cached prompt tokens where
// each API and engine reports them, and the prompt's whole count beside
// them, from a stream's events and from bodies.
func TestCachedPromptTokensOfEveryShape(t *testing.T) {
	c := func(n int64) timing.Count { return timing.Count{Value: n, Set: true} }
	for _, tc := range []struct {
		name           string
		usage          func() timing.Usage
		prompt, cached timing.Count
	}{
		{"vLLM chat usage event", func() timing.Usage {
			return ChatCompletions.ClassifyEvent([]byte(`data: {"id":"x","choices":[],"usage":{"prompt_tokens":100,"completion_tokens":5,"prompt_tokens_details":{"cached_tokens":64}}}` + "\n\n")).Usage
		}, c(100), c(64)},
		{"vLLM without --enable-prompt-tokens-details", func() timing.Usage {
			return ChatCompletions.ClassifyEvent([]byte(`data: {"id":"x","choices":[],"usage":{"prompt_tokens":100,"completion_tokens":5,"prompt_tokens_details":null}}` + "\n\n")).Usage
		}, c(100), timing.Count{}},
		{"chat body", func() timing.Usage {
			return BodyUsage([]byte(`{"choices":[{"message":{"content":"hi"}}],"usage":{"prompt_tokens":40,"prompt_tokens_details":{"cached_tokens":32},"completion_tokens":2}}`))
		}, c(40), c(32)},
		{"llama.cpp timings on the finishing event", func() timing.Usage {
			return ChatCompletions.ClassifyEvent([]byte(`data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}],"usage":{"prompt_tokens":30,"completion_tokens":3},"timings":{"cache_n":20,"prompt_n":10}}` + "\n\n")).Usage
		}, c(30), c(20)},
		{"llama.cpp body", func() timing.Usage {
			return BodyUsage([]byte(`{"choices":[],"usage":{"prompt_tokens":30,"completion_tokens":3},"timings":{"cache_n":0,"prompt_n":30}}`))
		}, c(30), c(0)},
		{"usage wins over timings", func() timing.Usage {
			return BodyUsage([]byte(`{"usage":{"prompt_tokens":30,"prompt_tokens_details":{"cached_tokens":16}},"timings":{"cache_n":20}}`))
		}, c(30), c(16)},
		{"Responses completed", func() timing.Usage {
			return Responses.ClassifyEvent([]byte(`data: {"type":"response.completed","response":{"id":"r","usage":{"input_tokens":50,"input_tokens_details":{"cached_tokens":48},"output_tokens":7}}}` + "\n\n")).Usage
		}, c(50), c(48)},
		{"Anthropic: input_tokens apart from the cache's", func() timing.Usage {
			start := Messages.ClassifyEvent([]byte(`data: {"type":"message_start","message":{"id":"m","usage":{"input_tokens":10,"cache_read_input_tokens":80,"cache_creation_input_tokens":6,"output_tokens":1}}}` + "\n\n")).Usage
			// The final usage repeats input_tokens without the cache's keys.
			delta := Messages.ClassifyEvent([]byte(`data: {"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"input_tokens":10,"output_tokens":9}}` + "\n\n")).Usage
			return start.Merge(delta)
		}, c(96), c(80)},
		{"Anthropic without cache keys: input_tokens is the prompt", func() timing.Usage {
			return BodyUsage([]byte(`{"type":"message","usage":{"input_tokens":12,"output_tokens":3}}`))
		}, c(12), timing.Count{}},
		{"a gateway's chat usage with Anthropic's keys beside prompt_tokens", func() timing.Usage {
			return BodyUsage([]byte(`{"usage":{"prompt_tokens":100,"prompt_tokens_details":{"cached_tokens":64},"cache_read_input_tokens":64,"cache_creation_input_tokens":0}}`))
		}, c(100), c(64)},
		{"Anthropic's final usage with the cache's keys alone", func() timing.Usage {
			start := Messages.ClassifyEvent([]byte(`data: {"type":"message_start","message":{"id":"m","usage":{"input_tokens":10,"cache_read_input_tokens":80,"output_tokens":1}}}` + "\n\n")).Usage
			delta := Messages.ClassifyEvent([]byte(`data: {"type":"message_delta","usage":{"cache_read_input_tokens":80,"output_tokens":9}}` + "\n\n")).Usage
			return start.Merge(delta)
		}, c(90), c(80)},
		{"rerank's total, all input", func() timing.Usage {
			return BodyUsage([]byte(`{"id":"rerank-1","model":"m","usage":{"total_tokens":12},"results":[]}`))
		}, c(12), timing.Count{}},
		{"a total beside the prompt is not the prompt", func() timing.Usage {
			return BodyUsage([]byte(`{"usage":{"prompt_tokens":5,"completion_tokens":7,"total_tokens":12}}`))
		}, c(5), timing.Count{}},
		{"a count that is not one", func() timing.Usage {
			return BodyUsage([]byte(`{"usage":{"prompt_tokens":30,"prompt_tokens_details":{"cached_tokens":-1}},"timings":{"cache_n":"20"}}`))
		}, c(30), timing.Count{}},
	} {
		u := tc.usage()
		if got := u.Prompt(); got != tc.prompt {
			t.Errorf("%s: prompt %+v, want %+v", tc.name, got, tc.prompt)
		}
		if u.CachedTokens != tc.cached {
			t.Errorf("%s: cached %+v, want %+v", tc.name, u.CachedTokens, tc.cached)
		}
	}
}

// TestCacheWriteTokens reads the prompt tokens written to the cache where
// each shape reports them, inside the prompt or apart from it.
func TestCacheWriteTokens(t *testing.T) {
	c := func(n int64) timing.Count { return timing.Count{Value: n, Set: true} }
	for _, tc := range []struct {
		name                    string
		usage                   timing.Usage
		prompt, cached, written timing.Count
	}{
		{"vLLM 0.27's details", BodyUsage([]byte(`{"usage":{"prompt_tokens":9520,"completion_tokens":3,"prompt_tokens_details":{"cached_tokens":0,"created_cache_tokens":9504}}}`)),
			c(9520), c(0), c(9504)},
		{"vLLM's written count alone", ChatCompletions.ClassifyEvent([]byte(`data: {"choices":[],"usage":{"prompt_tokens":40,"prompt_tokens_details":{"created_cache_tokens":32}}}` + "\n\n")).Usage,
			c(40), timing.Count{}, c(32)},
		{"Responses' cache_write_tokens", Responses.ClassifyEvent([]byte(`data: {"type":"response.completed","response":{"usage":{"input_tokens":50,"input_tokens_details":{"cached_tokens":16,"cache_write_tokens":32},"output_tokens":7}}}` + "\n\n")).Usage,
			c(50), c(16), c(32)},
		{"Anthropic's, apart", BodyUsage([]byte(`{"usage":{"input_tokens":10,"cache_read_input_tokens":80,"cache_creation_input_tokens":6}}`)),
			c(96), c(80), c(6)},
		{"none reported", BodyUsage([]byte(`{"usage":{"prompt_tokens":40,"prompt_tokens_details":{"cached_tokens":32}}}`)),
			c(40), c(32), timing.Count{}},
	} {
		if u := tc.usage; u.Prompt() != tc.prompt || u.CachedTokens != tc.cached || u.CacheWriteTokens != tc.written {
			t.Errorf("%s: prompt %+v, cached %+v, written %+v; want %+v, %+v, %+v", tc.name, u.Prompt(), u.CachedTokens, u.CacheWriteTokens, tc.prompt, tc.cached, tc.written)
		}
	}
}

// TestEngineHeader reads vLLM's request stats headers onto the body's
// names, and nothing else.
func TestEngineHeader(t *testing.T) {
	var e timing.EngineTiming
	var cached timing.Count
	for _, h := range [][2]string{
		{"x-vllm-total-time", "1000.00"},
		{"X-VLLM-Queue-Time", "50.00"}, // any case
		{"x-vllm-prefill-time", "120.25"},
		{"x-vllm-decode-time", "800.00"},
		{"x-vllm-inference-time", "920.25"},
		{"x-vllm-time-per-output-token", "8.08"},
		{"x-vllm-prompt-tokens", "300"},
		{"x-vllm-completion-tokens", "100"},
		{"x-vllm-cached-tokens", "256"},
		{"x-vllm-unknown", "1"},
		{"x-other-total-time", "7"},
	} {
		EngineHeader(&e, &cached, []byte(h[0]), []byte(h[1]))
	}
	n := func(v float64) timing.Number { return timing.Number{Value: v, Set: true} }
	want := timing.EngineTiming{Reported: true, Source: "vllm", QueueTime: n(50), TimeToFirstToken: n(120.25),
		GenerationTime: n(800), MeanITL: n(8.08), InferenceTime: n(920.25), Total: n(1000)}
	if e != want {
		t.Errorf("got  %+v\nwant %+v", e, want)
	}
	if cached != (timing.Count{Value: 256, Set: true}) {
		t.Errorf("cached %+v", cached)
	}
	// Values that are not figures stay unknown.
	for _, v := range []string{"", "-1", "NaN", "Inf", "1e999", "fast", "12ms"} {
		var e timing.EngineTiming
		var c timing.Count
		EngineHeader(&e, &c, []byte("x-vllm-queue-time"), []byte(v))
		EngineHeader(&e, &c, []byte("x-vllm-cached-tokens"), []byte(v))
		if e.Reported || e.QueueTime.Set || c.Set {
			t.Errorf("%q read as %+v, %+v", v, e, c)
		}
	}
}
