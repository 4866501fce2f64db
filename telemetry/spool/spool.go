// Package spool is the usage records' queue on disk: entries appended as
// requests start and finish, read in order by each sink from its own
// acknowledged position, released once every sink has acknowledged them,
// and found again by Open after a restart on the same directory.
//
// It keeps its files as a database keeps its write-ahead log (SQLite's
// and etcd's are the models): frames are only appended, each with a
// checksum; a segment is begun whole under a temporary name (in a spare
// made ahead with room reserved, as etcd's WAL keeps one) and renamed; a
// segment's mark, which lets older ones go, is written only once they are
// synced, and they go only once it is; a cursor is replaced by temp,
// fsync, rename and directory fsync. An append is one write(2): once it
// returns, the entry survives a kill (the kernel holds it), and a machine
// failure once the next sync has run (Options.Sync). Readers are handed
// only what is synced, so a record is never delivered that a power cut
// could take back (and deliver again, with other contents). A failed
// fsync fails the segment: it is cut back to what the disk holds, its
// unsynced ends are written again from memory, and no cursor is saved past
// it while it is named on the disk.
//
// The roles are in files of their own: segment.go (a segment's frames,
// beginning one), sync.go (syncing, a failed sync), recover.go (Open),
// reader.go (a sink's reading), cursor.go (a sink's saved position).
package spool

import (
	"errors"
	"fmt"
	"io"
	"sync"
	"time"
)

// Defaults.
const (
	// DefaultMaxSize is the spool's bound the sidecar and the manifests
	// inject writes use unless told otherwise: at about a kilobyte a
	// record, hours of a busy engine's records while a receiver is down.
	DefaultMaxSize     = 256 << 20
	DefaultSegmentSize = 4 << 20
	DefaultSync        = time.Second
	// endRoom is what a start holds back for its end: the end of a
	// request whose start was taken is never refused for the bound.
	endRoom = 8 << 10
	// syncAhead is the bytes of ends not yet synced that make the sync
	// loop run before its interval: they are held in memory until then.
	syncAhead = 4 << 20
)

var (
	// ErrFull is the refusal of an entry past the spool's bound.
	ErrFull = errors.New("usage spool full")
	// ErrClosed is the refusal of an entry after Close.
	ErrClosed = errors.New("usage spool closed")
	// errNoID is the refusal of an entry with no id: an empty id marks
	// a segment's head.
	errNoID = errors.New("usage spool entry without an id")
)

// Options configures a spool.
type Options struct {
	// Dir holds the segments and the readers' cursors.
	Dir string
	// MaxSize bounds the segments' total size, in bytes.
	MaxSize int64
	// SegmentSize is the size at which the active segment is closed and
	// a new one begun; DefaultSegmentSize when 0.
	SegmentSize int64
	// Sync is how often the segments are synced to the disk when they
	// have new entries: what a machine failure can lose, and how long a
	// record waits before a reader is handed it. DefaultSync when 0.
	Sync time.Duration
	// Readers names the spool's readers, one per sink.
	Readers []string
	// Failed, when set, hears of failures no caller sees: a new segment
	// that could not be begun, a sync that failed.
	Failed func(error)

	// fs is the filesystem the spool is on; osFS when nil, and then
	// the directory is locked. noSyncLoop leaves every sync to the
	// caller: tests that choose each step.
	fs         fileSystem
	noSyncLoop bool
}

// Recovery is what Open found.
type Recovery struct {
	// Pending is each reader's records not yet acknowledged, the lost
	// ones included.
	Pending map[string]int
	// Lost is the requests started and never ended: the process ended
	// first. Each has its start's record as its end, written now or,
	// on a disk that refuses it, at a later sync.
	Lost int
	// Corrupt is the bytes cut off where a frame did not check: the
	// tail a kill cut short, or a block the disk lost.
	Corrupt int64
}

// position is a place in the spool: a segment and an offset in it.
type position struct {
	seq uint64
	off int64
}

func (p position) before(q position) bool {
	return p.seq < q.seq || p.seq == q.seq && p.off < q.off
}

