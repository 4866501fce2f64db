package rewrite

import (
	"errors"
	"io"
)

// Edit is a request body as the engine gets it: the client's body with the
// sidecar's few changes, held as pieces of the client's bytes and of its
// own rather than as a copy. A request may carry tens of megabytes of
// base64 images or prompt, and the edit is a few members: copying the body
// to change them would double what each request holds (and sjson, which
// returns a new document per edit, would triple it). The pieces are
// written to the engine where they lie.
//
// The zero Edit is empty; Reset starts one on a body and keeps the room of
// the last, so a pooled Edit allocates nothing for the usual request.
type Edit struct {
	src   []byte
	own   []byte // the sidecar's bytes, which pieces with own set point into
	parts []part
	n     int
	// reader is Reader's, kept here so that asking for it allocates
	// nothing.
	reader bodyReader
}

// part is src[from:to], or own[from:to] when own is set. Offsets rather
// than slices, as own grows while the edit is built.
type part struct {
	from, to int
	own      bool
}

// Reset makes e the body as it came, unedited.
func (e *Edit) Reset(body []byte) {
	e.src, e.own, e.parts, e.n = body, e.own[:0], e.parts[:0], 0
	e.keep(0, len(body))
}

// Len is the size of the body the engine gets.
func (e *Edit) Len() int { return e.n }

// Unchanged says the engine gets the client's body as it came.
func (e *Edit) Unchanged() bool {
	return len(e.own) == 0 && len(e.parts) <= 1 && e.n == len(e.src)
}

// AppendTo appends the body to dst: for tests, and for the rare reader
// that needs it whole.
func (e *Edit) AppendTo(dst []byte) []byte {
	for _, p := range e.parts {
		dst = append(dst, e.piece(p)...)
	}
	return dst
}

func (e *Edit) piece(p part) []byte {
	if p.own {
		return e.own[p.from:p.to]
	}
	return e.src[p.from:p.to]
}

// keep appends src[from:to].
func (e *Edit) keep(from, to int) {
	if from >= to {
		return
	}
	if k := len(e.parts) - 1; k >= 0 && !e.parts[k].own && e.parts[k].to == from {
		e.parts[k].to = to
	} else {
		e.parts = append(e.parts, part{from: from, to: to})
	}
	e.n += to - from
}

// add appends the sidecar's bytes b.
func (e *Edit) add(b []byte) {
	from := len(e.own)
	e.own = append(e.own, b...)
	e.added(from)
}

// added records the sidecar's bytes appended to own since from.
func (e *Edit) added(from int) {
	to := len(e.own)
	if from == to {
		return
	}
	if k := len(e.parts) - 1; k >= 0 && e.parts[k].own && e.parts[k].to == from {
		e.parts[k].to = to
	} else {
		e.parts = append(e.parts, part{from: from, to: to, own: true})
	}
	e.n += to - from
}

// Reader returns the body as a reader at its start, for writers that
// take one (fasthttp's body stream). io.Copy prefers its WriteTo, which
// writes the pieces where they lie. One reader per Edit: a second call
// starts the first one over.
func (e *Edit) Reader() io.Reader {
	e.reader = bodyReader{e: e}
	return &e.reader
}

type bodyReader struct {
	e   *Edit
	off int // how much of the body has been read
}

func (r *bodyReader) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	n, err := r.copy(func(b []byte) (int, error) {
		c := copy(p, b)
		p = p[c:]
		if len(p) == 0 {
			return c, errFull
		}
		return c, nil
	})
	if err == errFull {
		err = nil
	}
	if n == 0 && err == nil {
		err = io.EOF
	}
	return n, err
}

func (r *bodyReader) WriteTo(w io.Writer) (int64, error) {
	n, err := r.copy(w.Write)
	return int64(n), err
}

// copy hands the unread rest of the body to write, piece by piece.
func (r *bodyReader) copy(write func([]byte) (int, error)) (int, error) {
	n, skip := 0, r.off
	for _, p := range r.e.parts {
		b := r.e.piece(p)
		if skip >= len(b) {
			skip -= len(b)
			continue
		}
		m, err := write(b[skip:])
		n, skip = n+m, 0
		if err != nil {
			r.off += n
			return n, err
		}
	}
	r.off += n
	return n, nil
}

var errFull = errors.New("buffer full")
