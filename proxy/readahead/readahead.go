package readahead

import (
	"io"
	"sync"
	"time"
)

// Size bounds a stream's read-ahead: some thousands of events, seconds
// of a client's pause at any real engine's pace. Reads bounds the reads it
// remembers the receive time of, one per engine read (an event, at a
// stream's pace).
const (
	Size  = 256 << 10
	Reads = 2048
	// Memory is what a read-ahead holds: the ring and its marks (32 bytes
	// each).
	Memory = Size + Reads*32
)

// Reader is a ring of the engine's bytes, written by its own goroutine
// and read by the relay, with the receive time of each read.
type Reader struct {
	mu   sync.Mutex
	buf  []byte
	r, n int // where the unread bytes start, and how many there are
	// marks are where each read's bytes end, counted from the stream's
	// start, and when they arrived: a ring, mr the oldest, mn many.
	marks        []mark
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

// mark is where an engine read's bytes end, counted from the stream's
// start, and when they arrived.
type mark struct {
	end int64
	at  time.Time
}

func signal(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

// Start starts reading body ahead, on a goroutine of its own, until its
// end, an error or Stop. received is the receive time of the bytes body
// returned last; onPanic records a panic below the goroutine and returns
// the error the stream's reads then end with.
func Start(body io.Reader, received func() time.Time, onPanic func(any) error) *Reader {
	a := &Reader{buf: make([]byte, Size), marks: make([]mark, Reads),
		ready: make(chan struct{}, 1), room: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{})}
	go a.run(body, received, onPanic)
	return a
}

// Stop ends the read-ahead once the relay is done with it, and returns
// how long the engine waited on it for room (the client held it back).
// abort, when the stream did not end, closes the engine's connection, to
// end a read the goroutine waits in; the goroutine has returned when Stop
// does, so the connection and response can be released.
func (a *Reader) Stop(abort func()) (waited time.Duration) {
	close(a.stop)
	if abort != nil {
		abort()
	}
	<-a.done
	return a.waited
}

// run reads the engine's side until its end, an error, or stop. It is a
// goroutine of the sidecar's own, so it is its own panic boundary: a
// panic ends the read-ahead with the error onPanic returns for it, which
// ends this stream and no other. Every locked
// section is a function that unlocks on the way out, so that a panic
// cannot leave the relay waiting on the lock.
func (a *Reader) run(body io.Reader, received func() time.Time, onPanic func(any) error) {
	defer close(a.done)
	defer func() {
		if r := recover(); r != nil {
			a.end(onPanic(r))
		}
	}()
	for {
		w, free, ok := a.awaitRoom()
		if !ok {
			return
		}
		n, err := body.Read(a.buf[w : w+free])
		a.commit(n, received())
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
func (a *Reader) awaitRoom() (w, free int, ok bool) {
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

func (a *Reader) writable() (w, free int, ok bool) {
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
func (a *Reader) commit(n int, at time.Time) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.n += n
	a.total += int64(n)
	if n > 0 {
		a.marks[(a.mr+a.mn)%len(a.marks)] = mark{end: a.total, at: at}
		a.mn++
	}
}

// end records how the engine side ended, and wakes the relay.
func (a *Reader) end(err error) {
	a.mu.Lock()
	a.err = err
	a.mu.Unlock()
	signal(a.ready)
}

// ReadStamped reads into b no further than the end of one engine read,
// and sets *at to that read's receive time; it waits for bytes or the
// stream's end.
func (a *Reader) ReadStamped(b []byte, at *time.Time) (int, error) {
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

// Await waits up to d for bytes or the stream's end, and tells whether
// either is there.
func (a *Reader) Await(d time.Duration) bool {
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
