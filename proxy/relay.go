package proxy

import (
	"errors"
	"io"
	"net"
	"runtime/debug"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/timing-sidecar/timing-sidecar/proxy/upstream"
	"github.com/timing-sidecar/timing-sidecar/rewrite"
	"github.com/timing-sidecar/timing-sidecar/telemetry/requests"
	"github.com/timing-sidecar/timing-sidecar/timing"
)

// relayBody streams the engine's response to the client as it arrives,
// unchanged. prefix holds body bytes already read from resp; readErr, if
// set, is the error that ended reading them. For a measured non-streaming
// response it keeps a copy of the body (up to the buffering limit) to read
// the engine's usage from at the end.
func (p *Proxy) relayBody(ctx *fasthttp.RequestCtx, f *flight, x *upstream.Exchange, resp *fasthttp.Response, prefix []byte, readErr error) {
	copyResponseHeader(ctx, resp)
	setResponseID(ctx, f)
	if f.timingHeader && f.measured {
		var b [serverTimingSize]byte
		addServerTiming(&ctx.Response.Header, f.clock.AppendFirstByteTiming(b[:0]))
	}
	f.rec.Status = resp.StatusCode()
	if resp.BodyStream() == nil {
		// HEAD, 204, 304: headers only.
		x.Finish(resp, true)
		return
	}
	size := resp.Header.ContentLength()
	if size < 0 || isEventStream(resp) {
		// Unknown length (chunked or until close) and event streams go
		// out chunked, each read flushed at once.
		size = -1
	}
	switch {
	case isEventStream(resp):
		ctx.Response.ImmediateHeaderFlush = true
	case size >= 0 && (readErr != nil || len(prefix)+x.Buffered() < size):
		// A body with a length that has not all arrived: the headers go
		// out now and each read of the body as it comes (clientconn.Conn's
		// ReadFrom), so if the engine stops short the client still gets
		// everything it sent, then a close before the length is reached.
		// A body already here goes out with the headers in one write.
		ctx.Response.ImmediateHeaderFlush = true
	}
	b := &bodyRelay{p: p, f: f, x: x, resp: resp, body: x.Body(resp), prefix: prefix, err: readErr}
	if f.measured {
		// A measured body passed through (no metrics planned, or none it
		// could take) is read for its usage, up to the buffering limit and
		// within the budget.
		b.capture = p.pools.buffer()
		b.capture.B = append(b.capture.B, prefix...)
	}
	p.startStream(ctx, f, b, size)
}

// streamBody is a response body the client gets as it is read: fasthttp
// calls CloseWithError once it is written, or its write failed. exchange
// is the engine's side it reads.
type streamBody interface {
	io.Reader
	CloseWithError(error) error
	exchange() *upstream.Exchange
}

// startStream sends body to the client after the handler, size bytes or,
// with size -1, until it ends: chunked to an HTTP/1.1 client. HTTP/1.0 has
// no chunked encoding (fasthttp would send it anyway), so an HTTP/1.0
// client gets such a body as it is read and the end of the connection
// ends it, as nginx does; no trailer.
//
// The stream is in p.streams until its record is made, for Shutdown to
// drain it, or at the grace's end to cut it: its reading of the engine
// and its client connection end, and it is recorded as cut.
func (p *Proxy) startStream(ctx *fasthttp.RequestCtx, f *flight, body streamBody, size int) {
	f.streaming = true
	// The cut holds this stream's own parts, not the flight's or the
	// relay's fields: those are reused once the stream has ended, and a
	// cut may come just after.
	cut, x, cc := new(atomic.Bool), body.exchange(), f.client
	f.cut = cut
	p.streams.add(f, func() {
		cut.Store(true)
		x.Abort()
		if cc != nil {
			cc.Close() //nolint:errcheck // a write to it fails, which ends the stream
		}
	})
	if size >= 0 || ctx.Request.Header.IsHTTP11() {
		ctx.SetBodyStream(body, size)
		return
	}
	h := &ctx.Response.Header
	h.SetContentLength(-2) // no framing header; the connection closes
	h.Del("Trailer")
	head := append([]byte(nil), h.Header()...)
	// The body is closed once, by the hijack after it is written; or, if
	// fasthttp closes the connection without running the hijack (a failed
	// flush of an earlier response), when the connection closes. Once the
	// hijack runs, a close (Shutdown's cut) only fails its writes: the
	// body is the hijack's to close.
	var mu sync.Mutex
	hijacked, ended := false, false
	if cc := f.client; cc != nil {
		cc.OnClose(func() {
			mu.Lock()
			first := !hijacked && !ended
			ended = true
			mu.Unlock()
			if first {
				body.CloseWithError(net.ErrClosed) //nolint:errcheck // it records, and fails nothing
			}
		})
	}
	ctx.HijackSetNoResponse(true)
	ctx.Hijack(func(c net.Conn) {
		mu.Lock()
		run := !ended
		hijacked = true
		mu.Unlock()
		if !run {
			return
		}
		_, err := c.Write(head)
		if err == nil {
			_, err = io.Copy(c, body)
		}
		body.CloseWithError(err) //nolint:errcheck // it records, and fails nothing
	})
}

