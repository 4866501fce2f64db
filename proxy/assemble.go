package proxy

import (
	"errors"
	"io"

	"github.com/valyala/fasthttp"

	"github.com/timing-sidecar/timing-sidecar/proxy/upstream"
	"github.com/timing-sidecar/timing-sidecar/rewrite"
	"github.com/timing-sidecar/timing-sidecar/telemetry"
	"github.com/timing-sidecar/timing-sidecar/timing"
)

// errEventTooLarge: an upgraded request's stream had an event larger than
// --max-event-size, which cannot be read whole to reassemble it.
var errEventTooLarge = errors.New("an event is larger than --max-event-size")

// relayAssembled reads the stream the sidecar asked for in place of a
// non-streaming response, marking the clock as for any stream, and answers
// the client with the non-streaming response reassembled from it.
func (p *Proxy) relayAssembled(ctx *fasthttp.RequestCtx, f *flight, x *upstream.Exchange, resp *fasthttp.Response) {
	r := p.pools.relay.Get().(*eventRelay)
	defer func() {
		r.events.Reset(nil)
		r.engineMetrics = r.engineMetrics[:0]
		p.pools.relay.Put(r)
	}()
	r.events.Reset(x.Body(resp))
	a := rewrite.NewAssembly(p.cfg.MaxBufferedResponse)
	engine, err := p.assemble(r.events, a, f, x, &r.engineMetrics)
	done := x.Received() // the read that ended the stream
	f.markEnd(done)

	copyResponseHeader(ctx, resp)
	x.Finish(resp, err == nil)
	if x.IsAborted() {
		closeUnanswered(ctx, f)
		return
	}
	setResponseID(ctx, f)
	ctx.Response.Header.SetContentType("application/json")
	if err != nil {
		p.log.Warn("could not reassemble an upgraded response", "path", f.rec.Path, "request_id", f.rec.ID, "err", safeError(err))
		e := apiError{Status: fasthttp.StatusBadGateway, Type: "upstream_error", Code: "upstream_interrupted",
			Message: "timing-sidecar: the model server's stream ended before the response was complete"}
		switch {
		case errors.Is(err, rewrite.ErrAssemblyTooLarge):
			e.Code, e.Message = "response_too_large", "timing-sidecar: the response is larger than --max-buffered-response-size; it can be had as a stream, or with --upgrade-non-streaming off"
		case errors.Is(err, rewrite.ErrNotAnEvent), errors.Is(err, errEventTooLarge):
			e.Code, e.Message = "bad_response", "timing-sidecar: the model server's stream could not be reassembled"
			f.rec.UpstreamError = telemetry.ErrorBadResponse
		default:
			f.rec.UpstreamError = upstreamErrorKind(err, false)
		}
		e.write(ctx)
		setResponseID(ctx, f)
		f.rec.Status = e.Status
		return
	}
	if body, status, ok := a.Error(); ok {
		// What the engine would have answered the request unstreamed.
		ctx.SetStatusCode(status)
		// Its own reason phrase, not the stream's 200's ("OK").
		ctx.Response.Header.SetStatusMessage(nil)
		ctx.Response.SetBody(body)
		f.rec.Status, f.rec.BytesOut = status, len(body)
		if status >= 500 {
			f.rec.UpstreamError = telemetry.ErrorStream
		}
		return
	}
	// The body is built for the response, which takes it without a copy;
	// it is charged to the budget from here until the client has it (the
	// assembly, charged as it grew, goes when the handler returns).
	body, ok := f.route.api.AppendAssembled(nil, a)
	if !ok {
		p.log.Warn("an upgraded stream held data that is not JSON", "path", f.rec.Path, "request_id", f.rec.ID)
		f.rec.UpstreamError = telemetry.ErrorBadResponse
		e := apiError{Status: fasthttp.StatusBadGateway, Type: "upstream_error", Code: "bad_response",
			Message: "timing-sidecar: the model server's stream could not be reassembled: an event is not valid JSON"}
		e.write(ctx)
		setResponseID(ctx, f)
		f.rec.Status = e.Status
		return
	}
	if f.plan.WantMetrics {
		mb := p.pools.buffer()
		defer p.pools.release(mb)
		mb.B = f.metricsJSON(mb.B[:0], done, engine)
		m := f.done(done, engine) // a body's end is the request's
		// Merged with the engine's object from the events, after ours in
		// the same buffer.
		n := len(mb.B)
		mb.B = rewrite.AppendMergedMetrics(mb.B, mb.B[:n], r.engineMetrics)
		if withMetrics, ok := rewrite.InspectBody(body).WithMetrics(body, mb.B[n:]); ok {
			body = withMetrics
			var b [serverTimingSize]byte
			addServerTiming(&ctx.Response.Header, m.AppendServerTiming(b[:0]))
		}
	}
	room := 0
	if len(body) > responseFree {
		room = len(body)
		p.bodies.Charge(room)
	}
	p.respondHeld(ctx, body, room)
	f.rec.Status, f.rec.BytesOut = fasthttp.StatusOK, len(body)
}

