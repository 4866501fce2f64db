package rewrite

import (
	"bytes"
	"io"
)

// EventReader splits a server-sent-events byte stream into events. It
// survives arbitrary splits of the stream into reads: it returns an event
// only once its terminating blank line has arrived, and it never blocks on
// the underlying reader while a complete event is buffered.
//
// Lines may end in LF, CRLF or a lone CR (WHATWG): a stream with CR line
// endings is framed event by event too. A stream that mixes a lone CR with
// LF endings has its lone-CR events framed with the next LF event: late,
// never lost or reordered.
type EventReader struct {
	src   io.Reader
	buf   []byte // grows on demand up to limit
	limit int    // the largest event that can be inspected
	start int    // buf[start:end] holds bytes not yet returned
	end   int
	scan  int   // bytes of buf[start:end] already searched for an event end
	large bool  // inside an event larger than buf
	err   error // sticky error from src, reported once the buffer is drained
}

// initialEventBuffer fits the events of a typical stream (a vLLM chunk is
// 250-400 bytes); the buffer doubles, up to the event size limit, only for
// larger ones (logprobs), so each of thousands of open streams holds 1 KiB.
const initialEventBuffer = 1 << 10

// NewEventReader reads events from src. Events longer than maxEvent bytes
// are returned in pieces (whole == false) and cannot be inspected.
func NewEventReader(src io.Reader, maxEvent int) *EventReader {
	maxEvent = max(maxEvent, 64)
	return &EventReader{src: src, buf: make([]byte, min(initialEventBuffer, maxEvent)), limit: maxEvent}
}

// Reset makes r read a new stream, keeping its buffer.
func (r *EventReader) Reset(src io.Reader) {
	*r = EventReader{src: src, buf: r.buf, limit: r.limit}
}

// Ended tells whether the stream has ended and everything read has been
// returned: after Next returned a piece, that the piece was the stream's
// unterminated tail, bytes after the last blank line, which SSE clients
// drop (WHATWG).
func (r *EventReader) Ended() bool { return r.err != nil && r.start == r.end }

// Ready tells whether Next would return without reading: an event, or a
// piece, is buffered, or the stream has ended.
func (r *EventReader) Ready() bool {
	return r.err != nil || r.end-r.start == len(r.buf) || eventEnd(r.buf[r.start:r.end], r.scan) >= 0
}

// Next returns the next event, terminator included, with whole == true; or,
// for an event larger than the buffer or bytes left unterminated when the
// stream ended, a piece of one with whole == false. The slice is valid until
// the next call. At the end of the stream it returns the source's error
// (io.EOF for a clean end).
func (r *EventReader) Next() (piece []byte, whole bool, err error) {
	for {
		if n := eventEnd(r.buf[r.start:r.end], r.scan); n >= 0 {
			piece, whole = r.buf[r.start:r.start+n], !r.large
			r.start += n
			r.scan, r.large = 0, false
			return piece, whole, nil
		}
		// A terminator can straddle reads: rescan the last two bytes
		// ("\n" and "\r") when more arrive.
		r.scan = max(0, r.end-r.start-2)
		if r.err != nil {
			if r.end > r.start {
				piece = r.buf[r.start:r.end]
				r.start, r.scan = r.end, 0
				return piece, false, nil
			}
			return nil, false, r.err
		}
		if r.end-r.start == len(r.buf) && len(r.buf) < r.limit {
			grown := make([]byte, min(2*len(r.buf), r.limit))
			r.end = copy(grown, r.buf[r.start:r.end])
			r.start, r.buf = 0, grown
			r.scan = max(0, r.end-2)
		}
		if r.end-r.start == len(r.buf) {
			// The event does not fit: hand out all but the tail that may
			// begin its terminator.
			keep := min(2, r.end-r.start)
			piece = r.buf[r.start : r.end-keep]
			r.start = r.end - keep
			r.scan, r.large = 0, true
			return piece, false, nil
		}
		switch {
		case r.start == r.end:
			// Everything handed out: the next event is read from the
			// buffer's start, whole in one read, rather than into the
			// room left at its end and then moved.
			r.start, r.end = 0, 0
		case r.end == len(r.buf):
			r.end = copy(r.buf, r.buf[r.start:r.end])
			r.start = 0
		}
		var n int
		n, r.err = r.src.Read(r.buf[r.end:])
		r.end += n
	}
}

var crPair = []byte("\r\r")

// eventEnd returns the length of the first event in b (through the blank
// line that ends it), or -1 if b holds no complete event. Searching starts
// at from.
func eventEnd(b []byte, from int) int {
	for i := from; i < len(b); {
		j := bytes.IndexByte(b[i:], '\n')
		if j < 0 {
			// No LF: a stream with lone CR line endings ends an event
			// with two of them. (A CRLF stream has no CR pair: its CRs
			// are each before an LF.) An LF that follows such a pair in
			// a later read begins the next event with an empty line,
			// which dispatches nothing.
			if k := bytes.Index(b[i:], crPair); k >= 0 {
				return i + k + 2
			}
			return -1
		}
		k := i + j + 1
		if k < len(b) && b[k] == '\n' {
			return k + 1
		}
		if k+1 < len(b) && b[k] == '\r' && b[k+1] == '\n' {
			return k + 2
		}
		i = k
	}
	return -1
}
