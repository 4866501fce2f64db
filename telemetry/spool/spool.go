// Package spool is the usage records' queue on disk: entries appended as
// requests start and finish, read in order by each sink from its own
// acknowledged position, released once every sink has acknowledged them,
// and found again by Open after a restart on the same directory.
//
// An append is one write(2) into the active segment file: once it returns,
// the entry survives the process being killed (the kernel holds it), and
// survives the machine failing once the next sync has run (Options.Sync);
// a reader's position is never saved past what is synced. A frame cut
// short by a kill is found by its checksum and cut off at Open. Nothing
// here waits on the disk while holding what Append needs, but the write.
package spool

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
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
)

var (
	// ErrFull is the refusal of an entry past the spool's bound.
	ErrFull = errors.New("usage spool full")
	// ErrClosed is the refusal of an entry after Close.
	ErrClosed = errors.New("usage spool closed")
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
	// Sync is how often the active segment is synced to the disk when it
	// has new entries: what a machine failure can lose. DefaultSync when
	// 0.
	Sync time.Duration
	// Readers names the spool's readers, one per sink.
	Readers []string
	// Failed, when set, hears of failures no caller sees: a new segment
	// that could not be begun, a sync that failed.
	Failed func(error)

	// fs is the filesystem the spool is on; osFS when nil, and then
	// the directory is locked.
	fs fileSystem
}

