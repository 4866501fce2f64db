// Package requests keeps what the debug page (/debug/requests) shows:
// the requests running now, the last finished ones, and the slowest few
// of each endpoint and model in each latency bucket over a recent window,
// each with its timeline. Everything it holds is bounded: a count of
// requests, and a count of events per request (timing.Timeline). It holds
// no prompt and no output: only what the access log has, and the times.
package requests

import (
	"cmp"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/timing-sidecar/timing-sidecar/telemetry"
	"github.com/timing-sidecar/timing-sidecar/timing"
)

// Options bound a Store.
type Options struct {
	// Recent is the finished requests kept, the latest.
	Recent int
	// Slowest is the requests kept per endpoint, model and latency
	// bucket: the slowest finished within Window.
	Slowest int
	Window  time.Duration
}

// Defaults: a page's worth of recent requests, and a few slow ones per
// bucket over the last ten minutes (x/net/trace keeps ten per bucket).
const (
	DefaultRecent  = 200
	DefaultSlowest = 3
	DefaultWindow  = 10 * time.Minute
	// maxSlowKeys bounds the endpoint and model pairs with slow requests
	// kept: the model label's own bound times a few endpoints.
	maxSlowKeys = 128
	// maxFree bounds the free entries kept: a finished request lets go
	// of about one (the ring's oldest) as it takes one.
	maxFree = 16
)

// Buckets are the latency buckets of the slowest sets, by the request's
// whole time (arrival to end): each holds the requests at or above it and
// below the next.
var Buckets = []time.Duration{0, 100 * time.Millisecond, 500 * time.Millisecond, time.Second,
	2 * time.Second, 5 * time.Second, 10 * time.Second, 30 * time.Second, time.Minute}

// Entry is one finished request as the page shows it.
type Entry struct {
	telemetry.Record
	// Clock is the request's marks; Timeline its stream's events.
	Clock    timing.Clock
	Timeline timing.Timeline
	// TraceID is the request's trace, when traced.
	TraceID string
	// holders is how many of the store's sets hold the entry (the
	// recent ring, the slow sets); at none it is free for the next
	// request.
	holders int
}

// Stage is the last mark a running request has passed.
type Stage uint32

// The stages of a running request, in order.
const (
	StageArrived  Stage = iota // the whole request is in
	StageAccepted              // the engine's response headers came
	StageTokens                // token events are coming
	StageEnding                // the answer ended; the response is finishing
)

// Running is a request being served, as the page reads it while it runs:
// its fixed facts, and its progress in atomics the request's own
// goroutine writes.
type Running struct {
	ID, Endpoint, Model, Tenant, Variant string
	Arrival                              time.Time
	stage                                atomic.Uint32
	stageAt                              atomic.Int64 // Unix nanoseconds
	events                               atomic.Int32
}

// Mark records that the request passed stage at at.
func (r *Running) Mark(stage Stage, at time.Time) {
	if r == nil {
		return
	}
	r.stage.Store(uint32(stage))
	r.stageAt.Store(at.UnixNano())
}

// Event counts a stream event.
func (r *Running) Event() {
	if r != nil {
		r.events.Add(1)
	}
}

// Progress is the last stage passed, when, and the events so far.
func (r *Running) Progress() (Stage, time.Time, int) {
	at := r.stageAt.Load()
	if at == 0 {
		return StageArrived, r.Arrival, int(r.events.Load())
	}
	return Stage(r.stage.Load()), time.Unix(0, at), int(r.events.Load())
}

// Store holds the requests the page shows.
type Store struct {
	opts    Options
	mu      sync.Mutex
	recent  []*Entry // a ring of opts.Recent
	next    int
	slow    map[slowKey][]*Entry
	running map[*Running]struct{}
	// free is entries no set holds any more, for the next requests: an
	// entry is a few KB, and a request allocating one would be most of
	// what a non-streaming request allocates.
	free []*Entry
}

type slowKey struct {
	endpoint, model string
	bucket          int
}

// New is a store with opts' bounds; zero fields take the defaults.
func New(opts Options) *Store {
	if opts.Recent <= 0 {
		opts.Recent = DefaultRecent
	}
	if opts.Slowest <= 0 {
		opts.Slowest = DefaultSlowest
	}
	if opts.Window <= 0 {
		opts.Window = DefaultWindow
	}
	return &Store{opts: opts, recent: make([]*Entry, 0, opts.Recent), slow: map[slowKey][]*Entry{}, running: map[*Running]struct{}{}}
}

// Begin registers a running request.
func (s *Store) Begin(r *Running) {
	s.mu.Lock()
	s.running[r] = struct{}{}
	s.mu.Unlock()
}

