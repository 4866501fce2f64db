package spool

import (
	"bytes"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"testing"
)

// deliverAll reads and acknowledges everything pending for reader name,
// by id.
func deliverAll(t *testing.T, s *Spool, name string) map[string][]string {
	t.Helper()
	got := map[string][]string{}
	r := s.Reader(name)
	s.Sync() //nolint:errcheck // a reader is handed what is synced; a failed sync shows in what it gets
	for {
		b, err := r.Next(1000, 1<<20)
		if err != nil {
			t.Fatal(err)
		}
		if len(b.Records) == 0 {
			return got
		}
		for _, rec := range b.Records {
			got[string(rec.ID)] = append(got[string(rec.ID)], string(rec.Data))
		}
		if err := r.Ack(b); err != nil {
			t.Fatal(err)
		}
	}
}

// pad appends n requests' starts and ends.
func pad(t *testing.T, s *Spool, n int) {
	for _, id := range ids(0, n) {
		record(t, s, Start, id)
		record(t, s, End, id)
	}
}

// TestNoRoomKeepsOneContentPerID: with no room for a new segment, a kill
// while the older segments are given back never leaves a start whose end
// is gone: a request delivered as ended is never delivered again as lost.
func TestNoRoomKeepsOneContentPerID(t *testing.T) {
	dir := t.TempDir()
	s, _ := open(t, dir, Options{SegmentSize: 1 << 10, Readers: []string{"a"}})
	s.Append(Start, "A", []byte("start of A"))
	s.mu.Lock()
	if err := s.newSegment(); err != nil {
		t.Fatal(err)
	}
	s.mu.Unlock()
	s.Append(End, "A", []byte("end of A"))
	pad(t, s, 5)
	s.Sync() //nolint:errcheck // what a reader is handed
	r := s.Reader("a")
	b, _ := r.Next(1000, 1<<20)
	first := map[string]string{}
	for _, rec := range b.Records {
		first[string(rec.ID)] = string(rec.Data)
	}
	// The filesystem refuses a new segment (ENOSPC in production; a name
	// taken here).
	blocker := s.path(s.nextSeq)
	os.Mkdir(blocker, 0o700)
	// Ack up to the deletion of the older segments, then SIGKILL.
	s.mu.Lock()
	r.cursor = b.end
	gone, _ := s.releasable()
	t.Logf("after releasable: segs %d gone %v", len(s.segs), gone)
	s.mu.Unlock()
	os.Remove(blocker)
	s2, rec := open(t, dir, Options{SegmentSize: 1 << 10, Readers: []string{"a"}})
	defer s2.Close()
	again := deliverAll(t, s2, "a")
	t.Logf("lost %d; A delivered first as %q, after the restart as %q", rec.Lost, first["A"], again["A"])
	for _, d := range again["A"] {
		if d != first["A"] {
			t.Errorf("two contents for A: %q then %q", first["A"], d)
		}
	}
}

// limitFileSize makes writes past n bytes fail (EFBIG), as a full
// filesystem fails them, until the returned func restores the limit.
func limitFileSize(t *testing.T, n uint64) func() {
	signal.Ignore(syscall.SIGXFSZ)
	var old syscall.Rlimit
	syscall.Getrlimit(syscall.RLIMIT_FSIZE, &old)
	lim := old
	lim.Cur = n
	if err := syscall.Setrlimit(syscall.RLIMIT_FSIZE, &lim); err != nil {
		t.Fatal(err)
	}
	return func() { syscall.Setrlimit(syscall.RLIMIT_FSIZE, &old) }
}

