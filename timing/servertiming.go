package timing

import (
	"strconv"
	"time"
)

// The W3C Server-Timing view of a request's figures
// (https://www.w3.org/TR/server-timing/): entries of a name and a duration
// in ms, three decimals, as the metrics object has them.

// AppendServerTiming appends the Server-Timing value of m's figures
// (queue, ttft, gen, e2e), leaving out any not measured.
func (m *Metrics) AppendServerTiming(dst []byte) []byte {
	start := len(dst)
	add := func(name string, n Number) {
		if !n.Set {
			return
		}
		if len(dst) > start {
			dst = append(dst, ", "...)
		}
		dst = append(dst, name...)
		dst = append(dst, ";dur="...)
		dst = strconv.AppendFloat(dst, n.Value, 'f', 3, 64)
	}
	add("queue", m.QueueTime)
	add("ttft", m.TimeToFirstToken)
	add("gen", m.GenerationTime)
	add("e2e", m.E2ELatency)
	return dst
}

// AppendFirstByteTiming appends the Server-Timing value of an answer
// passed through untouched: its time to first byte (arrival to the
// engine's response headers), which for an answer sent whole is the
// engine's computation. Its end is not known when the headers go out.
func (c *Clock) AppendFirstByteTiming(dst []byte) []byte {
	dst = append(dst, "ttfb;dur="...)
	return strconv.AppendFloat(dst, float64(c.Accepted.Sub(c.Arrival))/float64(time.Millisecond), 'f', 3, 64)
}
