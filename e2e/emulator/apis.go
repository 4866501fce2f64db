package emulator

import (
	"encoding/json"
	"net/http"
	"time"
)

// The endpoints' wire formats.
const (
	apiChat        = "chat"
	apiCompletions = "completions"
	apiMessages    = "messages"  // Anthropic's Messages API, as vLLM serves it
	apiResponses   = "responses" // OpenAI's Responses API, as vLLM serves it
)

func apiOf(path string) string {
	switch path {
	case "/v1/chat/completions":
		return apiChat
	case "/v1/messages":
		return apiMessages
	case "/v1/responses":
		return apiResponses
	}
	return apiCompletions
}

// typedEvent is one event of a typed stream (Messages, Responses): its
// "event:" name and data.
type typedEvent struct {
	name string
	data any
}

// typedStream is a stream's events in three parts: those sent with the
// headers, the token events (paced), and those after the last token. The
// token events and the closing ones are made when they are due, so a
// stream holds one step of its output at a time.
type typedStream struct {
	start []typedEvent
	token func(step) typedEvent // the token event of a step
	end   func() []typedEvent   // the events after the last token
}

// streamTyped sends a typed stream as vLLM does for these APIs: each event
// with its "event:" line, headers after the queue delay, the first token
// after TTFT, the others ITL apart. There is no "data: [DONE]".
func (g *generation) streamTyped(ts typedStream) {
	if !g.wait(g.timing.HeaderDelay) {
		return
	}
	flusher := g.w.(http.Flusher)
	g.w.Header().Set("Content-Type", "text/event-stream; charset=utf-8")
	g.mark(func(r *Record) { r.Status, r.HeadersSent = http.StatusOK, time.Now() })
	g.w.WriteHeader(http.StatusOK)
	flusher.Flush()
	send := func(e typedEvent) bool {
		b, _ := json.Marshal(e.data)
		if _, err := g.w.Write(append(append(append(append([]byte("event: "), e.name...), "\ndata: "...), b...), '\n', '\n')); err != nil {
			g.noteGone()
			return false
		}
		flusher.Flush()
		return true
	}
	for _, e := range ts.start {
		if !send(e) {
			return
		}
	}
	if !g.wait(g.timing.TTFT) {
		return
	}
	steps := g.stepper(g.timing.TokensPerEvent)
	for i := 0; steps.more(); i++ {
		if i > 0 && !g.wait(g.timing.ITL) {
			return
		}
		if i == g.cutAfter {
			g.cut()
			return
		}
		began := time.Now() // before the event's first byte: see Record
		if !send(ts.token(steps.next())) {
			return
		}
		g.markTokenEvent(began, i+1, nil)
	}
	for _, e := range ts.end() {
		if !send(e) {
			return
		}
	}
	g.mark(func(r *Record) { r.PromptTokens, r.CompletionTokens = g.prompt, g.tokens })
}

// stopReason is the Messages API's finish reason.
func (g *generation) stopReason() string {
	if g.finishReason() == "length" {
		return "max_tokens"
	}
	return "end_turn"
}

// messagesUsage is the Messages API's usage: with the cache reported,
// input_tokens is the prompt past the cache, and the cache's tokens are
// apart (vLLM's Anthropic server, as Anthropic's API counts them).
func (g *generation) messagesUsage(output int) map[string]int {
	if !g.reportsCache() {
		return map[string]int{"input_tokens": g.prompt, "output_tokens": output}
	}
	return map[string]int{"input_tokens": g.prompt - g.cached, "cache_creation_input_tokens": 0,
		"cache_read_input_tokens": g.cached, "output_tokens": output}
}

// messagesEvents is the Messages API stream: message_start with the input
// tokens, a text block of text_delta events, message_delta with the output
// tokens and stop reason, message_stop.
func (g *generation) messagesEvents() typedStream {
	msg := map[string]any{"id": g.e.rec.ID, "type": "message", "role": "assistant", "content": []any{},
		"model": g.s.cfg.Model, "stop_reason": nil, "stop_sequence": nil,
		"usage": g.messagesUsage(1)}
	ts := typedStream{start: []typedEvent{
		{name: "message_start", data: map[string]any{"type": "message_start", "message": msg}},
		{name: "content_block_start", data: map[string]any{"type": "content_block_start", "index": 0,
			"content_block": map[string]string{"type": "text", "text": ""}}},
		{name: "ping", data: map[string]string{"type": "ping"}},
	}}
	ts.token = func(st step) typedEvent {
		return typedEvent{name: "content_block_delta", data: map[string]any{
			"type": "content_block_delta", "index": 0, "delta": map[string]any{"type": "text_delta", "text": st.content}}}
	}
	ts.end = func() []typedEvent {
		return []typedEvent{
			{name: "content_block_stop", data: map[string]any{"type": "content_block_stop", "index": 0}},
			{name: "message_delta", data: map[string]any{"type": "message_delta",
				"delta": map[string]any{"stop_reason": g.stopReason(), "stop_sequence": nil},
				"usage": map[string]int{"output_tokens": g.tokens}}},
			{name: "message_stop", data: map[string]string{"type": "message_stop"}},
		}
	}
	return ts
}

