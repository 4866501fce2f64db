package spool

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
)

// opened is the spools these tests opened, by directory. Opening a
// directory again stands for a restart after the process was killed: the
// earlier spool stops where it is (abandon) and its lock is released, as
// the kernel does for a process that dies; nothing else of it.
var opened sync.Map

func open(t testing.TB, dir string, opts Options) (*Spool, Recovery) {
	t.Helper()
	if earlier, ok := opened.Load(dir); ok {
		abandon(earlier.(*Spool))
		earlier.(*Spool).lock.Close()
	}
	opts.Dir = dir
	if opts.MaxSize == 0 {
		opts.MaxSize = 1 << 20
	}
	if opts.Readers == nil {
		opts.Readers = []string{"a", "b"}
	}
	s, rec, err := Open(opts)
	if err != nil {
		t.Fatal(err)
	}
	opened.Store(dir, s)
	return s, rec
}

// drain reads and acknowledges everything pending for reader name, in
// batches of n, and returns the ids in order.
func drain(t *testing.T, s *Spool, name string, n int) []string {
	t.Helper()
	r := s.Reader(name)
	var ids []string
	if err := s.Sync(); err != nil {
		t.Fatal(err)
	}
	for {
		b, err := r.Next(n, 1<<20)
		if err != nil {
			t.Fatal(err)
		}
		if len(b.Records) == 0 {
			return ids
		}
		for _, rec := range b.Records {
			if want := "data of " + string(rec.ID); string(rec.Data) != want {
				t.Fatalf("record %s: data %q, want %q", rec.ID, rec.Data, want)
			}
			ids = append(ids, string(rec.ID))
		}
		if err := r.Ack(b); err != nil {
			t.Fatal(err)
		}
	}
}

func record(t *testing.T, s *Spool, kind Kind, id string) {
	t.Helper()
	if err := s.Append(kind, id, []byte("data of "+id)); err != nil {
		t.Fatal(err)
	}
}

func ids(from, to int) []string {
	var out []string
	for i := from; i < to; i++ {
		out = append(out, fmt.Sprintf("r%04d", i))
	}
	return out
}

// TestReadersReadEndsInOrder: each reader gets every end, in order, from
// its own position, and never a start.
func TestReadersReadEndsInOrder(t *testing.T) {
	s, _ := open(t, t.TempDir(), Options{SegmentSize: 1 << 10})
	defer s.Close()
	for _, id := range ids(0, 100) {
		record(t, s, Start, id)
		record(t, s, End, id)
	}
	if got := drain(t, s, "a", 7); !slices.Equal(got, ids(0, 100)) {
		t.Fatalf("reader a read %v", got)
	}
	if p := s.Reader("b").Pending(); p != 100 {
		t.Fatalf("reader b pending %d, want 100: readers are apart", p)
	}
	if got := drain(t, s, "b", 100); !slices.Equal(got, ids(0, 100)) {
		t.Fatalf("reader b read %v", got)
	}
	if p := s.Reader("a").Pending(); p != 0 {
		t.Fatalf("pending %d after all read", p)
	}
	// Every reader past them: the old segments are gone.
	segs, _ := filepath.Glob(filepath.Join(s.opts.Dir, "*.seg"))
	if len(segs) > 2 {
		t.Errorf("%d segments left once all was read: %v", len(segs), segs)
	}
}

