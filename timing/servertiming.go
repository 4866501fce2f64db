package timing

import "strconv"

// The W3C Server-Timing view of a request's figures
// (https://www.w3.org/TR/server-timing/): entries of a name and a duration
// in ms, three decimals, as the metrics object has them.

// AppendServerTiming appends the Server-Timing value of m's figures
// (queue, ttft, gen, e2e), leaving out any not measured.
func (m *Metrics) AppendServerTiming(dst []byte) []byte {
	start := len(dst)
	dst = appendEntry(dst, start, "queue", m.QueueTime)
	dst = appendEntry(dst, start, "ttft", m.TimeToFirstToken)
	dst = appendEntry(dst, start, "gen", m.GenerationTime)
	return appendEntry(dst, start, "e2e", m.E2ELatency)
}

// AppendFirstByteTiming appends the Server-Timing value of an answer
// passed through untouched: its time to first byte (arrival to the
// engine's response headers), which for an answer sent whole is the
// engine's computation, or nothing without both marks in order. Its end
// is not known when the headers go out.
func (c *Clock) AppendFirstByteTiming(dst []byte) []byte {
	return appendEntry(dst, len(dst), "ttfb", number(span(c.Arrival, c.Accepted)))
}

// appendEntry appends name;dur=n to dst, after a comma if the value
// begun at start has an entry already; nothing when n was not measured.
func appendEntry(dst []byte, start int, name string, n Number) []byte {
	if !n.Set {
		return dst
	}
	if len(dst) > start {
		dst = append(dst, ", "...)
	}
	dst = append(dst, name...)
	dst = append(dst, ";dur="...)
	return strconv.AppendFloat(dst, n.Value, 'f', 3, 64)
}