// Recovery is what Open found.
type Recovery struct {
	// Pending is each reader's records not yet acknowledged, the lost
	// ones included.
	Pending map[string]int
	// Lost is the requests started and never ended: the process ended
	// first. Each now has its start's record as its end.
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

type segment struct {
	seq  uint64
	size int64
	// copied is the size of the starts copied into it as it began.
	copied int64
}

// Spool is an open spool.
type Spool struct {
	opts Options
	fs   fileSystem

	mu       sync.Mutex
	segs     []segment // in order; the last is active
	nextSeq  uint64    // the next segment's: names only ever grow
	active   file
	total    int64
	frame    []byte
	readers  []*Reader
	inflight map[string][]byte // the starts not yet ended, by id
	// copiedAll says every start in flight is in the active segment
	// (copied as it began, or written to it since): older segments hold
	// nothing a restart needs, once the readers are past them.
	copiedAll bool
	closed    bool
	// lock is the directory's lock file, held until Close (lock.go).
	lock io.Closer
	// synced is how far the disk holds the spool; dirty says the active
	// segment or the directory has more, retired are segments left and
	// not yet synced and closed.
	synced   position
	dirty    bool
	retired  []file
	syncLock sync.Mutex // one sync at a time, outside mu

	stop    chan struct{}
	stopped chan struct{}
	closing sync.Once
}

func segmentName(seq uint64) string { return fmt.Sprintf("%016x.seg", seq) }

func (s *Spool) path(seq uint64) string { return filepath.Join(s.opts.Dir, segmentName(seq)) }

// Open opens the spool in opts.Dir, creating it if need be, and recovers
// what an earlier process left: a tail cut short is cut off, a request
// started and never ended gets its start's record, and each reader
// resumes after what it acknowledged. Only a directory it cannot read or
// make, or one another open spool holds (ErrInUse), fails it: a disk that
// is full leaves the spool refusing records, never the process unable to
// start.
func Open(opts Options) (*Spool, Recovery, error) {
	if opts.SegmentSize <= 0 {
		opts.SegmentSize = DefaultSegmentSize
	}
	if opts.Sync <= 0 {
		opts.Sync = DefaultSync
	}
	rec := Recovery{Pending: map[string]int{}}
	var lock io.Closer = io.NopCloser(nil)
	if opts.fs == nil {
		opts.fs = osFS{}
		if err := os.MkdirAll(opts.Dir, 0o700); err != nil {
			return nil, rec, fmt.Errorf("usage spool: %w", err)
		}
		f, err := lockDir(opts.Dir, opts.Failed)
		if err != nil {
			return nil, rec, err
		}
		lock = f
	}
	s, rec, err := recoverSpool(opts, lock)
	if err != nil {
		lock.Close()
		return nil, rec, err
	}
	return s, rec, nil
}

// recoverSpool opens the spool in opts.Dir, whose lock is held.
func recoverSpool(opts Options, lock io.Closer) (*Spool, Recovery, error) {
	rec := Recovery{Pending: map[string]int{}}
	s := &Spool{opts: opts, fs: opts.fs, lock: lock, inflight: map[string][]byte{}, stop: make(chan struct{}), stopped: make(chan struct{})}
	segs, err := s.listSegments()
	if err != nil {
		return nil, rec, err
	}
	// Every segment is read: the starts not ended (an end or a cancel
	// always follows its start), and where the ends lie.
	starts := map[string][]byte{}
	var endsAt []position
	for i := range segs {
		corrupt, err := s.scan(&segs[i], func(e entry, at position) {
			switch e.kind {
			case Start:
				starts[string(e.id)] = append([]byte(nil), e.data...)
			case End:
				delete(starts, string(e.id))
				endsAt = append(endsAt, at)
			case Cancel:
				delete(starts, string(e.id))
			}
		})
		if err != nil {
			return nil, rec, err
		}
		rec.Corrupt += corrupt
		s.total += segs[i].size
	}
	s.segs = segs
	s.nextSeq = 1
	if n := len(segs); n > 0 {
		s.nextSeq = segs[n-1].seq + 1
	}
	for _, name := range opts.Readers {
		cur, err := s.readCursor(name)
		if err != nil {
			return nil, rec, err
		}
		// A name a position saw is never given to a new segment: the
		// position would point into other records.
		s.nextSeq = max(s.nextSeq, cur.seq+1)
		cur = s.resume(cur)
		r := &Reader{s: s, name: name, cursor: cur, wake: make(chan struct{}, 1)}
		for _, at := range endsAt {
			if !at.before(cur) {
				r.pending++
			}
		}
		s.readers = append(s.readers, r)
	}
	// The lost requests' starts are in flight until their ends are
	// written: the new segment carries copies of them, so that the old
	// ones can go. A disk too full for it leaves the spool refusing
	// records, and the old segments where they are; never the process
	// unable to start.
	lost := make([]string, 0, len(starts))
	for id, data := range starts {
		lost = append(lost, id)
		s.inflight[id] = data
	}
	slices.Sort(lost)
	if s.begin() == nil {
		s.synced = position{s.segs[len(s.segs)-1].seq, 0}
	}
	for _, id := range lost {
		// Past the bound if need be: these records were taken already.
		// One the disk refuses stays a start, found again next time.
		if err := s.write(End, id, starts[id]); err != nil {
			continue
		}
		delete(s.inflight, id)
		rec.Lost++
		for _, r := range s.readers {
			r.pending++
		}
	}
	s.deleteSegments(s.releasable())
	for _, r := range s.readers {
		rec.Pending[r.name] = r.pending
	}
	go s.syncLoop()
	return s, rec, nil
}

// begin makes the spool's first active segment at Open, with copies of
// the starts in flight: a new one, or, if the disk cannot hold a new file,
// the last one, appended to (it holds every start already).
func (s *Spool) begin() error {
	err := s.newSegment()
	if err == nil {
		return nil
	}
	n := len(s.segs)
	if n == 0 {
		return err
	}
	f, ferr := s.fs.OpenFile(s.path(s.segs[n-1].seq), os.O_WRONLY|os.O_APPEND, 0o600)
	if ferr != nil {
		return errors.Join(err, ferr)
	}
	s.active = f
	s.copiedAll = false // the starts may be in older segments
	return nil
}

// listSegments lists the segment files in order.
func (s *Spool) listSegments() ([]segment, error) {
	des, err := s.fs.ReadDir(s.opts.Dir)
	if err != nil {
		return nil, fmt.Errorf("usage spool: %w", err)
	}
	var segs []segment
	for _, de := range des {
		name, ok := strings.CutSuffix(de, ".seg")
		if !ok {
			continue
		}
		seq, err := strconv.ParseUint(name, 16, 64)
		if err != nil {
			continue
		}
		segs = append(segs, segment{seq: seq})
	}
	slices.SortFunc(segs, func(a, b segment) int {
		switch {
		case a.seq < b.seq:
			return -1
		case a.seq > b.seq:
			return 1
		}
		return 0
	})
	return segs, nil
}

// scan reads a segment's frames, calling each with its position, and cuts
// the file at the first one that does not check. It sets the segment's
// size to what is good, and returns the bytes cut.
func (s *Spool) scan(seg *segment, each func(entry, position)) (int64, error) {
	b, err := readFile(s.fs, s.path(seg.seq))
	if err != nil {
		return 0, fmt.Errorf("usage spool: %w", err)
	}
	off := 0
	for off < len(b) {
		e, ok, _ := parseFrame(b[off:])
		if !ok {
			break
		}
		each(e, position{seg.seq, int64(off)})
		off += e.size
	}
	seg.size = int64(off)
	// What an earlier process wrote may be in the kernel alone: it is
	// made durable before anything is delivered past it.
	if f, err := s.fs.OpenFile(s.path(seg.seq), os.O_WRONLY, 0); err == nil {
		f.Sync()  //nolint:errcheck // at worst, as durable as before
		f.Close() //nolint:errcheck
	}
	if off == len(b) {
		return 0, nil
	}
	// Cutting needs no room; if it fails, the bad frame is cut in
	// memory all the same, and the next Open tries again.
	if f, err := s.fs.OpenFile(s.path(seg.seq), os.O_WRONLY, 0); err == nil {
		f.Truncate(int64(off)) //nolint:errcheck
		f.Close()              //nolint:errcheck
	}
	return int64(len(b) - off), nil
}

// newSegment begins a new active segment with a copy of every start not
// yet ended, in one write, so that older segments hold nothing a restart
// needs once the readers are past them. The old segment stays active if
// the new one cannot be written whole. Callers hold mu, or own the spool
// (Open).
func (s *Spool) newSegment() error {
	seq := s.nextSeq
	starts, err := s.inflightFrames()
	if err != nil {
		return err
	}
	f, err := s.fs.OpenFile(s.path(seq), os.O_CREATE|os.O_EXCL|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("usage spool: new segment: %w", err)
	}
	if len(starts) > 0 {
		if _, err := f.Write(starts); err != nil {
			f.Close()                //nolint:errcheck
			s.fs.Remove(s.path(seq)) //nolint:errcheck
			return fmt.Errorf("usage spool: new segment: %w", err)
		}
	}
	s.nextSeq++
	if s.active != nil {
		// Synced and closed by the sync loop, off the requests' path.
		s.retired = append(s.retired, s.active)
	}
	s.active = f
	n := int64(len(starts))
	s.segs = append(s.segs, segment{seq: seq, size: n, copied: n})
	s.total += n
	s.dirty = true
	s.copiedAll = true
	return nil
}

// inflightFrames is the frames of the starts in flight, for a segment's
// head.
func (s *Spool) inflightFrames() ([]byte, error) {
	var b []byte
	for id, data := range s.inflight {
		var err error
		if b, err = appendFrame(b, Start, id, data); err != nil {
			return nil, err
		}
	}
	return b, nil
}

// startsInActive says the active segment holds every start in flight:
// older segments hold nothing a restart needs, once the readers are past
// them.
func (s *Spool) startsInActive() bool { return s.copiedAll || len(s.inflight) == 0 }

// compactActive makes room on a full filesystem, when there is none for
// a new segment beside the active one, which every reader has read whole:
// all it holds that a restart needs is the starts in flight, so they are
// written over its head (room it has already), it is cut after them and
// renamed as the next segment (no saved position points into it then). A
// kill at any step leaves the starts on disk, and frames after them that
// are whole and read, or cut at Open. Only when every start in flight is
// in the active segment, and the older segments are gone: they may hold
// the start of a request whose end goes with this one. Callers hold mu.
func (s *Spool) compactActive() error {
	if !s.startsInActive() {
		return errors.New("usage spool: no room for a new segment, and starts in flight in older ones")
	}
	act := s.segs[len(s.segs)-1]
	starts, err := s.inflightFrames()
	if err != nil {
		return err
	}
	f, err := s.fs.OpenFile(s.path(act.seq), os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	defer f.Close() //nolint:errcheck // written and cut, or failed before
	if _, err := f.WriteAt(starts, 0); err != nil {
		return err
	}
	if err := f.Truncate(int64(len(starts))); err != nil {
		return err
	}
	seq := s.nextSeq
	if err := s.fs.Rename(s.path(act.seq), s.path(seq)); err != nil {
		return err
	}
	s.nextSeq++
	n := int64(len(starts))
	s.total += n - act.size
	s.segs[len(s.segs)-1] = segment{seq: seq, size: n, copied: n}
	s.copiedAll = true
	s.dirty = true
	return nil
}

// write appends one frame to the active segment, in one write. A failed
// write is cut back off, so the segment holds whole frames only.
func (s *Spool) write(kind Kind, id string, data []byte) error {
	var err error
	if s.frame, err = appendFrame(s.frame[:0], kind, id, data); err != nil {
		return err
	}
	if s.active == nil {
		// Open could begin none (a full disk): try again.
		if err := s.newSegment(); err != nil {
			return err
		}
	}
	seg := &s.segs[len(s.segs)-1]
	n, err := s.active.Write(s.frame)
	if err != nil {
		if n > 0 {
			s.active.Truncate(seg.size) //nolint:errcheck // the frame's checksum guards what this cannot
		}
		return err
	}
	seg.size += int64(n)
	s.total += int64(n)
	s.dirty = true
	return nil
}

// Append adds an entry: a start when a request is forwarded, its end when
// it is finished. It never blocks on a reader or a sync. A start, or an
// end whose start was not taken, past the bound is refused with ErrFull;
// the end of a started request is not, room having been held back for
// it. A write the filesystem refuses (no space) returns its error. Either
// way the caller counts the refusal, and calls Cancel for a refused end.
func (s *Spool) Append(kind Kind, id string, data []byte) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
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
		select {
		case r.wake <- struct{}{}:
		default:
		}
	}
	// Measured past the copied starts: with many requests in flight they
	// alone may pass the size, and each new segment would begin another.
	if act := s.segs[len(s.segs)-1]; act.size-act.copied >= s.opts.SegmentSize {
		s.rotate()
	}
	return nil
}

