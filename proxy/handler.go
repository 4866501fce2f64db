package proxy

import (
	"errors"
	"net"
	"runtime/debug"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/timing-sidecar/timing-sidecar/proxy/clientconn"
	"github.com/timing-sidecar/timing-sidecar/proxy/upstream"
	"github.com/timing-sidecar/timing-sidecar/rewrite"
	"github.com/timing-sidecar/timing-sidecar/telemetry"
	"github.com/timing-sidecar/timing-sidecar/telemetry/requests"
)

func (p *Proxy) handle(ctx *fasthttp.RequestCtx) {
	dropTrailers(&ctx.Request.Header)
	arrival := time.Now()
	if cc, ok := ctx.Conn().(*clientconn.Conn); ok {
		arrival = cc.Arrival() // when the request's last bytes arrived
		cc.NewResponse()
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
		p.sent(f) // when nothing was forwarded
		if !f.streaming {
			if f.rec.Status == 0 {
				f.rec.Status = ctx.Response.StatusCode()
				f.rec.BytesOut = len(ctx.Response.Body())
			}
			p.finish(f)
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
		clientconn.CloseAfterError(ctx)
		return
	}
	read := p.readBody
	if f.route.upload && ctx.IsPost() {
		read = p.readUpload
	}
	body, ok := read(ctx, f)
	if !ok {
		return
	}
	dropTrailers(&ctx.Request.Header) // a chunked body's, read with it
	if cc := f.client; cc != nil {
		f.clock.Arrival = cc.Arrival() // the body's last bytes
	}
	if ctx.IsPost() && f.route.measured {
		p.serveMeasured(ctx, f, body)
		return
	}
	f.edit.Reset(body)
	x, resp, ok := p.forward(ctx, f, false)
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

// sidecarHeader marks a request a timing-sidecar measured on its way to
// the engine. A sidecar further in (in front of a router's prefill and
// decode engines, or of the engine behind a routing sidecar) then adds
// metrics only where the request asks (include_metrics): the outermost
// sidecar's mode decides what the client gets, and its figures are not
// taken for an engine's own.
const sidecarHeader = "X-Timing-Sidecar"

// prefillerHeader is the header llm-d's endpoint picker sets on a request
// it splits: the prefill engine that the decode pod's routing sidecar
// sends the prefill leg to; oldPrefillerHeader is its earlier name.
const (
	prefillerHeader    = "x-prefiller-host-port"
	oldPrefillerHeader = "x-prefiller-url"
)

// splitDownstream tells a whole request that a router behind the sidecar
// will split over a prefill and a decode engine: its response headers
// come once the decode starts, so they cannot mark when the work began.
func splitDownstream(h *fasthttp.RequestHeader, req rewrite.Request) bool {
	return req.Leg == rewrite.LegWhole && !req.Bootstrapped && (len(h.Peek(prefillerHeader)) > 0 || len(h.Peek(oldPrefillerHeader)) > 0)
}

// serveMeasured handles a request to a measured endpoint: inspect, plan,
// forward, relay. Every one is timed; the metrics object goes into the
// response when the mode and the request ask for it.
func (p *Proxy) serveMeasured(ctx *fasthttp.RequestCtx, f *flight, body []byte) {
	// A body left unread is not inspected, but for an upload's first
	// bytes, which hold its form fields.
	inspected := f.unread == nil || f.route.upload && body != nil
	var req rewrite.Request // not Understood
	if inspected {
		req = f.route.api.InspectRequest(body)
	}
	switch {
	case !inspected:
		f.rec.Unread = telemetry.UnreadNoMemory
	case req.Repeated:
		f.rec.Unread = telemetry.UnreadRepeated
	case !req.Understood && !req.InvalidIncludeMetrics:
		f.rec.Unread = telemetry.UnreadInvalid
	}
	req.BehindSidecar = len(ctx.Request.Header.Peek(sidecarHeader)) > 0
	pl := rewrite.PlanFor(p.policy, req)
	f.rec.Model, f.rec.Stream = req.Model, req.Stream
	p.showLive(f)
	f.clock.HeadersLate = splitDownstream(&ctx.Request.Header, req)
	f.clock.SeveralChoices = req.MultipleChoices
	leg := req.Leg
	if leg == rewrite.LegWhole && req.Bootstrapped {
		leg = p.bootstrapLeg
	}
	f.rec.Leg = leg.String()
	// The answer comes from a decode engine, whose usage counts the KV it
	// pulled as cached: a decode leg, or a request split behind.
	f.kvPulled = leg == rewrite.LegDecode || f.clock.HeadersLate
	f.timingHeader = req.Untouched && p.cfg.Mode != rewrite.ModeOff
	if p.tracer != nil {
		p.beginTrace(ctx, f, body)
	}
	f.observeAnswer = f.rec.Trace.On() || p.genai != nil
	if pl.Refuse {
		// The sidecar's own field: its client gets told, not the engine.
		apiError{Status: fasthttp.StatusBadRequest, Type: "invalid_request_error", Code: "invalid_include_metrics",
			Param: "include_metrics", Message: "timing-sidecar: include_metrics must be a boolean"}.write(ctx)
		setResponseID(ctx, f)
		return
	}
	f.plan = p.editBody(f, body, req, pl)
	x, resp, ok := p.forward(ctx, f, f.plan.WantMetrics || f.plan.HideUsage || f.plan.Upgrade)
	if !ok {
		return
	}
	p.relayMeasured(ctx, f, x, resp)
}

// editBody sets f.edit to the body to send the engine as pl says:
// upgraded to a stream, or with include_metrics cut and usage asked for,
// or as it came. It returns the plan as carried out: a body the edit
// fails on goes as it came, without metrics.
func (p *Proxy) editBody(f *flight, body []byte, req rewrite.Request, pl rewrite.Plan) rewrite.Plan {
	edit := req
	edit.HasIncludeMetrics = pl.CutIncludeMetrics
	if pl.Upgrade {
		err := rewrite.UpgradedBody(&f.edit, body, edit)
		if err == nil {
			return pl
		}
		p.log.Warn("could not upgrade the request to a stream; forwarding it as it is", "err", err, "request_id", f.rec.ID)
		pl.Upgrade = false
	}
	if !pl.CutIncludeMetrics && !pl.AskUsage {
		f.edit.Reset(body)
		return pl
	}
	if err := rewrite.UpstreamBody(&f.edit, body, edit, pl.AskUsage); err != nil {
		p.log.Warn("could not edit request body; forwarding it unchanged", "err", err, "request_id", f.rec.ID)
		pl.WantMetrics, pl.HideUsage, pl.MetricsOnFinish = false, false, false
	}
	return pl
}

// relayMeasured relays the engine's answer to a measured request the way
// its kind asks: reassembled, event by event, buffered for the metrics,
// or as it comes.
func (p *Proxy) relayMeasured(ctx *fasthttp.RequestCtx, f *flight, x *upstream.Exchange, resp *fasthttp.Response) {
	if resp.StatusCode() != fasthttp.StatusOK || isEncoded(resp) {
		// Errors and what the sidecar cannot read pass through as they are.
		p.relayBody(ctx, f, x, resp, nil, nil)
		return
	}
	f.measured = true
	f.rec.Stream = isEventStream(resp)
	f.upgraded = f.plan.Upgrade && f.rec.Stream // not an engine that answered unstreamed anyway
	switch {
	case f.upgraded:
		f.rec.Stream = false // as the client sees it
		p.relayAssembled(ctx, f, x, resp)
	case f.rec.Stream:
		p.relayEvents(ctx, f, x, resp)
	case f.plan.WantMetrics:
		p.relayWithMetrics(ctx, f, x, resp)
	default:
		p.relayBody(ctx, f, x, resp, nil, nil)
	}
}

// forward sends the client's request upstream with the body f.out says and
// waits for the response headers, watching the client meanwhile. On
// failure it answers the client itself and returns false.
func (p *Proxy) forward(ctx *fasthttp.RequestCtx, f *flight, identity bool) (*upstream.Exchange, *fasthttp.Response, bool) {
	req := fasthttp.AcquireRequest()
	p.prepareUpstream(req, ctx, f, identity)
	resp := fasthttp.AcquireResponse()
	resp.SkipBody = ctx.IsHead()
	// A response without Content-Type must not read as text/plain.
	resp.Header.SetNoDefaultContentType(true)
	body := upstream.Body{Edit: &f.edit}
	if f.unread != nil {
		body = upstream.Body{Stream: f.unread, Size: f.unreadSize}
	}
	cc, _ := ctx.Conn().(*clientconn.Conn)
	var watcher upstream.Watcher
	if cc != nil {
		watcher = cc
	}
	// A client still sending is watched once its body is sent, not while
	// the body's reads are the server's.
	x := p.up.NewExchange(body, watcher, f.unread != nil)
	err := x.RoundTrip(req, resp)
	fasthttp.ReleaseRequest(req)
	f.bodyStreamedThrough(cc, x, err)
	p.sent(f)
	if err == nil {
		f.accepted(ctx, x, resp)
		return x, resp, true
	}
	if cc != nil {
		cc.Unwatch()
	}
	fasthttp.ReleaseResponse(resp)
	p.forwardFailed(ctx, f, err)
	return nil, nil, false
}

// prepareUpstream makes req the request the engine gets: the client's, its
// hop-by-hop headers gone, marked as measured for a sidecar further in,
// with the sidecar's trace context; and starts the request's usage record.
func (p *Proxy) prepareUpstream(req *fasthttp.Request, ctx *fasthttp.RequestCtx, f *flight, identity bool) {
	upstreamRequest(req, ctx, identity, p.up.Host())
	if ctx.IsPost() && f.route.measured && f.route.api != rewrite.Pooling && p.cfg.Mode != rewrite.ModeOff {
		req.Header.Set(sidecarHeader, "1")
	}
	if f.rec.Trace.On() {
		// The engine's span is the child of the sidecar's CLIENT span,
		// not of the client's: the client's trace context is replaced.
		req.Header.Del("Tracestate")
		p.tracer.Send(&f.rec.Trace, requestCarrier{&req.Header}, time.Now(), f.rec.Method, f.rec.Path)
	}
	if ctx.IsPost() && f.route.measured && f.rec.UsageID == "" {
		p.telemetry.StartUsage(&f.rec, f.clock.Arrival)
	}
}

// bodyStreamedThrough moves the arrival of a request whose body streamed
// through to the engine to when that body had arrived, or to the engine's
// answer if that came before the body's end.
func (f *flight) bodyStreamedThrough(cc *clientconn.Conn, x *upstream.Exchange, err error) {
	if f.unread == nil || cc == nil || !f.clock.Arrival.Before(cc.Arrival()) {
		return
	}
	f.clock.Arrival = cc.Arrival()
	if err == nil && x.HeadersRead().Before(f.clock.Arrival) {
		f.clock.Arrival = x.HeadersRead()
	}
}

// accepted records the engine's answer head: its acceptance mark, status
// and timing headers.
func (f *flight) accepted(ctx *fasthttp.RequestCtx, x *upstream.Exchange, resp *fasthttp.Response) {
	if x.Early() && f.unread != nil {
		// The rest of the client's body was never read: the connection
		// ends after the answer, lingering so that the client reads it
		// rather than a reset.
		clientconn.CloseAfterError(ctx)
	}
	f.clock.Accepted = x.HeadersRead()
	if f.liveOn {
		f.live.Mark(requests.StageAccepted, f.clock.Accepted)
	}
	f.rec.Trace.EngineStatus = resp.StatusCode()
	if f.route.measured {
		f.readEngineHeaders(&resp.Header)
	}
}

// forwardFailed answers a request the engine did not answer: nothing for a
// client that left, the client's own failure for a body that broke on the
// way, else an OpenAI-style error for the engine's.
func (p *Proxy) forwardFailed(ctx *fasthttp.RequestCtx, f *flight, err error) {
	if errors.Is(err, upstream.ErrAborted) {
		closeUnanswered(ctx, f)
		return
	}
	if f.unread != nil && f.unread.err != nil {
		// The client failed while its body streamed through.
		p.refuseBody(ctx, f, f.unread.err)
		return
	}
	p.log.Warn("upstream request failed", "path", f.rec.Path, "request_id", f.rec.ID, "err", safeError(err))
	f.rec.UpstreamError = upstreamErrorKind(err, true)
	upstreamError(err).write(ctx)
	setResponseID(ctx, f)
}

// closeUnanswered ends a request whose client left before it was answered:
// the connection is closed without a response, so that a client that only
// half-closed cannot mistake it for a success.
func closeUnanswered(ctx *fasthttp.RequestCtx, f *flight) {
	ctx.HijackSetNoResponse(true)
	ctx.Hijack(func(net.Conn) {})
	f.rec.Status, f.rec.ClientGone = telemetry.StatusClientGone, true
}
