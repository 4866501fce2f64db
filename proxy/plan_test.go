package proxy

import (
	"testing"
)

func TestPlan(t *testing.T) {
	configured := func(mode Mode, change ...func(*Config)) Config {
		c := DefaultConfig()
		c.Mode = mode
		for _, ch := range change {
			ch(&c)
		}
		return c
	}
	for _, tt := range []struct {
		name string
		cfg  Config
		r    route
		body string
		want plan
	}{
		{"off: nothing changes", configured(ModeOff), chatRoute, `{"stream":true,"include_metrics":"yes"}`, plan{}},
		{"opt-in, not asked: usage hidden for exact counts", configured(ModeOptIn), chatRoute, `{"stream":true}`,
			plan{hideUsage: true, askUsage: true}},
		{"opt-in, asked, no usage: on the finishing event", configured(ModeOptIn), chatRoute, `{"stream":true,"include_metrics":true}`,
			plan{wantMetrics: true, metricsOnFinish: true, cutIncludeMetrics: true, askUsage: true}},
		{"asked with usage: vLLM's shape", configured(ModeOptIn), chatRoute, `{"stream":true,"include_metrics":true,"stream_options":{"include_usage":true}}`,
			plan{wantMetrics: true, cutIncludeMetrics: true}},
		{"always, non-streaming", configured(ModeAlways), completionsRoute, `{"prompt":"x"}`, plan{wantMetrics: true}},
		{"several choices", configured(ModeAlways), chatRoute, `{"n":2}`, plan{wantMetrics: true, multiple: true}},
		{"running usage with usage off: not asked", configured(ModeAlways), chatRoute,
			`{"stream":true,"stream_options":{"continuous_usage_stats":true,"include_usage":false}}`, plan{wantMetrics: true, metricsOnFinish: true}},
		{"include_metrics the engine refuses", configured(ModeOptIn), chatRoute, `{"include_metrics":2}`, plan{refuse: true}},
		{"forwarded include_metrics", configured(ModeOptIn, func(c *Config) { c.ForwardIncludeMetrics = true }), chatRoute,
			`{"include_metrics":true}`, plan{wantMetrics: true}},
		{"upgrade", configured(ModeOptIn, func(c *Config) { c.UpgradeNonStreaming = true }), chatRoute,
			`{"model":"m","include_metrics":true}`, plan{wantMetrics: true, upgrade: true, cutIncludeMetrics: true}},
		{"no upgrade for Messages; usage is its own", configured(ModeOptIn, func(c *Config) { c.UpgradeNonStreaming = true }), messagesRoute,
			`{"model":"m","stream":true,"include_metrics":true}`, plan{wantMetrics: true, cutIncludeMetrics: true}},
		{"not understood: forwarded as it came", configured(ModeAlways), chatRoute, `{"stream":"maybe"}`, plan{}},
		{"no usage injected when turned off", configured(ModeOptIn, func(c *Config) { c.InjectUsage = false }), chatRoute,
			`{"stream":true}`, plan{}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if got := planFor(&tt.cfg, tt.r.api.InspectRequest([]byte(tt.body))); got != tt.want {
				t.Errorf("planFor = %+v\nwant      %+v", got, tt.want)
			}
		})
	}
}
