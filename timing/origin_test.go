package timing

import (
	"math/rand/v2"
	"testing"
)

// TestOrigin: which mark a stream's TTFT counts from, and the figures
// each gives. The headers' mark only when they came HeadersLead before
// the first output, no router split the request, and the engine's own
// TTFT is not longer; else arrival plus the engine's queue time; else
// arrival, with no queue time.
func TestOrigin(t *testing.T) {
	n := func(v float64) Number { return Number{v, true} }
	for _, tc := range []struct {
		name       string
		clock      *Clock
		engine     EngineTiming
		from       Origin
		queue      Number
		ttft       Number
		afterStart Number // first token − arrival
	}{
		{"headers well before the first token", streamClock(10, []float64{60, 80}, 90), EngineTiming{}, FromAccepted, n(10), n(50), n(60)},
		{"headers exactly HeadersLead before", streamClock(10, []float64{11, 80}, 90), EngineTiming{}, FromAccepted, n(10), n(1), n(11)},
		{"headers with the first token", streamClock(60, []float64{60, 80}, 90), EngineTiming{}, FromArrival, Number{}, n(60), n(60)},
		{"headers just before the first token", streamClock(59.5, []float64{60, 80}, 90), EngineTiming{}, FromArrival, Number{}, n(60), n(60)},
		{"headers behind a splitting router", late(streamClock(10, []float64{60, 80}, 90)), EngineTiming{}, FromArrival, Number{}, n(60), n(60)},
		{"the engine's queue time, headers with the token", streamClock(60, []float64{60, 80}, 90), EngineTiming{Reported: true, QueueTime: n(15)}, FromEngineQueue, n(15), n(45), n(60)},
		{"the engine's queue time past the first token is not believed", streamClock(60, []float64{60, 80}, 90), EngineTiming{Reported: true, QueueTime: n(75)}, FromArrival, Number{}, n(60), n(60)},
		{"headers that would give a TTFT under the engine's", streamClock(40, []float64{60, 80}, 90), EngineTiming{Reported: true, QueueTime: n(5), TimeToFirstToken: n(30)}, FromEngineQueue, n(5), n(55), n(60)},
		{"headers that agree with the engine's TTFT", streamClock(40, []float64{60, 80}, 90), EngineTiming{Reported: true, TimeToFirstToken: n(18)}, FromAccepted, n(40), n(20), n(60)},
		{"no output: the headers' queue", streamClock(60, nil, 90), EngineTiming{}, FromAccepted, n(60), Number{}, Number{}},
		{"no output behind a splitting router", late(streamClock(60, nil, 90)), EngineTiming{}, FromArrival, Number{}, Number{}, Number{}},
		{"behind a splitting router the engine's queue is the decode's", late(streamClock(60, []float64{60, 80}, 90)), EngineTiming{Reported: true, QueueTime: n(15)}, FromArrival, Number{}, n(60), n(60)},
		{"an engine queue past any duration", streamClock(60, []float64{60, 80}, 90), EngineTiming{Reported: true, QueueTime: n(1e13)}, FromArrival, Number{}, n(60), n(60)},
		{"no output, an engine queue past the end", streamClock(60, nil, 90), EngineTiming{Reported: true, QueueTime: n(1e9)}, FromAccepted, n(60), Number{}, Number{}},
	} {
		m := Compute(tc.clock, Usage{CompletionTokens: count(2)}, true, tc.engine)
		if m.TTFTFrom != tc.from || !near3(m.QueueTime, tc.queue) || !near3(m.TimeToFirstToken, tc.ttft) || !near3(m.FirstTokenAfterArrival, tc.afterStart) {
			t.Errorf("%s: from %v, queue %+v, ttft %+v, after arrival %+v; want %v, %+v, %+v, %+v", tc.name,
				m.TTFTFrom, m.QueueTime, m.TimeToFirstToken, m.FirstTokenAfterArrival, tc.from, tc.queue, tc.ttft, tc.afterStart)
		}
		if m.TTFTFrom != FromArrival && tc.ttft.Set && !near3(Number{m.QueueTime.Value + m.TimeToFirstToken.Value, true}, m.FirstTokenAfterArrival) {
			t.Errorf("%s: queue + ttft %v is not first token − arrival %v", tc.name, m.QueueTime.Value+m.TimeToFirstToken.Value, m.FirstTokenAfterArrival.Value)
		}
	}
	// Not streamed: no origin to choose, the object's shape as before.
	if m := Compute(late(streamClock(60, nil, 90)), Usage{}, false, EngineTiming{}); m.TTFTFrom != FromAccepted || m.QueueTime.Set {
		t.Errorf("not streamed: %v %+v", m.TTFTFrom, m.QueueTime)
	}
}

func late(c *Clock) *Clock { c.HeadersLate = true; return c }

func near3(a, b Number) bool {
	d := a.Value - b.Value
	return a.Set == b.Set && d < 1e-6 && d > -1e-6
}

// TestNoTTFTUnderTheEngines: over random marks and engine reports that
// fit inside them (the engine's queue and TTFT within the sidecar's
// arrival-to-first-token), the sidecar's TTFT is never shorter than the
// engine's own.
func TestNoTTFTUnderTheEngines(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for i := range 20000 {
		first := r.Float64() * 500
		accepted := r.Float64() * (first + 20) // before, with, or after the first token
		c := streamClock(accepted, []float64{first, first + 10}, first+20)
		c.HeadersLate = r.IntN(4) == 0
		inside := r.Float64() * first // the engine's arrival-to-first-token
		queue := r.Float64() * inside
		e := EngineTiming{Reported: true, TimeToFirstToken: Number{inside - queue, true}}
		if r.IntN(2) == 0 {
			e.QueueTime = Number{queue, true}
		}
		m := Compute(c, Usage{CompletionTokens: count(2)}, true, e)
		if m.TimeToFirstToken.Value < e.TimeToFirstToken.Value-1e-6 {
			t.Fatalf("case %d: ttft %v (from %v) under the engine's %v; accepted %v, first %v, queue %+v", i, m.TimeToFirstToken.Value, m.TTFTFrom, e.TimeToFirstToken.Value, accepted, first, e.QueueTime)
		}
	}
}
