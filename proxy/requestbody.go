package proxy

import (
	"bytes"
	"errors"
	"io"
	"slices"
	"sync/atomic"

	"github.com/timing-sidecar/timing-sidecar/proxy/membudget"

	"github.com/valyala/fasthttp"

	"github.com/timing-sidecar/timing-sidecar/proxy/clientconn"
)

// clientBody is a client's body streamed to the engine unread. A read
// error is the client's (it left, or stopped sending): kept apart from the
// engine's, so that it is not counted as an engine failure.
type clientBody struct {
	r   io.Reader
	err error
}

// Err is the error that cut the body: the client's.
func (c *clientBody) Err() error { return c.err }

func (c *clientBody) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	if err != nil && err != io.EOF {
		c.err = err
	}
	return n, err
}

// bodyJumpShare: a body of known length takes the rest of it at once when
// 1/bodyJumpShare of it has come (see readBody).
const bodyJumpShare = 8

// maxBodyRoom: room grown past this for a large body is left to the
// garbage collector rather than kept with the pooled flight.
const maxBodyRoom = 64 << 10

// bodyStart begins reading a request's body: one over
// --max-request-body-size is refused (false); one that came with the
// headers, or is empty, is returned whole (the connection's own buffer
// holds it); otherwise its stream and declared length (-1: chunked).
func (p *Proxy) bodyStart(ctx *fasthttp.RequestCtx, f *flight) (whole []byte, stream io.Reader, n int, ok bool) {
	n = ctx.Request.Header.ContentLength()
	if n > p.cfg.MaxRequestBodySize {
		p.refuseBody(ctx, f, fasthttp.ErrBodyTooLarge)
		return nil, nil, n, false
	}
	if !ctx.Request.IsBodyStream() || (n >= 0 && n <= bodyPrefetch) {
		whole = ctx.Request.Body()
		f.rec.BytesIn = len(whole)
		return whole, nil, n, true
	}
	if n >= 0 {
		f.rec.BytesIn = n
	}
	return nil, ctx.RequestBodyStream(), n, true
}

// readBody reads the request's body for inspection when the budget has
// room for it, or leaves it to stream through unread. It returns the body
// read (nil when it streams through) and false when it has answered the
// client itself: a body over --max-request-body-size, or a client that
// failed while sending it.
func (p *Proxy) readBody(ctx *fasthttp.RequestCtx, f *flight) ([]byte, bool) {
	whole, stream, n, ok := p.bodyStart(ctx, f)
	if !ok || stream == nil {
		return whole, ok
	}
	// The room grows as the bytes arrive, each step taken from the budget
	// first: it doubles, and once an eighth of a declared length has come
	// it takes the rest at once. A body holds at most eight times what it
	// has sent (twice, below an eighth), whatever it declares, so that
	// clients that declare 64 MB and trickle it cannot hold the budget
	// from the rest (and --client-read-timeout bounds how long they hold
	// it). Each doubling leaves the old room to the collector (GOMEMLIMIT
	// makes it collect before the container's limit): stepping to the
	// whole length at an eighth keeps that garbage, and the room a body
	// that loses the race for the rest holds, to an eighth of the body,
	// which keeps concurrent large uploads' peak well under the
	// container's limit (deploy/README.md). The first step waits for
	// room; of the bodies holding room, one at a time may wait for its
	// next step (awaitGrowth), and the others, finding none, send what
	// they have and the rest through unread, their room given back as
	// soon as what they had has gone to the engine: the bodies that hold
	// room never all wait, and concurrent large bodies leave one to be
	// read rather than none.
	limit := n
	if n < 0 {
		limit = p.cfg.MaxRequestBodySize + 1 // one past: a chunked body over the limit shows
	}
	body, wait := f.body[:0], membudget.Wait
	for {
		if len(body) == cap(body) {
			grown := min(limit, max(2*cap(body), 16<<10))
			if n >= 0 && len(body) >= n/bodyJumpShare {
				grown = n // one copy fewer, and no more garbage
			}
			if !p.bodies.Take(grown-cap(body), wait) && (wait > 0 || !p.bodies.AwaitGrowth(grown-cap(body))) {
				p.log.Warn("no room in --max-body-memory for the request body; it goes to the engine unread, and is answered without metrics",
					"request_id", f.rec.ID, "content_length", n, "max_body_memory", p.cfg.MaxBodyMemory)
				p.streamUnread(f, body, stream, n)
				return nil, true
			}
			f.bodyTaken += grown - cap(body)
			wait = 0
			room := make([]byte, len(body), grown)
			copy(room, body)
			body = room
		}
		m, err := stream.Read(body[len(body):cap(body)])
		body = body[:len(body)+m]
		switch {
		case len(body) > p.cfg.MaxRequestBodySize:
			p.refuseBody(ctx, f, fasthttp.ErrBodyTooLarge)
			return nil, false
		case len(body) == n, err == io.EOF && n < 0:
			f.rec.BytesIn = len(body)
			if cap(body) <= maxBodyRoom {
				f.body = body[:0]
			}
			return body, true
		case err == io.EOF:
			err = io.ErrUnexpectedEOF // shorter than its length
			fallthrough
		case err != nil:
			p.refuseBody(ctx, f, err)
			return nil, false
		}
	}
}

