package spool

import (
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"
)

// Open opens the spool in opts.Dir, creating it if need be, and recovers
// what an earlier process left: a tail cut short is cut off, a request
// started and never ended gets its start's record, and each reader
// resumes after what it acknowledged. Only a directory it cannot read or
// make, or one another open spool holds (ErrInUse), fails it: a disk that
// is full or failing leaves the spool refusing records, never the process
// unable to start.
func Open(opts Options) (*Spool, Recovery, error) {
	if opts.SegmentSize <= 0 {
		opts.SegmentSize = DefaultSegmentSize
	}
	if opts.Sync <= 0 {
		opts.Sync = DefaultSync
	}
	var lock io.Closer = nopCloser{}
	if opts.fs == nil {
		opts.fs = osFS{}
		if err := os.MkdirAll(opts.Dir, 0o700); err != nil {
			return nil, Recovery{}, fmt.Errorf("usage spool: %w", err)
		}
		f, err := lockDir(opts.Dir, opts.Failed)
		if err != nil {
			return nil, Recovery{}, err
		}
		lock = f
	}
	s, rec, err := recoverSpool(opts, lock)
	if err != nil {
		lock.Close() //nolint:errcheck // the error says what failed
		return nil, rec, err
	}
	return s, rec, nil
}

type nopCloser struct{}

func (nopCloser) Close() error { return nil }

// found is what reading the segments at Open found.
type found struct {
	// starts is the starts not ended, from the newest head on; endsAt,
	// where the ends lie.
	starts map[string][]byte
	endsAt []position
	// thisSeg is the starts of the segment being read, so far.
	thisSeg map[string][]byte
}

func (f *found) add(seg *segment, e entry, at position) {
	switch {
	case e.kind == Start:
		f.starts[string(e.id)] = append([]byte(nil), e.data...)
		f.thisSeg[string(e.id)] = f.starts[string(e.id)]
	case e.kind == End:
		delete(f.starts, string(e.id))
		delete(f.thisSeg, string(e.id))
		f.endsAt = append(f.endsAt, at)
		seg.ends++
	case isMark(e):
		// Every start in flight as the segment began is in its head,
		// and those since are in it too: a start read before it in an
		// older segment and not here has ended.
		f.starts = maps.Clone(f.thisSeg)
		seg.marked, seg.markEnd = true, at.off+int64(e.size)
	default:
		delete(f.starts, string(e.id))
		delete(f.thisSeg, string(e.id))
	}
}

// recoverSpool opens the spool in opts.Dir, whose lock is held.
func recoverSpool(opts Options, lock io.Closer) (*Spool, Recovery, error) {
	rec := Recovery{Pending: map[string]int{}}
	s := &Spool{opts: opts, fs: opts.fs, lock: lock, inflight: map[string][]byte{},
		syncSoon: make(chan struct{}, 1), stop: make(chan struct{}), stopped: make(chan struct{})}
	segs, err := s.listSegments()
	if err != nil {
		return nil, rec, err
	}
	f := found{starts: map[string][]byte{}}
	for _, seg := range segs {
		f.thisSeg = map[string][]byte{}
		corrupt, err := s.scan(seg, &f)
		if err != nil {
			return nil, rec, err
		}
		rec.Corrupt += corrupt
		s.total += seg.size
	}
	s.segs = segs
	s.nextSeq = 1
	if n := len(segs); n > 0 {
		s.nextSeq = segs[n-1].seq + 1
	}
	if err := s.openReaders(f.endsAt); err != nil {
		return nil, rec, err
	}
	rec.Lost = s.endLost(f.starts)
	// What the segments held is synced (scan), the new head and the
	// lost requests' ends are synced now; then the older segments go.
	if err := s.Sync(); err != nil && s.opts.Failed != nil {
		s.opts.Failed(err)
	}
	for _, r := range s.readers {
		rec.Pending[r.name] = r.pending
	}
	if opts.noSyncLoop {
		close(s.stopped)
	} else {
		go s.syncLoop()
	}
	return s, rec, nil
}

// openReaders reads each reader's saved position, and counts the ends
// after it.
func (s *Spool) openReaders(endsAt []position) error {
	for _, name := range s.opts.Readers {
		cur, err := s.readCursor(name)
		if err != nil {
			return err
		}
		// A name a position saw is never given to a new segment: the
		// position would point into other records.
		s.nextSeq = max(s.nextSeq, cur.seq+1)
		saved := cur
		cur = s.resume(cur)
		r := &Reader{s: s, name: name, cursor: cur, saved: saved, wake: make(chan struct{}, 1), behind: make(chan struct{}, 1), pending: s.carriedEnds}
		for _, at := range endsAt {
			if !at.before(cur) {
				r.pending++
			}
		}
		s.readers = append(s.readers, r)
	}
	return nil
}