// bodyRelay is the client's body stream for a response passed through.
type bodyRelay struct {
	p       *Proxy
	f       *flight
	x       *upstream.Exchange
	resp    *fasthttp.Response
	body    io.Reader
	prefix  []byte
	err     error // a read error met while the prefix was read
	eof     bool
	capture *buffer // the body, for its usage; nil if not needed
}

func (b *bodyRelay) Read(p []byte) (n int, err error) {
	defer b.p.recoverRead(b.f, &err)
	if len(b.prefix) > 0 {
		n = copy(p, b.prefix)
		b.prefix = b.prefix[n:]
		b.f.rec.BytesOut += n
		return n, nil
	}
	if b.err != nil {
		return 0, b.err
	}
	n, err = b.body.Read(p)
	b.f.rec.BytesOut += n
	if b.capture != nil {
		if len(b.capture.B)+n <= b.p.cfg.MaxBufferedResponse && b.p.holdResponse(b.f, len(b.capture.B)+n) {
			b.capture.B = append(b.capture.B, p[:n]...)
		} else {
			// Too large to read the usage from: stop keeping a copy.
			b.p.pools.release(b.capture)
			b.capture = nil
		}
	}
	switch {
	case err == io.EOF:
		b.eof = true
		b.f.markEnd(b.x.Received()) // the record's end: the last byte
	case err != nil:
		b.err = err
	}
	return n, err
}

func (b *bodyRelay) exchange() *upstream.Exchange { return b.x }

// CloseWithError is called by fasthttp once the body is written or the
// write failed (the client left).
func (b *bodyRelay) CloseWithError(writeErr error) error {
	f := b.f
	// The last byte read and handed to the connection, and the client not
	// seen leaving: fasthttp closes a body of known length before it
	// flushes its write buffer, so a client the watch saw leave may not
	// have it.
	noteEnd(f, b.x, b.err, writeErr, b.eof && writeErr == nil && !b.x.IsAborted())
	if b.capture != nil {
		if b.eof {
			f.usage = rewrite.BodyUsage(b.capture.B)
			if f.observeAnswer {
				f.route.api.ObserveBody(&f.answer, b.capture.B)
			}
		}
		b.p.pools.release(b.capture)
	}
	b.x.Finish(b.resp, b.eof)
	b.p.finish(f)
	return nil
}

// errPanic ends a response whose relay panicked.
var errPanic = errors.New("timing-sidecar: internal error while relaying the response")

// recoverRead is the panic boundary of a body stream, which runs after the
// handler's own: the response is cut (the client sees a truncated body)
// and the panic logged with its stack.
func (p *Proxy) recoverRead(f *flight, err *error) {
	if r := recover(); r != nil {
		p.countPanic()
		p.log.Error("panic while relaying a response", "panic", r, "path", f.rec.Path,
			"request_id", f.rec.ID, "stack", string(debug.Stack()))
		*err = errPanic
	}
}

// panicked logs and counts a panic recovered on a goroutine the sidecar
// started for one request, which that request's end reports.
func (p *Proxy) panicked(r any) {
	p.countPanic()
	p.log.Error("panic in a stream's read-ahead", "panic", r, "stack", string(debug.Stack()))
}

func (p *Proxy) countPanic() {
	if p.telemetry != nil {
		p.telemetry.Panic()
	}
}

