// Package spool is the usage records' queue on disk: entries appended as
// requests start and finish, read in order by each sink from its own
// acknowledged position, released once every sink has acknowledged them,
// and found again by Open after a restart on the same directory.
//
// An append is one write(2) into the active segment file: once it returns,
// the entry survives the process being killed (the kernel holds it), and
// survives the machine failing once the next sync has run (Options.Sync).
// A frame cut short by a kill is found by its checksum and cut off at Open.
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
	DefaultSegmentSize = 4 << 20
	DefaultSync        = time.Second
	// endRoom is what a start holds back for its end: an end whose start
	// was taken is never refused for the spool's bound.
	endRoom = 4 << 10
)

// ErrFull is the refusal of an entry past the spool's bound.
var ErrFull = errors.New("usage spool full")

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
	// 0; negative syncs every append (tests of the cost).
	Sync time.Duration
	// Readers names the spool's readers, one per sink.
	Readers []string
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
}

// Spool is an open spool.
type Spool struct {
	opts Options

	mu       sync.Mutex
	segs     []segment // in order; the last is active
	active   *os.File
	total    int64
	frame    []byte
	readers  []*Reader
	inflight map[string][]byte // the starts not yet ended, by id
	dirty    bool
	closed   bool
	// syncErr is the last sync's failure, for Close.
	syncErr error

	stop    chan struct{}
	stopped chan struct{}
	closing sync.Once
}

func segmentName(seq uint64) string { return fmt.Sprintf("%016x.seg", seq) }

// Open opens the spool in opts.Dir, creating it if need be, and recovers
// what an earlier process left: a tail cut short is cut off, a request
// started and never ended gets its start's record, and each reader
// resumes after what it acknowledged.
func Open(opts Options) (*Spool, Recovery, error) {
	if opts.SegmentSize <= 0 {
		opts.SegmentSize = DefaultSegmentSize
	}
	if opts.Sync == 0 {
		opts.Sync = DefaultSync
	}
	rec := Recovery{Pending: map[string]int{}}
	if err := os.MkdirAll(opts.Dir, 0o700); err != nil {
		return nil, rec, fmt.Errorf("usage spool: %w", err)
	}
	s := &Spool{opts: opts, inflight: map[string][]byte{}, stop: make(chan struct{}), stopped: make(chan struct{})}
	segs, err := s.listSegments()
	if err != nil {
		return nil, rec, err
	}
	// Every segment is read: ends and starts by id, and where each
	// reader's unacknowledged records lie.
	starts := map[string][]byte{}
	ended := map[string]bool{}
	var endsAt []position
	for i := range segs {
		corrupt, err := s.scan(&segs[i], func(e entry, at position) {
			id := string(e.id)
			if e.kind == Start {
				starts[id] = append([]byte(nil), e.data...)
				return
			}
			ended[id] = true
			endsAt = append(endsAt, at)
		})
		if err != nil {
			return nil, rec, err
		}
		rec.Corrupt += corrupt
		s.total += segs[i].size
	}
	s.segs = segs
	first := uint64(1)
	if len(segs) > 0 {
		first = segs[0].seq
	}
	for _, name := range opts.Readers {
		cur, err := s.readCursor(name, first)
		if err != nil {
			return nil, rec, err
		}
		r := &Reader{s: s, name: name, cursor: cur, wake: make(chan struct{}, 1)}
		for _, at := range endsAt {
			if !at.before(cur) {
				r.pending++
			}
		}
		s.readers = append(s.readers, r)
	}
	// A new segment for this process: nothing is appended after a tail
	// an earlier one may have left.
	if err := s.newSegment(); err != nil {
		return nil, rec, err
	}
	var lost []string
	for id := range starts {
		if !ended[id] {
			lost = append(lost, id)
		}
	}
	slices.Sort(lost)
	for _, id := range lost {
		// Past the bound if need be: these records were taken already.
		if err := s.write(End, id, starts[id]); err != nil {
			return nil, rec, fmt.Errorf("usage spool: record a lost request: %w", err)
		}
		for _, r := range s.readers {
			r.pending++
		}
	}
	rec.Lost = len(lost)
	for _, r := range s.readers {
		rec.Pending[r.name] = r.pending
	}
	go s.syncLoop()
	return s, rec, nil
}

