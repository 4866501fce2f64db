package rewrite

import (
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
		{"no usage injected when turned off", configured(ModeOptIn, func(p *Policy) { p.InjectUsage = false }), ChatCompletions,
			`{"stream":true}`, Plan{}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if got := PlanFor(tt.pol, tt.api.InspectRequest([]byte(tt.body))); got != tt.want {
				t.Errorf("PlanFor = %+v\nwant      %+v", got, tt.want)
			}
		})
	}
}
