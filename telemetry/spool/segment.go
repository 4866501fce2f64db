package spool

import (
	"fmt"
	"os"
	"path/filepath"
)

// A segment is one file of the spool, named by its sequence number, which
// only ever grows. Frames are only ever appended to it, never rewritten in
// place: a write that fails can tear the frame it wrote, never one before
// it.
//
// Each segment begins with a head: a copy of every start in flight as it
// began, then a mark (a Cancel frame with an empty id). A mark on the disk
// says no older segment holds a start that matters, so once a segment's
// head is synced, the older segments go as soon as every reader is past
// them, and a deleted one that a power cut brings back is harmless: Open
// reads starts only from the newest marked segment on.
type segment struct {
	seq uint64
	// size is its whole frames'; synced, how much of it the disk holds
	// (its name in the directory too); head, its head's size.
	size, synced, head int64
	// marked says it has a head; sealed, that it takes no more frames.
	marked, sealed bool
	// ends is the end frames in it.
	ends int
	// f is open while it takes frames or has some not yet synced.
	f file
	// tail is its end frames past synced, tailEnds their count: kept to
	// be written again if its sync fails.
	tail     []byte
	tailEnds int
}

// mark is the frame that ends a segment's head.
func isMark(e entry) bool { return e.kind == Cancel && len(e.id) == 0 }

func segmentName(seq uint64) string { return fmt.Sprintf("%016x.seg", seq) }

func (s *Spool) path(seq uint64) string { return filepath.Join(s.opts.Dir, segmentName(seq)) }

// tmpSuffix names a file not yet whole: a segment being begun, a cursor
// being saved. Open removes those a process left.
const tmpSuffix = ".tmp"

// active is the segment that takes frames, nil when none does (a new one
// could not be begun). Callers hold mu.
func (s *Spool) active() *segment {
	if n := len(s.segs); n > 0 && !s.segs[n-1].sealed {
		return s.segs[n-1]
	}
	return nil
}

// newSegment begins a new active segment: its head (a copy of every start
// in flight, and the mark), then the ends carried from a segment whose
// sync failed. It is written whole under a temporary name and then
// renamed, as etcd's WAL begins a segment, so that a segment that could
// not be begun leaves no file Open would read; the older segments stay
// until it is synced. Callers hold mu, or own the spool (Open).
func (s *Spool) newSegment() error {
	b := s.head[:0]
	for id, data := range s.inflight {
		var err error
		if b, err = appendFrame(b, Start, id, data); err != nil {
			return err
		}
	}
	b, _ = appendFrame(b, Cancel, "", nil)
	head := int64(len(b))
	b = append(b, s.carried...)
	s.head = b[:0]
	seq := s.nextSeq
	name := s.path(seq)
	f, err := s.fs.OpenFile(name+tmpSuffix, os.O_CREATE|os.O_TRUNC|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("usage spool: new segment: %w", err)
	}
	if _, err = f.Write(b); err == nil {
		err = s.fs.Rename(name+tmpSuffix, name)
	}
	s.dirDirty = true
	if err != nil {
		f.Close()                     //nolint:errcheck // abandoned
		s.fs.Remove(name + tmpSuffix) //nolint:errcheck // Open removes it otherwise
		return fmt.Errorf("usage spool: new segment: %w", err)
	}
	s.nextSeq++
	if act := s.active(); act != nil {
		act.sealed = true // synced and closed by the next sync
	}
	seg := &segment{seq: seq, size: int64(len(b)), head: head, marked: true, f: f,
		ends: s.carriedEnds, tail: append(s.spareTail(), s.carried...), tailEnds: s.carriedEnds}
	s.segs = append(s.segs, seg)
	s.total += seg.size
	s.carried, s.carriedEnds = nil, 0
	return nil
}

// maxSpareTails bounds the tails' memory kept for new segments: a few
// segments are unsynced at once at most.
const maxSpareTails = 4

// spareTail is memory for a new segment's tail. Callers hold mu.
func (s *Spool) spareTail() []byte {
	n := len(s.spareTails)
	if n == 0 {
		return nil
	}
	b := s.spareTails[n-1]
	s.spareTails = s.spareTails[:n-1]
	return b
}

// rotate begins a new segment, telling Failed when it cannot: the old one
// stays active and grows.
func (s *Spool) rotate() {
	if err := s.newSegment(); err != nil && s.opts.Failed != nil {
		s.opts.Failed(err)
	}
}

// write appends one frame to the active segment, in one write, beginning
// a segment first if none is active. Callers hold mu.
func (s *Spool) write(kind Kind, id string, data []byte) error {
	var err error
	if s.frame, err = appendFrame(s.frame[:0], kind, id, data); err != nil {
		return err
	}
	if s.broken != nil {
		return s.broken
	}
	act := s.active()
	if act == nil {
		if err := s.newSegment(); err != nil {
			return err
		}
		act = s.active()
	}
	n, err := act.f.Write(s.frame)
	if err != nil {
		s.cutBack(act, n)
		return err
	}
	act.size += int64(n)
	s.total += int64(n)
	if kind == End {
		act.ends++
		act.tail = append(act.tail, s.frame...)
		act.tailEnds++
		if s.unsynced += int64(n); s.unsynced >= syncAhead {
			select {
			case s.syncSoon <- struct{}{}:
			default:
			}
		}
	}
	return nil
}

// cutBack leaves a segment whose write landed part of a frame with whole
// frames only: cut back to its last one, and the cut checked. If it
// cannot be, the segment takes no more frames: one appended after torn
// bytes would be cut off with them at the next Open.
func (s *Spool) cutBack(seg *segment, landed int) {
	if landed == 0 {
		return
	}
	if seg.f.Truncate(seg.size) == nil {
		if size, err := seg.f.Size(); err == nil && size == seg.size {
			return
		}
	}
	seg.sealed = true
	if s.opts.Failed != nil {
		s.opts.Failed(fmt.Errorf("usage spool: %s could not be cut back after a failed write; a new segment takes the records", segmentName(seg.seq)))
	}
}
