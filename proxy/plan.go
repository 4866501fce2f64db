package proxy

import "github.com/timing-sidecar/timing-sidecar/rewrite"

// plan is what the sidecar does with one measured request: a pure function
// of the configuration, the request's route and what InspectRequest read.
type plan struct {
	// refuse: include_metrics is neither a boolean nor null; the client
	// gets a 400 and nothing is forwarded.
	refuse bool
	// wantMetrics: the response carries a metrics object.
	wantMetrics bool
	// metricsOnFinish: a stream whose client did not ask for usage; the
	// metrics ride on the event that finishes the choices.
	metricsOnFinish bool
	// hideUsage: the sidecar asks for the usage event, for exact token
	// counts, and keeps it from a client that did not ask for it.
	hideUsage bool
	// upgrade: the non-streaming request goes to the engine as a stream.
	upgrade bool
	// cutIncludeMetrics: include_metrics is removed before forwarding
	// (strict engines refuse unknown fields).
	cutIncludeMetrics bool
	// askUsage: stream_options.include_usage is set for the engine.
	askUsage bool
	// multiple: several choices, so the metrics object is null.
	multiple bool
}

// planFor is the plan for a request whose body req is, as its API read it
// (the API leaves out what it does not have: several choices, stream
// options, the upgrade).
func planFor(cfg *Config, req rewrite.Request) plan {
	if cfg.Mode == ModeOff || req.Untouched {
		return plan{} // a transparent proxy: measured, never changed
	}
	p := plan{
		refuse:      req.InvalidIncludeMetrics,
		multiple:    req.MultipleChoices,
		wantMetrics: req.Understood && (cfg.Mode == ModeAlways || req.IncludeMetrics),
		upgrade:     cfg.UpgradeNonStreaming && req.Upgradable,
		// With --forward-include-metrics the engine gets the field and
		// reports its own timing.
		cutIncludeMetrics: req.HasIncludeMetrics && !cfg.ForwardIncludeMetrics,
	}
	p.planUsage(cfg, req.Stream && !req.IncludeUsage, req)
	return p
}

// planUsage decides, for a stream whose client did not ask for usage
// (noUsage: only OpenAI's APIs have such streams), where the metrics ride and whether the engine is
// asked for the usage. Not with running usage asked for and usage off:
// asking would put usage on every event.
func (p *plan) planUsage(cfg *Config, noUsage bool, req rewrite.Request) {
	p.metricsOnFinish = p.wantMetrics && noUsage
	p.hideUsage = !p.wantMetrics && cfg.InjectUsage && req.Understood && noUsage && !req.ContinuousUsage
	p.askUsage = (p.wantMetrics || p.hideUsage) && noUsage && !req.ContinuousUsage
}
