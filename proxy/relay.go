package proxy

import (
	"io"
	"sync"
	"time"

	"github.com/valyala/bytebufferpool"
	"github.com/valyala/fasthttp"

	"github.com/timing-sidecar/timing-sidecar/rewrite"
	"github.com/timing-sidecar/timing-sidecar/timing"
)

// relayBody streams the engine's response to the client as it arrives,
// unchanged. prefix holds body bytes already read from resp; readErr, if
// set, is the error that ended reading them.
func (p *Proxy) relayBody(ctx *fasthttp.RequestCtx, x *exchange, resp *fasthttp.Response, prefix []byte, readErr error) {
	copyResponseHeader(ctx, resp)
	if resp.BodyStream() == nil {
		// HEAD, 204, 304: headers only.
		x.finish(resp, true)
		return
	}
	size := resp.Header.ContentLength()
	if size < 0 || isEventStream(resp) {
		// Unknown length (chunked or until close) and event streams go
		// out chunked, each read flushed at once.
		size = -1
	}
	if isEventStream(resp) {
		ctx.Response.ImmediateHeaderFlush = true
	}
	ctx.SetBodyStream(&bodyRelay{x: x, resp: resp, body: x.body(resp), prefix: prefix, err: readErr}, size)
}

// bodyRelay is the client's body stream for a response passed through.
type bodyRelay struct {
	x      *exchange
	resp   *fasthttp.Response
	body   io.Reader
	prefix []byte
	err    error // a read error met while the prefix was read
	eof    bool
}

func (b *bodyRelay) Read(p []byte) (int, error) {
	if len(b.prefix) > 0 {
		n := copy(p, b.prefix)
		b.prefix = b.prefix[n:]
		return n, nil
	}
	if b.err != nil {
		return 0, b.err
	}
	n, err := b.body.Read(p)
	if err == io.EOF {
		b.eof = true
	}
	return n, err
}

// CloseWithError is called by fasthttp once the body is written or the
// write failed (the client left).
func (b *bodyRelay) CloseWithError(error) error {
	b.x.finish(b.resp, b.eof)
	return nil
}

// relayWithMetrics reads a non-streaming response whole, splices the
// metrics in and sends it with its new length. A response too large to
// buffer passes through without metrics.
func (p *Proxy) relayWithMetrics(ctx *fasthttp.RequestCtx, x *exchange, resp *fasthttp.Response, clock timing.Clock, multiple bool) {
	limit := p.cfg.MaxBufferedResponse
	if resp.BodyStream() == nil || resp.Header.ContentLength() > limit {
		p.relayBody(ctx, x, resp, nil, nil)
		return
	}
	buf := bytebufferpool.Get()
	defer bytebufferpool.Put(buf)
	complete, err := readUpTo(buf, x.body(resp), limit)
	if err != nil || !complete {
		// Too large, or the engine failed mid-body: forward what arrived
		// and let the rest (or the failure) follow.
		prefix := append([]byte(nil), buf.B...)
		p.relayBody(ctx, x, resp, prefix, err)
		return
	}
	clock.Done = time.Now()
	copyResponseHeader(ctx, resp)
	x.finish(resp, true)

	metrics := appendMetrics(nil, &clock, rewrite.BodyUsage(buf.B), false, multiple)
	out := bytebufferpool.Get()
	defer bytebufferpool.Put(out)
	body, ok := rewrite.AppendWithMetrics(out.B[:0], buf.B, metrics)
	if ok {
		out.B = body // keep the grown buffer for the pool
	} else {
		body = buf.B // not a JSON object: as the engine sent it
	}
	ctx.Response.SetBody(body)
	ctx.Response.Header.SetContentLength(len(body))
}

// appendMetrics appends the metrics JSON, or null when one object cannot
// describe several choices (as vLLM does).
func appendMetrics(dst []byte, clock *timing.Clock, usage timing.Usage, streamed, multiple bool) []byte {
	if multiple {
		return append(dst, "null"...)
	}
	m := timing.Compute(clock, usage, streamed)
	return m.AppendJSON(dst)
}

