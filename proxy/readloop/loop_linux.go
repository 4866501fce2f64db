//go:build linux

package readloop

import (
	"errors"
	"iter"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"unsafe"
)

// Loop is one goroutine that resumes the tasks whose sockets have bytes.
type Loop struct {
	epfd int
	// poll is the epoll set's descriptor in Go's poller: the loop parks
	// there while no socket of its set has bytes.
	poll syscall.RawConn
	file *os.File
	// bell is an eventfd in the epoll set: Run and Wake ring it to hand
	// the loop a task to start or resume.
	bell int

	mu     sync.Mutex
	queued []*Task // to start or resume, rung in by Run and Wake
	rung   bool

	// Only the loop's goroutine, and its tasks, touch what follows.
	slots  []*Task  // a task registered, by its slot
	free   []uint32 // slots free for reuse
	gens   []uint32 // each slot's generation: an event of an earlier task is dropped
	events [128]syscall.EpollEvent
	ready  int // events of the latest wait
	taken  []*Task
	waitFD func(fd uintptr) bool
}

// bellSlot marks the bell's events: no task's slot.
const bellSlot int32 = -1

var (
	shared     []*Loop
	sharedOnce sync.Once
	sharedNext atomic.Uint32
)

// Shared returns one of the process's loops, started at the first call;
// nil where epoll cannot be used. A loop lives as long as the process, as
// Go's own poller does.
//
// There is a loop for each CPU the runtime uses, as nginx has a worker
// for each core. A stream stays on its loop, and while the loop's thread
// waits for a CPU its streams wait with it, where Go's scheduler would
// have moved their goroutines to another thread: on a CPU-starved node,
// a loop's share of the streams is what waits. One loop for two CPUs took
// about 8% less CPU per event, measured side by side, but its streams'
// marks erred more under contention (time to first token, p99, in two of
// seven runs over 0.5 ms, against none of three with two loops).
func Shared() *Loop {
	sharedOnce.Do(func() {
		for range runtime.GOMAXPROCS(0) {
			l, err := newLoop()
			if err != nil {
				return // the loops made serve; none, and there are none
			}
			shared = append(shared, l)
			go l.run()
		}
	})
	if len(shared) == 0 {
		return nil
	}
	return shared[sharedNext.Add(1)%uint32(len(shared))]
}

func newLoop() (*Loop, error) {
	epfd, err := syscall.EpollCreate1(syscall.EPOLL_CLOEXEC)
	if err != nil {
		return nil, err
	}
	bell, _, errno := syscall.RawSyscall(syscall.SYS_EVENTFD2, 0, syscall.O_NONBLOCK|syscall.O_CLOEXEC, 0)
	if errno != 0 {
		syscall.Close(epfd)
		return nil, errno
	}
	l := &Loop{epfd: epfd, bell: int(bell)}
	ev := syscall.EpollEvent{Events: syscall.EPOLLIN, Fd: bellSlot}
	if err := syscall.EpollCtl(epfd, syscall.EPOLL_CTL_ADD, l.bell, &ev); err != nil {
		l.closeFDs()
		return nil, err
	}
	// Non-blocking, so that os.NewFile puts it in Go's poller.
	if err := syscall.SetNonblock(epfd, true); err != nil {
		l.closeFDs()
		return nil, err
	}
	l.file = os.NewFile(uintptr(epfd), "readloop")
	if l.poll, err = l.file.SyscallConn(); err != nil {
		l.closeFDs()
		return nil, err
	}
	l.waitFD = l.epollWait
	return l, nil
}

func (l *Loop) closeFDs() {
	syscall.Close(l.bell)
	syscall.Close(l.epfd)
}

// run is the loop: wait, then resume each task its events name.
func (l *Loop) run() {
	for {
		if err := l.poll.Read(l.waitFD); err != nil {
			panic("readloop: the epoll set failed: " + err.Error())
		}
		for i := range l.ready {
			ev := &l.events[i]
			if ev.Fd == bellSlot {
				l.answerBell()
				continue
			}
			l.resumeSlot(uint32(ev.Fd), uint32(ev.Pad))
		}
	}
}