// rotate begins a new segment, telling Failed when it cannot: the old one
// stays active and grows.
func (s *Spool) rotate() {
	if err := s.newSegment(); err != nil && s.opts.Failed != nil {
		s.opts.Failed(err)
	}
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
	if !s.closed {
		s.write(Cancel, id, nil) //nolint:errcheck // without it, a restart delivers the start's record
	}
}

// Size is the segments' total size.
func (s *Spool) Size() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.total
}

// releasable is the segments every reader is past, and begins a new
// active segment first when every reader has read the whole active one
// and it holds enough beyond its copied starts to be worth giving back
// (on a filesystem that filled, that is what frees room). Callers hold
// mu, or own the spool.
func (s *Spool) releasable() []uint64 {
	if len(s.readers) == 0 || len(s.segs) == 0 {
		return nil
	}
	min := s.readers[0].cursor
	for _, r := range s.readers[1:] {
		if r.cursor.before(min) {
			min = r.cursor
		}
	}
	if act := s.segs[len(s.segs)-1]; min == (position{act.seq, act.size}) && act.size-act.copied >= s.opts.SegmentSize/16 && s.active != nil {
		err := s.newSegment()
		if err != nil && s.startsInActive() {
			// No room beside it: the older segments go now, then the
			// active one is cut to its starts.
			for len(s.segs) > 1 {
				s.fs.Remove(s.path(s.segs[0].seq)) //nolint:errcheck // gone from the books either way; Open cleans up
				s.total -= s.segs[0].size
				s.segs = s.segs[1:]
			}
			err = s.compactActive()
		}
		if err == nil {
			min = position{s.segs[len(s.segs)-1].seq, 0}
		} else if s.opts.Failed != nil {
			s.opts.Failed(err)
		}
	}
	if !s.startsInActive() {
		return nil // an older segment holds a start in flight
	}
	var gone []uint64
	for len(s.segs) > 1 && s.segs[0].seq < min.seq {
		gone = append(gone, s.segs[0].seq)
		s.total -= s.segs[0].size
		s.segs = s.segs[1:]
	}
	return gone
}

