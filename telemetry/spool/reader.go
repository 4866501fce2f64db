package spool

import (
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
)

// Reader reads one sink's records in order, from its acknowledged
// position. One goroutine uses a Reader at a time.
type Reader struct {
	s    *Spool
	name string
	// cursor is the position after the last acknowledged record (or run
	// of starts read past), pending the records after it, and skipTo the
	// segment it skips to when it has fallen behind (release.go); all
	// under s.mu.
	cursor  position
	pending int
	skipTo  uint64
	wake    chan struct{}
	behind  chan struct{}

	file    file
	fileSeq uint64
	// saved is the position the cursor file holds.
	saved position
	buf   []byte
	batch Batch
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

// Wake is signalled when records are synced, and so may be read.
func (r *Reader) Wake() <-chan struct{} { return r.wake }

// Behind is signalled when the reader has fallen so far behind that its
// next Next skips records: a delivery waiting out a backoff reads at once,
// so that the spool gives them back.
func (r *Reader) Behind() <-chan struct{} { return r.behind }

// Pending is the records not yet acknowledged.
func (r *Reader) Pending() int {
	r.s.mu.Lock()
	defer r.s.mu.Unlock()
	return r.pending
}

// past says the reader has read the whole of seg, which takes no more
// frames. Callers hold s.mu.
func (r *Reader) past(seg *segment) bool {
	return r.cursor.seq > seg.seq || r.cursor.seq == seg.seq && r.cursor.off >= seg.size && seg.sealed && seg.synced == seg.size
}

// Record is one record read: its id and data, valid until the next Next.
type Record struct {
	ID, Data []byte
}

// Batch is the records Next read, and where they end.
type Batch struct {
	Records []Record
	// Skipped is the records the reader skipped before this batch: it
	// had fallen so far behind that the spool gave them back for the
	// other readers (release.go). They are not delivered to its sink.
	Skipped int
	end     position
	bytes   int
}

// readable is the part of a segment a reader may read: up to what is
// synced; whole says it takes no more, so a reader at its end goes on to
// the next.
type readable struct {
	seq   uint64
	path  string
	end   int64
	whole bool
}

// Next reads up to max records, and about maxBytes of them, after the
// acknowledged position; an empty batch when there are none synced yet.
// Starts are read past, however many. The batch stays valid until the
// next call.
func (r *Reader) Next(max, maxBytes int) (*Batch, error) {
	s := r.s
	b := &r.batch
	b.Records, b.bytes, b.Skipped = b.Records[:0], 0, 0
	s.mu.Lock()
	if r.skipTo > r.cursor.seq {
		b.Skipped = r.pending - s.endsFrom(r.skipTo)
		r.pending -= b.Skipped
		r.cursor = position{r.skipTo, 0}
		select {
		case <-r.behind: // heard
		default:
		}
	}
	at := r.cursor
	var segs []readable
	for _, seg := range s.segs {
		if seg.seq >= at.seq {
			segs = append(segs, readable{seg.seq, s.segPath(seg), seg.synced, seg.sealed && seg.synced == seg.size})
		}
	}
	s.mu.Unlock()
	r.buf = r.buf[:0]
	// Not kept open between batches: a segment deleted meanwhile gives
	// its room back at once.
	defer r.closeSegment()
	for _, seg := range segs {
		if seg.seq > at.seq {
			at = position{seg.seq, 0}
		}
		var err error
		if at.off, err = r.readSegment(seg, at.off, max, maxBytes); err != nil {
			return nil, err
		}
		if len(b.Records) >= max || b.bytes >= maxBytes || at.off < seg.end || !seg.whole {
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

// readSegment reads seg's ends from off into the batch until it is full
// or seg's readable part ends, and returns where it stopped.
func (r *Reader) readSegment(seg readable, off int64, max, maxBytes int) (int64, error) {
	b := &r.batch
	full := func() bool { return len(b.Records) >= max || b.bytes >= maxBytes }
	for off < seg.end && !full() {
		if len(b.Records) == 0 {
			r.buf = r.buf[:0] // nothing read refers to it yet
		}
		n := min(seg.end-off, int64(maxBytes-b.bytes)+MaxEntry)
		chunk, err := r.readAt(seg, off, n)
		if err != nil {
			return off, err
		}
		read := off
		for len(chunk) > 0 && !full() {
			e, ok, _ := parseFrame(chunk)
			if !ok {
				break // a frame across the window: the next read
			}
			chunk, off = chunk[e.size:], off+int64(e.size)
			if e.kind == End {
				b.Records = append(b.Records, Record{ID: e.id, Data: e.data})
				b.bytes += len(e.data)
			}
		}
		if off == read {
			// Not one whole frame in a window larger than any: the
			// disk lost what it said it held; read no further.
			return off, fmt.Errorf("usage spool: %s at %d: a synced frame does not check", segmentName(seg.seq), off)
		}
		if len(b.Records) > 0 && off < seg.end {
			break // a batch in hand; the rest is the next one's
		}
	}
	return off, nil
}

// readAt reads n bytes of segment seg from off into r.buf, returning them.
func (r *Reader) readAt(seg readable, off, n int64) ([]byte, error) {
	if r.file == nil || r.fileSeq != seg.seq {
		r.closeSegment()
		f, err := r.s.fs.OpenFile(seg.path, os.O_RDONLY, 0)
		if err != nil {
			return nil, fmt.Errorf("usage spool: %w", err)
		}
		r.file, r.fileSeq = f, seg.seq
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

// Ack records that b's records were delivered: the reader moves past
// them, segments every reader is past are given back, and the position is
// saved (cursor.go). A batch holds only synced records, so a machine
// failure can make a record delivered again, never one delivered with two
// contents. A position that cannot be saved is returned; the reader has
// moved on all the same, and only a restart would send those records
// again.
func (r *Reader) Ack(b *Batch) error {
	s := r.s
	s.mu.Lock()
	if r.cursor.before(b.end) {
		r.cursor = b.end
	}
	gone, begun := s.releasable()
	refused := s.refused
	to := r.cursor
	s.mu.Unlock()
	s.deleteSegments(gone)
	var synced error
	if begun && refused {
		// Every reader has read the whole spool, on a disk that refused
		// a write: the segment just begun is synced now, and the older
		// ones go before the records are counted delivered (the room
		// the next records need). Elsewhere the sync loop does it, soon.
		synced = s.Sync()
	}
	s.mu.Lock()
	r.pending -= len(b.Records)
	s.mu.Unlock()
	if err := r.save(to); err != nil {
		return errors.Join(synced, fmt.Errorf("usage spool: save %s's position: %w", r.name, err))
	}
	return synced
}
