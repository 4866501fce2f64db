package netclock

import (
	"errors"
	"io"
	"net"
	"os"
	"strings"
	"testing"
	"time"
)

// tcpPair is a loopback TCP connection: the writer's end and the reader's,
// wrapped as the sidecar wraps its connections.
func tcpPair(t testing.TB, kernel bool) (net.Conn, *Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		accepted <- c
	}()
	w, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	r := <-accepted
	if r == nil {
		t.Fatal("accept failed")
	}
	rc := New(r, kernel)
	t.Cleanup(func() { w.Close(); rc.Close() })
	return w, rc
}

// conversionSlack widens the bounds a kernel stamp is checked against: the
// stamp is the kernel's wall clock, converted to the monotonic one with a
// reading of both (fromKernel), which a thread preempted at the wrong
// moment skews. Far below the 50 ms a held read is late by.
const conversionSlack = 2 * time.Millisecond

// inWrite tells whether a stamp lies within a write, give or take the
// conversion's slack.
func inWrite(stamp, before, after time.Time) bool {
	return !stamp.Before(before.Add(-conversionSlack)) && !stamp.After(after.Add(conversionSlack))
}

// write writes s and returns the times just before and just after.
func write(t *testing.T, c net.Conn, s string) (before, after time.Time) {
	t.Helper()
	before = time.Now()
	if _, err := io.WriteString(c, s); err != nil {
		t.Fatal(err)
	}
	return before, time.Now()
}

// needKernelStamps skips a test where the kernel gives no receive
// timestamps, and otherwise waits until it stamps.
func needKernelStamps(t *testing.T) {
	t.Helper()
	if !KernelTimestamps() {
		t.Skip("this platform gives no kernel receive timestamps; the fallback is tested on its own")
	}
	if err := WaitForKernelStamps(10 * time.Second); err != nil {
		t.Fatal(err)
	}
}

// A late reader still gets the time the bytes arrived: the stamp lies
// within the writer's write, though the read began 50 ms after it.
func TestKernelStampIsTheArrivalNotTheRead(t *testing.T) {
	needKernelStamps(t)
	w, rc := tcpPair(t, true)
	if rc.kernel == nil {
		t.Fatal("receive timestamps not enabled on a TCP socket")
	}
	rc.Hold = func() { time.Sleep(50 * time.Millisecond) }
	before, after := write(t, w, "data: one\n\n")
	buf := make([]byte, 64)
	n, err := rc.Read(buf)
	if err != nil || string(buf[:n]) != "data: one\n\n" {
		t.Fatalf("read %q, %v", buf[:n], err)
	}
	if !inWrite(rc.Received, before, after) {
		t.Errorf("stamp %v after the write began, want within the write (%v long); the read began %v after it",
			rc.Received.Sub(before), after.Sub(before), 50*time.Millisecond)
	}
}

// Bytes that arrived in two writes and are read at once carry the later
// write's stamp: the segment that completed the read.
func TestKernelStampOfAMergedReadIsItsLastSegment(t *testing.T) {
	needKernelStamps(t)
	w, rc := tcpPair(t, true)
	write(t, w, "first ")
	time.Sleep(20 * time.Millisecond) // two arrivals apart in time, not a synchronisation
	before, after := write(t, w, "second")
	buf := make([]byte, 64)
	got := ""
	for len(got) < len("first second") {
		n, err := rc.Read(buf)
		if err != nil {
			t.Fatal(err)
		}
		got += string(buf[:n])
	}
	if !inWrite(rc.Received, before, after) {
		t.Errorf("stamp %v after the second write began, want within it (%v long)", rc.Received.Sub(before), after.Sub(before))
	}
}

// Without kernel stamps a read's time is the clock at the read: after a
// late reader's hold, never before it.
func TestFallbackStampIsTheClockAtTheRead(t *testing.T) {
	for _, tc := range []struct {
		name string
		pair func(t *testing.T) (net.Conn, *Conn)
	}{
		{"kernel stamps off", func(t *testing.T) (net.Conn, *Conn) { return tcpPair(t, false) }},
		{"not a socket", func(t *testing.T) (net.Conn, *Conn) {
			a, b := net.Pipe()
			rc := New(b, true)
			t.Cleanup(func() { a.Close(); b.Close() })
			return a, rc
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w, rc := tc.pair(t)
			if rc.kernel != nil {
				t.Fatal("kernel reads on a connection that should fall back")
			}
			var held time.Time
			rc.Hold = func() { time.Sleep(50 * time.Millisecond); held = time.Now() }
			go io.WriteString(w, "data: one\n\n") //nolint:errcheck // a pipe blocks until read
			buf := make([]byte, 64)
			if _, err := rc.Read(buf); err != nil {
				t.Fatal(err)
			}
			if rc.Received.Before(held) || rc.Received.After(time.Now()) {
				t.Errorf("stamp %v from the hold's end, want the clock at the read, after it", rc.Received.Sub(held))
			}
		})
	}
}