func (g *generation) unaryMessages() {
	steps := g.steps(g.timing.TokensPerEvent)
	if !g.wait(g.timing.HeaderDelay + g.timing.TTFT + time.Duration(len(steps)-1)*g.timing.ITL) {
		return
	}
	g.mark(func(r *Record) {
		r.Status, r.HeadersSent = http.StatusOK, time.Now()
		r.PromptTokens, r.CompletionTokens = g.prompt, g.tokens
	})
	writeJSON(g.w, http.StatusOK, map[string]any{"id": g.e.rec.ID, "type": "message", "role": "assistant",
		"content": []map[string]string{{"type": "text", "text": joinText(stepsContent(steps))}},
		"model":   g.s.cfg.Model, "stop_reason": g.stopReason(), "stop_sequence": nil,
		"usage": g.messagesUsage(g.tokens)})
}

// response is a Responses API response object at a stage of its life.
func (g *generation) response(status string, text *string) map[string]any {
	r := map[string]any{"id": g.e.rec.ID, "object": "response", "created_at": g.s.created, "status": status,
		"model": g.s.cfg.Model, "output": []any{}, "usage": nil}
	if text != nil {
		r["output"] = []any{map[string]any{"id": "msg_" + g.e.rec.ID, "type": "message", "status": "completed", "role": "assistant",
			"content": []any{map[string]any{"type": "output_text", "text": *text, "annotations": []any{}}}}}
		r["usage"] = map[string]any{"input_tokens": g.prompt, "input_tokens_details": map[string]int{"cached_tokens": g.cached},
			"output_tokens": g.tokens, "output_tokens_details": map[string]int{"reasoning_tokens": 0},
			"total_tokens": g.prompt + g.tokens}
	}
	return r
}

// responsesEvents is the Responses API stream: the lifecycle events, one
// response.output_text.delta per step, the .done events, and
// response.completed with the usage.
func (g *generation) responsesEvents() typedStream {
	seq := 0
	ev := func(typ string, fields map[string]any) typedEvent {
		fields["type"], fields["sequence_number"] = typ, seq
		seq++
		return typedEvent{name: typ, data: fields}
	}
	item := "msg_" + g.e.rec.ID
	ts := typedStream{start: []typedEvent{
		ev("response.created", map[string]any{"response": g.response("in_progress", nil)}),
		ev("response.in_progress", map[string]any{"response": g.response("in_progress", nil)}),
		ev("response.output_item.added", map[string]any{"output_index": 0, "item": map[string]any{
			"id": item, "type": "message", "status": "in_progress", "role": "assistant", "content": []any{}}}),
		ev("response.content_part.added", map[string]any{"item_id": item, "output_index": 0, "content_index": 0,
			"part": map[string]any{"type": "output_text", "text": "", "annotations": []any{}}}),
	}}
	ts.token = func(st step) typedEvent {
		return ev("response.output_text.delta", map[string]any{"item_id": item, "output_index": 0, "content_index": 0,
			"delta": st.content, "logprobs": []any{}})
	}
	ts.end = func() []typedEvent {
		// The whole text, made again: the one part of a stream that grows
		// with its length (Config.MaxModelLen bounds it).
		text := g.outputText(g.timing.TokensPerEvent)
		return []typedEvent{
			ev("response.output_text.done", map[string]any{"item_id": item, "output_index": 0, "content_index": 0, "text": text}),
			ev("response.content_part.done", map[string]any{"item_id": item, "output_index": 0, "content_index": 0,
				"part": map[string]any{"type": "output_text", "text": text, "annotations": []any{}}}),
			ev("response.completed", map[string]any{"response": g.response("completed", &text)}),
		}
	}
	return ts
}

func (g *generation) unaryResponses() {
	steps := g.steps(g.timing.TokensPerEvent)
	if !g.wait(g.timing.HeaderDelay + g.timing.TTFT + time.Duration(len(steps)-1)*g.timing.ITL) {
		return
	}
	text := joinText(stepsContent(steps))
	g.mark(func(r *Record) {
		r.Status, r.HeadersSent = http.StatusOK, time.Now()
		r.PromptTokens, r.CompletionTokens = g.prompt, g.tokens
	})
	writeJSON(g.w, http.StatusOK, g.response("completed", &text))
}