// readUpTo reads r to its end into buf, unless that is more than limit
// bytes: then it stops with complete == false and what it read in buf.
func readUpTo(buf *bytebufferpool.ByteBuffer, r io.Reader, limit int) (complete bool, err error) {
	var chunk [8 << 10]byte
	for {
		n, err := r.Read(chunk[:])
		buf.B = append(buf.B, chunk[:n]...)
		switch {
		case err == io.EOF:
			return true, nil
		case err != nil:
			return false, err
		case len(buf.B) > limit:
			return false, nil
		}
	}
}

// relayEvents streams an event stream to the client event by event,
// marking the clock on token events and splicing the metrics into the final
// usage event.
func (p *Proxy) relayEvents(ctx *fasthttp.RequestCtx, x *exchange, resp *fasthttp.Response, clock timing.Clock, multiple bool) {
	copyResponseHeader(ctx, resp)
	if resp.BodyStream() == nil {
		x.finish(resp, true)
		return
	}
	r := p.pools.relay.Get().(*eventRelay)
	r.pools = p.pools
	r.x, r.resp, r.clock, r.multiple = x, resp, clock, multiple
	r.events.Reset(x.body(resp))
	ctx.Response.ImmediateHeaderFlush = true
	ctx.SetBodyStream(r, -1)
}

// eventRelay is the client's body stream for a measured event stream. Each
// Read returns at most one event, so fasthttp writes and flushes every event
// as its own chunk the moment it is complete.
type eventRelay struct {
	pools    *pools
	x        *exchange
	resp     *fasthttp.Response
	events   *rewrite.EventReader
	clock    timing.Clock
	multiple bool
	pending  []byte // the rest of the current event, not yet handed out
	spliced  []byte // scratch for the usage event with metrics
	metrics  []byte // scratch for the metrics JSON
	eof      bool
}

func (r *eventRelay) Read(p []byte) (int, error) {
	for len(r.pending) == 0 {
		piece, whole, err := r.events.Next()
		if err == io.EOF {
			r.eof = true
			return 0, io.EOF
		}
		if err != nil {
			// Everything received so far has been handed out; a non-EOF
			// error makes fasthttp end the chunked body without its final
			// chunk, so the client sees a truncated stream, not a clean end.
			return 0, err
		}
		r.pending = piece
		if whole {
			r.inspect(piece)
		}
	}
	n := copy(p, r.pending)
	r.pending = r.pending[n:]
	return n, nil
}

// inspect marks the clock for a whole event and splices the metrics into
// the final usage event.
func (r *eventRelay) inspect(raw []byte) {
	ev := rewrite.ClassifyEvent(raw)
	switch ev.Kind {
	case rewrite.EventToken:
		r.clock.MarkToken(time.Now())
	case rewrite.EventUsage:
		r.clock.Done = time.Now()
		r.metrics = appendMetrics(r.metrics[:0], &r.clock, ev.Usage, true, r.multiple)
		if out, ok := rewrite.AppendEventWithMetrics(r.spliced[:0], raw, ev, r.metrics); ok {
			r.spliced, r.pending = out, out
		}
	}
}

func (r *eventRelay) CloseWithError(error) error {
	r.x.finish(r.resp, r.eof)
	pools := r.pools
	r.events.Reset(nil)
	*r = eventRelay{events: r.events, spliced: r.spliced[:0], metrics: r.metrics[:0]}
	pools.relay.Put(r)
	return nil
}

// pools hold per-stream state for reuse, so a stream in steady state
// allocates nothing.
type pools struct {
	relay sync.Pool
}

func newPools(maxEvent int) *pools {
	p := &pools{}
	p.relay.New = func() any {
		return &eventRelay{
			events:  rewrite.NewEventReader(nil, maxEvent),
			spliced: make([]byte, 0, 1024),
			metrics: make([]byte, 0, 512),
		}
	}
	return p
}