// TestReopenResumes: a restart resumes each reader after what it
// acknowledged; a request started and never ended gets its start's record;
// a tail cut short is cut off.
func TestReopenResumes(t *testing.T) {
	dir := t.TempDir()
	s, _ := open(t, dir, Options{SegmentSize: 2 << 10})
	for _, id := range ids(0, 30) {
		record(t, s, Start, id)
		record(t, s, End, id)
	}
	if got := drain(t, s, "a", 10); len(got) != 30 {
		t.Fatalf("read %d", len(got))
	}
	record(t, s, Start, "r0030") // in flight at the kill
	record(t, s, Start, "r0031")
	record(t, s, End, "r0031")
	// A kill mid-write: half a frame at the end of the active segment.
	active := filepath.Join(dir, segmentName(lastSeq(s)))
	half, _ := appendFrame(nil, End, "r0032", []byte("data of r0032"))
	s.Close()
	f, err := os.OpenFile(active, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.Write(half[:len(half)/2])
	f.Close()

	s, rec := open(t, dir, Options{SegmentSize: 2 << 10})
	defer s.Close()
	if rec.Lost != 1 || rec.Corrupt != int64(len(half)/2) {
		t.Errorf("recovery %+v: want 1 lost, %d bytes cut", rec, len(half)/2)
	}
	if rec.Pending["a"] != 2 || rec.Pending["b"] != 32 {
		t.Errorf("pending %v, want a 2 (r0031, lost r0030), b 32", rec.Pending)
	}
	if got := drain(t, s, "a", 10); !slices.Equal(got, []string{"r0031", "r0030"}) {
		t.Errorf("reader a read %v after the restart", got)
	}
	want := append(ids(0, 30), "r0031", "r0030")
	if got := drain(t, s, "b", 10); !slices.Equal(got, want) {
		t.Errorf("reader b read %v after the restart", got)
	}
	// A third start finds the lost request ended: it is not lost twice.
	s.Close()
	s, rec = open(t, dir, Options{SegmentSize: 2 << 10})
	defer s.Close()
	if rec.Lost != 0 || rec.Pending["a"] != 0 {
		t.Errorf("second recovery %+v", rec)
	}
}

// TestStartsOutliveTheirSegment: a long request's start is carried into
// each new segment, so the old ones go once read, and a restart still
// finds it.
func TestStartsOutliveTheirSegment(t *testing.T) {
	dir := t.TempDir()
	s, _ := open(t, dir, Options{SegmentSize: 1 << 10, Readers: []string{"a"}})
	record(t, s, Start, "long")
	for _, id := range ids(0, 200) {
		record(t, s, Start, id)
		record(t, s, End, id)
		drain(t, s, "a", 100)
	}
	// The sync gives back what every reader is past.
	if err := s.Sync(); err != nil {
		t.Fatal(err)
	}
	s.mu.Lock()
	n := len(s.segs)
	s.mu.Unlock()
	if n > 2 {
		t.Errorf("%d segments kept: the start pins them", n)
	}
	s.Close()
	s, rec := open(t, dir, Options{SegmentSize: 1 << 10, Readers: []string{"a"}})
	defer s.Close()
	if rec.Lost != 1 {
		t.Fatalf("recovery %+v: the long request's start was lost", rec)
	}
	if got := drain(t, s, "a", 10); !slices.Equal(got, []string{"long"}) {
		t.Errorf("read %v", got)
	}
}

// TestFullSpoolRefuses: past the bound a start and an unstarted end are
// refused; a started request's end is not, and reading makes room.
func TestFullSpoolRefuses(t *testing.T) {
	s, _ := open(t, t.TempDir(), Options{MaxSize: 16 << 10, SegmentSize: 2 << 10, Readers: []string{"a"}})
	defer s.Close()
	record(t, s, Start, "kept")
	n := 0
	for ; ; n++ {
		id := fmt.Sprintf("r%04d", n)
		if err := s.Append(End, id, []byte("data of "+id)); err != nil {
			if !errors.Is(err, ErrFull) {
				t.Fatal(err)
			}
			break
		}
	}
	if err := s.Append(Start, "new", []byte("data of new")); !errors.Is(err, ErrFull) {
		t.Errorf("a start in a full spool: %v", err)
	}
	record(t, s, End, "kept") // its room was held back
	if got := drain(t, s, "a", 1000); len(got) != n+1 {
		t.Errorf("read %d, want %d", len(got), n+1)
	}
	if s.Size() > 4<<10 {
		t.Errorf("size %d once all is read", s.Size())
	}
	record(t, s, End, "after")
}

// TestRunsOfStartsAreReadPast: a burst of starts longer than a batch's
// window, and a rotation that copies many in-flight starts, never stall a
// reader.
func TestRunsOfStartsAreReadPast(t *testing.T) {
	s, _ := open(t, t.TempDir(), Options{MaxSize: 64 << 20, SegmentSize: 256 << 10, Readers: []string{"a"}})
	defer s.Close()
	data := make([]byte, 700)
	for _, id := range ids(0, 3000) {
		if err := s.Append(Start, id, data); err != nil {
			t.Fatal(err)
		}
	}
	for _, id := range ids(0, 3000) {
		if err := s.Append(End, id, []byte("data of "+id)); err != nil {
			t.Fatal(err)
		}
	}
	if got := drain(t, s, "a", 500); !slices.Equal(got, ids(0, 3000)) {
		t.Fatalf("read %d of 3000", len(got))
	}
}

// TestPositionsThatCannotBeTrusted: a position ahead of every segment, or
// unreadable, starts the reader from the first segment: records may come
// again, none is skipped.
func TestPositionsThatCannotBeTrusted(t *testing.T) {
	for name, cursor := range map[string]string{"ahead": "9 0 00000000", "garbage": "x", "bad checksum": "1 0 deadbeef"} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			os.WriteFile(filepath.Join(dir, "a.cursor"), []byte(cursor), 0o600)
			s, _ := open(t, dir, Options{SegmentSize: 1 << 10, Readers: []string{"a"}})
			defer s.Close()
			for _, id := range ids(0, 50) {
				record(t, s, Start, id)
				record(t, s, End, id)
			}
			if got := drain(t, s, "a", 100); !slices.Equal(got, ids(0, 50)) {
				t.Errorf("read %v", got)
			}
		})
	}
}

