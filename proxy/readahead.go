package proxy

import (
	"io"
	"time"

	"github.com/timing-sidecar/timing-sidecar/proxy/readahead"
	"github.com/timing-sidecar/timing-sidecar/proxy/upstream"
)

// streamSource is the engine's side of an event stream as the relay reads
// it, with the receive time of what it read last. While the client keeps
// up, the relay reads the engine itself, on its own goroutine. Once a
// write to the client waits (its socket's send buffer full: it paused, or
// reads slower than the engine sends), a read-ahead takes over the
// engine's side: a goroutine that keeps reading it, each read with its
// own receive time, into a bounded buffer the relay then drains. The marks
// stay the engine's while the client catches up; only past the bound does
// the engine wait for the client again, and the request is then counted
// as paced by its client.
type streamSource struct {
	p     *Proxy
	x     *upstream.Exchange
	body  io.Reader         // the engine's body; the read-ahead's once it runs
	at    time.Time         // when the bytes read last arrived
	ahead *readahead.Reader // nil until a write to the client first waits
	ended bool              // the relay has read the stream's end
}

// clientPacedAfter is how long the engine may wait on a client before the
// request counts as paced by it: a blip of a few milliseconds moves no
// figure anyone reads.
const clientPacedAfter = 10 * time.Millisecond

func (s *streamSource) reset(p *Proxy, x *upstream.Exchange, body io.Reader) {
	*s = streamSource{p: p, x: x, body: body}
}

func (s *streamSource) Read(b []byte) (n int, err error) {
	if s.ahead != nil {
		n, err = s.ahead.ReadStamped(b, &s.at)
	} else {
		n, err = s.body.Read(b)
		s.at = s.x.Received()
	}
	if err != nil {
		s.ended = true
	}
	return n, err
}

// received is when the bytes read last arrived from the engine.
func (s *streamSource) received() time.Time { return s.at }

// await waits up to d for more of the engine's bytes and tells whether
// any are there (see exchange.awaitBytes).
func (s *streamSource) await(d time.Duration) bool {
	if s.ahead == nil {
		return s.x.AwaitBytes(d)
	}
	return s.ahead.Await(d)
}

// clientBlocked starts the read-ahead, when a write to the client first
// waits; it stays for the rest of the stream. It runs while the relay is
// inside that write and holds it there (clientconn.Conn.OnStall's
// contract), so it owns the relay's state: the relay is not reading the
// engine, and reads it only through the read-ahead from now on. Without room in the budget there is none, and the engine
// waits for the client as before.
func (s *streamSource) clientBlocked() {
	if s.ahead != nil || s.ended || !s.p.bodies.TakeAhead(readahead.Memory) {
		return
	}
	p := s.p // not s, which the relay's pool reuses once the stream is done
	s.ahead = readahead.Start(s.body, s.x.Received, func(r any) error {
		p.panicked(r)
		return errPanic
	})
}

// close ends the read-ahead, if one ran, once the relay is done (abort
// closes the engine's connection of a stream that did not end: see
// readahead.Reader.Stop), tells whether one ran and how long the engine
// waited on it for room, and gives back the budget.
func (s *streamSource) close(abort func()) (ran bool, waited time.Duration) {
	if s.ahead == nil {
		return false, 0
	}
	if s.ended {
		abort = nil
	}
	waited = s.ahead.Stop(abort)
	s.ahead = nil
	s.p.bodies.GiveAhead(readahead.Memory)
	return true, waited
}