// deleteSegments removes segment files, outside mu.
func (s *Spool) deleteSegments(seqs []uint64) {
	for _, seq := range seqs {
		s.fs.Remove(s.path(seq)) //nolint:errcheck // gone from the books either way; Open cleans up
	}
}

// syncLoop syncs every Options.Sync when there is anything new.
func (s *Spool) syncLoop() {
	defer close(s.stopped)
	t := time.NewTicker(s.opts.Sync)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
			if err := s.Sync(); err != nil && s.opts.Failed != nil {
				s.opts.Failed(err)
			}
		}
	}
}

// Sync writes what the spool holds, and the directory's names, to the
// disk, and closes the segments left behind. Appends go on meanwhile.
func (s *Spool) Sync() error {
	s.syncLock.Lock()
	defer s.syncLock.Unlock()
	s.mu.Lock()
	if !s.dirty || s.closed {
		s.mu.Unlock()
		return nil
	}
	s.dirty = false
	active, retired := s.active, s.retired
	s.retired = nil
	var upTo position
	if n := len(s.segs); n > 0 {
		upTo = position{s.segs[n-1].seq, s.segs[n-1].size}
	}
	s.mu.Unlock()
	var err error
	for _, f := range retired {
		err = errors.Join(err, f.Sync(), f.Close())
	}
	if active != nil {
		err = errors.Join(err, active.Sync())
	}
	err = errors.Join(err, s.fs.SyncDir(s.opts.Dir))
	if err != nil {
		s.mu.Lock()
		s.dirty = true
		s.mu.Unlock()
		return fmt.Errorf("usage spool: sync: %w", err)
	}
	s.mu.Lock()
	if s.synced.before(upTo) {
		s.synced = upTo
	}
	s.mu.Unlock()
	return nil
}

