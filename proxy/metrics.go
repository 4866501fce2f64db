package proxy

import (
	"strconv"
	"time"

	"github.com/timing-sidecar/timing-sidecar/timing"
)

// A measured request's metrics come from one place: whatever carries them
// (the usage event, the event that finishes the choices, a non-streaming
// body, a reassembled upgrade, the Server-Timing trailer) and the record
// telemetry gets.

// markDone is the request's done mark, the only one: the moment the metrics
// a response carries are computed, or, for the record, the end of the
// response.
func (f *flight) markDone(t time.Time) { f.clock.Done = t }

// metrics computes the request's metrics from its clock and usage, with the
// engine's own timing beside them when it reported one.
func (f *flight) metrics(engine timing.EngineTiming) timing.Metrics {
	m := timing.Compute(&f.clock, f.usage, f.rec.Stream || f.upgraded)
	m.SetEngine(engine)
	return m
}

// metricsJSON marks the request done at done and appends to dst the
// metrics object its response carries, or null when one object cannot
// describe several choices (as vLLM does). It returns the metrics too.
func (f *flight) metricsJSON(dst []byte, done time.Time, engine timing.EngineTiming) ([]byte, timing.Metrics) {
	f.markDone(done)
	f.engine = engine // for the record
	m := f.metrics(engine)
	if f.multiple {
		return append(dst, "null"...), m
	}
	return m.AppendJSON(dst), m
}

// serverTiming formats the W3C Server-Timing value of the measured figures.
func serverTiming(m *timing.Metrics) []byte {
	var b []byte
	add := func(name string, n timing.Number) {
		if !n.Set {
			return
		}
		if len(b) > 0 {
			b = append(b, ", "...)
		}
		b = append(b, name...)
		b = append(b, ";dur="...)
		b = strconv.AppendFloat(b, n.Value, 'f', 3, 64)
	}
	add("queue", m.QueueTime)
	add("ttft", m.TimeToFirstToken)
	add("gen", m.GenerationTime)
	add("e2e", m.E2ELatency)
	return b
}
