package spool

import (
	"errors"
	"fmt"
	"os"
	"slices"
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
// hands it to the readers, marks the active segment's head once every
// older segment is on the disk whole, and gives back the segments every
// reader is past. Appends go on meanwhile.
//
// A segment whose fsync fails is failed (failSegment): a new segment is
// begun with the starts in flight and the failed one's ends past its last
// sync, and synced at once. If it cannot be, the spool refuses entries
// until a later Sync begins it. The error says what failed, even when the
// records were saved.
func (s *Spool) Sync() error {
	s.syncLock.Lock()
	defer s.syncLock.Unlock()
	s.mu.Lock()
	s.settleFailed()
	s.writeLost()
	s.mu.Unlock()
	err := s.syncFiles()
	for try := 0; try < 2 && s.mustRewrite(); try++ {
		if rerr := s.rewrite(); rerr != nil {
			err = errors.Join(err, rerr)
			break
		}
		err = errors.Join(err, s.syncFiles())
	}
	if s.markActive() {
		err = errors.Join(err, s.syncFiles())
	}
	s.mu.Lock()
	gone, _ := s.releasable()
	s.mu.Unlock()
	s.deleteSegments(gone)
	s.makeSpare()
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
// directory, outside mu. A segment's frames count as synced (readers may
// have them) once its file and its name are both on the disk.
func (s *Spool) syncFiles() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	var jobs []syncJob
	for _, seg := range s.segs {
		if seg.f != nil && (seg.fileSynced < seg.size || seg.sealed) {
			jobs = append(jobs, syncJob{seg: seg, f: seg.f, upTo: seg.size, tail: len(seg.tail), ends: seg.tailEnds})
		}
	}
	dir, removed := s.dirDirty, s.removed
	s.dirDirty, s.removed = false, nil
	s.mu.Unlock()
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
	if err != nil {
		s.dirDirty = true
		s.removed = append(s.removed, removed...)
	} else {
		// Removed for good: a failed segment no longer holds cursors back.
		s.failed = slices.DeleteFunc(s.failed, func(p position) bool { return slices.Contains(removed, p.seq) })
	}
	for _, j := range jobs {
		if j.err != nil {
			s.failSegment(j.seg)
			err = errors.Join(err, fmt.Errorf("usage spool: sync %s: %w", segmentName(j.seg.seq), j.err))
			continue
		}
		s.fileSynced(j)
	}
	if s.dirDirty {
		return err
	}
	advanced := false
	for _, seg := range s.segs {
		if seg.fileSynced > seg.synced {
			seg.synced, advanced = seg.fileSynced, true
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

// fileSynced records that the disk holds j's file up to j.upTo: its tail
// to there is not needed again. Callers hold mu.
func (s *Spool) fileSynced(j syncJob) {
	seg := j.seg
	if seg.f != j.f { // failed since
		return
	}
	seg.fileSynced = max(seg.fileSynced, j.upTo)
	seg.tail = seg.tail[:copy(seg.tail, seg.tail[j.tail:])]
	seg.tailEnds -= j.ends
	s.unsynced -= int64(j.tail)
	if seg.sealed && seg.fileSynced == seg.size {
		seg.f.Close() //nolint:errcheck // synced whole; nothing more to write
		seg.f = nil
		// Its tail's memory serves the next segment: the ends of a busy
		// engine fill one every interval, and would be allocated anew.
		if len(s.spareTails) < maxSpareTails {
			s.spareTails = append(s.spareTails, seg.tail[:0])
		}
		seg.tail = nil
	}
}

// markActive ends the active segment's head with the mark, once every
// older segment is on the disk whole (closed, and its name synced too):
// were the mark on the disk
// before an older segment's last ends, a power cut could leave a request's
// start behind the mark and its end nowhere. It says whether it wrote one.
func (s *Spool) markActive() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	act := s.active()
	if act == nil || act.marked || s.closed || s.broken != nil {
		return false
	}
	for _, seg := range s.segs {
		if seg != act && (seg.f != nil || seg.synced < seg.size) {
			return false // not on the disk whole: its name, or its last frames
		}
	}
	if s.write(Cancel, "", nil) != nil {
		return false
	}
	act.marked, act.markEnd = true, act.size
	return true
}

// failSegment fails a segment whose fsync failed. Its pages written since
// its last sync may be gone for good, and a later fsync would not say so:
// Linux marks them clean after reporting the error once (the "fsyncgate"
// PostgreSQL met in 2018), so the file is never synced again, and it is
// cut back to what the disk is known to hold (or, if it cannot be, set
// apart as suspect), lest a process started after a kill read from the
// page cache what the disk never got. It takes
// no more frames, readers stop at its synced size, and its ends past that
// are carried into a new segment (rewrite), from memory, with the starts
// in flight in its head. Callers hold mu.
func (s *Spool) failSegment(seg *segment) {
	if seg.f == nil {
		return
	}
	if !s.settle(seg, seg.f) {
		s.unsettled = append(s.unsettled, seg)
	}
	seg.f.Close() //nolint:errcheck // failed; never written or synced again
	seg.f = nil
	seg.sealed = true
	s.carried = append(s.carried, seg.tail...)
	s.carriedEnds += seg.tailEnds
	s.unsynced -= int64(len(seg.tail))
	seg.ends -= seg.tailEnds
	s.total -= seg.size - seg.fileSynced
	seg.size = seg.fileSynced
	seg.tail, seg.tailEnds = nil, 0
	s.rewriteDue = true
	s.failed = append(s.failed, position{seg.seq, seg.size})
}

// settle leaves a failed segment's file holding only what its disk is
// known to hold: cut back and the cut synced (its inode's size; the pages
// past it go with the cut), or, if that fails, renamed as suspect. f is
// its file, open for writing, or nil. It says whether it succeeded; until
// it does, each sync tries again (a process started after a kill would
// trust the page cache). A disk that refuses the cut, its sync and the
// rename alike, with a kill before a retry succeeds, leaves the next
// process that trust: nothing durable can then say what the file holds.
// Callers hold mu.
func (s *Spool) settle(seg *segment, f file) bool {
	if f == nil && !seg.carriedAll {
		var err error
		if f, err = s.fs.OpenFile(s.segPath(seg), os.O_WRONLY, 0); err == nil {
			defer f.Close() //nolint:errcheck // cut and synced, or failed
		}
	}
	// One carried whole at Open is not cut: what its disk holds is not
	// known, and its copy may not be on the disk yet.
	if !seg.carriedAll && f != nil && f.Truncate(seg.fileSynced) == nil && f.Sync() == nil {
		return true
	}
	return s.markSuspect(seg)
}

// settleFailed tries again to settle the failed segments not yet
// settled. Callers hold mu.
func (s *Spool) settleFailed() {
	s.unsettled = slices.DeleteFunc(s.unsettled, func(seg *segment) bool { return s.settle(seg, nil) })
}

// mustRewrite says a failed segment waits for the new one that replaces
// it.
func (s *Spool) mustRewrite() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.rewriteDue || s.broken != nil
}

// rewrite begins the segment that replaces a failed one. Until it can, the
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
	s.broken, s.rewriteDue = nil, false
	return nil
}
