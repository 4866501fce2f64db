package proxy

import (
	"io"
	"sync"
	"time"

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
	body  io.Reader  // the engine's body; the read-ahead's once it runs
	at    time.Time  // when the bytes read last arrived
	ahead *readAhead // nil until a write to the client first waits
	ended bool       // the relay has read the stream's end
}

// clientPacedAfter is how long the engine may wait on a client before the
// request counts as paced by it: a blip of a few milliseconds moves no
// figure anyone reads.
const clientPacedAfter = 10 * time.Millisecond

// readAheadBytes bounds a stream's read-ahead, taken from
// --max-body-memory: some thousands of events, seconds of a client's
// pause at any real engine's pace. readAheadReads bounds the reads it
// remembers the receive time of, one per engine read (an event, at a
// stream's pace).
const (
	readAheadBytes = 256 << 10
	readAheadReads = 2048
	// readAheadMemory is what a read-ahead takes from the budget: the
	// ring and its marks (32 bytes each).
	readAheadMemory = readAheadBytes + readAheadReads*32
)

// readAhead is a ring of the engine's bytes, written by the read-ahead's
// goroutine and read by the relay, with the receive time of each read.
type readAhead struct {
	mu   sync.Mutex
	buf  []byte
	r, n int // where the unread bytes start, and how many there are
	// marks are where each read's bytes end, counted from the stream's
	// start, and when they arrived: a ring, mr the oldest, mn many.
	marks        []aheadMark
	mr, mn       int
	total, taken int64         // bytes written into the ring, and read out of it
	err          error         // the engine side's end
	ready        chan struct{} // bytes or the end came (a signal, cap 1)
	room         chan struct{} // room came (a signal, cap 1)
	stop         chan struct{} // closed when the relay is done with the stream
	done         chan struct{} // closed when the goroutine has returned
	// waited is how long the goroutine waited for room: the engine held
	// back by the client. Read only after done.
	waited time.Duration
}

type aheadMark struct {
	end int64
	at  time.Time
}

func signal(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

func (s *streamSource) reset(p *Proxy, x *upstream.Exchange, body io.Reader) {
	*s = streamSource{p: p, x: x, body: body}
}

func (s *streamSource) Read(b []byte) (n int, err error) {
	if s.ahead != nil {
		n, err = s.ahead.read(b, &s.at)
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
	return s.ahead.await(d)
}

// clientBlocked starts the read-ahead, when a write to the client first
// waits; it stays for the rest of the stream. It runs while the relay is
// inside that write and holds it there (clientconn.Conn.OnStall's
// contract), so it owns the relay's state: the relay is not reading the
// engine, and reads it only through the read-ahead from now on. Without room in the budget there is none, and the engine
// waits for the client as before.
func (s *streamSource) clientBlocked() {
	if s.ahead != nil || s.ended || !s.p.bodies.TakeAhead(readAheadMemory) {
		return
	}
	a := &readAhead{buf: make([]byte, readAheadBytes), marks: make([]aheadMark, readAheadReads),
		ready: make(chan struct{}, 1), room: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{})}
	s.ahead = a
	go a.run(s.body, s.x, s.p.panicked)
}

// run reads the engine's side until its end, an error, or stop. It is a
// goroutine of the sidecar's own, so it is its own panic boundary: a
// panic ends the read-ahead with errPanic, which ends this request's
// stream and no other, and is logged and counted (onPanic). Every locked
// section is a function that unlocks on the way out, so that a panic
// cannot leave the relay waiting on the lock.
func (a *readAhead) run(body io.Reader, x *upstream.Exchange, onPanic func(any)) {
	defer close(a.done)
	defer func() {
		if r := recover(); r != nil {
			a.end(errPanic)
			onPanic(r)
		}
	}()
	for {
		w, free, ok := a.awaitRoom()
		if !ok {
			return
		}
		n, err := body.Read(a.buf[w : w+free])
		a.commit(n, x.Received())
		if err != nil {
			a.end(err)
			return
		}
		signal(a.ready)
	}
}

// awaitRoom waits for room in the ring and returns where it is: from the
// write position to the ring's end or to the unread bytes, which the
// relay does not touch. false when the relay is done.
func (a *readAhead) awaitRoom() (w, free int, ok bool) {
	for {
		if w, free, ok = a.writable(); ok {
			return w, free, true
		}
		full := time.Now()
		select {
		case <-a.room:
		case <-a.stop:
			return 0, 0, false
		}
		a.waited += time.Since(full)
	}
}

func (a *readAhead) writable() (w, free int, ok bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.n == len(a.buf) || a.mn == len(a.marks) {
		return 0, 0, false
	}
	w = (a.r + a.n) % len(a.buf)
	free = len(a.buf) - w
	if w < a.r {
		free = a.r - w
	}
	return w, free, true
}

// commit adds n bytes read, which arrived at at, to the ring.
func (a *readAhead) commit(n int, at time.Time) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.n += n
	a.total += int64(n)
	if n > 0 {
		a.marks[(a.mr+a.mn)%len(a.marks)] = aheadMark{end: a.total, at: at}
		a.mn++
	}
}

// end records how the engine side ended, and wakes the relay.
func (a *readAhead) end(err error) {
	a.mu.Lock()
	a.err = err
	a.mu.Unlock()
	signal(a.ready)
}

func (a *readAhead) read(b []byte, at *time.Time) (int, error) {
	for {
		a.mu.Lock()
		if a.n > 0 {
			// No further than the end of one engine read, so that each
			// read here carries that read's own receive time: events the
			// engine sent apart stay apart.
			k := min(len(b), a.n, len(a.buf)-a.r, int(a.marks[a.mr].end-a.taken))
			copy(b, a.buf[a.r:a.r+k])
			a.r, a.n = (a.r+k)%len(a.buf), a.n-k
			a.taken += int64(k)
			// The last byte read is in the first read that ends at or
			// past it; the reads before are done with.
			for a.marks[a.mr].end < a.taken {
				a.mr, a.mn = (a.mr+1)%len(a.marks), a.mn-1
			}
			*at = a.marks[a.mr].at
			if a.marks[a.mr].end == a.taken {
				a.mr, a.mn = (a.mr+1)%len(a.marks), a.mn-1
			}
			a.mu.Unlock()
			signal(a.room)
			return k, nil
		}
		err := a.err
		a.mu.Unlock()
		if err != nil {
			return 0, err
		}
		<-a.ready
	}
}

func (a *readAhead) await(d time.Duration) bool {
	t := time.NewTimer(max(d, time.Millisecond))
	defer t.Stop()
	for {
		a.mu.Lock()
		there := a.n > 0 || a.err != nil
		a.mu.Unlock()
		if there {
			return true
		}
		select {
		case <-a.ready:
		case <-t.C:
			return false
		}
	}
}

// close ends the read-ahead, if one ran, once the relay is done: the
// goroutine has returned when it does, so the engine's connection and
// response can be released. A stream that did not end has abort close
// the engine's connection, to end a read the goroutine waits in. It tells
// whether a read-ahead ran and how long the engine waited on it for room
// (the client held it back), and gives back the budget.
func (s *streamSource) close(abort func()) (ran bool, waited time.Duration) {
	a := s.ahead
	if a == nil {
		return false, 0
	}
	close(a.stop)
	if !s.ended {
		abort()
	}
	<-a.done
	s.ahead = nil
	s.p.bodies.GiveAhead(readAheadMemory)
	return true, a.waited
}