// Spool is an open spool.
type Spool struct {
	opts Options
	fs   fileSystem
	// lock is the directory's lock file, held until Close (lock.go).
	lock io.Closer

	mu       sync.Mutex
	segs     []*segment // in order; the last may be active
	nextSeq  uint64     // the next segment's: names only ever grow
	total    int64
	frame    []byte
	head     []byte // a new segment's head, built here
	readers  []*Reader
	inflight map[string][]byte // the starts not yet ended, by id
	// refusing refuses entries from Close's last sync on; closed says
	// the files are closed.
	refusing, closed bool
	// dirDirty says the directory has changes not yet synced.
	dirDirty bool
	// refused says a write failed since segments were last given back:
	// the disk may be full (reader.Ack).
	refused bool
	// spare is the file for the next segment, made ahead (segment.go);
	// headBytes, the last head's size.
	spare     file
	headBytes int64
	// unsynced is the bytes of ends in the segments' tails; spareTails,
	// the memory of tails synced, for the next segments'.
	unsynced   int64
	spareTails [][]byte
	// carried is the ends of a segment whose sync failed, for the next
	// segment, and carriedEnds their count; rewriteDue says that segment
	// is still to begin, and broken why the spool refuses entries while
	// it cannot be (sync.go).
	carried     []byte
	carriedEnds int
	rewriteDue  bool
	broken      error
	// failed is the failed segments still named on the disk, each at
	// the end of what its file is known to hold, and removed the seqs
	// removed since the directory's last sync (cursor.go).
	failed  []position
	removed []uint64
	// unsettled is the failed segments whose files still hold more than
	// their disks are known to (sync.go).
	unsettled []*segment
	// carriedInto is the segment the carried ends last went into.
	carriedInto uint64
	// lost is the requests Open found lost whose ends are not yet
	// written (recover.go).
	lost []string

	syncLock sync.Mutex // one sync at a time, outside mu
	syncSoon chan struct{}
	stop     chan struct{}
	stopped  chan struct{}
	closing  sync.Once
}

// Append adds an entry: a start when a request is forwarded, its end when
// it is finished. It never blocks on a reader or a sync. A start, or an
// end whose start was not taken, past the bound is refused with ErrFull;
// the end of a started request is not, room having been held back for
// it. A write the filesystem refuses (no space) returns its error. Either
// way the caller counts the refusal, and calls Cancel for a refused end.
func (s *Spool) Append(kind Kind, id string, data []byte) error {
	if id == "" {
		return errNoID
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed || s.refusing {
		return ErrClosed
	}
	size := frameSize(id, data)
	_, started := s.inflight[id]
	held := int64(len(s.inflight)) * endRoom
	switch {
	case kind == Start && s.total+size+held+endRoom > s.opts.MaxSize:
		return ErrFull
	case kind == End && !started && s.total+size+held > s.opts.MaxSize:
		return ErrFull
	}
	if err := s.write(kind, id, data); err != nil {
		return fmt.Errorf("usage spool: %w", err)
	}
	if kind == Start {
		s.inflight[id] = append([]byte(nil), data...)
		return nil
	}
	delete(s.inflight, id)
	for _, r := range s.readers {
		r.pending++
	}
	// Measured past the head: with many requests in flight it alone may
	// pass the size, and each new segment would begin another.
	if act := s.active(); act != nil && act.size-act.head >= s.opts.SegmentSize {
		s.rotate()
	}
	return nil
}

// Cancel drops the start of a request whose end was refused: no copy of
// it is carried into new segments, and a cancel on disk, written if the
// disk takes it, keeps the next Open from taking it for a lost request.
func (s *Spool) Cancel(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.inflight[id]; !ok {
		return
	}
	delete(s.inflight, id)
	if !s.closed && !s.refusing {
		s.write(Cancel, id, nil) //nolint:errcheck // without it, a restart delivers the start's record
	}
}

// Size is the segments' total size.
func (s *Spool) Size() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.total
}

// Close syncs and closes the spool; what is in it stays for the next Open.
func (s *Spool) Close() error {
	s.closing.Do(func() { close(s.stop) })
	<-s.stopped
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	// No entry after the last sync: it would be left unsynced.
	s.refusing = true
	s.mu.Unlock()
	err := s.Sync()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	// A reader's segment file is its own, closed by its Next.
	for _, seg := range s.segs {
		if seg.f != nil {
			err = errors.Join(err, seg.f.Close())
			seg.f = nil
		}
	}
	if s.spare != nil {
		s.spare.Close() //nolint:errcheck // removed at the next Open
		s.spare = nil
	}
	// Last: a process that opens the spool next finds every file closed.
	return errors.Join(err, s.lock.Close())
}