// TestNoRoomKeepsInFlightStarts: when no new segment with the copies of
// the starts in flight can be written, the start stays where it is: a
// kill makes it lost, delivered.
func TestNoRoomKeepsInFlightStarts(t *testing.T) {
	dir := t.TempDir()
	var mu sync.Mutex
	var failed []error
	s, _ := open(t, dir, Options{SegmentSize: 1 << 14, Readers: []string{"a"}, Failed: func(err error) {
		mu.Lock()
		failed = append(failed, err)
		mu.Unlock()
	}})
	big := bytes.Repeat([]byte("x"), 2000)
	if err := s.Append(Start, "A", big); err != nil {
		t.Fatal(err)
	}
	pad(t, s, 20)
	s.Sync() //nolint:errcheck // what a reader is handed
	r := s.Reader("a")
	b, _ := r.Next(1000, 1<<20)
	restore := limitFileSize(t, 1000) // no room for a segment holding A's copy
	r.Ack(b)
	restore()
	s.mu.Lock()
	mu.Lock()
	t.Logf("segs %d inflight %d failed %v", len(s.segs), len(s.inflight), failed)
	mu.Unlock()
	s.mu.Unlock()
	// SIGKILL now.
	s2, rec := open(t, dir, Options{SegmentSize: 1 << 10, Readers: []string{"a"}})
	defer s2.Close()
	got := deliverAll(t, s2, "a")
	if rec.Lost != 1 || len(got["A"]) != 1 {
		t.Errorf("request A in flight at the kill: lost %d, delivered %d times; want its start's record", rec.Lost, len(got["A"]))
	}
}

// TestLostEndRefusedAtOpenStaysAStart: an Open that cannot write a lost
// request's end keeps the segment with its start, for the next Open.
func TestLostEndRefusedAtOpenStaysAStart(t *testing.T) {
	dir := t.TempDir()
	s, _ := open(t, dir, Options{SegmentSize: 1 << 20, Readers: []string{"a"}})
	big := bytes.Repeat([]byte("x"), 2000)
	if err := s.Append(Start, "A", big); err != nil {
		t.Fatal(err)
	}
	// SIGKILL; restart on a filesystem that cannot take A's end.
	restore := limitFileSize(t, 1000)
	s2, rec := open(t, dir, Options{SegmentSize: 1 << 20, Readers: []string{"a"}})
	t.Logf("second open: lost %d (the end was refused)", rec.Lost)
	s2.Append(Start, "B", []byte("data of B"))
	s2.Append(End, "B", []byte("data of B"))
	got := deliverAll(t, s2, "a")
	restore()
	ents, _ := os.ReadDir(dir)
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	t.Logf("delivered %v; dir %s", keys(got), strings.Join(names, " "))
	// SIGKILL again.
	s3, rec3 := open(t, dir, Options{SegmentSize: 1 << 20, Readers: []string{"a"}})
	defer s3.Close()
	got3 := deliverAll(t, s3, "a")
	if rec3.Lost != 1 || len(got3["A"]) != 1 {
		t.Errorf("request A: lost %d, delivered %d times after the third open; want its start's record", rec3.Lost, len(got3["A"]))
	}
}

func keys(m map[string][]string) []string {
	var k []string
	for id := range m {
		k = append(k, id)
	}
	return k
}

// TestSegmentNamesAreNeverReused: a position saved in a segment since
// deleted never points into a new segment after a restart: names only
// grow past every saved position.
func TestSegmentNamesAreNeverReused(t *testing.T) {
	dir := t.TempDir()
	opts := Options{SegmentSize: 1 << 10, Readers: []string{"a"}}
	s, _ := open(t, dir, opts)
	pad(t, s, 5)
	blocker := s.path(s.nextSeq)
	os.Mkdir(blocker, 0o700) // no new segment can be begun
	got := deliverAll(t, s, "a")
	s.mu.Lock()
	t.Logf("run 1: delivered %d; segs %d cursor %+v", len(got), len(s.segs), s.readers[0].cursor)
	s.mu.Unlock()
	os.Remove(blocker)
	// SIGKILL. Run 2: records taken, the sink down, SIGKILL again.
	s2, _ := open(t, dir, opts)
	for _, id := range ids(100, 110) {
		record(t, s2, Start, id)
		if err := s2.Append(End, id, []byte("data of "+id+" longerX")); err != nil {
			t.Fatal(err)
		}
	}
	s2.mu.Lock()
	t.Logf("run 2: segs %+v", s2.segs)
	s2.mu.Unlock()
	s3, rec := open(t, dir, opts)
	defer s3.Close()
	got3 := deliverAll(t, s3, "a")
	t.Logf("run 3: pending %v, delivered %v", rec.Pending, keys(got3))
	if len(got3) != 10 {
		t.Errorf("run 3 delivered %d of the 10 records taken in run 2", len(got3))
	}
}