// TestConcurrentAppendsAndReads: many request goroutines appending, two
// readers reading and acknowledging, small segments rotating: each reader
// gets every end exactly once.
func TestConcurrentAppendsAndReads(t *testing.T) {
	s, _ := open(t, t.TempDir(), Options{SegmentSize: 2 << 10, MaxSize: 64 << 20})
	defer s.Close()
	const writers, each = 8, 200
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			for i := range each {
				id := fmt.Sprintf("w%d-%04d", w, i)
				if err := s.Append(Start, id, []byte("data of "+id)); err != nil {
					t.Error(err)
				}
				if err := s.Append(End, id, []byte("data of "+id)); err != nil {
					t.Error(err)
				}
			}
		})
	}
	read := map[string]*[]string{"a": new([]string), "b": new([]string)}
	var readers sync.WaitGroup
	for name, got := range read {
		readers.Go(func() {
			r := s.Reader(name)
			for len(*got) < writers*each {
				b, err := r.Next(50, 1<<20)
				if err != nil {
					t.Error(err)
					return
				}
				if len(b.Records) == 0 {
					<-r.Wake()
					continue
				}
				for _, rec := range b.Records {
					*got = append(*got, string(rec.ID))
				}
				if err := r.Ack(b); err != nil {
					t.Error(err)
				}
			}
		})
	}
	wg.Wait()
	readers.Wait()
	for name, got := range read {
		seen := map[string]bool{}
		for _, id := range *got {
			if seen[id] {
				t.Errorf("reader %s got %s twice", name, id)
			}
			seen[id] = true
		}
		if len(seen) != writers*each {
			t.Errorf("reader %s got %d of %d", name, len(seen), writers*each)
		}
	}
}

// TestCancelledStartIsNotLost: a start whose end was refused is withdrawn,
// so a restart does not deliver it as lost; an end after Close is refused
// as closed.
func TestCancelledStartIsNotLost(t *testing.T) {
	dir := t.TempDir()
	s, _ := open(t, dir, Options{Readers: []string{"a"}})
	record(t, s, Start, "refused")
	s.Cancel("refused")
	record(t, s, Start, "late")
	s.Close()
	if err := s.Append(End, "late", []byte("data of late")); !errors.Is(err, ErrClosed) {
		t.Fatalf("an end after Close: %v", err)
	}
	s, rec := open(t, dir, Options{Readers: []string{"a"}})
	defer s.Close()
	if rec.Lost != 1 {
		t.Errorf("recovery %+v: want only the late request lost", rec)
	}
}

// TestRotationKeepsNoRecordFromItsCaller: a new segment that cannot be
// begun leaves the old one active, and the end that triggered it taken.
func TestRotationFailureKeepsTheRecord(t *testing.T) {
	dir := t.TempDir()
	var failures atomic.Int64
	s, _ := open(t, dir, Options{Readers: []string{"a"}, SegmentSize: 1 << 10, Failed: func(error) { failures.Add(1) }})
	defer s.Close()
	// The next segment's name is taken: its creation fails.
	os.Mkdir(filepath.Join(dir, segmentName(lastSeq(s)+1)), 0o700)
	for _, id := range ids(0, 40) {
		record(t, s, Start, id)
		record(t, s, End, id)
	}
	if failures.Load() == 0 {
		t.Fatal("no rotation failed")
	}
	if got := drain(t, s, "a", 100); !slices.Equal(got, ids(0, 40)) {
		t.Errorf("read %v", got)
	}
}

// lastSeq is the newest segment's number.
func lastSeq(s *Spool) uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.segs[len(s.segs)-1].seq
}
