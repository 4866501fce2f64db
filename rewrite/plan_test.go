package rewrite

import (
	"strings"
	"testing"
)

func TestPlan(t *testing.T) {
	// The defaults but the mode, changed as a case says.
	configured := func(mode Mode, change ...func(*Policy)) Policy {
		p := Policy{Mode: mode, InjectUsage: true}
		for _, ch := range change {
			ch(&p)
		}
		return p
	}
	for _, tt := range []struct {
		name string
		pol  Policy
		api  API
		body string
		want Plan
	}{
		{"off: nothing changes", configured(ModeOff), ChatCompletions, `{"stream":true,"include_metrics":"yes"}`, Plan{}},
		{"opt-in, not asked: usage hidden for exact counts", configured(ModeOptIn), ChatCompletions, `{"stream":true}`,
			Plan{HideUsage: true, AskUsage: true}},
		{"opt-in, asked, no usage: on the finishing event", configured(ModeOptIn), ChatCompletions, `{"stream":true,"include_metrics":true}`,
			Plan{WantMetrics: true, MetricsOnFinish: true, CutIncludeMetrics: true, AskUsage: true}},
		{"asked with usage: vLLM's shape", configured(ModeOptIn), ChatCompletions, `{"stream":true,"include_metrics":true,"stream_options":{"include_usage":true}}`,
			Plan{WantMetrics: true, CutIncludeMetrics: true}},
		{"always, non-streaming", configured(ModeAlways), Completions, `{"prompt":"x"}`, Plan{WantMetrics: true}},
		{"several choices", configured(ModeAlways), ChatCompletions, `{"n":2}`, Plan{WantMetrics: true, Multiple: true}},
		{"running usage with usage off: not asked", configured(ModeAlways), ChatCompletions,
			`{"stream":true,"stream_options":{"continuous_usage_stats":true,"include_usage":false}}`, Plan{WantMetrics: true, MetricsOnFinish: true}},
		{"include_metrics the engine refuses", configured(ModeOptIn), ChatCompletions, `{"include_metrics":2}`, Plan{Refuse: true}},
		{"forwarded include_metrics", configured(ModeOptIn, func(p *Policy) { p.ForwardIncludeMetrics = true }), ChatCompletions,
			`{"include_metrics":true}`, Plan{WantMetrics: true}},
		{"upgrade", configured(ModeOptIn, func(p *Policy) { p.UpgradeNonStreaming = true }), ChatCompletions,
			`{"model":"m","include_metrics":true}`, Plan{WantMetrics: true, Upgrade: true, CutIncludeMetrics: true}},
		{"no upgrade for Messages; usage is its own", configured(ModeOptIn, func(p *Policy) { p.UpgradeNonStreaming = true }), Messages,
			`{"model":"m","stream":true,"include_metrics":true}`, Plan{WantMetrics: true, CutIncludeMetrics: true}},
		{"not understood: forwarded as it came", configured(ModeAlways), ChatCompletions, `{"stream":"maybe"}`, Plan{}},
		// vLLM's --enable-per-request-metrics, point by point.
		{"vllm, non-streaming: in the body", configured(ModeVLLM), ChatCompletions, `{"model":"m"}`, Plan{WantMetrics: true}},
		{"vllm, stream with usage: on the usage event", configured(ModeVLLM), Completions,
			`{"stream":true,"stream_options":{"include_usage":true}}`, Plan{WantMetrics: true}},
		{"vllm, stream without usage: none, counts kept", configured(ModeVLLM), ChatCompletions, `{"stream":true}`,
			Plan{HideUsage: true, AskUsage: true}},
		{"vllm, stream without usage, forced: the usage event, with them", configured(ModeVLLM, func(p *Policy) { p.ForceUsage = true }), ChatCompletions,
			`{"stream":true,"stream_options":{"include_usage":false}}`, Plan{WantMetrics: true, AskUsage: true}},
		{"vllm, several choices in a body: null", configured(ModeVLLM), ChatCompletions, `{"n":3}`, Plan{WantMetrics: true, Multiple: true}},
		{"vllm, several prompts streamed: none", configured(ModeVLLM), Completions,
			`{"prompt":["a","b"],"stream":true,"stream_options":{"include_usage":true}}`, Plan{Multiple: true}},
		{"vllm, Responses stream: on response.completed", configured(ModeVLLM), Responses, `{"input":"x","stream":true}`, Plan{WantMetrics: true}},
		{"vllm, Messages: none, as vLLM's", configured(ModeVLLM), Messages, `{"messages":[],"stream":true}`, Plan{}},
		{"vllm, the sidecar's include_metrics still counts", configured(ModeVLLM), ChatCompletions, `{"stream":true,"include_metrics":true}`,
			Plan{WantMetrics: true, MetricsOnFinish: true, CutIncludeMetrics: true, AskUsage: true}},
		{"behind another sidecar: none unasked", configured(ModeVLLM), ChatCompletions,
			`{"model":"m"}`, Plan{}},
		{"forcing usage without metrics: the client gets it", configured(ModeOptIn, func(p *Policy) { p.ForceUsage = true }), ChatCompletions,
			`{"stream":true}`, Plan{AskUsage: true}},
		{"forcing usage on a transparent proxy: nothing changes", configured(ModeOff, func(p *Policy) { p.ForceUsage = true }), ChatCompletions,
			`{"stream":true}`, Plan{}},
		{"no usage injected when turned off", configured(ModeOptIn, func(p *Policy) { p.InjectUsage = false }), ChatCompletions,
			`{"stream":true}`, Plan{}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			req := tt.api.InspectRequest([]byte(tt.body))
			req.BehindSidecar = strings.HasPrefix(tt.name, "behind")
			if got := PlanFor(tt.pol, req); got != tt.want {
				t.Errorf("PlanFor = %+v\nwant      %+v", got, tt.want)
			}
		})
	}
}
