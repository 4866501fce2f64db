package proxy

import (
	"context"
	"runtime/debug"
	"sync/atomic"
	"time"

	"golang.org/x/sync/semaphore"
)

// bodyBudget bounds the bytes of request bodies the sidecar holds at once
// (--max-body-memory). A body is read whole to be inspected and edited, and
// a pod's memory limit is shared by every request in it: without a bound,
// two uploads at the body size limit took the container past its limit and
// every stream in the pod died with it. What the budget does not cover
// streams through: a request whose body cannot have room in time goes to
// the engine as it arrives, unread, and is answered unmeasured for the
// metrics object (its timing is still recorded), as a body the sidecar
// does not understand is. Nothing is refused for memory, so nothing the
// engine would serve fails because of the sidecar.
//
// Bodies that fasthttp read with the headers (bodyPrefetch) are the
// connection's own buffer, counted per connection in deploy/README.md's
// formula, not here.
type bodyBudget struct {
	sem  *semaphore.Weighted
	size int64
	used atomic.Int64 // for the gauge
	// returning: memory is to go back to the system soon.
	returning atomic.Bool
}

// bodyBudgetWait is how long a body waits for room before it streams
// through unread: long enough for a body ahead of it, read at loopback or
// in-cluster speed, to be sent on and its room given back; short enough
// that a client's upload is not held up noticeably.
const bodyBudgetWait = 2 * time.Second

// bodyPrefetch is what fasthttp reads of a body with its headers
// (readBodyWithStreaming's pre-read): a body this small is already read
// when the handler runs.
const bodyPrefetch = 8 << 10

func newBodyBudget(size int) *bodyBudget {
	return &bodyBudget{sem: semaphore.NewWeighted(int64(size)), size: int64(size)}
}

// take reserves n bytes, waiting up to wait for them; false when they
// cannot be had in time, or ever.
func (b *bodyBudget) take(n int, wait time.Duration) bool {
	if n <= 0 {
		return true
	}
	if int64(n) > b.size {
		return false
	}
	ok := b.sem.TryAcquire(int64(n))
	if !ok && wait > 0 {
		ctx, cancel := context.WithTimeout(context.Background(), wait)
		ok = b.sem.Acquire(ctx, int64(n)) == nil
		cancel()
	}
	if ok {
		b.used.Add(int64(n))
	}
	return ok
}

// give returns n bytes taken before. Once a large body is let go, its
// memory goes back to the system: the runtime would otherwise keep the
// peak until its next collection, which an idle sidecar may not run for
// minutes, and the pod's RSS is what the kubelet and dashboards see. The
// return waits a moment, for the request's last reference to the body
// (its handler) to be gone, and is one for all the bodies freed then.
func (b *bodyBudget) give(n int) {
	if n <= 0 {
		return
	}
	b.used.Add(-int64(n))
	b.sem.Release(int64(n))
	if n >= returnMemoryAfter && b.returning.CompareAndSwap(false, true) {
		time.AfterFunc(returnMemoryDelay, func() {
			b.returning.Store(false)
			debug.FreeOSMemory()
		})
	}
}

// returnMemoryAfter is the body size past which its memory goes back to
// the system once free, returnMemoryDelay how long after: at most one
// forced collection per delay, a few milliseconds of CPU on the sidecar's
// small heap.
const (
	returnMemoryAfter = 8 << 20
	returnMemoryDelay = time.Second
)

// responseFree is what a held response may take without the budget: the
// usual non-streaming answer, counted per request in deploy/README.md's
// formula, so that the budget is touched only by large ones.
const responseFree = 64 << 10

// holdResponse makes sure the budget covers n bytes of response held for
// f (to splice the metrics in, to read its usage, or reassembled), taking
// more in steps of responseFree and never waiting; false when it has no
// room. The caller then passes the response through without metrics, as
// one over --max-buffered-response-size. finish gives it back.
func (p *Proxy) holdResponse(f *flight, n int) bool {
	if n <= responseFree || n <= f.responseTaken {
		return true
	}
	step := max(n-f.responseTaken, responseFree)
	if !p.bodies.take(step, 0) {
		return false
	}
	f.responseTaken += step
	return true
}
