package spool

import (
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
)

// A segment is one file of the spool, named by its sequence number, which
// only ever grows. Frames are only ever appended to it, never rewritten in
// place: a write that fails can tear the frame it wrote, never one before
// it.
//
// Each segment begins with a head: a copy of every start in flight as it
// began (and the ends carried from a segment whose sync failed). Once
// every older segment is on the disk whole, a sync appends the mark (a
// Cancel frame with an empty id): every start still in flight is before
// it in this segment. A mark on the disk says no older segment holds a
// start that matters, so once it is synced, the older segments go as soon
// as every reader is past them, and a deleted one that a power cut brings
// back is harmless: Open reads starts only from the newest mark on.
type segment struct {
	seq uint64
	// size is its whole frames'; fileSynced, how much of them the file
	// holds on the disk; synced, how much readers may have: the file's
	// part whose name is on the disk too. head is its head's size, and
	// markEnd where its mark ends.
	size, fileSynced, synced, head, markEnd int64
	// marked says it has its mark; sealed, that it takes no more frames;
	// suspect, that a sync of it failed and it could not be cut back to
	// what the disk holds (segPath).
	marked, sealed, suspect bool
	// carriedAll says Open carried every end it holds into a new segment
	// (a sync of it failed, or it was suspect): once they are on the
	// disk there, it goes, whichever readers are behind it.
	carriedAll bool
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

// suspectSuffix names a segment whose sync failed and that could not be
// cut back to what the disk holds. A process started after a kill would
// read from the page cache what the disk may never have got, and its
// fsync would succeed (the error was reported once, to the process that
// failed); so Open reads no such segment as synced, but carries its ends
// into a new segment, as for a sync that fails at Open.
const suspectSuffix = ".suspect"

// segPath is where seg's file is.
func (s *Spool) segPath(seg *segment) string {
	if seg.suspect {
		return filepath.Join(s.opts.Dir, fmt.Sprintf("%016x%s", seg.seq, suspectSuffix))
	}
	return s.path(seg.seq)
}

// markSuspect renames seg's file as suspect. Callers hold mu, or own the
// spool.
func (s *Spool) markSuspect(seg *segment) bool {
	if seg.suspect {
		return true
	}
	from := s.segPath(seg)
	seg.suspect = true
	if err := s.rename(from, s.segPath(seg)); err != nil {
		seg.suspect = false
		if s.opts.Failed != nil {
			s.opts.Failed(fmt.Errorf("usage spool: %s, whose sync failed, could not be set apart: %w", segmentName(seg.seq), err))
		}
		return false
	}
	s.dirDirty = true
	return true
}

// rename renames from to to, as done when it says it failed but to is
// there and from is not (a network filesystem may answer so).
func (s *Spool) rename(from, to string) error {
	err := s.fs.Rename(from, to)
	if err == nil {
		return nil
	}
	there := func(name string) bool {
		f, err := s.fs.OpenFile(name, os.O_RDONLY, 0)
		if err == nil {
			f.Close() //nolint:errcheck // read only
		}
		return err == nil
	}
	if there(to) && !there(from) {
		return nil
	}
	return err
}

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

// newSegment begins a new active segment: its head, a copy of every start
// in flight, then the ends carried from a segment whose sync failed. It is written whole under a temporary name and then
// renamed, as etcd's WAL begins a segment, so that a segment that could
// not be begun leaves no file Open would read; the older segments stay
// until it is synced. Callers hold mu, or own the spool (Open).
func (s *Spool) newSegment() error {
	b := s.head[:0]
	// In order, so that a test's run is the same each time.
	for _, id := range slices.Sorted(maps.Keys(s.inflight)) {
		var err error
		if b, err = appendFrame(b, Start, id, s.inflight[id]); err != nil {
			return err
		}
	}
	b = append(b, s.carried...)
	head := int64(len(b))
	s.head = b[:0]
	s.headBytes = head
	seq := s.nextSeq
	name := s.path(seq)
	// The spare, with room reserved on the disk, when there is one: on
	// a full disk it is what lets the spool begin the segment that lets
	// the older ones go.
	tmp, f := s.sparePath(), s.spare
	s.spare = nil
	if f == nil {
		tmp = name + tmpSuffix
		var err error
		if f, err = s.fs.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY|os.O_APPEND, 0o600); err != nil {
			return fmt.Errorf("usage spool: new segment: %w", err)
		}
	}
	_, err := f.Write(b)
	if err == nil {
		err = s.rename(tmp, name)
	}
	s.dirDirty = true
	if err != nil {
		f.Close()        //nolint:errcheck // abandoned
		s.fs.Remove(tmp) //nolint:errcheck // Open removes it otherwise
		return fmt.Errorf("usage spool: new segment: %w", err)
	}
	s.nextSeq++
	if act := s.active(); act != nil {
		// Synced and closed by a sync run now, off the requests' path:
		// its tail's memory then serves the segment after this one.
		act.sealed = true
		select {
		case s.syncSoon <- struct{}{}:
		default:
		}
	}
	seg := &segment{seq: seq, size: head, head: head, f: f,
		ends: s.carriedEnds, tail: append(s.spareTail(), s.carried...), tailEnds: s.carriedEnds}
	s.segs = append(s.segs, seg)
	s.total += seg.size
	s.unsynced += int64(len(s.carried))
	if len(s.carried) > 0 {
		s.carriedInto = seq
	}
	s.carried, s.carriedEnds = nil, 0
	return nil
}

// spareName is the file made ahead of need for the next segment, with
// room reserved (etcd's WAL keeps such a file); spareRoom, the least room
// it reserves, or twice the last head if more.
const (
	spareName = "next.seg" + tmpSuffix
	spareRoom = 64 << 10
)

func (s *Spool) sparePath() string { return filepath.Join(s.opts.Dir, spareName) }

// makeSpare makes the spare when there is none, outside mu. A disk that
// cannot reserve room leaves the spare without: the next segment takes
// the room it finds.
func (s *Spool) makeSpare() {
	s.mu.Lock()
	need := s.spare == nil && !s.closed
	room := max(spareRoom, 2*s.headBytes)
	s.mu.Unlock()
	if !need {
		return
	}
	f, err := s.fs.OpenFile(s.sparePath(), os.O_CREATE|os.O_TRUNC|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return
	}
	f.Reserve(room) //nolint:errcheck // see above
	// Synced empty: were it a leftover cut by O_TRUNC, a power cut could
	// bring its old bytes back under the next segment's name.
	if f.Sync() != nil {
		f.Close() //nolint:errcheck // not used
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.spare != nil || s.closed {
		f.Close() //nolint:errcheck // not needed
		return
	}
	s.spare = f
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
		s.refused = true
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