// errStreamCut: the upgraded stream ended, cleanly as far as HTTP goes,
// without [DONE] and with a choice unfinished: an engine that closed a
// close-delimited body mid-generation.
var errStreamCut = errors.New("the stream ended before its choices finished")

// assemble reads events to the end of the stream into a, marking f's clock
// and taking the engine's usage; it returns the engine's own timing report
// if the stream carried one.
func (p *Proxy) assemble(events *rewrite.EventReader, a *rewrite.Assembly, f *flight, x *upstream.Exchange, engineMetrics *[]byte) (timing.EngineTiming, error) {
	var engine timing.EngineTiming
	done := false
	for {
		raw, err := nextWholeEvent(events)
		switch {
		case err == io.EOF:
			return engine, streamEnd(a, done)
		case err != nil:
			return engine, err
		case raw == nil:
			continue
		}
		ev := f.route.api.ClassifyEvent(raw)
		if f.readsAnswer() {
			f.route.api.ObserveEvent(&f.answer, ev)
		}
		switch ev.Kind {
		case rewrite.EventDone:
			done = true
			continue
		case rewrite.EventToken:
			f.clock.MarkOutput(x.Received(), ev.Output)
		}
		f.clock.CountOutput(ev.CompletionCount(), ev.Kind == rewrite.EventToken)
		if ev.Kind == rewrite.EventUsage || ev.UsageOnChoices {
			f.addUsage(ev.Usage)
			takeEngineReport(ev, &engine, engineMetrics)
		}
		if err := p.addEvent(a, f, raw, ev); err != nil {
			return engine, err
		}
	}
}

// nextWholeEvent is the stream's next event, whole; nil for bytes after
// the last blank line at the end of the stream: no event, as SSE parsers
// drop them (WHATWG), such as a [DONE] without its blank line.
func nextWholeEvent(events *rewrite.EventReader) ([]byte, error) {
	raw, whole, err := events.Next()
	if err != nil || whole {
		return raw, err
	}
	if rest, _, err := events.Next(); rest == nil && err == io.EOF {
		return nil, nil // the stream ends at the next read
	}
	return nil, errEventTooLarge
}

// streamEnd is how the upgraded stream's end reads: cut short, unless
// [DONE] came, every choice finished or the engine sent an error.
func streamEnd(a *rewrite.Assembly, done bool) error {
	if !done && !a.Finished() {
		if _, _, failed := a.Error(); !failed {
			return errStreamCut
		}
	}
	return nil
}

// takeEngineReport keeps the engine's own metrics object and timing from
// an event with usage.
func takeEngineReport(ev rewrite.Event, engine *timing.EngineTiming, engineMetrics *[]byte) {
	if m := rewrite.EngineMetrics(ev.Target()); m != nil {
		// A copy: the event's bytes are reused by the next read.
		*engineMetrics = append((*engineMetrics)[:0], m...)
	}
	if e := rewrite.EngineTimingOf(ev.Target()); e.Reported || e.AcceptanceLength.Set {
		*engine = e
	}
}

// addEvent adds an event's data to the assembly, within the budget.
func (p *Proxy) addEvent(a *rewrite.Assembly, f *flight, raw []byte, ev rewrite.Event) error {
	if ev.Data == nil {
		if rewrite.HasDataField(raw) {
			// Data over several lines: not read, so it cannot be
			// reassembled, and leaving it out would lose output.
			return rewrite.ErrNotAnEvent
		}
		return nil // a comment
	}
	if err := a.Add(ev.Data); err != nil {
		return err
	}
	if !p.holdResponse(f, a.Size()) {
		return rewrite.ErrAssemblyTooLarge
	}
	return nil
}
