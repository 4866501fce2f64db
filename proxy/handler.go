package proxy

import (
	"errors"
	"net"
	"runtime/debug"
	"time"
	"unsafe"

	"github.com/valyala/fasthttp"

	"github.com/timing-sidecar/timing-sidecar/rewrite"
	"github.com/timing-sidecar/timing-sidecar/telemetry"
)

// maxKeptRequestBody: a request body buffer grown past this is given back
// when its request has been handled, not kept for the connection's next.
const maxKeptRequestBody = 1 << 20

func (p *Proxy) handle(ctx *fasthttp.RequestCtx) {
	dropTrailers(&ctx.Request.Header)
	arrival := time.Now()
	if cc, ok := ctx.Conn().(*clientConn); ok {
		arrival = cc.arrival() // when the request's last bytes arrived
		cc.newResponse()
	}
	f := p.begin(ctx, arrival)
	defer func() {
		p.recoverRequest(ctx, f)
		if p.ready.stopping.Load() {
			// Draining: the client's next request goes elsewhere. Set
			// last, as the engine's headers were copied without their
			// hop-by-hop ones; the response's headers are written after.
			ctx.SetConnectionClose()
		}
		if !f.streaming {
			if f.rec.Status == 0 {
				f.rec.Status = ctx.Response.StatusCode()
				f.rec.BytesOut = len(ctx.Response.Body())
			}
			p.finish(f)
		}
		// The request has been sent on; the body is not read again. A
		// large one's buffer would otherwise stay with the connection
		// while it idles (the server keeps body buffers), up to the body
		// limit per idle client: the buffer is swapped for none and left
		// to the garbage collector.
		if cap(ctx.Request.Body()) > maxKeptRequestBody {
			ctx.Request.SwapBody(nil)
		}
	}()
	// Flush each response as soon as it is written. fasthttp otherwise
	// holds a response while the client has pipelined requests waiting,
	// and a short answer would wait for a long generation behind it.
	ctx.SetWriteDeadline(time.Time{}) //nolint:errcheck
	if e := checkRequest(&ctx.Request.Header); e != nil {
		// Refuse rather than guess where this request ends; the
		// connection cannot be trusted for another one.
		e.write(ctx)
		setResponseID(ctx, f)
		closeAfterError(ctx)
		return
	}
	if ctx.IsPost() && f.route.measured {
		p.serveMeasured(ctx, f)
		return
	}
	x, resp, ok := p.forward(ctx, f, ctx.PostBody(), false)
	if ok {
		p.relayBody(ctx, f, x, resp, nil, nil)
	}
}

// recoverRequest is the per-request panic boundary: a bug answers one
// request with a 500 instead of taking the pod's traffic down.
func (p *Proxy) recoverRequest(ctx *fasthttp.RequestCtx, f *flight) {
	if r := recover(); r != nil {
		p.telemetry.Panic()
		p.log.Error("panic while serving a request", "panic", r, "path", string(ctx.Path()),
			"request_id", f.rec.ID, "stack", string(debug.Stack()))
		apiError{Status: fasthttp.StatusInternalServerError, Type: "internal_error", Code: "sidecar_panic",
			Message: "timing-sidecar: internal error while proxying the request"}.write(ctx)
		setResponseID(ctx, f)
		ctx.SetConnectionClose()
		f.streaming = false
		f.rec.Status = fasthttp.StatusInternalServerError
	}
}

// serveMeasured handles a request to a measured endpoint: inspect, plan,
// forward, relay. Every one is timed; the metrics object goes into the
// response when the mode and the request ask for it.
func (p *Proxy) serveMeasured(ctx *fasthttp.RequestCtx, f *flight) {
	body := ctx.PostBody()
	req := rewrite.InspectRequest(body)
	pl := planFor(&p.cfg, f.route, req)
	f.rec.Model, f.rec.Stream = req.Model, req.Stream
	if p.tracer != nil {
		p.beginTrace(ctx, f, body)
	}
	if pl.refuse {
		// The sidecar's own field: its client gets told, not the engine.
		apiError{Status: fasthttp.StatusBadRequest, Type: "invalid_request_error", Code: "invalid_include_metrics",
			Param: "include_metrics", Message: "timing-sidecar: include_metrics must be true or false"}.write(ctx)
		setResponseID(ctx, f)
		return
	}
	f.wantMetrics, f.metricsOnFinish, f.hideUsage, f.multiple = pl.wantMetrics, pl.metricsOnFinish, pl.hideUsage, pl.multiple
	upBody := p.upstreamBody(f, body, req, pl) // settles f.upgraded, and what a failed edit turns off
	x, resp, ok := p.forward(ctx, f, upBody, f.wantMetrics || f.hideUsage || f.upgraded)
	if !ok {
		return
	}
	p.relayMeasured(ctx, f, x, resp)
}

