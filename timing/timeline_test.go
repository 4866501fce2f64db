package timing

import (
	"math"
	"testing"
	"time"
)

// TestTimelineKeepsEventsAndTheLongestGap: events are kept in
// microseconds up to the bound, counted past it, and the longest gap
// between arrivals is found over all of them, kept or not.
func TestTimelineKeepsEventsAndTheLongestGap(t *testing.T) {
	var tl Timeline
	at := time.Duration(0)
	for i := range MaxTimelineEvents + 10 {
		gap := 10 * time.Millisecond
		if i == 5 {
			gap = 300 * time.Millisecond // a stall among the kept events
		}
		if i == MaxTimelineEvents+5 {
			gap = time.Second // a longer one past the bound
		}
		at += gap
		tl.Event(at, at+50*time.Microsecond)
	}
	if tl.Events != MaxTimelineEvents+10 || len(tl.Arrived) != MaxTimelineEvents || len(tl.Written) != MaxTimelineEvents {
		t.Fatalf("events %d, kept %d and %d", tl.Events, len(tl.Arrived), len(tl.Written))
	}
	if tl.Arrived[0] != 10_000 || tl.Written[0] != 10_050 {
		t.Errorf("first event at %d µs, written %d µs", tl.Arrived[0], tl.Written[0])
	}
	if tl.LongestGap != 1_000_000 || tl.LongestGapAt != MaxTimelineEvents+5 {
		t.Errorf("longest gap %d µs before event %d", tl.LongestGap, tl.LongestGapAt)
	}
	c := tl.Clone()
	tl.Reset()
	if len(tl.Arrived) != 0 || tl.Events != 0 || cap(tl.Arrived) < MaxTimelineEvents {
		t.Errorf("reset: %d kept, %d events, room %d", len(tl.Arrived), tl.Events, cap(tl.Arrived))
	}
	tl.Event(0, 0) // written over the reset room, not over the clone
	if len(c.Arrived) != MaxTimelineEvents || c.Arrived[0] != 10_000 || c.Arrived[5] != 350_000 {
		t.Errorf("the clone changed with the original: %d kept, event 5 at %d", len(c.Arrived), c.Arrived[5])
	}
}

// TestTimelineClampsOffsets: an offset before the arrival (a clock step)
// counts as 0, and one past 71 minutes as the most a uint32 holds.
func TestTimelineClampsOffsets(t *testing.T) {
	var tl Timeline
	tl.Event(-time.Second, 2*time.Hour)
	if tl.Arrived[0] != 0 || tl.Written[0] != math.MaxUint32 {
		t.Errorf("arrived %d, written %d", tl.Arrived[0], tl.Written[0])
	}
}

// TestTimelineEventAllocatesNothing: with room from a stream before, an
// event costs no allocation: it is on the per-event path.
func TestTimelineEventAllocatesNothing(t *testing.T) {
	var tl Timeline
	for i := range 100 {
		tl.Event(time.Duration(i)*time.Millisecond, time.Duration(i)*time.Millisecond)
	}
	tl.Reset()
	if n := testing.AllocsPerRun(50, func() { tl.Event(time.Millisecond, time.Millisecond) }); n != 0 {
		t.Errorf("%v allocations an event", n)
	}
}
