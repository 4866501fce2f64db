package proxy

import (
	"time"

	"github.com/valyala/fasthttp"

	"github.com/timing-sidecar/timing-sidecar/rewrite"
	"github.com/timing-sidecar/timing-sidecar/timing"
)

// A measured request's metrics are computed once, when it is done, and
// that one value goes to whatever carries them (the usage event, the event
// that finishes the choices, a non-streaming body, a reassembled upgrade,
// the Server-Timing trailer) and to the record telemetry gets.

// markEnd marks the response's end, for metrics not yet computed: the
// last byte of a body, the end of a stream.
func (f *flight) markEnd(t time.Time) {
	if !f.computed {
		f.clock.Done = t
	}
}

// done marks the request done at t and computes its metrics, with the
// engine's own timing beside them when it reported one; once done, it
// returns the metrics computed then.
func (f *flight) done(t time.Time, engine timing.EngineTiming) *timing.Metrics {
	if !f.computed {
		f.clock.Done = t
		f.compute(engine)
	}
	return &f.result
}

// compute computes the metrics, once, in place: done's callers lie on a
// stream's deepest path (see eventRelay.take).
func (f *flight) compute(engine timing.EngineTiming) {
	u, e := f.counts(), engine.WithHeaders(f.engineHeaders)
	timing.ComputeInto(&f.result, &f.clock, &u, f.streamed(), &e)
	f.computed = true
	f.doneClock = f.clock
}

// counts is the engine's usage, with the cached prompt tokens of its
// headers where the usage has none.
func (f *flight) counts() timing.Usage {
	u := f.usage
	if !u.CachedTokens.Set {
		u.CachedTokens = f.headerCached
	}
	if f.kvPulled {
		// A decode engine's cached tokens count the KV it pulled from the
		// prefill engine with its own prefix cache's: not a cache hit
		// the sidecar can tell apart.
		u.CachedTokens = timing.Count{}
	}
	return u
}

// readEngineHeaders reads the engine's timing headers, if it sent any.
func (f *flight) readEngineHeaders(h *fasthttp.ResponseHeader) {
	var tgi rewrite.TGIHeaders
	for k, v := range h.All() {
		rewrite.EngineHeader(&f.engineHeaders, &f.headerCached, k, v)
		tgi.Header(k, v)
	}
	if e, ok := tgi.Timing(); ok && !f.engineHeaders.Reported {
		f.engineHeaders = e
	}
}

// streamed: the engine's response was an event stream (reassembled or not).
func (f *flight) streamed() bool { return f.rec.Stream || f.upgraded }

// addUsage takes the engine's token counts; counts that come after the
// metrics were computed (a finishing event sent when its hold's bound
// passed) complete the record.
func (f *flight) addUsage(u timing.Usage) {
	if u == (timing.Usage{}) {
		return // most events carry none
	}
	f.usage = f.usage.Merge(u)
	f.lateUsage = f.lateUsage || f.computed
}

// metricsJSON appends to dst the metrics object a response carries, the
// request done at done; or null when one object cannot describe several
// choices (as vLLM does). Those are not computed here: other choices may
// still stream, and the record computes them at the request's end.
func (f *flight) metricsJSON(dst []byte, done time.Time, engine timing.EngineTiming) []byte {
	if f.plan.Multiple {
		return append(dst, "null"...)
	}
	return f.done(done, engine).AppendJSON(dst)
}
