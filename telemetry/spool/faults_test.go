package spool

import (
	"errors"
	"slices"
	"strings"
	"syscall"
	"testing"
)

// These tests imitate the faults a spool on a real disk meets, through
// faultFS: a power cut at each step that changes the files, a write cut
// short by a full disk, a cut that fails, a failed fsync. Each says what
// the spool promises through it.

const faultDir = "/spool"

// openOn opens a spool on fs, as a process starting on that disk does.
// The tests sync by hand: the sync loop's interval is never reached.
func openOn(t *testing.T, fs *faultFS, opts Options) (*Spool, Recovery) {
	t.Helper()
	opts.fs, opts.Dir, opts.noSyncLoop = fs, faultDir, true
	if opts.MaxSize == 0 {
		opts.MaxSize = 1 << 20
	}
	if opts.Readers == nil {
		opts.Readers = []string{"a"}
	}
	if opts.Sync == 0 {
		opts.Sync = 1 << 62
	}
	s, rec, err := Open(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { abandon(s) })
	return s, rec
}

// abandon stops a spool as a kill or a power cut stops its process: no
// sync, no write, nothing closed.
func abandon(s *Spool) {
	s.closing.Do(func() { close(s.stop) })
	<-s.stopped
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
}

// appendAll appends each id's start and end, the end's data the id and
// suffix, and returns the ids whose end the spool took.
func appendAll(s *Spool, ids []string, suffix string) []string {
	var took []string
	for _, id := range ids {
		if s.Append(Start, id, []byte("start of "+id)) != nil {
			continue
		}
		if s.Append(End, id, []byte(id+suffix)) != nil {
			s.Cancel(id)
			continue
		}
		took = append(took, id)
	}
	return took
}

// failing fails the operations op on files named with suffix: the nth
// such operation (from 1) lands land[n] bytes, if a write, and fails with
// errs[n]; the others pass. A file keeps the name it was opened by, a
// temporary one included.
func failing(op, suffix string, plan map[int]error, land map[int]int) func(string, string, int) (int, error) {
	seen := 0
	return func(o, name string, n int) (int, error) {
		if o != op || !strings.Contains(name, suffix) {
			return n, nil
		}
		seen++
		if err, ok := plan[seen]; ok {
			return min(n, land[seen]), err
		}
		return n, nil
	}
}

// TestRotationKeepsStartsThroughAPowerCut: once every sink has caught up,
// the segment is given back and the starts in flight live on in a new
// one. The old one goes only once the new one is on the disk: a power cut
// that kept the directory's changes and not the new file's data still
// finds the request in flight, and delivers it as lost.
func TestRotationKeepsStartsThroughAPowerCut(t *testing.T) {
	fs := newFaultFS()
	s, _ := openOn(t, fs, Options{SegmentSize: 1 << 10})
	if err := s.Append(Start, "A", []byte("start of A")); err != nil {
		t.Fatal(err)
	}
	pad(t, s, 20)
	if err := s.Sync(); err != nil {
		t.Fatal(err)
	}
	deliverAll(t, s, "a")
	after := fs.cut(cutMode{keepDirOps: 1})
	t.Logf("before the cut: %s; after: %s", fs, after)
	s2, rec := openOn(t, after, Options{SegmentSize: 1 << 10})
	got := deliverAll(t, s2, "a")
	if rec.Lost != 1 || !slices.Equal(got["A"], []string{"start of A"}) {
		t.Errorf("request A in flight at the power cut: lost %d, delivered %q; want its start's record once", rec.Lost, got["A"])
	}
}

// TestAFailedWriteNeverCostsLaterRecords: a write the disk cuts short
// never leaves torn bytes that the next Open would cut off with every
// record after them.
func TestAFailedWriteNeverCostsLaterRecords(t *testing.T) {
	for _, tc := range []struct {
		name  string
		fault func(string, string, int) (int, error)
	}{{
		// No room for a new segment's head, then a write cut short.
		name:  "no room for a new segment",
		fault: failing("write", ".seg", map[int]error{1: syscall.ENOSPC, 2: syscall.ENOSPC}, map[int]int{2: 12}),
	}, {
		// A write cut short, and the cut back to the last whole
		// frame refused.
		name: "a write cut short and its cut refused",
		fault: func() func(string, string, int) (int, error) {
			w := failing("write", ".seg", map[int]error{3: syscall.ENOSPC}, map[int]int{3: 12})
			tr := failing("truncate", ".seg", map[int]error{1: syscall.EIO}, nil)
			return func(op, name string, n int) (int, error) {
				if op == "truncate" {
					return tr(op, name, n)
				}
				return w(op, name, n)
			}
		}(),
	}} {
		t.Run(tc.name, func(t *testing.T) {
			fs := newFaultFS()
			s, _ := openOn(t, fs, Options{SegmentSize: 1 << 10})
			if err := s.Append(Start, "A", []byte("start of A")); err != nil {
				t.Fatal(err)
			}
			pad(t, s, 20)
			// A's start was carried into a new segment's head; B's
			// is after it.
			if err := s.Append(Start, "B", []byte("start of B")); err != nil {
				t.Fatal(err)
			}
			if err := s.Append(End, "A", []byte("end of A")); err != nil {
				t.Fatal(err)
			}
			if err := s.Sync(); err != nil {
				t.Fatal(err)
			}
			fs.mu.Lock()
			fs.fault = tc.fault
			fs.mu.Unlock()
			deliverAll(t, s, "a")
			took := appendAll(s, ids(100, 110), "")
			fs.mu.Lock()
			fs.fault = nil
			fs.mu.Unlock()
			took = append(took, appendAll(s, ids(110, 120), "")...)
			s.Sync() //nolint:errcheck // a kill follows: the kernel holds what was written
			s2, _ := openOn(t, fs.kill(), Options{SegmentSize: 1 << 10})
			got := deliverAll(t, s2, "a")
			var lost []string
			for _, id := range took {
				if len(got[id]) == 0 {
					lost = append(lost, id)
				}
			}
			if len(lost) > 0 || len(took) < 15 {
				t.Errorf("the spool took %d records after the fault; %d were lost at the next Open: %v (files %s)", len(took), len(lost), lost, fs)
			}
		})
	}
}

