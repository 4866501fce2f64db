package rewrite

import (
	"strings"

	"github.com/tidwall/gjson"

	"github.com/timing-sidecar/timing-sidecar/timing"
)

// API is the wire format of a measured endpoint.
type API uint8

const (
	// APIChat is OpenAI's Chat Completions and Completions (choices,
	// "data: [DONE]").
	APIChat API = iota
	// APIMessages is Anthropic's Messages API (/v1/messages): typed
	// events, the output in content_block_delta, the final usage in
	// message_delta.
	APIMessages
	// APIResponses is OpenAI's Responses API (/v1/responses): typed
	// events, the output in *.delta events, the usage in the "response"
	// of response.completed.
	APIResponses
)

// ClassifyEventFor classifies one raw event of api's stream. What counts:
//
//   - Messages: a token is a content_block_delta with non-empty text,
//     thinking or partial_json (tool input); message_start's usage gives
//     the input tokens; message_delta carries the final usage and takes
//     the metrics; ping and the lifecycle events are neither.
//   - Responses: a token is any "response.<...>.delta" event with a
//     non-empty delta (output text, reasoning, reasoning summary, function
//     call arguments, refusal); response.completed (or .incomplete) carries
//     the usage, and the metrics go into its "response" object; the
//     lifecycle events (created, in_progress, output_item.added, *.done)
//     are not tokens.
func ClassifyEventFor(api API, raw []byte) Event {
	if api == APIChat {
		return ClassifyEvent(raw)
	}
	at, data := dataLine(raw)
	if data == nil {
		return Event{}
	}
	ev := Event{Data: data, dataAt: at}
	s := view(data)
	typ := gjson.Get(s, "type").Str
	if api == APIMessages {
		classifyMessages(&ev, s, typ)
	} else {
		classifyResponses(&ev, s, typ)
	}
	return ev
}

func classifyMessages(ev *Event, s, typ string) {
	switch typ {
	case "content_block_delta":
		d := gjson.Get(s, "delta")
		for _, k := range [...]string{"text", "thinking", "partial_json"} {
			if v := d.Get(k); v.Type == gjson.String && len(v.Raw) > 2 {
				ev.Kind, ev.Output = EventToken, timing.OutputContent
				if k == "thinking" {
					ev.Output = timing.OutputReasoning
				}
				return
			}
		}
	case "message_start":
		if u := gjson.Get(s, "message.usage"); u.IsObject() {
			// The input tokens; output_tokens here is a placeholder.
			ev.Usage.PromptTokens = parseUsage(u).PromptTokens
		}
	case "message_delta":
		if u := gjson.Get(s, "usage"); u.IsObject() {
			ev.Kind = EventUsage
			ev.Usage = parseUsage(u)
		}
	case "error":
		ev.Kind = EventError
	}
}

func classifyResponses(ev *Event, s, typ string) {
	switch {
	case strings.HasSuffix(typ, ".delta"):
		if v := gjson.Get(s, "delta"); v.Type == gjson.String && len(v.Raw) > 2 {
			ev.Kind, ev.Output = EventToken, timing.OutputContent
			if strings.HasPrefix(typ, "response.reasoning") {
				ev.Output = timing.OutputReasoning // reasoning text and its summary
			}
		}
	case typ == "response.completed" || typ == "response.incomplete":
		r := gjson.Get(s, "response")
		if !r.IsObject() {
			return
		}
		ev.Kind = EventUsage
		ev.nestedAt, ev.nestedLen = r.Index, len(r.Raw)
		if u := r.Get("usage"); u.IsObject() {
			ev.Usage = parseUsage(u)
		}
	case typ == "error" || typ == "response.failed":
		ev.Kind = EventError
	}
}
