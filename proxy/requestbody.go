package proxy

import (
	"bytes"
	"errors"
	"io"

	"github.com/timing-sidecar/timing-sidecar/proxy/clientconn"
	"github.com/valyala/fasthttp"
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

// bodyStepUp is how far a body of known length grows by doubling before
// it takes the rest of its length at once.
const bodyStepUp = 1 << 20

// maxBodyRoom: room grown past this for a large body is left to the
// garbage collector rather than kept with the pooled flight.
const maxBodyRoom = 64 << 10

// readBody reads the request's body for inspection when the budget has
// room for it, or leaves it to stream through unread. It returns the body
// read (nil when it streams through) and false when it has answered the
// client itself: a body over --max-request-body-size, or a client that
// failed while sending it.
func (p *Proxy) readBody(ctx *fasthttp.RequestCtx, f *flight) ([]byte, bool) {
	n := ctx.Request.Header.ContentLength()
	if n > p.cfg.MaxRequestBodySize {
		p.refuseBody(ctx, f, fasthttp.ErrBodyTooLarge)
		return nil, false
	}
	if !ctx.Request.IsBodyStream() || (n >= 0 && n <= bodyPrefetch) {
		// Read with the headers, or nothing to read: the connection's own
		// buffer holds it.
		body := ctx.Request.Body()
		f.rec.BytesIn = len(body)
		return body, true
	}
	stream := ctx.RequestBodyStream()
	if n >= 0 {
		f.rec.BytesIn = n
	}
	// The room grows as the bytes arrive, each step taken from the budget
	// first: a client that declares 60 MB and sends little holds little.
	// It doubles up to bodyStepUp, then a body of known length gets the
	// rest at once (each doubling leaves the old room to the collector:
	// up to the body's size again, for a large one), and a chunked one
	// goes on doubling. Only the first step waits for room; a body
	// holding room that finds none for its next step sends what it has
	// and the rest through unread, so that two bodies never wait on each
	// other.
	limit := n
	if n < 0 {
		limit = p.cfg.MaxRequestBodySize + 1 // one past: a chunked body over the limit shows
	}
	body, wait := f.body[:0], bodyBudgetWait
	for {
		if len(body) == cap(body) {
			grown := min(limit, max(2*cap(body), 16<<10))
			if n >= 0 && cap(body) >= bodyStepUp {
				grown = n
			}
			if !p.bodies.take(grown-cap(body), wait) {
				p.streamUnread(f, &clientBody{r: io.MultiReader(bytes.NewReader(body), stream)}, n)
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

// streamUnread sends a body the budget has no room for to the engine as it
// arrives, unread: the request is answered, without the metrics object.
func (p *Proxy) streamUnread(f *flight, body *clientBody, size int) {
	f.unread, f.unreadSize = body, size
	p.log.Warn("no room in --max-body-memory for the request body; it goes to the engine unread, and is answered without metrics",
		"request_id", f.rec.ID, "content_length", size, "max_body_memory", p.cfg.MaxBodyMemory)
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
	p.bodies.give(f.bodyTaken)
	f.bodyTaken = 0
	f.edit.Reset(nil)
}
