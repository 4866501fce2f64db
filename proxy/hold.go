package proxy

import "github.com/timing-sidecar/timing-sidecar/rewrite"

// finishHold decides, event by event, which event of a measured stream
// carries the metrics, which the client does not get, and which waits: a
// pure state machine the relay asks, with a table test of its own
// (TestFinishHold).
//
// One event at most is held back, and only for a short, bounded time
// (--max-event-hold, the relay's business):
//   - an event that finishes the choices, in a stream whose client asked
//     for metrics but not for usage (plan.metricsOnFinish): it takes the
//     metrics once the usage the sidecar asked for has come, and the
//     usage event is removed;
//   - an event that finishes the choices and carries the usage
//     (llama.cpp's last event, for one): it may or may not be the last to
//     carry usage, which only the next event shows.
type finishHold struct {
	plan plan
	// held: an event is held back; forFinish: it waits for the usage
	// (metricsOnFinish), rather than carrying usage itself.
	held, forFinish bool
	// sent: an event carried the metrics; no other will.
	sent bool
}

// eventFacts is what the hold needs to know of an event.
type eventFacts struct {
	kind                                 rewrite.EventKind
	usageOnChoices, carriesChoices, ends bool
	// keepAlive: a comment or a ping, which may pass a held finishing
	// event (read only while one waits for the usage: see waitsForUsage).
	keepAlive bool
}

func factsOf(ev rewrite.Event) eventFacts {
	return eventFacts{kind: ev.Kind, usageOnChoices: ev.UsageOnChoices,
		carriesChoices: rewrite.CarriesChoices(ev), ends: rewrite.FinishesChoice(ev)}
}

// holdAction is what becomes of an event.
type holdAction uint8

const (
	actPass   holdAction = iota // goes out as it came
	actSplice                   // goes out with the metrics
	actDrop                     // the client does not get it: usage it did not ask for
	actHold                     // held back until the next event, the end or the bound
)

// waitsForUsage tells whether a finishing event waits for the usage, so
// that whether the next event is a keep-alive matters.
func (h *finishHold) waitsForUsage() bool { return h.held && h.forFinish }

// releaseBefore tells whether the held event goes out ahead of e, which
// shows whether it takes the metrics: the engine's order is kept. Only a
// keep-alive passes a finishing event that waits for the usage (it carries
// nothing a client reads in order), and the hold goes on.
func (h *finishHold) releaseBefore(e eventFacts) (release, withMetrics bool) {
	if !h.held || (h.forFinish && e.keepAlive) {
		return false, false
	}
	return true, h.release() && h.takesMetrics(e)
}

// takesMetrics tells, from the event after it, whether the held event is
// the one to carry the metrics.
func (h *finishHold) takesMetrics(next eventFacts) bool {
	switch {
	case next.kind == rewrite.EventUsage:
		// A usage event the client gets takes them itself; one it does
		// not get leaves them to the held event.
		return h.plan.metricsOnFinish
	case h.forFinish:
		// Another choice's event means this was not the last to finish.
		// Anything else (an error, an event the sidecar does not know)
		// goes out after the held event, and nothing after it may carry
		// the metrics: they go now, as measured so far.
		return !next.carriesChoices
	default:
		// Held for its usage: the last event with usage takes them.
		return !next.usageOnChoices
	}
}

// release lets the held event go (at the end of the stream, at the
// bound, or before the next event) and tells whether it may still carry
// the metrics.
func (h *finishHold) release() bool {
	h.held = false
	return !h.sent
}

// act is what becomes of e, once any held event was released before it.
func (h *finishHold) act(e eventFacts) holdAction {
	switch {
	case e.kind == rewrite.EventUsage:
		switch {
		case h.plan.metricsOnFinish:
			return actDrop // the finishing event held before it takes the metrics
		case h.plan.wantMetrics && !h.sent:
			// The first usage event takes the metrics; an engine that
			// sends more gets them passed as sent, so no stream carries
			// two metrics objects.
			return actSplice
		case h.plan.hideUsage:
			return actDrop
		}
	case e.usageOnChoices:
		if h.plan.wantMetrics && !h.sent {
			h.held, h.forFinish = true, false
			return actHold
		}
	case h.plan.metricsOnFinish && !h.sent && e.ends:
		// The usage the sidecar asked for follows this event.
		h.held, h.forFinish = true, true
		return actHold
	}
	return actPass
}

// carried records that an event went out with the metrics.
func (h *finishHold) carried() { h.sent = true }
