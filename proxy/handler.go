package proxy

import (
	"bytes"
	"errors"
	"net"
	"runtime/debug"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/timing-sidecar/timing-sidecar/rewrite"
	"github.com/timing-sidecar/timing-sidecar/timing"
)

// measuredPaths are the endpoints whose responses get metrics.
var measuredPaths = [][]byte{[]byte("/v1/chat/completions"), []byte("/v1/completions")}

func isMeasured(ctx *fasthttp.RequestCtx) bool {
	if !ctx.IsPost() {
		return false
	}
	path := ctx.Path()
	for _, p := range measuredPaths {
		if bytes.Equal(path, p) {
			return true
		}
	}
	return false
}

func (p *Proxy) handle(ctx *fasthttp.RequestCtx) {
	arrival := time.Now()
	defer p.recoverRequest(ctx)
	// Flush each response as soon as it is written. fasthttp otherwise
	// holds a response while the client has pipelined requests waiting,
	// and a short answer would wait for a long generation behind it.
	ctx.SetWriteDeadline(time.Time{}) //nolint:errcheck
	if p.cfg.Mode != ModeOff && isMeasured(ctx) {
		p.serveMeasured(ctx, arrival)
		return
	}
	x, resp, ok := p.forward(ctx, ctx.PostBody(), false)
	if ok {
		p.relayBody(ctx, x, resp, nil, nil)
	}
}

// recoverRequest is the per-request panic boundary: a bug answers one
// request with a 500 instead of taking the pod's traffic down.
func (p *Proxy) recoverRequest(ctx *fasthttp.RequestCtx) {
	if r := recover(); r != nil {
		p.log.Error("panic while serving a request", "panic", r, "path", string(ctx.Path()), "stack", string(debug.Stack()))
		apiError{fasthttp.StatusInternalServerError, "internal_error", "sidecar_panic",
			"timing-sidecar: internal error while proxying the request"}.write(ctx)
		ctx.SetConnectionClose()
	}
}

// serveMeasured handles a chat or completions request.
func (p *Proxy) serveMeasured(ctx *fasthttp.RequestCtx, arrival time.Time) {
	body := ctx.PostBody()
	req := rewrite.InspectRequest(body)
	wanted := req.Understood && (p.cfg.Mode == ModeAlways || req.IncludeMetrics)
	upBody := body
	if req.HasIncludeMetrics || wanted {
		var err error
		if upBody, err = rewrite.UpstreamBody(body, req, wanted); err != nil {
			p.log.Warn("could not edit request body; forwarding it unchanged", "err", err)
			upBody, wanted = body, false
		}
	}
	x, resp, ok := p.forward(ctx, upBody, wanted)
	if !ok {
		return
	}
	clock := timing.Clock{Arrival: arrival, Accepted: time.Now()}
	switch {
	case !wanted || resp.StatusCode() != fasthttp.StatusOK || isEncoded(resp):
		// Errors and what the sidecar cannot read pass through as they are.
		p.relayBody(ctx, x, resp, nil, nil)
	case isEventStream(resp):
		p.relayEvents(ctx, x, resp, clock, req.MultipleChoices)
	default:
		p.relayWithMetrics(ctx, x, resp, clock, req.MultipleChoices)
	}
}

// forward sends the client's request upstream with body and waits for the
// response headers, watching the client meanwhile. On failure it answers
// the client itself and returns false.
func (p *Proxy) forward(ctx *fasthttp.RequestCtx, body []byte, identity bool) (*exchange, *fasthttp.Response, bool) {
	req := fasthttp.AcquireRequest()
	upstreamRequest(req, ctx, body, identity, p.up.addr.host)
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
		return x, resp, true
	}
	if cc != nil {
		cc.unwatch()
	}
	fasthttp.ReleaseResponse(resp)
	if errors.Is(err, errAborted) {
		// The client left: close the connection without a response, so
		// a client that only half-closed cannot mistake it for a success.
		ctx.HijackSetNoResponse(true)
		ctx.Hijack(func(net.Conn) {})
		return nil, nil, false
	}
	p.log.Warn("upstream request failed", "path", string(ctx.Path()), "err", err)
	upstreamError(err).write(ctx)
	return nil, nil, false
}