// noteEnd records how a relayed body ended: delivered whole, an engine
// failure (readErr) or a client that left (writeErr, or the watcher's
// abort). A body delivered is complete, whatever came after it: the
// client's close noticed, the engine's connection let go, a write of the
// chunked terminator that failed.
func noteEnd(f *flight, x *upstream.Exchange, readErr, writeErr error, delivered bool) {
	switch {
	case delivered:
	case f.cut != nil && f.cut.Load():
		f.rec.CutAtShutdown = true // neither the client's doing nor the engine's
	case x.IsAborted() || (writeErr != nil && readErr == nil):
		f.rec.ClientGone = true
	case readErr != nil && readErr != io.EOF:
		f.rec.UpstreamError = upstreamErrorKind(readErr, false)
	}
}

// relayWithMetrics reads a non-streaming response whole, splices the
// metrics in and sends it with its new length. A response too large to
// buffer passes through without metrics.
func (p *Proxy) relayWithMetrics(ctx *fasthttp.RequestCtx, f *flight, x *upstream.Exchange, resp *fasthttp.Response) {
	limit := p.cfg.MaxBufferedResponse
	if resp.BodyStream() == nil || resp.Header.ContentLength() > limit {
		// Too large to splice into: it passes as it comes.
		p.relayBody(ctx, f, x, resp, nil, nil)
		return
	}
	buf := p.pools.buffer()
	defer p.pools.release(buf)
	if n := resp.Header.ContentLength(); n > cap(buf.B) && p.holdResponse(f, n) {
		// Room for the declared length at once: growing to it would leave
		// copies of the body to the collector on the way.
		buf.B = slices.Grow(buf.B, n)
	}
	complete, err := readUpTo(buf, x.Body(resp), limit, func(n int) bool { return p.holdResponse(f, n) })
	done := x.Received() // the engine's whole body
	if err != nil {
		x.Finish(resp, false)
		if x.IsAborted() {
			closeUnanswered(ctx, f)
			return
		}
		// Nothing has been sent: the client gets a clear failure rather
		// than a body cut short.
		f.rec.UpstreamError = upstreamErrorKind(err, false)
		p.log.Warn("the model server's response ended early", "path", f.rec.Path, "request_id", f.rec.ID, "err", safeError(err))
		apiError{Status: fasthttp.StatusBadGateway, Type: "upstream_error", Code: "upstream_interrupted",
			Message: "timing-sidecar: the model server's response ended before it was complete"}.write(ctx)
		setResponseID(ctx, f)
		f.rec.Status = fasthttp.StatusBadGateway
		return
	}
	if !complete {
		// Too large to buffer: forward what arrived and let the rest follow.
		p.relayBody(ctx, f, x, resp, append([]byte(nil), buf.B...), nil)
		return
	}
	inspected := rewrite.InspectBody(buf.B)
	f.usage = inspected.Usage
	if f.observeAnswer {
		f.route.api.ObserveBody(&f.answer, buf.B)
	}
	copyResponseHeader(ctx, resp)
	setResponseID(ctx, f)
	f.rec.Status = resp.StatusCode()
	x.Finish(resp, true)

	mb := p.pools.buffer()
	defer p.pools.release(mb)
	mb.B = f.metricsJSON(mb.B[:0], done, inspected.Engine)
	m := f.done(done, inspected.Engine) // a body's end is the request's
	// The spliced body is a second copy, held until the client has it:
	// the budget is asked for its room first, and without room the
	// engine's body goes as it came. Either way the response takes the
	// body held, without copying it again.
	room := inspected.SplicedSize(len(buf.B), len(mb.B))
	if room <= responseFree {
		room = 0 // counted per request (deploy/README.md)
	}
	var body []byte
	ok := p.bodies.Take(room, 0)
	if ok {
		body, ok = inspected.WithMetrics(buf.B, mb.B)
		if !ok {
			p.bodies.Give(room)
		}
	}
	if ok {
		var b [serverTimingSize]byte
		addServerTiming(&ctx.Response.Header, m.AppendServerTiming(b[:0]))
	} else {
		// As the engine sent it: the read buffer, and its room, go to the
		// response.
		body, buf.B = buf.B, nil
		room, f.responseTaken = f.responseTaken, 0
	}
	p.respondHeld(ctx, body, room)
	f.rec.BytesOut = len(body)
}

