package rewrite

// Mode says which requests get a metrics object (--per-request-metrics).
type Mode string

const (
	// ModeOff makes the sidecar a transparent proxy.
	ModeOff Mode = "off"
	// ModeVLLM adds metrics where vLLM's --enable-per-request-metrics
	// puts its own, with no request field: every Chat Completions,
	// Completions and Responses answer; in a Chat Completions or
	// Completions stream, only on the usage event, so only where the
	// client gets one (include_usage, or Policy.ForceUsage); null in a
	// body with several choices, none in such a stream; not Anthropic's
	// Messages. A request with "include_metrics": true gets them as in
	// ModeOptIn as well.
	ModeVLLM Mode = "vllm"
	// ModeOptIn adds metrics for requests with "include_metrics": true,
	// the sidecar's own field.
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
	// ForceUsage gives every Chat Completions and Completions stream's
	// client the usage event, asked or not, as vLLM's
	// --enable-force-include-usage does (which also puts running usage
	// on every event; the sidecar does not ask for that, a field only
	// vLLM and SGLang know).
	ForceUsage bool
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
	forced, noUsage := streamUsage(pol, req)
	p := Plan{
		Refuse:      req.InvalidIncludeMetrics,
		Multiple:    req.MultipleChoices,
		WantMetrics: req.Understood && (req.IncludeMetrics || byMode(pol.Mode, req, noUsage)),
		Upgrade:     pol.UpgradeNonStreaming && req.Upgradable,
		// With --forward-include-metrics the engine gets the field and
		// reports its own timing.
		CutIncludeMetrics: req.HasIncludeMetrics && !pol.ForwardIncludeMetrics,
	}
	p.planUsage(pol, req, forced, noUsage)
	return p
}

// streamUsage says whether a stream's usage event is forced on it
// (ForceUsage), and whether its client gets none: only OpenAI's APIs have
// such streams.
func streamUsage(pol Policy, req Request) (forced, noUsage bool) {
	forced = pol.ForceUsage && req.Understood && req.Stream && !req.IncludeUsage
	return forced, req.Stream && !req.IncludeUsage && !forced
}

// planUsage decides where the metrics ride in a stream whose client did
// not ask for usage, and whether the engine is asked for the usage. Not
// with running usage asked for and usage off, unless forced: asking would
// put usage on every event (as vLLM's forcing does).
func (p *Plan) planUsage(pol Policy, req Request, forced, noUsage bool) {
	p.MetricsOnFinish = p.WantMetrics && noUsage
	p.HideUsage = !p.WantMetrics && pol.InjectUsage && req.Understood && noUsage && !req.ContinuousUsage
	p.AskUsage = forced || (p.WantMetrics || p.HideUsage) && noUsage && !req.ContinuousUsage
}

// byMode tells whether the mode gives req's response metrics without the
// request asking; noUsage says the client of a stream gets no usage event.
func byMode(mode Mode, req Request, noUsage bool) bool {
	if req.BehindSidecar {
		return false // the outer sidecar's mode decides
	}
	switch mode {
	case ModeAlways:
		return true
	case ModeVLLM:
		// vLLM's object rides on a stream's usage event, and a stream of
		// several choices gets none (its null is left out of events).
		return !req.NoEngineMetrics && !(req.Stream && (noUsage || req.MultipleChoices))
	}
	return false
}
