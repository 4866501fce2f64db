package readloop

import (
	"sync/atomic"
	"syscall"
	"time"
)

// Task is a stream's relay running on a loop. Its own code calls
// WaitReadable and Leave; any goroutine may call Wake.
type Task struct {
	loop  *Loop
	next  func() (reason, bool)
	stop  func()
	yield func(reason) bool
	back  chan struct{} // to Run: the task ended, or left its loop
	// slot is its place in the loop's table. started is the loop's;
	// ended the loop's until back says the task ended or left, then
	// Run's.
	slot           uint32
	started, ended bool
	// attached: the loop runs it. The task's own code clears it
	// (Leave, finish); a connection's other readers read it too (a
	// read-ahead after Leave).
	attached atomic.Bool
	// waiting: it waits on the loop for a read, and Wake may resume it;
	// woken: a Wake is queued. readable: the loop resumes it for its
	// socket, not a Wake.
	waiting, woken atomic.Bool
	readable       bool
	// reg is the socket in the loop's set, and regFD its descriptor.
	reg   syscall.RawConn
	regFD int
	// timer wakes it at its read's deadline, timerAt (Deadline's).
	timer   *time.Timer
	timerAt int64
	// panicked is what fn panicked with, for Run to raise again.
	panicked any
}

// reason is why a task hands its loop back.
type reason uint8

const (
	readable reason = iota // it waits for its socket to be readable
	leave                  // it leaves the loop (Leave)
)

// Outcome is what a wait came to.
type Outcome uint8

const (
	// Ready: the socket may be readable (a spurious wake reads nothing
	// and waits again), or the task is not on a loop.
	Ready Outcome = iota
	// Stopped: the stop flag was set (the connection is closing).
	Stopped
	// TimedOut: the read's deadline passed.
	TimedOut
)

// epoch is what deadlines count from: the monotonic clock, as Go's
// poller's deadlines do, so a step of the wall clock moves none.
var epoch = time.Now()

// Deadline is t as a read deadline for WaitReadable: 0, none, for the zero
// time. Store it where the read finds it (an atomic.Int64).
func Deadline(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return max(int64(t.Sub(epoch)), 1)
}

func sinceEpoch() int64 { return int64(time.Since(epoch)) }

// Run runs fn as a task of l and returns once fn has: on l while fn waits
// only for reads, then, if fn leaves l, on the calling goroutine. A panic
// in fn is raised again here.
func (l *Loop) Run(fn func(*Task)) {
	t := &Task{loop: l, back: make(chan struct{}, 1)}
	t.attached.Store(true)
	pull(t, fn)
	l.ring(t)
	<-t.back
	for !t.ended {
		// It left the loop: carried on here, its waits the ordinary ones.
		if _, more := t.next(); !more {
			t.ended = true
		}
	}
	t.stop()
	if t.timer != nil {
		t.timer.Stop()
	}
	if t.panicked != nil {
		panic(t.panicked)
	}
}

// finish ends the task's coroutine: a panic kept for Run, the socket
// taken out of the set.
func (t *Task) finish() {
	if r := recover(); r != nil {
		t.panicked = r
	}
	// A connection left pointing at it (fn panicked) reads the ordinary
	// way from now on.
	t.attached.Store(false)
	t.unregister()
}

// Attached tells whether the loop runs t; false for nil.
func (t *Task) Attached() bool { return t != nil && t.attached.Load() }

// WaitReadable waits on the loop until fd is readable, the deadline in
// *deadline (Deadline's; 0 for none) passes or *stop is set, and says
// which; Wake hurries it after either changed. fd is raw's, and the
// caller holds it open: it is inside raw's Read. A task not on a loop
// returns Ready at once. For t's own code.
func (t *Task) WaitReadable(raw syscall.RawConn, fd uintptr, stop *atomic.Bool, deadline *atomic.Int64) Outcome {
	if !t.Attached() {
		return Ready
	}
	if t.reg != raw || t.regFD != int(fd) {
		t.unregister()
		if t.loop.register(t, int(fd)) != nil {
			t.Leave() // the read waits the ordinary way
			return Ready
		}
		t.reg, t.regFD = raw, int(fd)
	}
	// Set before stop and the deadline are read, as Wake reads waiting
	// after they are written: one of the two sees the other.
	t.waiting.Store(true)
	if out := t.due(stop, deadline); out != Ready {
		t.waiting.Store(false)
		return out
	}
	t.yield(readable) // the loop clears waiting as it resumes
	if t.readable && !stop.Load() {
		// Bytes came: read them, as Go's poller would, even if the loop
		// got to it past the deadline.
		return Ready
	}
	return t.due(stop, deadline)
}

// due says whether the wait is over without a read: stopped, or past its
// deadline; it arms the timer for a deadline to come.
func (t *Task) due(stop *atomic.Bool, deadline *atomic.Int64) Outcome {
	if stop.Load() {
		return Stopped
	}
	d := deadline.Load()
	if d != 0 && sinceEpoch() >= d {
		return TimedOut
	}
	t.arm(d)
	return Ready
}

// arm sets the timer to wake t at d, or stops it for 0.
func (t *Task) arm(d int64) {
	if d == t.timerAt {
		return
	}
	t.timerAt = d
	switch {
	case d == 0:
		t.timer.Stop()
	case t.timer == nil:
		t.timer = time.AfterFunc(time.Duration(d-sinceEpoch()), t.Wake)
	default:
		t.timer.Reset(time.Duration(d - sinceEpoch()))
	}
}

// Wake resumes t if it waits on its loop: its stop flag was set, or its
// deadline moved. Any goroutine may call it; nil is a no-op.
func (t *Task) Wake() {
	if t == nil || !t.waiting.Load() || t.woken.Swap(true) {
		return
	}
	t.loop.ring(t)
}

// Leave takes t off its loop for good, before it does what may block
// (a write to a client whose socket is full): the goroutine that called
// Run carries it on, and its waits are the ordinary ones. For t's own
// code; a no-op off a loop.
func (t *Task) Leave() {
	if !t.Attached() {
		return
	}
	t.attached.Store(false)
	t.unregister()
	t.yield(leave)
}

// unregister takes t's socket out of the loop's set, if it is still
// open: closed, its file is gone from the set with it.
func (t *Task) unregister() {
	if t.reg == nil {
		return
	}
	raw, fd := t.reg, t.regFD
	t.reg = nil
	raw.Control(func(f uintptr) { //nolint:errcheck // closed: see above
		if int(f) == fd {
			t.loop.unregister(fd)
		}
	})
}
