package emulator

import (
	"encoding/json"
	"net/http"
	"strconv"
	"time"
)

// stream sends the response as vLLM does: headers at once (after the
// configured queue delay), a role event per choice (chat), token events
// with the choices interleaved, the finish reason on each choice's last
// token event, the usage event when asked, then [DONE]. Each event is made
// when it is due and written before the next is made: a client that does
// not read blocks the write (TCP backpressure), and so its generation.
func (g *generation) stream() {
	late := g.lateHeaders()
	wait, ttft := g.timing.HeaderDelay, g.timing.TTFT
	if late {
		// The headers wait for the first token, and go with it.
		wait, ttft = wait+ttft, 0
	}
	if !g.wait(wait) {
		return
	}
	flusher := g.w.(http.Flusher)
	h := g.w.Header()
	h.Set("Content-Type", "text/event-stream; charset=utf-8")
	h.Set("Cache-Control", "no-cache")
	g.mark(func(r *Record) { r.Status, r.HeadersSent = http.StatusOK, time.Now() })
	g.w.WriteHeader(http.StatusOK)
	// Late, the headers and the opening chunks stay in the buffer until
	// the first token's flush: one write.
	g.holdFlush = late
	if !late {
		flusher.Flush()
	}

	cs := g.newChunkStream(flusher)
	if !cs.sendOpening() || !g.wait(ttft) || !cs.sendTokens() {
		return
	}
	if g.includeUsage() && !cs.sendUsage() {
		return
	}
	g.event([]byte("[DONE]"), flusher)
	g.mark(func(r *Record) { r.PromptTokens, r.CompletionTokens = g.prompt, cs.sent })
}

// chunkStream is a chat or completions stream being written: what its
// chunks share and the counts they report.
type chunkStream struct {
	g       *generation
	flusher http.Flusher
	format  chunkFormat
	// continuous puts the usage so far on every chunk
	// (continuous_usage_stats).
	continuous bool
	// reason is the finish reason of each choice's last token event.
	reason string
	// sent counts the completion tokens sent, all choices; perChoice
	// those of each choice (the choices advance together).
	sent, perChoice int
}

func (g *generation) newChunkStream(f http.Flusher) *chunkStream {
	var format chunkFormat = &completionChunks{g: g}
	if g.chat {
		format = chatChunks{g: g}
	}
	return &chunkStream{g: g, flusher: f, format: format,
		continuous: g.includeUsage() && bool(g.req.StreamOptions.ContinuousUsageStats), reason: g.finishReason()}
}

// send writes one chunk with these choices; false when the client is gone.
func (cs *chunkStream) send(choices any, withUsage bool) bool {
	g := cs.g
	c := chunk{ID: g.e.rec.ID, Object: cs.format.object(), Created: g.s.created, Model: g.s.cfg.Model, Choices: choices}
	if withUsage {
		u := g.usage(cs.sent)
		c.Usage = &u
	}
	b, _ := json.Marshal(c)
	return g.event(b, cs.flusher)
}

// sendOpening sends the chunks that come before the first token, if the
// format has any.
func (cs *chunkStream) sendOpening() bool {
	for i := 0; i < cs.g.choices; i++ {
		if choices := cs.format.opening(i); choices != nil && !cs.send(choices, cs.continuous) {
			return false
		}
	}
	return true
}

// sendTokens sends the token events, ITL apart, one step of the output
// to every choice at a time; false when the stream ended early.
func (cs *chunkStream) sendTokens() bool {
	g := cs.g
	steps := g.stepper(g.timing.TokensPerEvent)
	for events := 0; steps.more(); events++ {
		pause := g.timing.ITL
		if events == g.stallAfter {
			pause += g.stall
		}
		if events > 0 && !g.wait(pause) {
			return false
		}
		if cs.injectFault(events) {
			return false
		}
		st := steps.next()
		last := !steps.more()
		g.holdFlush = false
		began := time.Now() // before the step's first byte: see Record
		if !cs.sendStep(&st, last) {
			return false
		}
		g.markTokenEvent(began, events+1, &st)
	}
	return true
}

// injectFault plays the fault the request asked for (HeaderCutAfter,
// HeaderErrorAfter) when its token event is next; true when it did, which
// ends the stream.
func (cs *chunkStream) injectFault(events int) bool {
	g := cs.g
	switch events {
	case g.cutAfter:
		g.cut()
	case g.errorAfter:
		e, _ := json.Marshal(newAPIError(http.StatusInternalServerError, "InternalServerError", "emulated engine failure"))
		if g.event(e, cs.flusher) {
			g.event([]byte("[DONE]"), cs.flusher)
		}
	default:
		return false
	}
	return true
}

// sendStep sends step st to every choice, an event each; last marks each
// choice's last token event, which carries the finish reason.
func (cs *chunkStream) sendStep(st *step, last bool) bool {
	g := cs.g
	n := len(st.tokens)
	if last {
		n = g.tokens - cs.perChoice // the step split for a surrogate pair carries none
	}
	if g.output == OutputTools {
		n = min(n, g.tokens-cs.perChoice)
	}
	var finish *string
	if last {
		finish = &cs.reason
	}
	for i := 0; i < g.choices; i++ {
		cs.sent += n
		e := choiceEvent{index: i, st: st, content: g.eventContent(st), finish: finish, from: cs.perChoice}
		if !cs.send(cs.format.choice(e), cs.continuous) {
			return false
		}
	}
	cs.perChoice += n
	cs.format.advance(st)
	return true
}