// upstreamBody is the body to send the engine as pl says: upgraded to a
// stream, or with include_metrics cut and usage asked for, or as it came.
// A body the edit fails on goes as it came, without metrics.
func (p *Proxy) upstreamBody(f *flight, body []byte, req rewrite.Request, pl plan) []byte {
	edit := req
	edit.HasIncludeMetrics = pl.cutIncludeMetrics
	if pl.upgrade {
		b, err := rewrite.UpgradedBody(body, edit)
		if err == nil {
			f.upgraded = true
			return b
		}
		p.log.Warn("could not upgrade the request to a stream; forwarding it as it is", "err", err, "request_id", f.rec.ID)
	}
	if !pl.cutIncludeMetrics && !pl.askUsage {
		return body
	}
	upBody, err := rewrite.UpstreamBody(f.upstreamBody, body, edit, pl.askUsage)
	if err != nil {
		p.log.Warn("could not edit request body; forwarding it unchanged", "err", err, "request_id", f.rec.ID)
		f.wantMetrics, f.hideUsage, f.metricsOnFinish = false, false, false
		return body
	}
	if cap(upBody) > cap(f.upstreamBody) && cap(upBody) <= maxKeptUpstreamBody &&
		unsafe.SliceData(upBody) != unsafe.SliceData(body) {
		f.upstreamBody = upBody[:0] // grown: keep the room for next time
	}
	return upBody
}

// relayMeasured relays the engine's answer to a measured request the way
// its kind asks: reassembled, event by event, buffered for the metrics,
// or as it comes.
func (p *Proxy) relayMeasured(ctx *fasthttp.RequestCtx, f *flight, x *exchange, resp *fasthttp.Response) {
	if resp.StatusCode() != fasthttp.StatusOK || isEncoded(resp) {
		// Errors and what the sidecar cannot read pass through as they are.
		p.relayBody(ctx, f, x, resp, nil, nil)
		return
	}
	f.measured = true
	f.rec.Stream = isEventStream(resp)
	f.upgraded = f.upgraded && f.rec.Stream // an engine that answered unstreamed anyway
	switch {
	case f.upgraded:
		f.rec.Stream = false // as the client sees it
		p.relayAssembled(ctx, f, x, resp)
	case f.rec.Stream:
		p.relayEvents(ctx, f, x, resp)
	case f.wantMetrics:
		p.relayWithMetrics(ctx, f, x, resp)
	default:
		p.relayBody(ctx, f, x, resp, nil, nil)
	}
}

// forward sends the client's request upstream with body and waits for the
// response headers, watching the client meanwhile. On failure it answers
// the client itself and returns false.
func (p *Proxy) forward(ctx *fasthttp.RequestCtx, f *flight, body []byte, identity bool) (*exchange, *fasthttp.Response, bool) {
	req := fasthttp.AcquireRequest()
	upstreamRequest(req, ctx, body, identity, p.up.addr.host)
	if f.rec.Trace.On() {
		// The engine's span is the child of the sidecar's CLIENT span,
		// not of the client's: the client's trace context is replaced.
		req.Header.Del("Tracestate")
		p.tracer.Send(&f.rec.Trace, requestCarrier{&req.Header}, time.Now(), f.rec.Method, f.rec.Path)
	}
	resp := fasthttp.AcquireResponse()
	resp.SkipBody = ctx.IsHead()
	// A response without Content-Type must not read as text/plain.
	resp.Header.SetNoDefaultContentType(true)
	x := &exchange{up: p.up}
	cc, _ := ctx.Conn().(*clientConn)
	if cc != nil {
		cc.watch(x.abort)
	}
	err := x.roundTrip(req, resp)
	fasthttp.ReleaseRequest(req)
	if err == nil {
		x.client = cc
		f.clock.Accepted = x.headersRead
		f.rec.Trace.EngineStatus = resp.StatusCode()
		return x, resp, true
	}
	if cc != nil {
		cc.unwatch()
	}
	fasthttp.ReleaseResponse(resp)
	if errors.Is(err, errAborted) {
		closeUnanswered(ctx, f)
		return nil, nil, false
	}
	p.log.Warn("upstream request failed", "path", f.rec.Path, "request_id", f.rec.ID, "err", safeError(err))
	f.rec.UpstreamError = upstreamErrorKind(err, true)
	upstreamError(err).write(ctx)
	setResponseID(ctx, f)
	return nil, nil, false
}

// closeUnanswered ends a request whose client left before it was answered:
// the connection is closed without a response, so that a client that only
// half-closed cannot mistake it for a success.
func closeUnanswered(ctx *fasthttp.RequestCtx, f *flight) {
	ctx.HijackSetNoResponse(true)
	ctx.Hijack(func(net.Conn) {})
	f.rec.Status, f.rec.ClientGone = telemetry.StatusClientGone, true
}
