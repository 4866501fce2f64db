package proxy

import (
	"context"
	"fmt"
	"sync"
	"time"
)

// streamSet holds the responses being streamed to clients, so that
// Shutdown drains every one of them: fasthttp's own shutdown waits only
// for the connections it still serves, not for those it has handed over
// (an HTTP/1.0 client's close-delimited stream is written on a hijacked
// connection), and at the grace's end it returns with the rest still
// open. Each stream leaves the set when its record is made (finish).
type streamSet struct {
	mu    sync.Mutex
	open  map[*flight]func() // each stream's cut
	empty chan struct{}      // closed while no stream is open
}

func newStreamSet() *streamSet {
	s := &streamSet{open: map[*flight]func(){}, empty: make(chan struct{})}
	close(s.empty)
	return s
}

// add counts f's stream until done(f); cut ends it early.
func (s *streamSet) add(f *flight, cut func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.open) == 0 {
		s.empty = make(chan struct{})
	}
	s.open[f] = cut
}

// done takes f out of the set, if it is there.
func (s *streamSet) done(f *flight) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.open[f]; !ok {
		return
	}
	delete(s.open, f)
	if len(s.open) == 0 {
		close(s.empty)
	}
}

// drain waits until no stream is open or ctx is done. Then it cuts the
// streams still open and waits up to wait for them to end, each recorded
// as cut, and returns how many it cut.
func (s *streamSet) drain(ctx context.Context, wait time.Duration) int {
	s.mu.Lock()
	empty := s.empty
	s.mu.Unlock()
	select {
	case <-empty:
		return 0
	case <-ctx.Done():
	}
	s.mu.Lock()
	open := make([]*flight, 0, len(s.open))
	for f := range s.open {
		open = append(open, f)
	}
	empty = s.empty
	s.mu.Unlock()
	cut := 0
	for _, f := range open {
		// One that ended meanwhile is not cut, nor counted.
		s.mu.Lock()
		c, ok := s.open[f]
		s.mu.Unlock()
		if ok {
			c()
			cut++
		}
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-empty:
	case <-t.C:
	}
	return cut
}

// cutEndWait is how long the streams cut at the grace's end get to end
// and be recorded, past the grace: their reads and writes fail at once,
// so this is a bound, not a wait. The pod's terminationGracePeriodSeconds
// leaves room for it (deploy/README.md).
const cutEndWait = time.Second

// streamsCut: the shutdown grace ran out with streams open, which the
// sidecar cut; each is recorded, with what it had sent.
type streamsCut struct{ n int }

func (e streamsCut) Error() string {
	return fmt.Sprintf("shutdown grace over: %d streams cut", e.n)
}

// Is makes a cut a grace's end: a warning, not a failure of the process.
func (e streamsCut) Is(target error) bool { return target == errInFlightAtGrace }