// sendUsage sends the usage event, with the engine's own metrics when it
// plays vLLM's: none for several choices (vLLM leaves its null out of
// events).
func (cs *chunkStream) sendUsage() bool {
	g := cs.g
	var rec Record
	g.mark(func(r *Record) { rec = *r })
	c := chunk{ID: g.e.rec.ID, Object: cs.format.object(), Created: g.s.created, Model: g.s.cfg.Model, Choices: []struct{}{}}
	if g.choices == 1 {
		c.Metrics = g.engineMetrics(rec.HeadersSent, rec.FirstToken, rec.LastToken, g.tokens)
	}
	u := g.usage(cs.sent)
	c.Usage = &u
	b, _ := json.Marshal(c)
	return g.event(b, cs.flusher)
}

// eventContent is the content of a token event carrying st: st's own, or
// with HeaderStamp the moment the event is made.
func (g *generation) eventContent(st *step) json.RawMessage {
	content := st.content
	if g.stamp && content != nil {
		content, _ = json.Marshal(" @" + strconv.FormatInt(time.Now().UnixNano(), 10))
	}
	return content
}

// choiceEvent is one choice's part of a token event.
type choiceEvent struct {
	index   int
	st      *step
	content json.RawMessage // what the event says st's content is (eventContent)
	finish  *string         // the finish reason, on the choice's last event
	from    int             // the choice's tokens sent before this event, for logprobs
}

// chunkFormat is what differs between the chat and the completions
// stream; a stream picks one as it starts.
type chunkFormat interface {
	// object is every chunk's "object".
	object() string
	// opening is the choices of choice i's chunk before the first token;
	// nil for none.
	opening(i int) any
	// choice is the choices of a token event's chunk.
	choice(e choiceEvent) any
	// advance is told that step st went out to every choice.
	advance(st *step)
}

// chatChunks is the Chat Completions stream: a role event per choice,
// then deltas with content, reasoning or a tool call.
type chatChunks struct{ g *generation }

func (chatChunks) object() string { return "chat.completion.chunk" }

func (chatChunks) opening(i int) any {
	return []chatChunkChoice{{Index: i, Delta: chatDelta{Role: "assistant", Content: json.RawMessage(`""`)}}}
}

func (f chatChunks) choice(e choiceEvent) any {
	c := chatChunkChoice{Index: e.index, FinishReason: e.finish, Delta: chatDelta{Content: e.content}}
	if e.st.reasoning != nil {
		c.Delta.ReasoningContent = e.st.reasoning
		if f.g.output == OutputReasoningField {
			c.Delta.Reasoning = e.st.reasoning // newer vLLM sends both, alike
		}
	}
	if e.st.tool != nil {
		c.Delta.ToolCalls = []toolDelta{*e.st.tool}
	}
	if f.g.logprobs {
		c.Logprobs = map[string]any{"content": f.g.chatLogprobs(e.st.tokens, e.from)}
	}
	if e.finish != nil {
		c.StopReason = json.RawMessage("null") // on the last event only
	}
	return []chatChunkChoice{c}
}

func (chatChunks) advance(*step) {}

// completionChunks is the Completions stream: text pieces, whose logprobs
// give each token's offset in the choice's text.
type completionChunks struct {
	g *generation
	// textAt is the length of each choice's text so far.
	textAt int
}

func (*completionChunks) object() string { return "text_completion" }

func (*completionChunks) opening(int) any { return nil }

func (f *completionChunks) choice(e choiceEvent) any {
	c := completionChunkChoice{Index: e.index, Text: e.content, FinishReason: e.finish}
	if f.g.logprobs {
		c.Logprobs = f.g.completionLogprobs(e.st.tokens, e.from, f.textAt)
	}
	return []completionChunkChoice{c}
}

func (f *completionChunks) advance(st *step) {
	if st.content != nil {
		f.textAt += len(joinText([]json.RawMessage{st.content}))
	}
}

// event writes and flushes one event; false when the client is gone.
func (g *generation) event(data []byte, f http.Flusher) bool {
	if _, err := g.w.Write(append(append([]byte("data: "), data...), '\n', '\n')); err != nil {
		g.noteGone()
		return false
	}
	if !g.holdFlush {
		f.Flush()
	}
	if g.r.Context().Err() != nil {
		g.noteGone()
		return false
	}
	return true
}

// cut drops the connection mid-stream, as an engine that crashed.
func (g *generation) cut() {
	if conn, _, err := http.NewResponseController(g.w).Hijack(); err == nil {
		conn.Close()
	}
}

// markTokenEvent records that token event number events (from 1), whose
// writing began at now, went out with st's output, or with content when st
// is nil. It is called once the event is written, so an event the client
// never got is not counted; now was read before its first byte.
func (g *generation) markTokenEvent(now time.Time, events int, st *step) {
	g.mark(func(r *Record) {
		if r.FirstToken.IsZero() {
			r.FirstToken = now
		} else {
			r.MaxTokenGap = max(r.MaxTokenGap, now.Sub(r.LastToken))
		}
		r.LastToken = now
		r.TokenEvents = events
		if st != nil && st.reasoning != nil && r.FirstReasoning.IsZero() {
			r.FirstReasoning = now
		}
		if (st == nil || st.content != nil || st.tool != nil) && r.FirstContent.IsZero() {
			r.FirstContent = now
		}
	})
}
