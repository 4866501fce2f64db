//go:build linux && (amd64 || arm64 || ppc64le || riscv64)

package netclock

import (
	"errors"
	"net"
	"testing"
	"time"

	"github.com/timing-sidecar/timing-sidecar/proxy/readloop"
)

// onLoop runs fn as a task of a loop, its reads of c on the loop, and
// returns at once; fn's result arrives on the channel.
func onLoop(t *testing.T, c *Conn, fn func() error) <-chan error {
	t.Helper()
	l := readloop.Shared()
	if l == nil {
		t.Skip("no epoll here")
	}
	done := make(chan error, 1)
	go l.Run(func(task *readloop.Task) {
		if !c.LoopReads(task) {
			done <- errors.New("no loop reads on this connection")
			return
		}
		defer c.LoopReads(nil)
		done <- fn()
	})
	return done
}

// On a loop, an arrival costs one read, stamped by the kernel: a read
// after one that took all the socket had waits for the loop's word, and
// none finds nothing.
func TestOnALoopAnArrivalCostsOneStampedRead(t *testing.T) {
	needKernelStamps(t)
	w, rc := tcpPair(t, true)
	const arrivals = 20
	type read struct {
		n  int
		at time.Time
	}
	got := make(chan read)
	next := make(chan struct{})
	done := onLoop(t, rc, func() error {
		buf := make([]byte, 64)
		for range arrivals {
			n, err := rc.Read(buf)
			if err != nil {
				return err
			}
			got <- read{n, rc.Received}
			<-next
		}
		return nil
	})
	var first int
	for i := range arrivals {
		before, after := write(t, w, "event")
		r := <-got
		if r.n != len("event") || !inWrite(r.at, before, after) {
			t.Fatalf("arrival %d: read %d bytes stamped %v, written within [%v, %v]", i, r.n, r.at, before, after)
		}
		if i == 0 {
			first = rc.kernel.recvmsgs // the first may try before the loop's word
		}
		next <- struct{}{}
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if reads := rc.kernel.recvmsgs - first; reads != arrivals-1 {
		t.Fatalf("%d reads for the %d arrivals after the first, want one each", reads, arrivals-1)
	}
}

// A read waiting on a loop ends as Go's poller ends one: net.ErrClosed
// when another goroutine closes the connection, a timeout at its
// deadline, and sooner when another goroutine moves the deadline nearer.
func TestOnALoopAWaitingReadEndsAsThePollersDo(t *testing.T) {
	t.Run("closed", func(t *testing.T) {
		_, rc := tcpPair(t, true)
		started := make(chan struct{})
		done := onLoop(t, rc, func() error {
			close(started)
			_, err := rc.Read(make([]byte, 8))
			return err
		})
		<-started
		if err := rc.Close(); err != nil {
			t.Fatal(err)
		}
		if err := <-done; !errors.Is(err, net.ErrClosed) {
			t.Fatalf("got %v, want net.ErrClosed", err)
		}
	})
	t.Run("deadline", func(t *testing.T) {
		_, rc := tcpPair(t, true)
		start := time.Now()
		rc.SetReadDeadline(start.Add(20 * time.Millisecond))
		done := onLoop(t, rc, func() error {
			_, err := rc.Read(make([]byte, 8))
			return err
		})
		err := <-done
		var ne net.Error
		if !errors.As(err, &ne) || !ne.Timeout() {
			t.Fatalf("got %v, want a timeout", err)
		}
		if waited := time.Since(start); waited < 20*time.Millisecond {
			t.Fatalf("timed out after %v, before the deadline", waited)
		}
	})
	t.Run("deadline moved nearer", func(t *testing.T) {
		_, rc := tcpPair(t, true)
		started := make(chan struct{})
		done := onLoop(t, rc, func() error {
			close(started)
			_, err := rc.Read(make([]byte, 8))
			return err
		})
		<-started
		// Without a deadline the read would wait for ever: this one
		// ends it.
		rc.SetReadDeadline(time.Now())
		var ne net.Error
		if err := <-done; !errors.As(err, &ne) || !ne.Timeout() {
			t.Fatalf("got %v, want a timeout", err)
		}
	})
}

// On a loop, a read and its wait allocate nothing: the task, the wait
// and the loop's resuming of it are made once per stream.
func TestOnALoopAReadAllocatesNothing(t *testing.T) {
	needKernelStamps(t)
	w, rc := tcpPair(t, true)
	buf := make([]byte, 64)
	msg := []byte("data: x\n\n")
	var allocs float64
	done := onLoop(t, rc, func() error {
		read := func() {
			w.Write(msg) //nolint:errcheck
			for got := 0; got < len(msg); {
				n, err := rc.Read(buf)
				if err != nil {
					t.Error(err)
					return
				}
				got += n
			}
		}
		read() // the socket's first wait registers it
		allocs = testing.AllocsPerRun(50, read)
		return nil
	})
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if allocs != 0 {
		t.Errorf("a write and its read on a loop allocate %v times, want 0", allocs)
	}
}