// Close syncs and closes the spool; what is in it stays for the next Open.
func (s *Spool) Close() error {
	s.closing.Do(func() { close(s.stop) })
	<-s.stopped
	err := s.Sync()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	s.closed = true
	for _, r := range s.readers {
		r.closeFiles()
	}
	if s.active != nil {
		err = errors.Join(err, s.active.Close())
	}
	// Last: a process that opens the spool next finds every file closed.
	return errors.Join(err, s.lock.Close())
}

// Reader reads one sink's records in order, from its acknowledged
// position. One goroutine uses a Reader at a time.
type Reader struct {
	s    *Spool
	name string
	// cursor is the position after the last acknowledged record (or run
	// of starts read past), and pending the records after it; both under
	// s.mu.
	cursor  position
	pending int
	wake    chan struct{}

	file    file
	fileSeq uint64
	// cursorFile holds the saved position, written in place.
	cursorFile file
	buf        []byte
	batch      Batch
}

// Reader returns the reader named name, nil when there is none.
func (s *Spool) Reader(name string) *Reader {
	for _, r := range s.readers {
		if r.name == name {
			return r
		}
	}
	return nil
}

// Wake is signalled when a record is appended.
func (r *Reader) Wake() <-chan struct{} { return r.wake }

// Pending is the records not yet acknowledged.
func (r *Reader) Pending() int {
	r.s.mu.Lock()
	defer r.s.mu.Unlock()
	return r.pending
}

