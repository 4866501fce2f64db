package proxy

import (
	"bytes"
	"encoding/hex"
	"math/rand/v2"
	"runtime/debug"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/timing-sidecar/timing-sidecar/proxy/clientconn"
	"github.com/timing-sidecar/timing-sidecar/rewrite"
	"github.com/timing-sidecar/timing-sidecar/telemetry"
	"github.com/timing-sidecar/timing-sidecar/telemetry/requests"
	"github.com/timing-sidecar/timing-sidecar/timing"
)

// flight is one request on its way through the sidecar: its clock, what
// the engine reported, and the record telemetry gets when it ends.
type flight struct {
	rec   telemetry.Record
	clock timing.Clock
	usage timing.Usage
	// live is the request as /debug/requests shows it running, once
	// registered (liveOn); timeline its stream's events, for the page.
	live     requests.Running
	liveOn   bool
	timeline timing.Timeline
	// measured: the clock ran (a chat or completions request the engine
	// accepted with 200).
	measured bool
	// plan is what the sidecar does with the request, settled before
	// it is forwarded.
	plan rewrite.Plan
	// result is the request's metrics, computed once when it is done,
	// from the marks in doneClock; computed says they are, and lateUsage
	// that counts came after.
	result              timing.Metrics
	doneClock           timing.Clock
	computed, lateUsage bool
	// trailers: the client accepts trailers (TE: trailers).
	trailers bool
	// timingHeader: an answer passed through untouched (the pooling
	// endpoints) gets a Server-Timing header with its time to first byte.
	timingHeader bool
	// streaming: a body stream finishes the flight, not the handler.
	streaming bool
	// route is what the path makes of the request.
	route route
	// upgraded: a non-streaming request the engine was asked to stream
	// (--upgrade-non-streaming) answered with a stream, which is
	// reassembled.
	upgraded bool
	// body is room for the request body, and edit the body as edited
	// for the engine: kept with the pooled flight so that a usual
	// request allocates nothing for them.
	body []byte
	edit rewrite.Edit
	// bodyTaken is what the body holds of the budget until it is sent,
	// and responseTaken what a held response holds until the end.
	bodyTaken, responseTaken int
	// out is what the engine gets as the body.
	// unread is the client's body passed on as it arrives, unread (of
	// unreadSize bytes; -1 for chunked); nil when the body was read, and
	// the engine gets edit.
	unread     *clientBody
	unreadSize int
	// readRoom is the room held by what was read of an unread body.
	readRoom *readRoom
	// readAhead: the stream was read ahead of a stalled client, and
	// aheadWaited is how long the engine waited on it even so.
	readAhead   bool
	aheadWaited time.Duration
	// engineHeaders is the engine's timing from its response headers, and
	// headerCached its cached prompt tokens from there (see
	// rewrite.EngineHeader); the body's report comes first.
	engineHeaders timing.EngineTiming
	headerCached  timing.Count
	// answer is what the response said of itself, read when
	// observeAnswer: for the trace, and the GenAI metrics' response model
	// (see readsAnswer).
	answer        rewrite.Answer
	observeAnswer bool
	// client is the connection the request came on; nil for one that is
	// not a clientconn.Conn.
	client *clientconn.Conn
	// cut, for a stream: Shutdown cut it at the grace's end (set from
	// its goroutine; one per stream, see startStream).
	cut *atomic.Bool
	// kvPulled: the answer comes from a decode engine, which counts the
	// KV it pulled from a prefill engine among its cached tokens.
	kvPulled bool
}

var requestIDHeader = []byte("X-Request-Id")

// begin starts a flight: request id, tenant, variant, and the in-flight
// gauge.
func (p *Proxy) begin(ctx *fasthttp.RequestCtx, arrival time.Time) *flight {
	f, _ := p.pools.flights.Get().(*flight)
	if f == nil {
		f = new(flight)
	}
	cc, _ := ctx.Conn().(*clientconn.Conn)
	// The flight is cleared in place and filled field by field: a
	// composite literal of it (4 KB) would be built on the stack first,
	// and that frame alone would double every connection's goroutine
	// stack, 8 KB more for each open stream.
	timeline, body, edit := f.timeline, f.body[:0], f.edit
	timeline.Reset()
	*f = flight{}
	f.clock.Arrival = arrival
	f.route = routeOf(ctx.Path())
	f.body, f.edit, f.client, f.timeline = body, edit, cc, timeline
	f.rec.Method = string(ctx.Method())
	f.rec.Path = string(ctx.Path())
	f.rec.Endpoint = f.route.label
	if id := ctx.Request.Header.PeekBytes(requestIDHeader); len(id) > 0 {
		f.rec.ID = string(id)
	} else {
		f.rec.ID = newRequestID()
		ctx.Request.Header.SetBytesKV(requestIDHeader, []byte(f.rec.ID))
	}
	if p.cfg.TenantHeader != "" {
		f.rec.Tenant = string(ctx.Request.Header.Peek(p.cfg.TenantHeader))
	}
	f.rec.Variant = p.cfg.Variant
	if v := variantHeader(&ctx.Request.Header, p.cfg.VariantHeader); len(v) > 0 {
		f.rec.Variant = string(v) // the request's own arm wins over the deployment's
	}
	var ok bool
	if f.rec.Asked.TTFT, ok = askedObjective(&ctx.Request.Header, p.cfg.SLOTTFTHeader); !ok {
		f.rec.AskedInvalid |= telemetry.ObjectiveTTFT
	}
	if f.rec.Asked.ITL, ok = askedObjective(&ctx.Request.Header, p.cfg.SLOITLHeader); !ok {
		f.rec.AskedInvalid |= telemetry.ObjectiveITL
	}
	// HTTP/1.0 has no trailers (nor chunks to end with them).
	f.trailers = ctx.Request.Header.IsHTTP11() && bytes.Contains(ctx.Request.Header.Peek("Te"), []byte("trailers"))
	p.telemetry.Begin()
	return f
}