// listSegments lists the segment files in order.
func (s *Spool) listSegments() ([]segment, error) {
	des, err := os.ReadDir(s.opts.Dir)
	if err != nil {
		return nil, fmt.Errorf("usage spool: %w", err)
	}
	var segs []segment
	for _, de := range des {
		name, ok := strings.CutSuffix(de.Name(), ".seg")
		if !ok || de.IsDir() {
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
	path := filepath.Join(s.opts.Dir, segmentName(seg.seq))
	b, err := os.ReadFile(path)
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
	if off == len(b) {
		return 0, nil
	}
	if err := os.Truncate(path, int64(off)); err != nil {
		return 0, fmt.Errorf("usage spool: cut a damaged segment: %w", err)
	}
	return int64(len(b) - off), nil
}

// newSegment begins a new active segment, with a copy of every start not
// yet ended, so that older segments hold nothing a restart needs once the
// readers are past them. Callers hold mu, or own the spool (Open).
func (s *Spool) newSegment() error {
	seq := uint64(1)
	if n := len(s.segs); n > 0 {
		seq = s.segs[n-1].seq + 1
	}
	f, err := os.OpenFile(filepath.Join(s.opts.Dir, segmentName(seq)), os.O_CREATE|os.O_EXCL|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("usage spool: new segment: %w", err)
	}
	if s.active != nil {
		// What the old one holds is synced before it is left.
		s.active.Sync()  //nolint:errcheck // a failed sync of a file still open is retried by no one; the data is in the kernel
		s.active.Close() //nolint:errcheck
	}
	s.active = f
	s.segs = append(s.segs, segment{seq: seq})
	s.dirty = true
	for id, data := range s.inflight {
		if err := s.write(Start, id, data); err != nil {
			return err
		}
	}
	return nil
}

// write appends one frame to the active segment, in one write. A failed
// write is cut back off, so the segment holds whole frames only.
func (s *Spool) write(kind Kind, id string, data []byte) error {
	var err error
	if s.frame, err = appendFrame(s.frame[:0], kind, id, data); err != nil {
		return err
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
// it is finished. It never blocks on a reader. An entry past the bound is
// refused with ErrFull, except the end of a request whose start was taken,
// for which room was held back; a write the filesystem refuses (no space)
// returns its error. Either way the caller counts the refusal.
func (s *Spool) Append(kind Kind, id string, data []byte) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrFull
	}
	size := frameSize(id, data)
	_, started := s.inflight[id]
	held := int64(len(s.inflight)) * endRoom
	switch {
	case kind == Start && s.total+size+held+endRoom > s.opts.MaxSize:
		return ErrFull
	case kind == End && started && s.total+size > s.opts.MaxSize+endRoom:
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
	if s.segs[len(s.segs)-1].size >= s.opts.SegmentSize {
		return s.newSegment()
	}
	return nil
}

// Forget drops a start whose request will have no end written (its end
// was refused): a restart must not take it for a lost request.
func (s *Spool) Forget(id string) {
	s.mu.Lock()
	delete(s.inflight, id)
	s.mu.Unlock()
}

// Size is the segments' total size.
func (s *Spool) Size() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.total
}

// release deletes the segments every reader is past, and begins a new
// segment when every reader has read the whole active one and it is worth
// giving back: on a filesystem that filled, that is what frees room.
func (s *Spool) release() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed || len(s.readers) == 0 {
		return
	}
	act := s.segs[len(s.segs)-1]
	min := s.readers[0].cursor
	for _, r := range s.readers[1:] {
		if r.cursor.before(min) {
			min = r.cursor
		}
	}
	if min == (position{act.seq, act.size}) && act.size >= s.opts.SegmentSize/16 {
		if err := s.newSegment(); err == nil {
			min = position{s.segs[len(s.segs)-1].seq, 0}
		}
	}
	for len(s.segs) > 1 && s.segs[0].seq < min.seq {
		if err := os.Remove(filepath.Join(s.opts.Dir, segmentName(s.segs[0].seq))); err != nil && !os.IsNotExist(err) {
			return
		}
		s.total -= s.segs[0].size
		s.segs = s.segs[1:]
	}
}

// syncLoop syncs the active segment every Options.Sync when it has new
// entries.
func (s *Spool) syncLoop() {
	defer close(s.stopped)
	every := s.opts.Sync
	if every < 0 {
		every = time.Millisecond
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
			s.Sync() //nolint:errcheck // kept for Close
		}
	}
}

// Sync writes the active segment, and the directory's new names, to the
// disk when there is anything new.
func (s *Spool) Sync() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.dirty || s.closed {
		return nil
	}
	s.dirty = false
	err := s.active.Sync()
	if d, derr := os.Open(s.opts.Dir); derr == nil {
		err = errors.Join(err, d.Sync())
		d.Close() //nolint:errcheck
	}
	s.syncErr = err
	return err
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
		r.closeFile()
	}
	return errors.Join(err, s.active.Close())
}