// Record is one record read: its id and data, valid until the next Next.
type Record struct {
	ID, Data []byte
}

// Batch is the records Next read, and where they end.
type Batch struct {
	Records []Record
	end     position
	bytes   int
}

// Next reads up to max records, and about maxBytes of them, after the
// acknowledged position; an empty batch when there are none yet. Starts
// are read past, however many. The batch stays valid until the next call.
func (r *Reader) Next(max, maxBytes int) (*Batch, error) {
	s := r.s
	s.mu.Lock()
	segs := slices.Clone(s.segs)
	at := r.cursor
	s.mu.Unlock()
	b := &r.batch
	b.Records, b.bytes = b.Records[:0], 0
	r.buf = r.buf[:0]
	// Not kept open between batches: a segment deleted meanwhile gives
	// its room back at once.
	defer r.closeSegment()
	full := func() bool { return len(b.Records) >= max || b.bytes >= maxBytes }
	for _, seg := range segs {
		if seg.seq < at.seq {
			continue
		}
		if seg.seq > at.seq {
			at = position{seg.seq, 0}
		}
		for at.off < seg.size && !full() {
			if len(b.Records) == 0 {
				r.buf = r.buf[:0] // nothing read refers to it yet
			}
			n := min(seg.size-at.off, int64(maxBytes-b.bytes)+MaxEntry)
			chunk, err := r.readAt(seg.seq, at.off, n)
			if err != nil {
				return nil, err
			}
			read := at.off
			for len(chunk) > 0 && !full() {
				e, ok, _ := parseFrame(chunk)
				if !ok {
					break // a frame across the window: the next read
				}
				chunk, at.off = chunk[e.size:], at.off+int64(e.size)
				if e.kind == End {
					b.Records = append(b.Records, Record{ID: e.id, Data: e.data})
					b.bytes += len(e.data)
				}
			}
			if at.off == read {
				// Not one whole frame in a window larger than any:
				// the segment's size says otherwise only if it changed
				// under a cut; read no further.
				break
			}
			if len(b.Records) > 0 && at.off < seg.size {
				break // a batch in hand; the rest is the next one's
			}
		}
		if full() || at.off < seg.size {
			break
		}
	}
	b.end = at
	if len(b.Records) == 0 && r.cursor.before(at) {
		// Only starts: read past, for good (they are never records).
		s.mu.Lock()
		r.cursor = at
		s.mu.Unlock()
	}
	return b, nil
}

// readAt reads n bytes of segment seq from off into r.buf, returning them.
func (r *Reader) readAt(seq uint64, off, n int64) ([]byte, error) {
	if r.file == nil || r.fileSeq != seq {
		if r.file != nil {
			r.file.Close() //nolint:errcheck // read only
		}
		f, err := r.s.fs.OpenFile(r.s.path(seq), os.O_RDONLY, 0)
		if err != nil {
			r.file = nil
			return nil, fmt.Errorf("usage spool: %w", err)
		}
		r.file, r.fileSeq = f, seq
	}
	start := len(r.buf)
	r.buf = slices.Grow(r.buf, int(n))[:start+int(n)]
	got, err := r.file.ReadAt(r.buf[start:], off)
	if err != nil && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("usage spool: %w", err)
	}
	r.buf = r.buf[:start+got]
	return r.buf[start:], nil
}

