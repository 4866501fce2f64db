package proxy

import (
	"errors"
	"io"
	"log/slog"
	"strings"
	"testing"

	"github.com/timing-sidecar/timing-sidecar/proxy/membudget"
	"github.com/timing-sidecar/timing-sidecar/proxy/netclock"
	"github.com/timing-sidecar/timing-sidecar/proxy/readahead"
	"github.com/timing-sidecar/timing-sidecar/proxy/upstream"
	"github.com/timing-sidecar/timing-sidecar/telemetry"
)

// TestReadAheadTakesItsRoom: a stalled client's stream gets a read-ahead
// only with room in the budget, holds readahead.Memory while it runs, and
// gives it back when the relay is done; the relay then reads the engine's
// bytes through it.
func TestReadAheadTakesItsRoom(t *testing.T) {
	// Read-aheads together hold a quarter of the budget: room for one.
	p := &Proxy{bodies: membudget.New(4 * readahead.Memory)}
	x := &upstream.Exchange{Recv: &netclock.Conn{}}
	var s streamSource
	s.reset(p, x, strings.NewReader("data: x\n\n"))
	s.clientBlocked()
	if s.ahead == nil || p.bodies.Used() != readahead.Memory {
		t.Fatalf("read-ahead %v holding %d of the budget, want %d", s.ahead != nil, p.bodies.Used(), readahead.Memory)
	}
	var other streamSource
	other.reset(p, x, strings.NewReader(""))
	if other.clientBlocked(); other.ahead != nil {
		t.Fatal("a second read-ahead without room in the budget")
	}
	if got, err := io.ReadAll(&s); string(got) != "data: x\n\n" || err != nil {
		t.Fatalf("read %q, %v through the read-ahead", got, err)
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
	p := &Proxy{bodies: membudget.New(DefaultMaxBodyMemory), registry: telemetry.NewRegistry(),
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
