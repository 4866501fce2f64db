package timing

import (
	"math"
	"time"
)

// MaxTimelineEvents bounds the events a Timeline keeps: a long stream's
// first events and, past them, only its count and its longest gap. 2,048
// events cover the answers of almost every chat request one event a
// token, and keep a request's timeline within 16 KiB.
const MaxTimelineEvents = 2048

// Timeline is a stream's events as they passed the sidecar: when each
// arrived from the engine and when it was written to the client's
// socket, in microseconds since the request's arrival (a uint32 holds 71
// minutes). Kept compact for the debug page, which draws the gaps
// between events and tells the engine's pauses (gaps in arrival) from
// the client's (writes that waited).
type Timeline struct {
	// Arrived and Written are the kept events' offsets, in order.
	Arrived, Written []uint32
	// Events counts every event, kept or not; LongestGap is the largest
	// gap between two arrivals, over all of them, and LongestGapAt the
	// index of the event after it (Events-1 at most).
	Events       int
	LongestGap   uint32
	LongestGapAt int
	lastArrived  uint32
}

// Reset empties the timeline, keeping its room: a pooled flight's
// timeline allocates only until it has held its longest stream.
func (t *Timeline) Reset() {
	*t = Timeline{Arrived: t.Arrived[:0], Written: t.Written[:0]}
}

// Event records one event that arrived, and was written, the offsets
// given after the request's arrival. Offsets before it count as 0.
func (t *Timeline) Event(arrived, written time.Duration) {
	a, w := micros(arrived), micros(written)
	if t.Events > 0 && a-t.lastArrived > t.LongestGap && a >= t.lastArrived {
		t.LongestGap, t.LongestGapAt = a-t.lastArrived, t.Events
	}
	t.lastArrived = a
	t.Events++
	if len(t.Arrived) < MaxTimelineEvents {
		t.Arrived = append(t.Arrived, a)
		t.Written = append(t.Written, w)
	}
}

// Clone is a copy that shares nothing with t.
func (t *Timeline) Clone() Timeline {
	var c Timeline
	c.CopyFrom(t)
	return c
}

// CopyFrom makes t a copy of src that shares nothing with it, in t's own
// room: a reused timeline allocates only until it has held the longest.
func (t *Timeline) CopyFrom(src *Timeline) {
	arrived, written := t.Arrived[:0], t.Written[:0]
	*t = *src
	t.Arrived = append(arrived, src.Arrived...)
	t.Written = append(written, src.Written...)
}

// micros is d in whole microseconds, clamped to a uint32.
func micros(d time.Duration) uint32 {
	switch us := d.Microseconds(); {
	case us < 0:
		return 0
	case us > math.MaxUint32:
		return math.MaxUint32
	default:
		return uint32(us)
	}
}
