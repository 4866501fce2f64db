//go:build linux

package readloop

import (
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
	"unsafe"
)

// pair is a loopback connection: the task reads r, the test writes w.
func pair(t *testing.T) (r *net.TCPConn, w net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	w, err = net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	c, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.Close(); c.Close() })
	return c.(*net.TCPConn), w
}

// loopReader reads a socket the way netclock's does on a loop: a read
// that finds nothing waits on the task.
type loopReader struct {
	raw      syscall.RawConn
	task     *Task
	stop     atomic.Bool
	deadline atomic.Int64
	buf      []byte
	n        int
	out      Outcome
}

func (r *loopReader) read() (int, Outcome) {
	r.n, r.out = 0, Ready
	r.raw.Read(func(fd uintptr) bool {
		for {
			n, _, errno := syscall.RawSyscall(syscall.SYS_READ, fd, uintptr(unsafe.Pointer(&r.buf[0])), uintptr(len(r.buf)))
			if errno == syscall.EAGAIN {
				if !r.task.Attached() {
					return false
				}
				if r.out = r.task.WaitReadable(r.raw, fd, &r.stop, &r.deadline); r.out != Ready {
					return true
				}
				continue
			}
			r.n = int(n)
			return true
		}
	})
	return r.n, r.out
}

func newLoopReader(t *testing.T, c *net.TCPConn) *loopReader {
	raw, err := c.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	return &loopReader{raw: raw, buf: make([]byte, 64)}
}

func testLoop(t *testing.T) *Loop {
	l, err := newLoop()
	if err != nil {
		t.Fatal(err)
	}
	go l.run()
	return l
}

func TestATaskReadsWhatArrivesAndTheOthersGoOn(t *testing.T) {
	l := testLoop(t)
	// A silent stream on the same loop does not hold the others up.
	silentConn, _ := pair(t)
	silent := newLoopReader(t, silentConn)
	silentDone, silentTask := make(chan Outcome, 1), make(chan *Task, 1)
	go l.Run(func(task *Task) {
		silent.task = task
		silentTask <- task
		_, out := silent.read()
		silentDone <- out
	})
	const streams, events = 8, 20
	var wg sync.WaitGroup
	for range streams {
		c, w := pair(t)
		r := newLoopReader(t, c)
		wg.Add(1)
		go func() {
			defer wg.Done()
			got := make(chan string, events)
			go l.Run(func(task *Task) {
				r.task = task
				for range events {
					n, out := r.read()
					if out != Ready || n == 0 {
						got <- "failed"
						return
					}
					got <- string(r.buf[:n])
				}
			})
			for i := range events {
				msg := string(rune('a' + i))
				if _, err := w.Write([]byte(msg)); err != nil {
					t.Error(err)
					return
				}
				if g := <-got; g != msg {
					t.Errorf("event %d: got %q, want %q", i, g, msg)
					return
				}
			}
		}()
	}
	wg.Wait()
	// Stopped and woken, the silent one ends, whether it waits yet or
	// not: it reads the flag as its wait begins.
	silent.stop.Store(true)
	(<-silentTask).Wake()
	if out := <-silentDone; out != Stopped {
		t.Fatalf("silent stream: %v, want Stopped", out)
	}
}

func TestAReadPastItsDeadlineTimesOut(t *testing.T) {
	l := testLoop(t)
	c, w := pair(t)
	r := newLoopReader(t, c)
	// Causal bounds only: it waited at least its 20 ms, and the stream
	// went on after it (the deadline cleared).
	start := time.Now()
	r.deadline.Store(Deadline(start.Add(20 * time.Millisecond)))
	outs := make(chan Outcome, 2)
	go l.Run(func(task *Task) {
		r.task = task
		_, out := r.read()
		outs <- out
		r.deadline.Store(0)
		_, out = r.read()
		outs <- out
	})
	if out := <-outs; out != TimedOut {
		t.Fatalf("got %v, want TimedOut", out)
	}
	if waited := time.Since(start); waited < 20*time.Millisecond {
		t.Fatalf("timed out after %v, before its deadline", waited)
	}
	w.Write([]byte("x"))
	if out := <-outs; out != Ready {
		t.Fatalf("after the deadline was cleared: %v, want Ready", out)
	}
}

func TestALeftTaskGoesOnOnItsOwnGoroutine(t *testing.T) {
	l := testLoop(t)
	c, w := pair(t)
	r := newLoopReader(t, c)
	// After Leave, a wait that blocks its goroutine does not hold the
	// loop: a task started after it still reads.
	release := make(chan struct{})
	done := make(chan bool, 1)
	go l.Run(func(task *Task) {
		r.task = task
		task.Leave()
		<-release
		n, out := r.read() // the ordinary wait, in Go's poller
		done <- n == 1 && out == Ready && !task.Attached()
	})
	c2, w2 := pair(t)
	r2 := newLoopReader(t, c2)
	got := make(chan int, 1)
	go l.Run(func(task *Task) {
		r2.task = task
		n, _ := r2.read()
		got <- n
	})
	w2.Write([]byte("y"))
	if n := <-got; n != 1 {
		t.Fatalf("the other task read %d bytes", n)
	}
	close(release)
	w.Write([]byte("x"))
	if !<-done {
		t.Fatal("the task that left did not read on its own")
	}
}

func TestAPanicInATaskIsRaisedInRunAndTheLoopGoesOn(t *testing.T) {
	l := testLoop(t)
	func() {
		defer func() {
			if r := recover(); r != "boom" {
				t.Fatalf("recovered %v, want boom", r)
			}
		}()
		l.Run(func(*Task) { panic("boom") })
		t.Fatal("Run returned")
	}()
	ran := false
	l.Run(func(*Task) { ran = true })
	if !ran {
		t.Fatal("the loop did not run the next task")
	}
}
