package spool

import (
	"errors"
	"fmt"
	"time"
)

// syncLoop syncs every Options.Sync, and sooner when syncAhead bytes of
// ends wait: readers are handed only what is synced, and the ends not yet
// synced are held in memory.
func (s *Spool) syncLoop() {
	defer close(s.stopped)
	t := time.NewTicker(s.opts.Sync)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
		case <-s.syncSoon:
		}
		if err := s.Sync(); err != nil && s.opts.Failed != nil {
			s.opts.Failed(err)
		}
	}
}

// Sync makes what the spool holds durable, the directory's names too,
// hands it to the readers, and gives back the segments every reader is
// past. Appends go on meanwhile.
//
// A segment whose fsync fails is failed (failSegment): its ends past its
// last sync are written again into a new segment, synced at once. If that
// fails too, the spool refuses entries until a later Sync writes them.
// The error says what failed, even when the records were saved.
func (s *Spool) Sync() error {
	s.syncLock.Lock()
	defer s.syncLock.Unlock()
	err := s.syncFiles()
	for try := 0; try < 2 && s.mustRewrite(); try++ {
		if rerr := s.rewrite(); rerr != nil {
			err = errors.Join(err, rerr)
			break
		}
		err = errors.Join(err, s.syncFiles())
	}
	s.mu.Lock()
	gone := s.releasable()
	s.mu.Unlock()
	s.deleteSegments(gone)
	return err
}

// syncJob is one file a sync makes durable: how far, and how much of its
// tail that covers.
type syncJob struct {
	seg        *segment
	f          file
	upTo       int64
	tail, ends int
	err        error
}

// syncFiles fsyncs every segment with frames not yet synced, then the
// directory, outside mu, and moves each segment's synced position.
func (s *Spool) syncFiles() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	var jobs []syncJob
	for _, seg := range s.segs {
		if seg.f != nil && (seg.synced < seg.size || seg.sealed) {
			jobs = append(jobs, syncJob{seg: seg, f: seg.f, upTo: seg.size, tail: len(seg.tail), ends: seg.tailEnds})
		}
	}
	dir := s.dirDirty
	s.dirDirty = false
	s.mu.Unlock()
	if len(jobs) == 0 && !dir {
		return nil
	}
	for i := range jobs {
		jobs[i].err = jobs[i].f.Sync()
	}
	var err error
	if dir {
		if derr := s.fs.SyncDir(s.opts.Dir); derr != nil {
			// The new segments' names may not be on the disk: nothing
			// counts as synced until a sync of the directory succeeds.
			err = fmt.Errorf("usage spool: sync the directory: %w", derr)
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	dirFailed := err != nil
	if dirFailed {
		s.dirDirty = true
	}
	advanced := false
	for _, j := range jobs {
		switch {
		case j.err != nil:
			s.failSegment(j.seg)
			err = errors.Join(err, fmt.Errorf("usage spool: sync %s: %w", segmentName(j.seg.seq), j.err))
		case !dirFailed:
			advanced = s.synced(j) || advanced
		}
	}
	if advanced {
		for _, r := range s.readers {
			select {
			case r.wake <- struct{}{}:
			default:
			}
		}
	}
	return err
}

// synced records that the disk holds j's segment up to j.upTo. Callers
// hold mu.
func (s *Spool) synced(j syncJob) bool {
	seg := j.seg
	if seg.f != j.f { // failed since
		return false
	}
	advanced := j.upTo > seg.synced
	seg.synced = max(seg.synced, j.upTo)
	seg.tail = seg.tail[:copy(seg.tail, seg.tail[j.tail:])]
	seg.tailEnds -= j.ends
	s.unsynced -= int64(j.tail)
	if seg.sealed && seg.synced == seg.size {
		seg.f.Close() //nolint:errcheck // synced whole; nothing more to write
		seg.f = nil
		// Its tail's memory serves the next segment: the ends of a busy
		// engine fill one every interval, and would be allocated anew.
		if len(s.spareTails) < maxSpareTails {
			s.spareTails = append(s.spareTails, seg.tail[:0])
		}
		seg.tail = nil
	}
	return advanced
}

// failSegment fails a segment whose fsync failed. Its pages written since
// its last sync may be gone for good, and a later fsync would not say so:
// Linux marks them clean after reporting the error once (the "fsyncgate"
// PostgreSQL met in 2018), so the file is never synced again. It takes no
// more frames, its size is what the disk is known to hold (readers stop
// there), and its ends past that are carried into the next segment, from
// memory. Its starts need no carrying: those still in flight are in the
// next segment's head. Callers hold mu.
func (s *Spool) failSegment(seg *segment) {
	if seg.f == nil {
		return
	}
	seg.f.Close() //nolint:errcheck // failed; never written or synced again
	seg.f = nil
	seg.sealed = true
	s.carried = append(s.carried, seg.tail...)
	s.carriedEnds += seg.tailEnds
	s.unsynced -= int64(len(seg.tail))
	seg.ends -= seg.tailEnds
	s.total -= seg.size - seg.synced
	seg.size = seg.synced
	seg.tail, seg.tailEnds = nil, 0
}

// mustRewrite says ends carried from a failed segment wait for a new one.
func (s *Spool) mustRewrite() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.carried) > 0 || s.broken != nil
}

// rewrite writes the carried ends into a new segment. Until it can, the
// spool refuses entries: an end taken now could be delivered before the
// carried ones are on the disk again, and a record is never reported as
// synced that is not.
func (s *Spool) rewrite() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	if err := s.newSegment(); err != nil {
		s.broken = fmt.Errorf("usage spool: records a failed sync left could not be written again, so the spool refuses new ones: %w", err)
		return s.broken
	}
	s.broken = nil
	return nil
}