// TestNoRecordLeavesBeforeItIsSynced: a sink is handed only what the disk
// holds. Were it handed a request's end before the sync, a power cut
// would leave only its start, and the next process would deliver the
// same id again as lost: two contents for one id.
func TestNoRecordLeavesBeforeItIsSynced(t *testing.T) {
	fs := newFaultFS()
	s, _ := openOn(t, fs, Options{})
	if err := s.Append(Start, "A", []byte("start of A")); err != nil {
		t.Fatal(err)
	}
	if err := s.Sync(); err != nil {
		t.Fatal(err)
	}
	if err := s.Append(End, "A", []byte("completed, 1234 tokens")); err != nil {
		t.Fatal(err)
	}
	seen := map[string][]string{}
	b, err := s.Reader("a").Next(100, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	for _, rec := range b.Records {
		seen[string(rec.ID)] = append(seen[string(rec.ID)], string(rec.Data))
	}
	// The sink has the batch; the power is cut before its
	// acknowledgement.
	s2, _ := openOn(t, fs.cut(cutMode{}), Options{})
	for id, data := range deliverAll(t, s2, "a") {
		seen[id] = append(seen[id], data...)
	}
	if len(seen["A"]) == 0 || len(slices.Compact(slices.Clone(seen["A"]))) != 1 {
		t.Errorf("request A was delivered as %q; want one content", seen["A"])
	}
}

// TestAFailedSyncFailsTheSegment: once a segment's fsync fails, what it
// held past its last sync may never reach the disk, whatever a later
// fsync says. Those records are written again into a new segment, so that
// a Sync that returns nil means what it says.
func TestAFailedSyncFailsTheSegment(t *testing.T) {
	fs := newFaultFS()
	s, _ := openOn(t, fs, Options{})
	fs.mu.Lock()
	fs.fault = failing("sync", ".seg", map[int]error{1: syscall.EIO}, nil)
	fs.mu.Unlock()
	took := appendAll(s, ids(0, 10), "")
	err := s.Sync()
	t.Logf("the first sync: %v", err)
	if !errors.Is(err, syscall.EIO) {
		t.Errorf("the failed fsync was not reported: %v", err)
	}
	took = append(took, appendAll(s, ids(10, 20), "")...)
	if err := s.Sync(); err != nil {
		t.Fatalf("the second sync: %v", err)
	}
	after := fs.cut(cutMode{})
	s2, _ := openOn(t, after, Options{})
	got := deliverAll(t, s2, "a")
	var lost []string
	for _, id := range took {
		if !slices.Equal(got[id], []string{id}) {
			lost = append(lost, id)
		}
	}
	if len(lost) > 0 || len(took) != 20 {
		t.Errorf("took %d records, synced; after a power cut %d were not delivered as taken: %v (files %s)", len(took), len(lost), lost, after)
	}
}

// TestAFullDiskGivesItsRoomBack: on a disk the spool filled, with
// requests in flight all along, delivering every record gives the room
// back: the next segment, with the starts in flight, goes into the spare
// made ahead with room reserved, and the older segments go.
func TestAFullDiskGivesItsRoomBack(t *testing.T) {
	fs := newFaultFS()
	fs.capacity = 256 << 10
	// Segments larger than the disk: the active one holds all of it.
	s, _ := openOn(t, fs, Options{SegmentSize: 1 << 20})
	for _, id := range []string{"held-1", "held-2"} {
		if err := s.Append(Start, id, []byte("start of "+id)); err != nil {
			t.Fatal(err)
		}
	}
	refused, n := 0, 0
	for ; refused == 0; n += 50 {
		if n > 100000 {
			t.Fatal("the disk never filled")
		}
		refused = 50 - len(appendAll(s, ids(n, n+50), strings.Repeat("x", 200)))
		s.Sync() //nolint:errcheck // the disk fills
	}
	fs.mu.Lock()
	used := fs.used()
	fs.mu.Unlock()
	deliverAll(t, s, "a")
	took := appendAll(s, ids(100000, 100100), "")
	for _, id := range []string{"held-1", "held-2"} {
		if err := s.Append(End, id, []byte(id)); err != nil {
			t.Errorf("the end of %s, in flight all along: %v", id, err)
		}
	}
	t.Logf("full after %d records (%d bytes of %d); after the delivery: %s", n, used, fs.capacity, fs)
	if len(took) != 100 {
		t.Errorf("after every record was delivered, the spool took %d of 100 new ones", len(took))
	}
}