// readUpTo reads r to its end into buf, unless that is more than limit
// bytes or hold refuses room for it: then it stops with complete == false
// and what it read in buf.
func readUpTo(buf *buffer, r io.Reader, limit int, hold func(n int) bool) (complete bool, err error) {
	for {
		// Read straight into the pooled buffer's spare room: no chunk
		// buffer per request.
		if cap(buf.B)-len(buf.B) < 4<<10 {
			buf.B = slices.Grow(buf.B, 8<<10)
		}
		n, err := r.Read(buf.B[len(buf.B):cap(buf.B)])
		buf.B = buf.B[:len(buf.B)+n]
		switch {
		case err == io.EOF:
			return true, nil
		case err != nil:
			return false, err
		case len(buf.B) > limit || !hold(len(buf.B)):
			return false, nil
		}
	}
}

// relayEvents streams an event stream to the client event by event,
// marking the clock on token events. It splices the metrics into the final
// usage event when the client asked for them, and removes the usage event
// when only the sidecar did.
func (p *Proxy) relayEvents(ctx *fasthttp.RequestCtx, f *flight, x *upstream.Exchange, resp *fasthttp.Response) {
	copyResponseHeader(ctx, resp)
	setResponseID(ctx, f)
	f.rec.Status = resp.StatusCode()
	if resp.BodyStream() == nil {
		x.Finish(resp, true)
		return
	}
	r := p.pools.relay.Get().(*eventRelay)
	r.p, r.f, r.x, r.resp = p, f, x, resp
	r.hold = rewrite.FinishHold{Plan: f.plan}
	r.src.reset(p, x, x.Body(resp))
	r.events.Reset(&r.src)
	if f.client != nil {
		f.client.OnStall(r.clientBlocked)
	}
	if f.plan.WantMetrics && f.trailers {
		// Announced now, filled in when the stream ends.
		ctx.Response.Header.SetTrailer("Server-Timing") //nolint:errcheck
		r.trailer = &ctx.Response.Header
	}
	ctx.Response.ImmediateHeaderFlush = true
	p.startStream(ctx, f, r, -1)
}

// eventRelay is the client's body stream for a measured event stream. Each
// Write of WriteTo (and each Read) hands over at most one event, so fasthttp
// writes and flushes every event as its own chunk the moment it is complete.
// It runs on the connection's goroutine, which also writes the trailer after
// the last event.
//
// One event at a time may be held back (see rewrite.FinishHold), for at most
// --max-event-hold.
type eventRelay struct {
	p       *Proxy
	f       *flight
	x       *upstream.Exchange
	resp    *fasthttp.Response
	events  *rewrite.EventReader
	trailer *fasthttp.ResponseHeader // set when a Server-Timing trailer is announced
	pending []byte                   // the rest of the current event, not yet handed out
	queued  []byte                   // the event to hand out after pending
	held    []byte                   // the event held back, a copy; nil if none
	// heldEvent is held's classification, as it came.
	heldEvent rewrite.Event
	// pendingAt, queuedAt and heldAt are when those events arrived from
	// the engine, for the relay delay.
	pendingAt, queuedAt, heldAt time.Time
	spliced                     []byte // scratch for the usage event with metrics
	heldBuf                     []byte // scratch for held
	heldOut                     []byte // scratch for held with metrics
	metrics                     []byte // scratch for the metrics JSON
	readErr                     error
	eof                         bool
	// answerEnded: the event that ends the answer (Event.EndsAnswer) has
	// arrived, at answerEndedAt; delivered: it, and all before it, or the
	// whole stream, reached the client's socket. A client that leaves
	// after that was served, and a stream cut after that is complete.
	answerEnded   bool
	answerEndedAt time.Time
	delivered     bool
	// hold decides which event carries the metrics and which waits.
	hold rewrite.FinishHold
	// engine is the engine's own timing from a usage event removed
	// before the client (metricsOnFinish), and engineMetrics its metrics
	// object, whose members the sidecar does not write go on with its own.
	engine        timing.EngineTiming
	engineMetrics []byte
	// src is the engine's side, read ahead of a client that stalls;
	// clientBlocked is src's hook for that, bound once per pooled relay.
	src           streamSource
	clientBlocked func()
}

// fasthttp frames the stream through WriteTo only for a BodyWriterTo.
var _ fasthttp.BodyWriterTo = (*eventRelay)(nil)

// SupportsBodyWriteTo lets fasthttp take the stream through WriteTo.
func (r *eventRelay) SupportsBodyWriteTo() bool { return true }