func (r *Reader) closeSegment() {
	if r.file != nil {
		r.file.Close() //nolint:errcheck // read only
		r.file = nil
	}
}

func (r *Reader) closeFiles() {
	for _, f := range []file{r.file, r.cursorFile} {
		if f != nil {
			f.Close() //nolint:errcheck
		}
	}
	r.file, r.cursorFile = nil, nil
}

// Ack records that b's records were delivered: the reader moves past
// them, segments every reader is past are deleted, and the position is
// saved once the disk holds what it is past (a sync first, if need be),
// so that a machine failure can make a record delivered again, never one
// delivered with two contents. A position that cannot be saved is
// returned; the reader has moved on all the same, and only a restart
// would send those records again.
func (r *Reader) Ack(b *Batch) error {
	s := r.s
	s.mu.Lock()
	if r.cursor.before(b.end) {
		r.cursor = b.end
	}
	r.pending -= len(b.Records)
	gone := s.releasable()
	unsynced := s.synced.before(r.cursor)
	to := r.cursor
	s.mu.Unlock()
	s.deleteSegments(gone)
	if unsynced {
		if err := s.Sync(); err != nil {
			return err
		}
	}
	if err := r.save(to); err != nil {
		return fmt.Errorf("usage spool: save %s's position: %w", r.name, err)
	}
	return nil
}

// cursorSize is a cursor file's size: two numbers and their checksum,
// written in place over the last, so that saving takes no new room on a
// full disk.
const cursorSize = 48

// save writes the reader's position to its cursor file.
func (r *Reader) save(p position) error {
	if r.cursorFile == nil {
		f, err := r.s.fs.OpenFile(filepath.Join(r.s.opts.Dir, r.name+".cursor"), os.O_CREATE|os.O_WRONLY, 0o600)
		if err != nil {
			return err
		}
		r.cursorFile = f
	}
	line := fmt.Appendf(nil, "%d %d", p.seq, p.off)
	line = fmt.Appendf(line, " %08x", crc(line))
	line = append(line, strings.Repeat(" ", cursorSize-1-len(line))...)
	_, err := r.cursorFile.WriteAt(append(line, '\n'), 0)
	return err
}

// readCursor reads a reader's saved position; the zero position when it
// has none, or one that does not read back whole.
func (s *Spool) readCursor(name string) (position, error) {
	b, err := readFile(s.fs, filepath.Join(s.opts.Dir, name+".cursor"))
	if os.IsNotExist(err) {
		return position{}, nil
	}
	if err != nil {
		return position{}, fmt.Errorf("usage spool: read %s's position: %w", name, err)
	}
	fields := strings.Fields(string(b))
	if len(fields) != 3 {
		return position{}, nil
	}
	seq, err1 := strconv.ParseUint(fields[0], 10, 64)
	off, err2 := strconv.ParseInt(fields[1], 10, 64)
	sum, err3 := strconv.ParseUint(fields[2], 16, 32)
	if err1 != nil || err2 != nil || err3 != nil || uint32(sum) != crc([]byte(fields[0]+" "+fields[1])) {
		return position{}, nil
	}
	return position{seq, off}, nil
}

// resume is where a reader saved at p goes on: p in its segment (at most
// its end, past a tail cut short); the start of the next segment, when
// its own is gone (every reader was past it); from the first segment when
// p is none, or past every segment (a directory emptied by hand), which
// at worst delivers again.
func (s *Spool) resume(p position) position {
	if len(s.segs) == 0 {
		return position{s.nextSeq, 0}
	}
	first, last := s.segs[0], s.segs[len(s.segs)-1]
	if p.seq == 0 || p.seq > last.seq {
		return position{first.seq, 0}
	}
	for _, seg := range s.segs {
		switch {
		case seg.seq == p.seq:
			return position{p.seq, min(p.off, seg.size)}
		case seg.seq > p.seq:
			return position{seg.seq, 0}
		}
	}
	return position{first.seq, 0}
}
