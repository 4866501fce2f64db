package proxy

import (
	"bytes"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"
)

// bodyBudget bounds the bytes the sidecar holds at once for requests'
// bodies (--max-body-memory): request bodies read to be inspected and
// edited, responses held past their first 64 KiB, and the read-aheads of
// streams whose client stalled. A pod's memory limit is shared by every
// request in it: without a bound, two uploads at the body size limit took
// the container past its limit and every stream in the pod died with it.
// What the budget does not cover passes through: a request body with no
// room in time goes to the engine as it arrives, unread, and is answered
// unmeasured for the metrics object (its timing is still recorded), as a
// body the sidecar does not understand is; a held response with no room
// passes through without metrics; a stream without room for a read-ahead
// waits on its client as before. Nothing is refused for memory, so
// nothing the engine would serve fails because of the sidecar.
//
// Room is taken as it is needed (a body as its bytes arrive), and only a
// request body's first take waits: one that holds room never waits for
// more, so two cannot wait on each other. A take that does not wait
// never queues behind one that does.
//
// Bodies that fasthttp read with the headers (bodyPrefetch) are the
// connection's own buffer, counted per connection in deploy/README.md's
// formula, not here.
type bodyBudget struct {
	size  int64
	used  atomic.Int64
	ahead atomic.Int64 // the part of used that read-aheads hold
	// waiting counts the takes that wait; freed is closed, and replaced,
	// when room is given back while any does.
	waiting atomic.Int32
	mu      sync.Mutex
	freed   chan struct{}
	// growing: a body that holds room waits for more (awaitGrowth).
	growing atomic.Bool
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
	return &bodyBudget{size: int64(size), freed: make(chan struct{})}
}

// tryTake takes n bytes if there is room now.
func (b *bodyBudget) tryTake(n int64) bool {
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

// take reserves n bytes, waiting up to wait for them; false when they
// cannot be had in time, or ever.
func (b *bodyBudget) take(n int, wait time.Duration) bool {
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

// awaitGrowth takes n bytes for a body that holds room already, waiting
// up to bodyBudgetWait, when no other such body waits: one waits at a
// time, so that bodies holding room never all wait on each other. false
// when another waits or the room does not come in time.
func (b *bodyBudget) awaitGrowth(n int) bool {
	if !b.growing.CompareAndSwap(false, true) {
		return false
	}
	defer b.growing.Store(false)
	return b.take(n, bodyBudgetWait)
}

// give returns n bytes taken before, and wakes the takes that wait. Once
// large bodies are let go, their memory goes back to the system: the
// runtime would otherwise keep the peak until its next collection, which
// a sidecar relaying only streams may not run for minutes (measured: 160
// to 210 MiB resident long after a burst of uploads, against 22 MiB), and
// the pod's RSS is what the kubelet and dashboards see. The return is
// one for all the bodies freed, once the budget is quiet (returnMemory):
// it forces a collection, whose cost on every stream's delivery is
// nothing measurable alone but about 20 ms on the p99 when it lands among
// other large bodies, so it never does.
func (b *bodyBudget) give(n int) {
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
func (b *bodyBudget) returnMemory() {
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

// takeAhead reserves room for a stream's read-ahead, without waiting:
// read-aheads together hold at most a quarter of the budget, so that
// streams whose clients stalled once cannot take the room request bodies
// and held responses need.
func (b *bodyBudget) takeAhead(n int) bool {
	if b.ahead.Add(int64(n)) > b.size/4 || !b.tryTake(int64(n)) {
		b.ahead.Add(-int64(n))
		return false
	}
	return true
}

// giveAhead returns a read-ahead's room.
func (b *bodyBudget) giveAhead(n int) {
	b.ahead.Add(-int64(n))
	b.give(n)
}

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

// charge counts n bytes the sidecar already holds, room or not: the
// budget counts what is held, and takes fail until it is given back.
func (b *bodyBudget) charge(n int) {
	if n > 0 {
		b.used.Add(int64(n))
	}
}

// respondHeld makes body, which the response now owns (no copy is made),
// the response's body. room is what the budget holds for it: given back
// once fasthttp has written the body to the client, or failed to, not
// when the handler returns, since the body is held until then.
func (p *Proxy) respondHeld(ctx *fasthttp.RequestCtx, body []byte, room int) {
	if room <= 0 {
		ctx.Response.SetBodyRaw(body)
		ctx.Response.Header.SetContentLength(len(body))
		return
	}
	ctx.Response.SetBodyStream(&heldBody{Reader: bytes.NewReader(body), budget: p.bodies, room: room}, len(body))
}

// heldBody is a response body held in memory, with its room in the budget.
type heldBody struct {
	*bytes.Reader
	budget *bodyBudget
	room   int
}

// Close is called by fasthttp once the body is written, or the write
// failed, and for a response that is never sent.
func (h *heldBody) Close() error {
	h.budget.give(h.room)
	h.room = 0
	return nil
}