// WriteTo hands each event to fasthttp's chunk writer straight from the
// event buffer, one flushed chunk per Write: no copy into a chunk buffer,
// and no 4 KiB chunk buffer held for the life of every open stream.
func (r *eventRelay) WriteTo(w io.Writer) (written int64, err error) {
	defer r.p.recoverRead(r.f, &err)
	for {
		if err := r.fill(); err != nil {
			if err == io.EOF {
				return written, nil
			}
			return written, err
		}
		// The sidecar's own delay on the event: until it is handed to the
		// client's socket. Not how long the client then takes to take
		// it, and not for an event that waited behind a client's stall.
		delay := time.Since(r.pendingAt)
		n, werr := w.Write(r.pending)
		r.pending = r.pending[n:]
		r.f.rec.BytesOut += n
		written += int64(n)
		if werr != nil {
			return written, werr
		}
		r.noteDelivery()
		if r.f.liveOn && len(r.pending) == 0 {
			r.f.showEvent(r.pendingAt)
		}
		if c := r.f.client; len(r.pending) == 0 && (c == nil || !r.pendingAt.Before(c.StallEnded())) {
			r.p.relayed(r.f, delay)
		}
	}
}

// Read is the same stream for a caller that reads: at most one event per
// call.
func (r *eventRelay) Read(p []byte) (n int, err error) {
	defer r.p.recoverRead(r.f, &err)
	// The caller reads again once it has written what it was given.
	r.noteDelivery()
	if err := r.fill(); err != nil {
		return 0, err
	}
	n = copy(p, r.pending)
	r.pending = r.pending[n:]
	r.f.rec.BytesOut += n
	return n, nil
}

// fill makes pending hold the next bytes to hand out, the rest of an event
// or the next one, reading from the engine as needed; or returns io.EOF at
// the stream's clean end, or the error that cut it.
func (r *eventRelay) fill() error {
	for len(r.pending) == 0 {
		if r.queued != nil {
			r.pending, r.queued = r.queued, nil
			r.pendingAt = r.queuedAt
			continue
		}
		if r.eof {
			// Everything was handed out, and written: the caller asks for
			// more only then.
			r.delivered = true
			return io.EOF
		}
		if r.readErr != nil {
			// Everything received so far has been handed out; a non-EOF
			// error makes fasthttp end the chunked body without its final
			// chunk, so the client sees a truncated stream, not a clean end.
			return r.readErr
		}
		if r.held != nil && !r.events.Ready() && !r.src.await(r.p.cfg.MaxEventHold-time.Since(r.heldAt)) {
			// The engine has sent nothing more within the hold's bound:
			// the held event goes with the metrics measured so far (counts
			// not yet sent are null), and a usage event that comes later
			// is still the sidecar's to remove.
			r.pending, r.pendingAt = r.releaseHeld(true, r.heldAt), r.heldAt
			continue
		}
		piece, whole, err := r.events.Next()
		// Whatever Next returns was completed by the latest read.
		at := r.src.received()
		switch {
		case err == io.EOF:
			r.eof = true
			r.f.markEnd(at)
			if r.held != nil {
				r.pending, r.pendingAt = r.releaseHeld(true, at), r.heldAt // the last event with usage
			}
			r.fillTrailer()
		case err != nil:
			r.readErr = err
			if r.held != nil {
				r.pending, r.pendingAt = r.releaseHeld(false, at), r.heldAt // received, so it is delivered
			}
		default:
			r.pending, r.pendingAt = piece, at
			if whole {
				r.inspect(piece, at)
			} else if r.events.Ended() && r.hiddenUsage(piece) {
				// The usage the sidecar asked for, cut short by the
				// stream's end: its counts are kept, and the client, which
				// never asked for it, does not get it.
				r.pending = nil
			} else if r.held != nil {
				// Not inspected, so it carries no usage the sidecar knows of.
				r.pending, r.queued = r.releaseHeld(true, at), piece
				r.pendingAt, r.queuedAt = r.heldAt, at
			}
		}
	}
	return nil
}

// noteDelivery records, once everything handed out so far was written,
// that the answer was delivered if its final event was among it.
func (r *eventRelay) noteDelivery() {
	if r.answerEnded && len(r.pending) == 0 && r.queued == nil && r.held == nil {
		r.delivered = true
	}
}

// inspect marks the clock for a whole event that arrived at at, takes its
// usage, and carries out what the hold makes of it: the metrics spliced
// in, the event removed or held back, and a held event released ahead of
// it.
func (r *eventRelay) inspect(raw []byte, at time.Time) {
	r.take(raw, r.f.route.api.ClassifyEvent(raw), at)
}

