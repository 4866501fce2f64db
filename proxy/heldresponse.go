package proxy

import (
	"bytes"

	"github.com/valyala/fasthttp"

	"github.com/timing-sidecar/timing-sidecar/proxy/membudget"
)

// bodyPrefetch is what fasthttp reads of a body with its headers
// (readBodyWithStreaming's pre-read): a body this small is already read
// when the handler runs, in the connection's own buffer, outside the
// budget (proxy/membudget).
const bodyPrefetch = 8 << 10

// responseFree is what a held response may take without the budget: the
// usual non-streaming answer, counted per request in deploy/README.md's
// formula, so that the budget is touched only by large ones.
const responseFree = 64 << 10

// holdResponse makes sure the budget covers n bytes of response held for
// f (to splice the metrics in, to read its usage, or reassembled), taking
// more in steps of responseFree and never waiting; false when it has no
// room. The caller then passes the response through without metrics, as
// one over --max-buffered-response-size. finish gives it back.
func (p *Proxy) holdResponse(f *flight, n int) bool {
	if n <= responseFree || n <= f.responseTaken {
		return true
	}
	step := max(n-f.responseTaken, responseFree)
	if !p.bodies.Take(step, 0) {
		return false
	}
	f.responseTaken += step
	return true
}

// respondHeld makes body, which the response now owns (no copy is made),
// the response's body. room is what the budget holds for it: given back
// once fasthttp has written the body to the client, or failed to, not
// when the handler returns, since the body is held until then.
func (p *Proxy) respondHeld(ctx *fasthttp.RequestCtx, body []byte, room int) {
	if room <= 0 {
		ctx.Response.SetBodyRaw(body)
		ctx.Response.Header.SetContentLength(len(body))
		return
	}
	ctx.Response.SetBodyStream(&heldBody{Reader: bytes.NewReader(body), budget: p.bodies, room: room}, len(body))
}

// heldBody is a response body held in memory, with its room in the budget.
type heldBody struct {
	*bytes.Reader
	budget *membudget.Budget
	room   int
}

// Close is called by fasthttp once the body is written, or the write
// failed, and for a response that is never sent.
func (h *heldBody) Close() error {
	h.budget.Give(h.room)
	h.room = 0
	return nil
}
