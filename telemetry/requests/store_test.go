package requests

import (
	"fmt"
	"runtime"
	"testing"
	"time"
	"unsafe"

	"github.com/timing-sidecar/timing-sidecar/telemetry"
	"github.com/timing-sidecar/timing-sidecar/timing"
)

// finish hands s a finished request of endpoint and model that arrived at
// at and took took, with events stream events.
func finish(s *Store, id, endpoint, model string, at time.Time, took time.Duration, events int) {
	r := &Running{ID: id, Arrival: at}
	s.Begin(r)
	var tl timing.Timeline
	for i := range events {
		tl.Event(time.Duration(i)*time.Millisecond, time.Duration(i)*time.Millisecond)
	}
	rec := telemetry.Record{ID: id, Endpoint: endpoint, Model: model, Status: 200, Elapsed: took}
	s.Finish(r, &rec, &timing.Clock{Arrival: at}, &tl, "")
}

// TestStoreKeepsTheRecentAndTheSlowest: the last Recent requests, newest
// first; per endpoint, model and bucket the Slowest slowest within the
// window, slowest first; a finished request is no longer running.
func TestStoreKeepsTheRecentAndTheSlowest(t *testing.T) {
	s := New(Options{Recent: 3, Slowest: 2, Window: time.Minute})
	t0 := time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC)
	for i, took := range []time.Duration{1200, 1900, 1500, 1100, 150} {
		finish(s, fmt.Sprint("r", i), "chat_completions", "m", t0.Add(time.Duration(i)*time.Second), took*time.Millisecond, 3)
	}
	running, recent, slowest := s.Snapshot(t0.Add(5 * time.Second))
	if len(running) != 0 {
		t.Errorf("%d running", len(running))
	}
	var ids []string
	for _, e := range recent {
		ids = append(ids, e.ID)
	}
	if fmt.Sprint(ids) != "[r4 r3 r2]" {
		t.Errorf("recent %v", ids)
	}
	ids = nil
	for _, e := range slowest {
		ids = append(ids, e.ID)
	}
	// r1 and r2 are the slowest of the 1-2 s bucket; r4 alone in its own.
	if fmt.Sprint(ids) != "[r1 r2 r4]" {
		t.Errorf("slowest %v", ids)
	}
	// Past the window, the slow ones leave the slowest set.
	if _, _, slowest := s.Snapshot(t0.Add(2 * time.Minute)); len(slowest) != 0 {
		t.Errorf("%d slow requests kept past the window", len(slowest))
	}
}

// TestStoreMemoryIsBounded: 100,000 requests of long streams over many
// endpoints, models and durations leave the store holding its bounds'
// worth (the recent ring, and Slowest of each of at most maxSlowKeys
// sets), and the heap where 50,000 left it.
func TestStoreMemoryIsBounded(t *testing.T) {
	const events = 300
	s := New(Options{})
	t0 := time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC)
	heap := func() uint64 {
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m.HeapAlloc
	}
	send := func(from, to int) {
		for i := from; i < to; i++ {
			at := t0.Add(time.Duration(i) * 10 * time.Millisecond)
			took := time.Duration(i%977) * 97 * time.Millisecond
			finish(s, fmt.Sprint("req-", i), fmt.Sprint("endpoint-", i%7), fmt.Sprint("model-", i%53), at, took, events)
		}
	}
	before := heap()
	send(0, 50_000)
	at50k := heap()
	send(50_000, 100_000)
	at100k := heap()
	runtime.KeepAlive(s) // what is measured is what the store holds
	held := int64(at100k) - int64(before)
	t.Logf("heap: %d KiB before, %d KiB at 50,000 requests, %d KiB at 100,000", before>>10, at50k>>10, at100k>>10)
	// Each entry and its events, with half again for the allocator's
	// size classes, the ids and the maps.
	perEntry := int64(unsafe.Sizeof(Entry{})) + 8*events
	if bound := int64(DefaultRecent+maxSlowKeys*DefaultSlowest) * perEntry * 3 / 2; held > bound {
		t.Errorf("the store holds %d KiB, over its bound of %d KiB", held>>10, bound>>10)
	}
	if at100k > at50k+at50k/20 {
		t.Errorf("the heap grew from %d KiB to %d KiB between 50,000 and 100,000 requests", at50k>>10, at100k>>10)
	}
}

// TestStoreReusesTheEntriesItLetsGo: once the ring is full, a finished
// request takes the entry of the one it pushes out, timeline room
// included, and allocates nothing.
func TestStoreReusesTheEntriesItLetsGo(t *testing.T) {
	s := New(Options{Recent: 4, Slowest: 2, Window: time.Minute})
	t0 := time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC)
	r := &Running{ID: "r"}
	var tl timing.Timeline
	for i := range 20 {
		tl.Event(time.Duration(i)*time.Millisecond, time.Duration(i)*time.Millisecond)
	}
	rec := telemetry.Record{ID: "r", Endpoint: "chat_completions", Model: "m", Status: 200, Elapsed: time.Second}
	clock := timing.Clock{Arrival: t0}
	for range 10 {
		s.Begin(r)
		s.Finish(r, &rec, &clock, &tl, "")
	}
	allocs := testing.AllocsPerRun(100, func() {
		s.Begin(r)
		s.Finish(r, &rec, &clock, &tl, "")
	})
	if allocs != 0 {
		t.Errorf("a finished request allocates %.1f times in steady state", allocs)
	}
	if _, recent, _ := s.Snapshot(t0); len(recent) != 4 || len(recent[0].Timeline.Arrived) != 20 {
		t.Errorf("recent %d, the newest with %d events", len(recent), len(recent[0].Timeline.Arrived))
	}
}

// TestSnapshotsAreTheirOwn: what a snapshot returned stays as it was when
// the store reuses the entries it copied.
func TestSnapshotsAreTheirOwn(t *testing.T) {
	s := New(Options{Recent: 2, Slowest: 1, Window: time.Minute})
	t0 := time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC)
	finish(s, "a", "chat_completions", "m", t0, time.Second, 3)
	finish(s, "b", "chat_completions", "m", t0, 2*time.Second, 5)
	_, recent, slowest := s.Snapshot(t0)
	events := fmt.Sprint(recent[0].Timeline.Arrived)
	var late timing.Timeline
	for i := range 3 { // within the room of the entries it reuses
		late.Event(time.Duration(100+i)*time.Millisecond, time.Duration(100+i)*time.Millisecond)
	}
	for i := range 10 {
		r := &Running{ID: fmt.Sprint("late-", i)}
		s.Begin(r)
		rec := telemetry.Record{ID: r.ID, Endpoint: "chat_completions", Model: "m", Status: 200, Elapsed: 3 * time.Second}
		s.Finish(r, &rec, &timing.Clock{Arrival: t0}, &late, "")
	}
	if recent[0].ID != "b" || recent[1].ID != "a" || slowest[0].ID != "b" || fmt.Sprint(recent[0].Timeline.Arrived) != events {
		t.Errorf("the snapshot changed: recent %s (events %v, were %s), %s; slowest %s",
			recent[0].ID, recent[0].Timeline.Arrived, events, recent[1].ID, slowest[0].ID)
	}
}
