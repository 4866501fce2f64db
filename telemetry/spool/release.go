package spool

import "slices"

// evictAbove is the share of MaxSize past which a sink that has fallen
// behind stops holding the others' records: the oldest segment only it
// still needs is given back, and what that costs it is counted.
const evictAbove = 0.75

// releasable takes off the books the segments that can go, and returns
// them for deleteSegments. A segment goes once every reader is past it,
// and a newer segment's mark is synced (durableBase): the starts in
// flight it held are on the disk elsewhere. When every reader has read the
// whole active segment and it holds enough beyond its head, a new one is
// begun (begun), so that it can go once the new one is synced. Callers
// hold mu.
func (s *Spool) releasable() (gone []*segment, begun bool) {
	if len(s.readers) == 0 || len(s.segs) == 0 || s.closed {
		return nil, false
	}
	if act := s.active(); act != nil && act.size-act.head >= s.opts.SegmentSize/16 && s.caughtUp(act) {
		s.rotate()
		begun = s.active() != act
	}
	base := s.durableBase()
	s.evict(base)
	// One still open has a sync to come (which may be running now, outside
	// mu): it goes at a later release.
	for len(s.segs) > 1 && s.segs[0].seq < base && s.segs[0].f == nil && s.readAll(s.segs[0]) && !s.carrying(s.segs[0]) {
		seg := s.segs[0]
		gone = append(gone, seg)
		s.total -= seg.size
		s.segs = s.segs[1:]
	}
	// Were one carried whole kept for a reader behind it, every Open
	// would carry its ends again.
	s.segs = slices.DeleteFunc(s.segs, func(seg *segment) bool {
		if seg.carriedAll && seg.seq < base && seg.f == nil && !s.carrying(seg) {
			gone = append(gone, seg)
			return true
		}
		return false
	})
	return gone, begun
}

// durableBase is the newest segment whose mark the disk holds: no older
// one holds a start that matters. 0 when there is none. Callers hold mu.
func (s *Spool) durableBase() uint64 {
	for i := len(s.segs) - 1; i >= 0; i-- {
		if seg := s.segs[i]; seg.marked && seg.synced >= seg.markEnd {
			return seg.seq
		}
	}
	return 0
}

// readAll says every reader has read the whole of seg.
func (s *Spool) readAll(seg *segment) bool {
	for _, r := range s.readers {
		if !r.past(seg) {
			return false
		}
	}
	return true
}

// carrying says seg failed a sync, and the ends it held past it are not
// yet on the disk in the segment they were carried into: until they are,
// it is their only copy there may be. Callers hold mu.
func (s *Spool) carrying(seg *segment) bool {
	if !slices.ContainsFunc(s.failed, func(p position) bool { return p.seq == seg.seq }) {
		return false
	}
	if s.rewriteDue || len(s.carried) > 0 {
		return true
	}
	for _, c := range s.segs {
		if c.seq == s.carriedInto {
			return c.synced < c.head
		}
	}
	return false
}

// caughtUp says every reader has read all the active segment holds.
func (s *Spool) caughtUp(act *segment) bool {
	for _, r := range s.readers {
		if r.cursor != (position{act.seq, act.size}) {
			return false
		}
	}
	return true
}

// evict lets the readers that have fallen behind skip the oldest segment,
// when the spool is past evictAbove of its bound and another reader is
// past it: one sink that cannot deliver must not stop the other's records
// for good. Each skips at its next read, and counts what it skipped
// (Batch.Skipped). Callers hold mu.
func (s *Spool) evict(base uint64) {
	if float64(s.total) <= evictAbove*float64(s.opts.MaxSize) || len(s.segs) < 2 || s.segs[0].seq >= base {
		return
	}
	old, next := s.segs[0], s.segs[1].seq
	ahead := 0
	for _, r := range s.readers {
		if r.past(old) {
			ahead++
		}
	}
	if ahead == 0 {
		return // every sink is behind: new records are refused instead
	}
	for _, r := range s.readers {
		if !r.past(old) && r.skipTo < next {
			r.skipTo = next
			select {
			case r.behind <- struct{}{}:
			default:
			}
		}
	}
}

// endsFrom is the ends in the segments from seq on, and those carried for
// the next one. Callers hold mu.
func (s *Spool) endsFrom(seq uint64) int {
	n := s.carriedEnds + len(s.lost)
	for _, seg := range s.segs {
		if seg.seq >= seq {
			n += seg.ends
		}
	}
	return n
}

// deleteSegments removes segment files, outside mu; the next sync makes
// the removals durable. One a power cut brings back is read again by
// Open, harmlessly: its starts are older than a synced head, and its ends
// older than every saved position or delivered again whole.
func (s *Spool) deleteSegments(segs []*segment) {
	if len(segs) == 0 {
		return
	}
	for _, seg := range segs {
		s.fs.Remove(s.segPath(seg)) //nolint:errcheck // gone from the books either way; Open cleans up
	}
	s.mu.Lock()
	s.dirDirty = true
	for _, seg := range segs {
		s.removed = append(s.removed, seg.seq)
	}
	s.refused = false
	s.mu.Unlock()
}
