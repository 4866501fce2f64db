package proxy

import (
	"net"
	"strconv"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/timing-sidecar/timing-sidecar/rewrite"
	"github.com/timing-sidecar/timing-sidecar/telemetry"
)

// Tracing, when on, gives each measured request a SERVER span from its
// arrival and a CLIENT span for the exchange with the engine, whose
// context replaces the client's in the request to the engine. Requests to
// other paths get no span, and their trace headers pass as they came: the
// engine's own span, if it makes one, joins the client's trace directly.
// Health probes and model lists would otherwise fill a trace backend with
// spans that say nothing of inference.

// beginTrace starts a measured request's trace.
func (p *Proxy) beginTrace(ctx *fasthttp.RequestCtx, f *flight, body []byte) {
	tr := &f.rec.Trace
	p.tracer.Begin(tr, requestCarrier{&ctx.Request.Header}, f.clock.Arrival, f.route.label, f.rec.Model)
	tr.Sampling = telemetry.Sampling(rewrite.SamplingOf(body))
	tr.Address, tr.Port = splitHostPort(string(ctx.Host()), 0)
	tr.EngineAddress, tr.EnginePort = p.engineAddress, p.enginePort
}

// endTraceAfterPanic ends the spans of a request whose recording panicked
// before the recorder could (it ends them itself if it got that far).
// Its own panic is swallowed: the request's is already logged.
func (p *Proxy) endTraceAfterPanic(f *flight) {
	defer func() { recover() }() //nolint:errcheck
	if f.rec.Trace.On() {
		p.tracer.End(&f.rec, time.Now())
	}
}

// splitHostPort splits host[:port]; a missing port is def.
func splitHostPort(hostport string, def int) (string, int) {
	host, port, err := net.SplitHostPort(hostport)
	if err != nil {
		return hostport, def
	}
	n, err := strconv.Atoi(port)
	if err != nil {
		return host, def
	}
	return host, n
}

// requestCarrier gives OpenTelemetry's propagator a fasthttp request's
// headers.
type requestCarrier struct{ h *fasthttp.RequestHeader }

func (c requestCarrier) Get(key string) string { return string(c.h.Peek(key)) }
func (c requestCarrier) Set(key, value string) { c.h.Set(key, value) }

func (c requestCarrier) Keys() []string {
	var keys []string
	for k := range c.h.All() {
		keys = append(keys, string(k))
	}
	return keys
}
