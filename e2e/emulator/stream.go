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
	if !g.wait(g.timing.HeaderDelay) {
		return
	}
	flusher := g.w.(http.Flusher)
	h := g.w.Header()
	h.Set("Content-Type", "text/event-stream; charset=utf-8")
	h.Set("Cache-Control", "no-cache")
	g.mark(func(r *Record) { r.Status, r.HeadersSent = http.StatusOK, time.Now() })
	g.w.WriteHeader(http.StatusOK)
	flusher.Flush()

	continuous := g.includeUsage() && g.req.StreamOptions.ContinuousUsageStats
	object := "text_completion"
	if g.chat {
		object = "chat.completion.chunk"
	}
	sent := 0 // completion tokens sent, all choices
	send := func(choices any, withUsage bool) bool {
		c := chunk{ID: g.e.rec.ID, Object: object, Created: g.s.created, Model: g.s.cfg.Model, Choices: choices}
		if withUsage {
			u := g.usage(sent)
			c.Usage = &u
		}
		b, _ := json.Marshal(c)
		return g.event(b, flusher)
	}
	if g.chat {
		for i := 0; i < g.choices; i++ {
			if !send([]chatChunkChoice{{Index: i, Delta: chatDelta{Role: "assistant", Content: json.RawMessage(`""`)}}}, continuous) {
				return
			}
		}
	}
	if !g.wait(g.timing.TTFT) {
		return
	}
	steps := g.stepper(g.timing.TokensPerEvent)
	reason := g.finishReason()
	events, tokensSent, textAt := 0, 0, 0
	for k := 0; steps.more(); k++ {
		if k > 0 && !g.wait(g.timing.ITL) {
			return
		}
		if events == g.cutAfter {
			g.cut()
			return
		}
		if events == g.errorAfter {
			e, _ := json.Marshal(newAPIError(http.StatusInternalServerError, "InternalServerError", "emulated engine failure"))
			if g.event(e, flusher) {
				g.event([]byte("[DONE]"), flusher)
			}
			return
		}
		st := steps.next()
		last := !steps.more()
		began := time.Now() // before the step's first byte: see Record
		n := len(st.tokens)
		if last {
			n = g.tokens - tokensSent // the step split for a surrogate pair carries none
		}
		if g.output == OutputTools {
			n = min(n, g.tokens-tokensSent)
		}
		for i := 0; i < g.choices; i++ {
			sent += n
			var fr *string
			if last {
				fr = &reason
			}
			var choices any
			content := st.content
			if g.stamp && content != nil {
				content, _ = json.Marshal(" @" + strconv.FormatInt(time.Now().UnixNano(), 10))
			}
			if g.chat {
				c := chatChunkChoice{Index: i, FinishReason: fr, Delta: chatDelta{Content: content}}
				if st.reasoning != nil {
					c.Delta.ReasoningContent = st.reasoning
					if g.output == OutputReasoningField {
						c.Delta.Reasoning = st.reasoning // newer vLLM sends both, alike
					}
				}
				if st.tool != nil {
					c.Delta.ToolCalls = []toolDelta{*st.tool}
				}
				if g.logprobs {
					c.Logprobs = map[string]any{"content": g.chatLogprobs(st.tokens, tokensSent)}
				}
				if last {
					c.StopReason = json.RawMessage("null")
				}
				choices = []chatChunkChoice{c}
			} else {
				c := completionChunkChoice{Index: i, Text: content, FinishReason: fr}
				if g.logprobs {
					c.Logprobs = g.completionLogprobs(st.tokens, tokensSent, textAt)
				}
				choices = []completionChunkChoice{c}
			}
			if !send(choices, continuous) {
				return
			}
		}
		tokensSent += n
		if content := st.content; content != nil && !g.chat {
			textAt += len(joinText([]json.RawMessage{content}))
		}
		events++
		g.markTokenEvent(began, events, &st)
	}
	if g.includeUsage() {
		var rec Record
		g.mark(func(r *Record) { rec = *r })
		c := chunk{ID: g.e.rec.ID, Object: object, Created: g.s.created, Model: g.s.cfg.Model, Choices: []struct{}{},
			Metrics: g.engineMetrics(rec.HeadersSent, rec.FirstToken, rec.LastToken, g.tokens)}
		u := g.usage(sent)
		c.Usage = &u
		b, _ := json.Marshal(c)
		if !g.event(b, flusher) {
			return
		}
	}
	g.event([]byte("[DONE]"), flusher)
	g.mark(func(r *Record) { r.PromptTokens, r.CompletionTokens = g.prompt, sent })
}

// event writes and flushes one event; false when the client is gone.
func (g *generation) event(data []byte, f http.Flusher) bool {
	if _, err := g.w.Write(append(append([]byte("data: "), data...), '\n', '\n')); err != nil {
		g.noteGone()
		return false
	}
	f.Flush()
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
