package proxy

import (
	"bytes"
	"io"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/timing-sidecar/timing-sidecar/proxy/netclock"
	"github.com/timing-sidecar/timing-sidecar/proxy/upstream"
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
	p := &Proxy{bodies: newBodyBudget(DefaultMaxBodyMemory)}
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
	if used := p.bodies.used.Load(); used != 0 {
		t.Fatalf("%d bytes of the budget still held", used)
	}
}