// streamUnread sends a body to the engine as it arrives, unread: what was
// read of it, then the rest (a body the budget has no room for, or an
// upload past its form fields). The room what was read holds is given
// back once it has gone to the engine.
func (p *Proxy) streamUnread(f *flight, read []byte, rest io.Reader, size int) {
	room := &readRoom{budget: p.bodies}
	room.n.Store(int64(f.bodyTaken))
	f.bodyTaken, f.readRoom = 0, room
	body := &clientBody{r: io.MultiReader(&roomReader{Reader: bytes.NewReader(read), room: room}, rest)}
	f.unread, f.unreadSize = body, size
}

// uploadPeek is how much of an upload the sidecar reads for its form
// fields (model, stream), which clients send before the file: the file
// streams on to the engine unread, never held.
const uploadPeek = 16 << 10

// readUpload reads an upload's first bytes, within the budget, and leaves
// the rest to stream to the engine unread; a body that fits in them (or
// came with the headers) is read whole. It returns what it read, and
// false when it has answered the client itself.
func (p *Proxy) readUpload(ctx *fasthttp.RequestCtx, f *flight) ([]byte, bool) {
	whole, stream, n, ok := p.bodyStart(ctx, f)
	if !ok || stream == nil {
		return whole, ok
	}
	size := uploadPeek
	if n >= 0 {
		size = min(size, n)
	}
	if !p.bodies.Take(size, membudget.Wait) {
		p.streamUnread(f, nil, stream, n) // no room even for the fields: unread
		return nil, true
	}
	f.bodyTaken += size
	// Into the flight's pooled room, as a body read whole is (uploadPeek
	// is within maxBodyRoom).
	peek := slices.Grow(f.body[:0], size)[:size]
	f.body = peek[:0]
	m, err := io.ReadFull(stream, peek)
	peek = peek[:m]
	switch {
	case m == n || (n < 0 && (err == io.EOF || err == io.ErrUnexpectedEOF)):
		f.rec.BytesIn = m
		return peek, true // all of it
	case err != nil:
		p.refuseBody(ctx, f, err)
		return nil, false
	}
	p.streamUnread(f, peek, stream, n)
	return peek, true
}

// refuseBody answers a request whose body could not be read as fasthttp
// answers one it reads itself (413, 408, 400), and ends the connection.
func (p *Proxy) refuseBody(ctx *fasthttp.RequestCtx, f *flight, err error) {
	if errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) {
		err = fasthttp.ErrConnectionClosed
	}
	e := requestError(err)
	e.write(ctx)
	setResponseID(ctx, f)
	f.rec.Status = e.Status
	clientconn.CloseAfterError(ctx)
}

// sent gives back the budget a request's body held, once the engine has
// it: the body is not read again, and a large one is let go (the edit
// refers to it).
func (p *Proxy) sent(f *flight) {
	p.bodies.Give(f.bodyTaken)
	f.bodyTaken = 0
	if f.readRoom != nil {
		f.readRoom.give()
		f.readRoom = nil
	}
	f.edit.Reset(nil)
}

// readRoom is the room held by what was read of a body that then streams
// through unread; given back once, by whichever comes first: the last of
// those bytes going to the engine, or the request's end.
type readRoom struct {
	budget *membudget.Budget
	n      atomic.Int64
}

func (r *readRoom) give() { r.budget.Give(int(r.n.Swap(0))) }

// roomReader gives back its room once its bytes have all been read.
type roomReader struct {
	*bytes.Reader
	room *readRoom
}

func (r *roomReader) Read(p []byte) (int, error) {
	n, err := r.Reader.Read(p)
	if r.Len() == 0 {
		r.room.give()
	}
	return n, err
}
