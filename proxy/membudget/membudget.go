package membudget

import (
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"
)

// Budget is one budget for a process's bodies; the zero Budget has no
// room: use New.
type Budget struct {
	size  int64
	used  atomic.Int64
	ahead atomic.Int64 // the part of used that read-aheads hold
	// waiting counts the takes that wait; freed is closed, and replaced,
	// when room is given back while any does.
	waiting atomic.Int32
	mu      sync.Mutex
	freed   chan struct{}
	// growing: a body that holds room waits for more (AwaitGrowth).
	growing atomic.Bool
	// returning: memory is to go back to the system soon.
	returning atomic.Bool
}

// Wait is how long a request body waits for room before it streams
// through unread: long enough for a body ahead of it, read at loopback or
// in-cluster speed, to be sent on and its room given back; short enough
// that a client's upload is not held up noticeably.
const Wait = 2 * time.Second

// New is a budget of size bytes.
func New(size int) *Budget {
	return &Budget{size: int64(size), freed: make(chan struct{})}
}

// tryTake takes n bytes if there is room now.
func (b *Budget) tryTake(n int64) bool {
	for {
		u := b.used.Load()
		if u+n > b.size {
			return false
		}
		if b.used.CompareAndSwap(u, u+n) {
			return true
		}
	}
}

// Take reserves n bytes, waiting up to wait for them; false when they
// cannot be had in time, or ever.
func (b *Budget) Take(n int, wait time.Duration) bool {
	if n <= 0 {
		return true
	}
	if int64(n) > b.size {
		return false
	}
	if b.tryTake(int64(n)) {
		return true
	}
	if wait <= 0 {
		return false
	}
	b.waiting.Add(1)
	defer b.waiting.Add(-1)
	t := time.NewTimer(wait)
	defer t.Stop()
	for {
		b.mu.Lock()
		freed := b.freed
		b.mu.Unlock()
		// After taking hold of freed: room given back from here on
		// closes it.
		if b.tryTake(int64(n)) {
			return true
		}
		select {
		case <-freed:
		case <-t.C:
			return false
		}
	}
}

// AwaitGrowth takes n bytes for a body that holds room already, waiting
// up to Wait, when no other such body waits: one waits at a
// time, so that bodies holding room never all wait on each other. false
// when another waits or the room does not come in time.
func (b *Budget) AwaitGrowth(n int) bool {
	if !b.growing.CompareAndSwap(false, true) {
		return false
	}
	defer b.growing.Store(false)
	return b.Take(n, Wait)
}

// Give returns n bytes taken before, and wakes the takes that wait. Once
// large bodies are let go, their memory goes back to the system: the
// runtime would otherwise keep the peak until its next collection, which
// a sidecar relaying only streams may not run for minutes (measured: 160
// to 210 MiB resident long after a burst of uploads, against 22 MiB), and
// the pod's RSS is what the kubelet and dashboards see. The return is
// one for all the bodies freed, once the budget is quiet (returnMemory):
// it forces a collection, whose cost on every stream's delivery is
// nothing measurable alone but about 20 ms on the p99 when it lands among
// other large bodies, so it never does.
func (b *Budget) Give(n int) {
	if n <= 0 {
		return
	}
	b.used.Add(-int64(n))
	if b.waiting.Load() > 0 {
		b.mu.Lock()
		close(b.freed)
		b.freed = make(chan struct{})
		b.mu.Unlock()
	}
	if n >= returnMemoryAfter && b.returning.CompareAndSwap(false, true) {
		time.AfterFunc(returnMemoryDelay, b.returnMemory)
	}
}

// returnMemory gives the memory of large bodies let go back to the system
// once the budget is quiet: less than returnMemoryAfter of it held, so no
// large body is being read or held. Until then it looks again every
// returnMemoryDelay: a burst of uploads gets one return, after its end.
func (b *Budget) returnMemory() {
	if b.used.Load() >= returnMemoryAfter {
		time.AfterFunc(returnMemoryDelay, b.returnMemory)
		return
	}
	b.returning.Store(false)
	debug.FreeOSMemory()
}

// returnMemoryAfter is the size past which memory given back goes back to
// the system, returnMemoryDelay how long after at the soonest: at most one
// forced collection per delay, 6 to 28 ms of one core on the sidecar's
// small heap (measured beside 50 streams).
const (
	returnMemoryAfter = 8 << 20
	returnMemoryDelay = time.Second
)

// TakeAhead reserves room for a stream's read-ahead, without waiting:
// read-aheads together hold at most a quarter of the budget, so that
// streams whose clients stalled once cannot take the room request bodies
// and held responses need.
func (b *Budget) TakeAhead(n int) bool {
	if b.ahead.Add(int64(n)) > b.size/4 || !b.tryTake(int64(n)) {
		b.ahead.Add(-int64(n))
		return false
	}
	return true
}

// GiveAhead returns a read-ahead's room.
func (b *Budget) GiveAhead(n int) {
	b.ahead.Add(-int64(n))
	b.Give(n)
}

// Charge counts n bytes the sidecar already holds, room or not: the
// budget counts what is held, and takes fail until it is given back.
func (b *Budget) Charge(n int) {
	if n > 0 {
		b.used.Add(int64(n))
	}
}

// Used is how many bytes are held now.
func (b *Budget) Used() int64 { return b.used.Load() }