// take is inspect's work on raw, classified as ev, in a frame of its own:
// the classification runs on inspect's small one. A stream's deepest
// calls, a classification and the metrics spliced into a held event, then
// stay within a goroutine's first 8 KB of stack, so an open stream holds
// no more (e2e's TestAStreamKeepsAGoroutinesFirstStack).
//
//go:noinline
func (r *eventRelay) take(raw []byte, ev rewrite.Event, at time.Time) {
	f := r.f
	if ev.Kind == rewrite.EventToken {
		f.clock.MarkOutput(at, ev.Output)
		if f.liveOn {
			f.live.Mark(requests.StageTokens, at)
		}
	}
	if ev.EndsAnswer() && !r.answerEnded {
		r.answerEnded, r.answerEndedAt = true, at
		if f.liveOn {
			f.live.Mark(requests.StageEnding, at)
		}
	}
	f.clock.CountOutput(ev.CompletionCount(), ev.Kind == rewrite.EventToken)
	noteStreamError(f, ev)
	if f.readsAnswer() {
		f.route.api.ObserveEvent(&f.answer, ev)
	}
	// Anthropic's message_start carries the input tokens ahead of the
	// rest; a usage event, the counts a held event's metrics need, and
	// with them, maybe, the engine's own timing.
	f.addUsage(ev.Usage)
	if ev.Kind == rewrite.EventUsage && f.plan.MetricsOnFinish {
		r.keepEngineReport(ev)
	}
	facts := rewrite.HoldFactsOf(ev)
	if r.hold.WaitsForUsage() {
		facts.KeepAlive = rewrite.IsKeepAlive(raw, ev)
	}
	var released []byte
	var releasedAt time.Time
	if release, withMetrics := r.hold.ReleaseBefore(facts); release {
		released, releasedAt = r.sendHeld(withMetrics, at), r.heldAt
	}
	switch r.hold.Act(facts) {
	case rewrite.ActDrop:
		r.pending = nil
	case rewrite.ActSplice:
		if !rewrite.TakesMetrics(ev) {
			break // not an object to splice into: it goes as it came
		}
		r.metrics = f.metricsJSON(r.metrics[:0], at, rewrite.EngineTimingOf(ev.Target()))
		if out, ok := rewrite.AppendEventWithMetrics(r.spliced[:0], raw, ev, r.metrics); ok {
			r.spliced, r.pending = out, out
			r.hold.Carried()
		}
	case rewrite.ActHold:
		r.heldBuf = append(r.heldBuf[:0], raw...)
		r.held, r.pending, r.heldAt = r.heldBuf, nil, at
		r.heldEvent = ev.In(r.heldBuf)
	}
	if released != nil {
		r.pending, r.queued = released, r.pending
		r.pendingAt, r.queuedAt = releasedAt, at
	}
}

// keepEngineReport keeps the engine's own timing and metrics object from
// a usage event the client does not get (metricsOnFinish): they go with
// the sidecar's, on the finishing event. A copy, as the event's bytes are
// reused.
func (r *eventRelay) keepEngineReport(ev rewrite.Event) {
	r.engine = rewrite.EngineTimingOf(ev.Target())
	r.engineMetrics = append(r.engineMetrics[:0], rewrite.EngineMetrics(ev.Target())...)
}

// hiddenUsage tells whether raw, a stream's unterminated tail, is a usage
// event the sidecar asked for and the client did not, and takes its counts.
func (r *eventRelay) hiddenUsage(raw []byte) bool {
	f := r.f
	if !f.plan.HideUsage && !f.plan.MetricsOnFinish {
		return false
	}
	ev := f.route.api.ClassifyEvent(raw)
	if ev.Kind != rewrite.EventUsage {
		return false
	}
	f.addUsage(ev.Usage)
	return true
}

// releaseHeld lets the held event go at the end of the stream or the
// hold's bound, with the metrics if withMetrics and no event carried them.
func (r *eventRelay) releaseHeld(withMetrics bool, done time.Time) []byte {
	return r.sendHeld(r.hold.Release() && withMetrics, done)
}

// sendHeld returns the held event, with the metrics spliced in if
// withMetrics (the request done at done), and holds nothing after.
func (r *eventRelay) sendHeld(withMetrics bool, done time.Time) []byte {
	held := r.held
	r.held = nil
	if withMetrics {
		if out, ok := r.spliceHeld(held, done); ok {
			return out
		}
	}
	// A copy: heldBuf may take the next event before this one is out.
	r.heldOut = append(r.heldOut[:0], held...)
	return r.heldOut
}