// Reader reads one sink's records in order, from its acknowledged
// position. One goroutine uses a Reader at a time.
type Reader struct {
	s    *Spool
	name string
	// cursor is the position after the last acknowledged record, and
	// pending the records after it; both under s.mu.
	cursor  position
	pending int
	wake    chan struct{}

	file    *os.File
	fileSeq uint64
	buf     []byte
	batch   Batch
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
// acknowledged position; an empty batch when there are none yet. The
// batch stays valid until the next call.
func (r *Reader) Next(max, maxBytes int) (*Batch, error) {
	s := r.s
	s.mu.Lock()
	segs := slices.Clone(s.segs)
	at := r.cursor
	s.mu.Unlock()
	b := &r.batch
	b.Records, b.bytes = b.Records[:0], 0
	r.buf = r.buf[:0]
	for _, seg := range segs {
		if seg.seq < at.seq {
			continue
		}
		if seg.seq > at.seq {
			at = position{seg.seq, 0}
		}
		if at.off >= seg.size {
			continue // read; the next segment follows
		}
		n := min(seg.size-at.off, int64(maxBytes-b.bytes)+MaxEntry)
		if err := r.readAt(seg.seq, at.off, n); err != nil {
			return nil, err
		}
		chunk := r.buf[len(r.buf)-int(n):]
		for len(chunk) > 0 && len(b.Records) < max && b.bytes < maxBytes {
			e, ok, _ := parseFrame(chunk)
			if !ok {
				break // the rest comes with the next read
			}
			chunk, at.off = chunk[e.size:], at.off+int64(e.size)
			if e.kind == End {
				b.Records = append(b.Records, Record{ID: e.id, Data: e.data})
				b.bytes += len(e.data)
			}
		}
		if len(b.Records) >= max || b.bytes >= maxBytes || at.off < seg.size {
			break
		}
	}
	b.end = at
	return b, nil
}

// readAt appends n bytes of segment seq from off to r.buf.
func (r *Reader) readAt(seq uint64, off, n int64) error {
	if r.file == nil || r.fileSeq != seq {
		r.closeFile()
		f, err := os.Open(filepath.Join(r.s.opts.Dir, segmentName(seq)))
		if err != nil {
			return fmt.Errorf("usage spool: %w", err)
		}
		r.file, r.fileSeq = f, seq
	}
	start := len(r.buf)
	r.buf = slices.Grow(r.buf, int(n))[:start+int(n)]
	if _, err := r.file.ReadAt(r.buf[start:], off); err != nil && !errors.Is(err, io.EOF) {
		return fmt.Errorf("usage spool: %w", err)
	}
	return nil
}

func (r *Reader) closeFile() {
	if r.file != nil {
		r.file.Close() //nolint:errcheck // read only
		r.file = nil
	}
}

// Ack records that b's records were delivered: the cursor moves past
// them, on disk, and segments every reader is past are deleted. A cursor
// lost to a machine failure only means records delivered again.
//
// The reader moves on even when its position cannot be saved, which is
// returned: only a restart would send those records again.
func (r *Reader) Ack(b *Batch) error {
	err := r.writeCursor(b.end)
	r.s.mu.Lock()
	r.cursor = b.end
	r.pending -= len(b.Records)
	r.s.mu.Unlock()
	if err == nil {
		// A segment goes only once every reader's saved position is past it.
		r.s.release()
	}
	return err
}

// writeCursor writes the cursor file: written aside, then renamed over
// the old one, so a kill leaves one or the other.
func (r *Reader) writeCursor(p position) error {
	path := filepath.Join(r.s.opts.Dir, r.name+".cursor")
	tmp := path + ".new"
	if err := os.WriteFile(tmp, fmt.Appendf(nil, "%d %d\n", p.seq, p.off), 0o600); err != nil {
		return fmt.Errorf("usage spool: write %s's position: %w", r.name, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("usage spool: write %s's position: %w", r.name, err)
	}
	return nil
}

// readCursor reads a reader's cursor; a reader with none, or with one
// before the first segment, starts at the first segment.
func (s *Spool) readCursor(name string, first uint64) (position, error) {
	b, err := os.ReadFile(filepath.Join(s.opts.Dir, name+".cursor"))
	if os.IsNotExist(err) {
		return position{first, 0}, nil
	}
	if err != nil {
		return position{}, fmt.Errorf("usage spool: read %s's position: %w", name, err)
	}
	var p position
	if _, err := fmt.Sscanf(string(b), "%d %d", &p.seq, &p.off); err != nil || p.seq < first {
		// Unreadable, or older than what is left: from the start, which
		// at worst delivers again.
		return position{first, 0}, nil
	}
	return p, nil
}