// variantHeader is the arm a request names in header name, nil when name
// is empty or the request names none.
func variantHeader(h *fasthttp.RequestHeader, name string) []byte {
	if name == "" {
		return nil
	}
	return h.Peek(name)
}

// askedObjective reads the objective a request carries in header name:
// 0 when it carries none; false when the header holds no objective. The
// header itself goes to the engine as it came: llm-d's scheduler may read
// it there.
func askedObjective(h *fasthttp.RequestHeader, name string) (time.Duration, bool) {
	if name == "" {
		return 0, true
	}
	v := h.Peek(name)
	if v == nil {
		return 0, true
	}
	return telemetry.ParseAskedObjective(v)
}

// readsAnswer tells whether a stream's next event is read for the answer:
// each one when traced (its id, model and finish reasons), and for the
// GenAI metrics alone only until the model is known, off the per-event
// path after that.
func (f *flight) readsAnswer() bool {
	return f.observeAnswer && (f.rec.Trace.On() || f.answer.Model == "")
}

// newRequestID makes a 16-hex-digit id for a request that came without one.
func newRequestID() string {
	var b [8]byte
	v := rand.Uint64()
	for i := range b {
		b[i] = byte(v >> (8 * i))
	}
	return hex.EncodeToString(b[:])
}

// showLive registers a measured request on /debug/requests as running,
// once its model is read.
func (p *Proxy) showLive(f *flight) {
	if p.debug == nil {
		return
	}
	f.live = requests.Running{ID: f.rec.ID, Endpoint: f.rec.Endpoint, Model: f.rec.Model, Tenant: f.rec.Tenant,
		Variant: f.rec.Variant, Arrival: f.clock.Arrival}
	f.liveOn = true
	p.debug.Begin(&f.live)
}

// showEvent records, for /debug/requests, an event that arrived at
// arrived and has now been written to the client: the clock read is the
// page's one cost per event, paid only with the page on.
func (f *flight) showEvent(arrived time.Time) {
	f.timeline.Event(arrived.Sub(f.clock.Arrival), time.Since(f.clock.Arrival))
	f.live.Event()
}

// relayed records that an event reached the client's socket delay after
// it arrived from the engine: the sidecar's own delay on it.
func (p *Proxy) relayed(f *flight, delay time.Duration) {
	f.rec.RelayDelays.Observe(delay)
	p.telemetry.RelayDelay(delay)
}

// finish records the flight. It runs once, when the response is complete
// (or failed): at the end of the handler, or when a body stream closes.
func (p *Proxy) finish(f *flight) {
	p.bodies.Give(f.responseTaken)
	f.responseTaken = 0
	recorded := p.record(f)
	// Out of the streams Shutdown drains once recorded, so that the
	// record is in what it flushes.
	p.streams.done(f)
	if recorded {
		// Nothing holds the flight after this: it is reused.
		p.pools.flights.Put(f)
	}
}

// record computes the flight's metrics and hands its record to telemetry.
// It is the panic boundary of what runs after the response is written,
// outside the handler's and the body stream's: a bug there costs one
// request's record, not the process. A flight that panicked is not reused.
func (p *Proxy) record(f *flight) (ok bool) {
	defer func() {
		if r := recover(); r != nil {
			p.telemetry.Panic()
			p.log.Error("panic while recording a request", "panic", r, "path", f.rec.Path,
				"request_id", f.rec.ID, "stack", string(debug.Stack()))
			p.endTraceAfterPanic(f)
		}
	}()
	now := time.Now()
	if f.client != nil {
		f.client.Ended(now)
	}
	f.rec.Elapsed = now.Sub(f.clock.Arrival)
	if f.client != nil {
		f.rec.ClientStall = f.client.Stalled()
	}
	// The client held the engine back: past the read-ahead, or with none.
	if f.readAhead {
		f.rec.ClientPaced = f.aheadWaited >= clientPacedAfter
	} else {
		f.rec.ClientPaced = f.rec.ClientStall >= clientPacedAfter
	}
	if f.measured {
		if f.clock.Done.IsZero() {
			f.markEnd(now)
		}
		f.rec.Measured = true
		f.rec.Metrics = *f.done(f.clock.Done, timing.EngineTiming{})
		if f.lateUsage {
			f.rec.Metrics.CountLate(&f.doneClock, f.counts(), f.streamed())
		}
	}
	if f.rec.Trace.On() {
		f.rec.Trace.Clock = f.clock
		f.rec.Trace.Answer = telemetry.Answer(f.answer)
	}
	f.rec.ResponseModel = f.answer.Model
	p.telemetry.Finish(&f.rec)
	if f.liveOn {
		p.debug.Finish(&f.live, &f.rec, &f.clock, &f.timeline, f.rec.Trace.ID())
	}
	return true
}
