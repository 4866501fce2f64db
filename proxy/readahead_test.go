package proxy

import (
	"bytes"
	"errors"
	"io"
	"log/slog"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/timing-sidecar/timing-sidecar/proxy/membudget"
	"github.com/timing-sidecar/timing-sidecar/proxy/netclock"
	"github.com/timing-sidecar/timing-sidecar/proxy/upstream"
	"github.com/timing-sidecar/timing-sidecar/telemetry"
)

// stampedChunks is an engine body read in set chunks, each read stamping
// the exchange's receive time as the connection would.
type stampedChunks struct {
	x      *upstream.Exchange
	chunks [][]byte
	at     []time.Time
	i      int
}

func (s *stampedChunks) Read(p []byte) (int, error) {
	if s.i == len(s.chunks) {
		return 0, io.EOF
	}
	n := copy(p, s.chunks[s.i])
	s.chunks[s.i] = s.chunks[s.i][n:]
	s.x.Recv.Received = s.at[s.i]
	if len(s.chunks[s.i]) == 0 {
		s.i++
	}
	return n, nil
}

// TestReadAheadKeepsBytesAndStamps: through the read-ahead's ring, which
// wraps and fills many times over, the relay reads the engine's bytes
// unchanged and in order, each read within one engine read and stamped
// with its receive time; and the budget is given back.
func TestReadAheadKeepsBytesAndStamps(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	t0 := time.Now()
	var want []byte
	var ends []int // where each engine read's bytes end in the stream
	var at []time.Time
	src := &stampedChunks{x: &upstream.Exchange{Recv: &netclock.Conn{}}}
	for i := range 3000 {
		c := make([]byte, 1+rng.IntN(1200))
		for j := range c {
			c[j] = byte(rng.Uint32())
		}
		want = append(want, c...)
		ends = append(ends, len(want))
		at = append(at, t0.Add(time.Duration(i)*time.Millisecond))
		src.chunks = append(src.chunks, c)
	}
	src.at = at
	p := &Proxy{bodies: membudget.New(DefaultMaxBodyMemory)}
	var s streamSource
	s.reset(p, src.x, src)
	s.clientBlocked()
	if s.ahead == nil {
		t.Fatal("no read-ahead with room in the budget")
	}
	var got []byte
	buf := make([]byte, 4096)
	for {
		n, err := s.Read(buf[:1+rng.IntN(len(buf))])
		got = append(got, buf[:n]...)
		if n > 0 {
			k := 0
			for ends[k] < len(got) {
				k++
			}
			if s.received() != at[k] {
				t.Fatalf("after %d bytes: stamp of read %d, want %d", len(got), int(s.received().Sub(t0)/time.Millisecond), k)
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
	if ran, _ := s.close(func() { t.Error("aborted a stream that ended") }); !ran {
		t.Fatal("no read-ahead ran")
	}
	if used := p.bodies.Used(); used != 0 {
		t.Fatalf("%d bytes of the budget still held", used)
	}
}

// panickingBody is an engine body whose read panics: a bug below the
// read-ahead's goroutine.
type panickingBody struct{}

func (panickingBody) Read([]byte) (int, error) { panic("engine body bug") }

// TestReadAheadPanicEndsOnlyItsStream: a panic on the read-ahead's own
// goroutine ends that stream's reads with an error, is counted and
// logged, and leaves the process, and the budget, as they were.
func TestReadAheadPanicEndsOnlyItsStream(t *testing.T) {
	var log syncBuffer
	p := &Proxy{bodies: membudget.New(DefaultMaxBodyMemory), registry: newRegistry(),
		log: slog.New(slog.NewJSONHandler(&log, nil))}
	p.telemetry = telemetry.NewRecorder(p.registry, telemetry.Options{})
	var s streamSource
	x := &upstream.Exchange{Recv: &netclock.Conn{}}
	s.reset(p, x, panickingBody{})
	s.clientBlocked()
	if s.ahead == nil {
		t.Fatal("no read-ahead with room in the budget")
	}
	if _, err := s.Read(make([]byte, 64)); !errors.Is(err, errPanic) {
		t.Fatalf("read after the read-ahead panicked: %v, want errPanic", err)
	}
	s.close(func() {})
	if n := counterValue(t, p, "timing_sidecar_panics_total", nil); n != 1 {
		t.Fatalf("panics counted: %v", n)
	}
	if !strings.Contains(log.String(), "engine body bug") {
		t.Fatalf("the panic is not logged: %s", log.String())
	}
	if used := p.bodies.Used(); used != 0 {
		t.Fatalf("%d bytes of the budget still held", used)
	}
}