// endLost gives each request started and never ended its start's record
// as its end, in a new segment whose head carries their starts. Each is
// counted lost, and pending for every reader, at once; a disk that cannot
// take the ends now gets them at a later sync (writeLost), and until then
// the starts stay on the disk, found again by a restart.
func (s *Spool) endLost(starts map[string][]byte) int {
	for id, data := range starts {
		s.lost = append(s.lost, id)
		s.inflight[id] = data
	}
	slices.Sort(s.lost)
	for _, r := range s.readers {
		r.pending += len(s.lost)
	}
	if err := s.newSegment(); err != nil && s.opts.Failed != nil {
		s.opts.Failed(err)
	}
	s.writeLost()
	return len(starts)
}

// writeLost writes the lost requests' ends not yet written, into the
// active segment. Past the bound if need be: these records were taken
// already. Callers hold mu, or own the spool.
func (s *Spool) writeLost() {
	if s.active() == nil || s.broken != nil {
		return
	}
	s.lost = slices.DeleteFunc(s.lost, func(id string) bool {
		if s.write(End, id, s.inflight[id]) != nil {
			return false
		}
		delete(s.inflight, id)
		return true
	})
}

// listSegments lists the segment files in order, and removes what an
// earlier process left under a temporary name.
func (s *Spool) listSegments() ([]*segment, error) {
	names, err := s.fs.ReadDir(s.opts.Dir)
	if err != nil {
		return nil, fmt.Errorf("usage spool: %w", err)
	}
	var segs []*segment
	for _, name := range names {
		if strings.HasSuffix(name, tmpSuffix) {
			s.fs.Remove(s.opts.Dir + "/" + name) //nolint:errcheck // never read
			continue
		}
		hex, ok := strings.CutSuffix(name, ".seg")
		suspect := false
		if !ok {
			hex, suspect = strings.CutSuffix(name, suspectSuffix)
		}
		if !ok && !suspect {
			continue
		}
		seq, err := strconv.ParseUint(hex, 16, 64)
		if err != nil {
			continue
		}
		segs = append(segs, &segment{seq: seq, sealed: true, suspect: suspect})
	}
	slices.SortFunc(segs, func(a, b *segment) int {
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

// scan reads a segment's frames into f, cuts the file at the first one
// that does not check, and makes what an earlier process wrote durable
// before anything is delivered from it. It sets the segment's size to
// what is good, and returns the bytes cut. A segment whose fsync fails is
// read all the same, and its ends carried into the next segment: its
// pages may be in memory alone.
func (s *Spool) scan(seg *segment, f *found) (int64, error) {
	path := s.segPath(seg)
	b, err := readFile(s.fs, path)
	if err != nil {
		return 0, fmt.Errorf("usage spool: %w", err)
	}
	off := 0
	var carried []byte
	ends := len(f.endsAt)
	for off < len(b) {
		e, ok, _ := parseFrame(b[off:])
		if !ok {
			break
		}
		f.add(seg, e, position{seg.seq, int64(off)})
		if e.kind == End {
			carried = append(carried, b[off:off+e.size]...)
		}
		off += e.size
	}
	// Readers have it once the directory is synced too (the first Sync).
	seg.size, seg.fileSynced, seg.head = int64(off), int64(off), int64(off)
	s.dirDirty = true
	file, err := s.fs.OpenFile(path, os.O_WRONLY, 0)
	if err == nil {
		if off < len(b) {
			// Cutting needs no room; if it fails, the bad frame is
			// cut in memory all the same, and the next Open tries
			// again. Nothing is appended to an old segment.
			file.Truncate(int64(off)) //nolint:errcheck // see above
		}
		err = file.Sync()
		file.Close() //nolint:errcheck // synced or failed
	}
	if err == nil && seg.suspect {
		err = errors.New("set apart as suspect")
	}
	if err != nil {
		if s.opts.Failed != nil {
			s.opts.Failed(fmt.Errorf("usage spool: sync %s at start: %w; its records are written again", segmentName(seg.seq), err))
		}
		s.carried = append(s.carried, carried...)
		s.carriedEnds += seg.ends
		s.rewriteDue = true
		s.failed = append(s.failed, position{seg.seq, 0})
		f.endsAt = f.endsAt[:ends]
		seg.ends, seg.size, seg.fileSynced = 0, 0, 0
		seg.carriedAll = true
		if !s.settle(seg, nil) {
			s.unsettled = append(s.unsettled, seg)
		}
	}
	return int64(len(b) - off), nil
}
