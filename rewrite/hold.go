package rewrite

// FinishHold decides, event by event, which event of a measured stream
// carries the metrics, which the client does not get, and which waits: a
// pure state machine the proxy's relay asks, with a table test of its own
// (TestFinishHold).
//
// One event at most is held back, and only for a short, bounded time
// (--max-event-hold, the proxy's business):
//   - an event that finishes the choices, in a stream whose client asked
//     for metrics but not for usage (Plan.MetricsOnFinish): it takes the
//     metrics once the usage the sidecar asked for has come, and the
//     usage event is removed;
//   - an event that finishes the choices and carries the usage
//     (llama.cpp's last event, for one): it may or may not be the last to
//     carry usage, which only the next event shows.
type FinishHold struct {
	Plan Plan
	// held: an event is held back; forFinish: it waits for the usage
	// (MetricsOnFinish), rather than carrying usage itself.
	held, forFinish bool
	// sent: an event carried the metrics; no other will.
	sent bool
}

// HoldFacts is what the hold needs to know of an event.
type HoldFacts struct {
	Kind                                 EventKind
	UsageOnChoices, CarriesChoices, Ends bool
	// KeepAlive: a comment or a ping, which may pass a held finishing
	// event (read only while one waits for the usage: see WaitsForUsage).
	KeepAlive bool
}

// HoldFactsOf is what the hold needs to know of a classified event;
// whether it is a keep-alive is read only when it matters (WaitsForUsage).
func HoldFactsOf(ev Event) HoldFacts {
	return HoldFacts{Kind: ev.Kind, UsageOnChoices: ev.UsageOnChoices,
		CarriesChoices: ev.carriesChoices, Ends: ev.finishes}
}

// HoldAction is what becomes of an event.
type HoldAction uint8

const (
	ActPass   HoldAction = iota // goes out as it came
	ActSplice                   // goes out with the metrics
	ActDrop                     // the client does not get it: usage it did not ask for
	ActHold                     // held back until the next event, the end or the bound
)

// WaitsForUsage tells whether a finishing event waits for the usage, so
// that whether the next event is a keep-alive matters.
func (h *FinishHold) WaitsForUsage() bool { return h.held && h.forFinish }

// ReleaseBefore tells whether the held event goes out ahead of e, which
// shows whether it takes the metrics: the engine's order is kept. Only a
// keep-alive passes a finishing event that waits for the usage (it carries
// nothing a client reads in order), and the hold goes on.
func (h *FinishHold) ReleaseBefore(e HoldFacts) (release, withMetrics bool) {
	if !h.held || (h.forFinish && e.KeepAlive) {
		return false, false
	}
	return true, h.Release() && h.takesMetrics(e)
}

// takesMetrics tells, from the event after it, whether the held event is
// the one to carry the metrics.
func (h *FinishHold) takesMetrics(next HoldFacts) bool {
	switch {
	case next.Kind == EventUsage:
		// A usage event the client gets takes them itself; one it does
		// not get leaves them to the held event.
		return h.Plan.MetricsOnFinish
	case h.forFinish:
		// Another choice's event means this was not the last to finish.
		// Anything else (an error, an event the sidecar does not know)
		// goes out after the held event, and nothing after it may carry
		// the metrics: they go now, as measured so far.
		return !next.CarriesChoices
	default:
		// Held for its usage: the last event with usage takes them.
		return !next.UsageOnChoices
	}
}

// Release lets the held event go (at the end of the stream, at the
// bound, or before the next event) and tells whether it may still carry
// the metrics.
func (h *FinishHold) Release() bool {
	h.held = false
	return !h.sent
}

// Act is what becomes of e, once any held event was released before it.
func (h *FinishHold) Act(e HoldFacts) HoldAction {
	switch {
	case e.Kind == EventUsage:
		switch {
		case h.Plan.MetricsOnFinish:
			return ActDrop // the finishing event held before it takes the metrics
		case h.Plan.WantMetrics && !h.sent:
			// The first usage event takes the metrics; an engine that
			// sends more gets them passed as sent, so no stream carries
			// two metrics objects.
			return ActSplice
		case h.Plan.HideUsage:
			return ActDrop
		}
	case e.UsageOnChoices:
		if h.Plan.WantMetrics && !h.sent {
			h.held, h.forFinish = true, false
			return ActHold
		}
	case h.Plan.MetricsOnFinish && !h.sent && e.Ends:
		// The usage the sidecar asked for follows this event.
		h.held, h.forFinish = true, true
		return ActHold
	}
	return ActPass
}

// Carried records that an event went out with the metrics.
func (h *FinishHold) Carried() { h.sent = true }