// Finish takes a finished request, copying what it keeps (the caller's
// timeline is reused), and stops showing r as running. rec's strings are
// the recorder's, already cleaned and bounded.
func (s *Store) Finish(r *Running, rec *telemetry.Record, clock *timing.Clock, timeline *timing.Timeline, traceID string) {
	now := clock.Arrival.Add(rec.Elapsed)
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.running, r)
	e := s.entry()
	e.Record = *rec
	e.Record.Trace = telemetry.Trace{} // spans are the exporter's, not the page's
	e.Clock, e.TraceID = *clock, traceID
	e.Timeline.CopyFrom(timeline)
	e.holders = 1 // the ring
	if len(s.recent) < s.opts.Recent {
		s.recent = append(s.recent, e)
	} else {
		s.release(s.recent[s.next])
		s.recent[s.next] = e
	}
	s.next = (s.next + 1) % s.opts.Recent
	s.keepIfSlow(e, now)
}

// entry is a free entry, or a new one.
func (s *Store) entry() *Entry {
	if n := len(s.free); n > 0 {
		e := s.free[n-1]
		s.free[n-1] = nil
		s.free = s.free[:n-1]
		return e
	}
	return new(Entry)
}

// release lets go of one set's hold on e; the last frees it.
func (s *Store) release(e *Entry) {
	if e.holders--; e.holders == 0 && len(s.free) < maxFree {
		s.free = append(s.free, e)
	}
}

// keepIfSlow keeps e among the slowest of its endpoint, model and bucket
// within the window, dropping those that left the window.
func (s *Store) keepIfSlow(e *Entry, now time.Time) {
	k := slowKey{e.Endpoint, e.Model, bucketOf(e.Elapsed)}
	kept, ok := s.slow[k]
	if !ok && len(s.slow) >= maxSlowKeys {
		s.evictStale(now)
		if len(s.slow) >= maxSlowKeys {
			return
		}
	}
	kept = slices.DeleteFunc(kept, func(o *Entry) bool {
		stale := now.Sub(o.Clock.Arrival) > s.opts.Window
		if stale {
			s.release(o)
		}
		return stale
	})
	e.holders++
	kept = append(kept, e)
	slices.SortFunc(kept, func(a, b *Entry) int { return int(b.Elapsed - a.Elapsed) })
	if len(kept) > s.opts.Slowest {
		for _, o := range kept[s.opts.Slowest:] {
			s.release(o)
		}
		clear(kept[s.opts.Slowest:])
		kept = kept[:s.opts.Slowest]
	}
	s.slow[k] = kept
}

// evictStale forgets the slow sets none of whose requests is within the
// window.
func (s *Store) evictStale(now time.Time) {
	for k, kept := range s.slow {
		if !slices.ContainsFunc(kept, func(o *Entry) bool { return now.Sub(o.Clock.Arrival) <= s.opts.Window }) {
			for _, o := range kept {
				s.release(o)
			}
			delete(s.slow, k)
		}
	}
}

func bucketOf(d time.Duration) int {
	i := len(Buckets) - 1
	for i > 0 && d < Buckets[i] {
		i--
	}
	return i
}

// Snapshot is what the store holds now: the running requests, oldest
// first, read while the lock keeps them registered (a finished request's
// Running is reused); the recent ones newest first; and the slowest ones
// of the window, slowest first. The entries are copies: the store reuses
// its own once it lets go of them.
func (s *Store) Snapshot(now time.Time) (running []RunningView, recent, slowest []*Entry) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for r := range s.running {
		running = append(running, runningView(r, now))
	}
	slices.SortFunc(running, func(a, b RunningView) int { return cmp.Compare(b.ElapsedMS, a.ElapsedMS) })
	for i := range len(s.recent) {
		recent = append(recent, copyEntry(s.recent[(s.next-1-i+2*len(s.recent))%len(s.recent)]))
	}
	seen := map[*Entry]bool{}
	for _, kept := range s.slow {
		for _, e := range kept {
			if now.Sub(e.Clock.Arrival) <= s.opts.Window && !seen[e] {
				seen[e] = true
				slowest = append(slowest, copyEntry(e))
			}
		}
	}
	slices.SortFunc(slowest, func(a, b *Entry) int { return int(b.Elapsed - a.Elapsed) })
	return running, recent, slowest
}

// copyEntry is a copy of e that shares nothing with it.
func copyEntry(e *Entry) *Entry {
	c := *e
	c.Timeline = e.Timeline.Clone()
	return &c
}