// The receive-stamped read keeps net.Conn's behaviour: data, a deadline,
// a close from another goroutine, the peer's close.
func TestKernelReadKeepsConnSemantics(t *testing.T) {
	needKernelStamps(t)
	t.Run("deadline", func(t *testing.T) {
		_, rc := tcpPair(t, true)
		rc.SetReadDeadline(time.Now().Add(30 * time.Millisecond)) //nolint:errcheck
		_, err := rc.Read(make([]byte, 16))
		var ne net.Error
		if !errors.As(err, &ne) || !ne.Timeout() || !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Errorf("read past the deadline: %v, want a timeout", err)
		}
		// A deadline is not the end: a later deadline lets data through.
		rc.SetReadDeadline(time.Time{}) //nolint:errcheck
	})
	t.Run("closed while reading", func(t *testing.T) {
		_, rc := tcpPair(t, true)
		done := make(chan error, 1)
		go func() {
			_, err := rc.Read(make([]byte, 16))
			done <- err
		}()
		time.Sleep(10 * time.Millisecond) // let the read block; if it has not yet, it meets a closed conn: the same error
		rc.Close()
		if err := <-done; !errors.Is(err, net.ErrClosed) {
			t.Errorf("read on a closed conn: %v, want net.ErrClosed", err)
		}
	})
	t.Run("peer closes after data", func(t *testing.T) {
		w, rc := tcpPair(t, true)
		write(t, w, "last")
		w.Close()
		got, err := io.ReadAll(rc)
		if err != nil || string(got) != "last" {
			t.Errorf("read %q, %v; want the data, then EOF", got, err)
		}
	})
	t.Run("data that arrived between two reads", func(t *testing.T) {
		// A read that waited for readiness before reading would miss it:
		// the poller's readiness is reset as each read begins.
		w, rc := tcpPair(t, true)
		buf := make([]byte, 64)
		write(t, w, "one")
		if n, err := rc.Read(buf); err != nil || string(buf[:n]) != "one" {
			t.Fatalf("read %q, %v", buf[:n], err)
		}
		before, after := write(t, w, "two")                 // while nobody reads
		rc.SetReadDeadline(time.Now().Add(5 * time.Second)) //nolint:errcheck // a stall fails, not hangs
		if n, err := rc.Read(buf); err != nil || string(buf[:n]) != "two" {
			t.Fatalf("read %q, %v; want the bytes already there", buf[:n], err)
		}
		if !inWrite(rc.Received, before, after) {
			t.Errorf("stamp %v after the write began, want within it (%v long)", rc.Received.Sub(before), after.Sub(before))
		}
	})
	t.Run("data after a wait", func(t *testing.T) {
		w, rc := tcpPair(t, true)
		read := make(chan string, 1)
		go func() {
			buf := make([]byte, 16)
			n, _ := rc.Read(buf)
			read <- string(buf[:n])
		}()
		time.Sleep(10 * time.Millisecond) // the read parks on the poller first
		before, after := write(t, w, "late")
		if got := <-read; got != "late" {
			t.Fatalf("read %q", got)
		}
		if !inWrite(rc.Received, before, after) {
			t.Errorf("stamp %v after the write began, want within it (%v long)", rc.Received.Sub(before), after.Sub(before))
		}
	})
}

func TestKernelReadAllocatesNothing(t *testing.T) {
	needKernelStamps(t)
	w, rc := tcpPair(t, true)
	buf := make([]byte, 64)
	msg := []byte("data: x\n\n")
	allocs := testing.AllocsPerRun(50, func() {
		w.Write(msg) //nolint:errcheck
		got := 0
		for got < len(msg) {
			n, err := rc.Read(buf)
			if err != nil {
				t.Fatal(err)
			}
			got += n
		}
	})
	if allocs != 0 {
		t.Errorf("a write and its stamped read allocate %v times, want 0", allocs)
	}
}

// BenchmarkRead is one loopback write and the read that takes it, plainly
// and receive-stamped: the cost of the stamp per read.
func BenchmarkRead(b *testing.B) {
	for _, kernel := range []bool{false, true} {
		name := map[bool]string{false: "clock at the read", true: "kernel receive time"}[kernel]
		b.Run(name, func(b *testing.B) {
			if kernel && !KernelTimestamps() {
				b.Skip("no kernel receive timestamps here")
			}
			w, rc := tcpPair(b, kernel)
			msg := []byte("data: " + strings.Repeat("x", 292) + "\n\n") // an event of 300 bytes
			buf := make([]byte, 4096)
			b.ReportAllocs()
			for b.Loop() {
				w.Write(msg) //nolint:errcheck
				for got := 0; got < len(msg); {
					n, err := rc.Read(buf)
					if err != nil {
						b.Fatal(err)
					}
					got += n
				}
			}
		})
	}
}