// epollWait takes the ready events without waiting; false asks Go's
// poller to wait for the set to have some. A raw system call: it never
// blocks (see netclock's socketWriter.writeRaw).
func (l *Loop) epollWait(fd uintptr) bool {
	for {
		n, _, errno := syscall.RawSyscall6(syscall.SYS_EPOLL_PWAIT, fd,
			uintptr(unsafe.Pointer(&l.events[0])), uintptr(len(l.events)), 0, 0, 0)
		switch errno {
		case 0:
			l.ready = int(n)
			return n > 0
		case syscall.EINTR:
			continue
		}
		panic("readloop: epoll_pwait: " + errno.Error())
	}
}

// resumeSlot resumes the task registered in slot, if the event is its.
func (l *Loop) resumeSlot(slot, gen uint32) {
	if int(slot) >= len(l.slots) || l.gens[slot] != gen {
		return
	}
	if t := l.slots[slot]; t != nil && t.waiting.Load() {
		t.readable = true
		l.resume(t)
		t.readable = false
	}
}

// answerBell starts and resumes the tasks rung in.
func (l *Loop) answerBell() {
	var b [8]byte
	syscall.RawSyscall(syscall.SYS_READ, uintptr(l.bell), uintptr(unsafe.Pointer(&b[0])), 8) //nolint:errcheck // emptied; EAGAIN if already
	l.mu.Lock()
	l.taken, l.queued = l.queued, l.taken[:0]
	l.rung = false
	l.mu.Unlock()
	for i, t := range l.taken {
		l.taken[i] = nil
		t.woken.Store(false)
		switch {
		case !t.started:
			t.started = true
			l.take(t)
			l.resume(t)
		case t.waiting.Load():
			l.resume(t)
		}
	}
}

// ring hands t to the loop.
func (l *Loop) ring(t *Task) {
	l.mu.Lock()
	l.queued = append(l.queued, t)
	first := !l.rung
	l.rung = true
	l.mu.Unlock()
	if first {
		one := uint64(1)
		syscall.RawSyscall(syscall.SYS_WRITE, uintptr(l.bell), uintptr(unsafe.Pointer(&one)), 8) //nolint:errcheck // a full counter is rung already
	}
}

// take gives t a slot.
func (l *Loop) take(t *Task) {
	if n := len(l.free); n > 0 {
		t.slot = l.free[n-1]
		l.free = l.free[:n-1]
	} else {
		t.slot = uint32(len(l.slots))
		l.slots = append(l.slots, nil)
		l.gens = append(l.gens, 0)
	}
	l.slots[t.slot] = t
}

// give frees t's slot: events still queued for it are dropped.
func (l *Loop) give(t *Task) {
	l.slots[t.slot] = nil
	l.gens[t.slot]++
	l.free = append(l.free, t.slot)
}

// resume runs t until it waits again, leaves, or ends.
func (l *Loop) resume(t *Task) {
	t.waiting.Store(false)
	why, more := t.next()
	switch {
	case !more:
		l.give(t)
		t.ended = true
		t.back <- struct{}{}
	case why == leave:
		l.give(t)
		t.back <- struct{}{}
	}
	// Otherwise it waits for a read (waiting is set).
}

// register adds fd to the set for t, level-triggered: readable until
// read dry. Called on the loop, with fd held open (inside raw's Read).
func (l *Loop) register(t *Task, fd int) error {
	ev := syscall.EpollEvent{Events: syscall.EPOLLIN | syscall.EPOLLRDHUP, Fd: int32(t.slot), Pad: int32(l.gens[t.slot])}
	err := syscall.EpollCtl(l.epfd, syscall.EPOLL_CTL_ADD, fd, &ev)
	if errors.Is(err, syscall.EEXIST) {
		err = syscall.EpollCtl(l.epfd, syscall.EPOLL_CTL_MOD, fd, &ev)
	}
	return err
}

func (l *Loop) unregister(fd int) {
	syscall.EpollCtl(l.epfd, syscall.EPOLL_CTL_DEL, fd, nil) //nolint:errcheck // gone with its file already
}

// pull makes t's coroutine.
func pull(t *Task, fn func(*Task)) {
	t.next, t.stop = iter.Pull(func(yield func(reason) bool) {
		t.yield = yield
		defer t.finish()
		fn(t)
	})
}