// spliceHeld splices the metrics, the request done at done, into the
// held event, when it is an object that can take them.
func (r *eventRelay) spliceHeld(held []byte, done time.Time) ([]byte, bool) {
	ev := &r.heldEvent
	if !rewrite.TakesMetrics(*ev) {
		return nil, false
	}
	engine := rewrite.EngineTimingOf(ev.Target())
	if !engine.Reported && !engine.AcceptanceLength.Set {
		engine = r.engine // from the usage event the client does not get
	}
	r.metrics = r.f.metricsJSON(r.metrics[:0], done, engine)
	metrics := r.metrics
	if rewrite.EngineMetrics(ev.Target()) == nil {
		// The engine's object came on that usage event; the splice
		// merges with an object on this one itself. Merged after ours in
		// the same buffer.
		n := len(r.metrics)
		r.metrics = rewrite.AppendMergedMetrics(r.metrics, r.metrics[:n], r.engineMetrics)
		metrics = r.metrics[n:]
	}
	out, ok := rewrite.AppendEventWithMetrics(r.heldOut[:0], held, *ev, metrics)
	if ok {
		r.heldOut = out
		r.hold.Carried()
	}
	return out, ok
}

// fillTrailer sets the Server-Timing trailer for the whole stream.
func (r *eventRelay) fillTrailer() {
	if r.trailer == nil {
		return
	}
	m := r.f.done(r.f.clock.Done, timing.EngineTiming{})
	// After the engine's entries, which announcing the trailer moved here:
	// fasthttp keeps a field name in the header or in the trailer.
	var b [serverTimingSize]byte
	addServerTiming(r.trailer, m.AppendServerTiming(b[:0]))
}

func (r *eventRelay) exchange() *upstream.Exchange { return r.x }

func (r *eventRelay) CloseWithError(writeErr error) error {
	if r.delivered && r.f.clock.Done.IsZero() {
		// Cut after the answer's end (the client left, and the watch
		// let go of the engine before its stream closed): the request
		// ended with the event that ended the answer.
		r.f.markEnd(r.answerEndedAt)
	}
	noteEnd(r.f, r.x, r.readErr, writeErr, r.delivered)
	if c := r.f.client; c != nil {
		c.OnStall(nil)
	}
	// The read-ahead's goroutine is done with the engine before the
	// engine's connection and response are let go.
	r.f.readAhead, r.f.aheadWaited = r.src.close(r.x.Abort)
	r.x.Finish(r.resp, r.eof)
	r.p.finish(r.f)
	pools := r.p.pools
	r.events.Reset(nil)
	*r = eventRelay{events: r.events, spliced: r.spliced[:0], heldBuf: r.heldBuf[:0], heldOut: r.heldOut[:0], metrics: r.metrics[:0],
		engineMetrics: r.engineMetrics[:0], clientBlocked: r.clientBlocked}
	pools.relay.Put(r)
	return nil
}

// pools hold per-stream state and body buffers for reuse, so a stream in
// steady state allocates nothing and a non-streaming response little.
type pools struct {
	relay   sync.Pool
	buffers sync.Pool
	flights sync.Pool
}

// buffer is a reusable byte buffer.
type buffer struct{ B []byte }

// maxPooledBuffer: a buffer grown past this (a rare huge body) is left to
// the garbage collector rather than kept.
const maxPooledBuffer = 1 << 20

func (p *pools) buffer() *buffer {
	if b, ok := p.buffers.Get().(*buffer); ok {
		b.B = b.B[:0]
		return b
	}
	return &buffer{B: make([]byte, 0, 16<<10)}
}

func (p *pools) release(b *buffer) {
	if cap(b.B) <= maxPooledBuffer {
		p.buffers.Put(b)
	}
}

func newPools(maxEvent int) *pools {
	p := &pools{}
	p.relay.New = func() any {
		// The scratch for the metrics (spliced, metrics, held*) is grown
		// at a stream's end, when it is needed, and kept with the pooled
		// relay: thousands of open streams do not each hold 1.5 KiB for
		// their last event.
		r := &eventRelay{events: rewrite.NewEventReader(nil, maxEvent)}
		r.clientBlocked = r.src.clientBlocked
		return r
	}
	return p
}
