package readahead

import (
	"bytes"
	"errors"
	"io"
	"math/rand/v2"
	"testing"
	"testing/synctest"
	"time"
)

// stampedChunks is an engine body read in set chunks, each read setting
// the receive time as the connection would.
type stampedChunks struct {
	chunks [][]byte
	at     []time.Time
	i      int
	last   time.Time
}

func (s *stampedChunks) Read(p []byte) (int, error) {
	if s.i == len(s.chunks) {
		return 0, io.EOF
	}
	n := copy(p, s.chunks[s.i])
	s.chunks[s.i] = s.chunks[s.i][n:]
	s.last = s.at[s.i]
	if len(s.chunks[s.i]) == 0 {
		s.i++
	}
	return n, nil
}

func (s *stampedChunks) received() time.Time { return s.last }

// TestKeepsBytesAndStamps: through the ring, which wraps and fills many
// times over, the relay reads the engine's bytes unchanged and in order,
// each read within one engine read and stamped with its receive time.
func TestKeepsBytesAndStamps(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	t0 := time.Now()
	var want []byte
	var ends []int // where each engine read's bytes end in the stream
	src := &stampedChunks{}
	for i := range 3000 {
		c := make([]byte, 1+rng.IntN(1200))
		for j := range c {
			c[j] = byte(rng.Uint32())
		}
		want = append(want, c...)
		ends = append(ends, len(want))
		src.at = append(src.at, t0.Add(time.Duration(i)*time.Millisecond))
		src.chunks = append(src.chunks, c)
	}
	a := Start(src, src.received, func(any) error { t.Error("panicked"); return nil })
	var got []byte
	var at time.Time
	buf := make([]byte, 4096)
	for {
		n, err := a.ReadStamped(buf[:1+rng.IntN(len(buf))], &at)
		got = append(got, buf[:n]...)
		if n > 0 {
			k := 0
			for ends[k] < len(got) {
				k++
			}
			if at != src.at[k] {
				t.Fatalf("after %d bytes: stamp of read %d, want %d", len(got), int(at.Sub(t0)/time.Millisecond), k)
			}
			if k > 0 && len(got)-n < ends[k-1] {
				t.Fatalf("a read took bytes of engine reads %d and %d: they would share one stamp", k-1, k)
			}
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if rng.IntN(50) == 0 {
			time.Sleep(time.Millisecond) // a slow relay now and then: the ring fills
		}
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("%d bytes out, %d in, not the same", len(got), len(want))
	}
	a.Stop(nil)
}

// endless is an engine that sends forever, as fast as it is read.
type endless struct{}

func (endless) Read(p []byte) (int, error) { return len(p), nil }

// TestTheEngineWaitsOnlyPastTheBound: the ring takes the engine's bytes
// until it is full; only then does the engine wait, and Stop reports how
// long it waited. synctest's clock makes the wait exact.
func TestTheEngineWaitsOnlyPastTheBound(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a := Start(endless{}, time.Now, func(any) error { return nil })
		synctest.Wait() // the ring is full; the goroutine waits for room
		a.mu.Lock()
		full := a.n == Size || a.mn == Reads
		a.mu.Unlock()
		if !full {
			t.Fatal("the goroutine waits with room in the ring")
		}
		time.Sleep(3 * time.Second) // the client's pause
		var at time.Time
		if n, err := a.ReadStamped(make([]byte, 100), &at); n == 0 || err != nil {
			t.Fatalf("read %d, %v", n, err)
		}
		synctest.Wait() // the goroutine took the room and is full again
		if waited := a.Stop(nil); waited != 3*time.Second {
			t.Fatalf("the engine waited %v, want the client's pause of 3s", waited)
		}
	})
}

// TestAwait: Await sees bytes and the end, and gives up on silence.
func TestAwait(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r, w := io.Pipe()
		a := Start(r, time.Now, func(any) error { return nil })
		if a.Await(time.Second) {
			t.Fatal("Await saw bytes on a silent engine")
		}
		go w.Write([]byte("data: x\n\n")) //nolint:errcheck
		if !a.Await(time.Second) {
			t.Fatal("Await missed the engine's bytes")
		}
		a.ReadStamped(make([]byte, 64), new(time.Time)) //nolint:errcheck
		w.Close()
		if !a.Await(time.Second) {
			t.Fatal("Await missed the stream's end")
		}
		if _, err := a.ReadStamped(make([]byte, 64), new(time.Time)); err != io.EOF {
			t.Fatalf("read at the end: %v", err)
		}
		a.Stop(nil)
	})
}

// TestStopEndsAReadInProgress: Stop on a stream that did not end aborts
// the engine's read the goroutine waits in, and returns once it has.
func TestStopEndsAReadInProgress(t *testing.T) {
	r, w := io.Pipe()
	a := Start(r, time.Now, func(any) error { return nil })
	aborted := false
	a.Stop(func() { aborted = true; w.CloseWithError(errors.New("aborted")) })
	if !aborted {
		t.Fatal("abort not called")
	}
	select {
	case <-a.done:
	default:
		t.Fatal("Stop returned before the goroutine did")
	}
}

type panickingBody struct{}

func (panickingBody) Read([]byte) (int, error) { panic("engine body bug") }

// TestAPanicEndsTheReads: a panic below the goroutine ends the stream's
// reads with the error onPanic returns for it.
func TestAPanicEndsTheReads(t *testing.T) {
	errBug := errors.New("bug")
	var recovered any
	a := Start(panickingBody{}, time.Now, func(r any) error { recovered = r; return errBug })
	if _, err := a.ReadStamped(make([]byte, 64), new(time.Time)); err != errBug {
		t.Fatalf("read after a panic: %v", err)
	}
	a.Stop(nil)
	if recovered != "engine body bug" {
		t.Fatalf("onPanic got %v", recovered)
	}
}
