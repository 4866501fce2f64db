package rewrite

// Mode says which requests get a metrics object (--per-request-metrics).
type Mode string

const (
	// ModeOff makes the sidecar a transparent proxy.
	ModeOff Mode = "off"
	// ModeOptIn adds metrics for requests with "include_metrics": true.
	ModeOptIn Mode = "opt-in"
	// ModeAlways adds metrics to every measured request.
	ModeAlways Mode = "always"
)

// Policy is what the operator decided for every request: the settings a
// plan is made from.
type Policy struct {
	Mode Mode
	// UpgradeNonStreaming sends a non-streaming request to the engine as
	// a stream, for a time to first token.
	UpgradeNonStreaming bool
	// ForwardIncludeMetrics leaves include_metrics in the request, for an
	// engine that reports its own timing.
	ForwardIncludeMetrics bool
	// InjectUsage asks the engine for the usage event, for exact token
	// counts, even when the client gets no metrics.
	InjectUsage bool
}

// Plan is what the sidecar does with one measured request: a pure
// function of the policy and what the request's API read of its body.
type Plan struct {
	// Refuse: include_metrics is neither a boolean nor null; the client
	// gets a 400 and nothing is forwarded.
	Refuse bool
	// WantMetrics: the response carries a metrics object.
	WantMetrics bool
	// MetricsOnFinish: a stream whose client did not ask for usage; the
	// metrics ride on the event that finishes the choices.
	MetricsOnFinish bool
	// HideUsage: the sidecar asks for the usage event, for exact token
	// counts, and keeps it from a client that did not ask for it.
	HideUsage bool
	// Upgrade: the non-streaming request goes to the engine as a stream.
	Upgrade bool
	// CutIncludeMetrics: include_metrics is removed before forwarding
	// (strict engines refuse unknown fields).
	CutIncludeMetrics bool
	// AskUsage: stream_options.include_usage is set for the engine.
	AskUsage bool
	// Multiple: several choices, so the metrics object is null.
	Multiple bool
}

// PlanFor is the plan for a request whose body req is, as its API read it
// (the API leaves out what it does not have: several choices, stream
// options, the upgrade).
func PlanFor(pol Policy, req Request) Plan {
	if pol.Mode == ModeOff || req.Untouched {
		return Plan{} // a transparent proxy: measured, never changed
	}
	p := Plan{
		Refuse:      req.InvalidIncludeMetrics,
		Multiple:    req.MultipleChoices,
		WantMetrics: req.Understood && (pol.Mode == ModeAlways || req.IncludeMetrics),
		Upgrade:     pol.UpgradeNonStreaming && req.Upgradable,
		// With --forward-include-metrics the engine gets the field and
		// reports its own timing.
		CutIncludeMetrics: req.HasIncludeMetrics && !pol.ForwardIncludeMetrics,
	}
	// Where the metrics ride in a stream whose client did not ask for
	// usage (only OpenAI's APIs have such streams), and whether the engine
	// is asked for the usage. Not with running usage asked for and usage
	// off: asking would put usage on every event.
	noUsage := req.Stream && !req.IncludeUsage
	p.MetricsOnFinish = p.WantMetrics && noUsage
	p.HideUsage = !p.WantMetrics && pol.InjectUsage && req.Understood && noUsage && !req.ContinuousUsage
	p.AskUsage = (p.WantMetrics || p.HideUsage) && noUsage && !req.ContinuousUsage
	return p
}
