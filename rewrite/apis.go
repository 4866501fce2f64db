package rewrite

import (
	"strings"

	"github.com/tidwall/gjson"

	"github.com/timing-sidecar/timing-sidecar/timing"
)

// An API is what differs between the wire formats the sidecar measures:
// how a request body is read, how an event of its stream is classified
// (and with it, where the metrics go: Event.Target), what the record
// learns of the answer, and how a stream reassembles into the body a
// non-streaming request expects. One value per API, chosen once by the
// request's route: nothing else asks which API a request uses.
type API interface {
	// InspectRequest reads a request body. What does not apply to the
	// API is left out: only OpenAI's Chat Completions and Completions
	// have several choices, stream_options and the stream upgrade; the
	// other APIs' streams always carry their usage.
	InspectRequest(body []byte) Request
	// ClassifyEvent classifies one raw event of the API's stream; it
	// reads only the keys it needs and allocates nothing.
	ClassifyEvent(raw []byte) Event
	// ObserveEvent and ObserveBody read what an event or a non-streaming
	// body says of the answer (id, model, finish reasons), for traces.
	ObserveEvent(a *Answer, ev Event)
	ObserveBody(a *Answer, body []byte)
	// AppendAssembled appends the body reassembled from an upgraded
	// stream; false when the events held something that is not JSON, or
	// for an API whose requests are never Upgradable.
	AppendAssembled(dst []byte, a *Assembly) ([]byte, bool)
}

// The measured APIs.
var (
	// ChatCompletions is OpenAI's Chat Completions (choices with a
	// delta, "data: [DONE]").
	ChatCompletions API = openAIAPI{chat: true}
	// Completions is OpenAI's Completions: Chat Completions' stream
	// format, with text in place of a delta and a body of its own.
	Completions API = openAIAPI{}
	// Messages is Anthropic's Messages API (/v1/messages): typed events,
	// the output in content_block_delta, the final usage in
	// message_delta.
	Messages API = messagesAPI{typedAPI{eventID: "message.id", eventModel: "message.model",
		eventReason: "delta.stop_reason", bodyReason: "stop_reason"}}
	// Responses is OpenAI's Responses API (/v1/responses): typed events,
	// the output in *.delta events, the usage in the "response" of
	// response.completed.
	Responses API = responsesAPI{typedAPI{eventID: "response.id", eventModel: "response.model",
		eventReason: "response.status", bodyReason: "status"}}
)

// Pooling is vLLM's pooling endpoints: embeddings (/v1/embeddings, also
// OpenAI's), /pooling, /classify, /score and rerank (Jina's and Cohere's
// shapes). A request is one JSON object answered by one JSON body with a
// "usage" (prompt_tokens, or rerank's total_tokens, all input); nothing
// streams, and neither the request nor the answer is edited: vLLM's
// schemas for them have no metrics object.
var Pooling API = poolingAPI{}

type poolingAPI struct{}

// InspectRequest reads the model alone, as the engine does (the last copy
// counts; a repeated one leaves it unread). None of the generation APIs'
// members means anything here: a "stream", an "n" or an include_metrics
// goes to the engine as it came, for the engine to judge.
func (poolingAPI) InspectRequest(body []byte) Request {
	s := view(body)
	if !valid(s) || body[firstNonSpace(body)] != '{' {
		return Request{Untouched: true}
	}
	var m modelReading
	eachMember(s, m.member)
	if m.repeated {
		return Request{Repeated: true, Untouched: true}
	}
	return Request{Understood: true, Model: m.model, Untouched: true}
}

// modelReading is a body's "model", read member by member.
type modelReading struct {
	model          string
	seen, repeated bool
}

func (m *modelReading) member(key string, _ int, raw string, _ int) bool {
	if key == "model" {
		m.repeated = m.repeated || m.seen
		m.seen, m.model = true, ""
		if shallow(raw).Type == gjson.String {
			m.model = stringPrefix(raw, MaxModelBytes)
		}
	}
	return true
}

func (poolingAPI) ClassifyEvent(raw []byte) Event { return Event{} }

func (poolingAPI) ObserveEvent(*Answer, Event) {}

func (poolingAPI) ObserveBody(a *Answer, body []byte) {
	r := gjson.GetManyBytes(body, "id", "model")
	a.identify(r[0], r[1])
}

func (poolingAPI) AppendAssembled(dst []byte, _ *Assembly) ([]byte, bool) { return dst, false }

// openAIAPI is Chat Completions (chat) and Completions.
type openAIAPI struct{ chat bool }

func (openAIAPI) InspectRequest(body []byte) Request { return InspectRequest(body) }
func (openAIAPI) ClassifyEvent(raw []byte) Event     { return ClassifyEvent(raw) }

func (openAIAPI) ObserveEvent(a *Answer, ev Event) {
	if ev.Data == nil {
		return
	}
	s := view(ev.Data)
	if a.ID == "" {
		a.identify(gjson.Get(s, "id"), gjson.Get(s, "model"))
	}
	if mayFinish(ev.Data) {
		a.finishReasons(gjson.Get(s, "choices"), "finish_reason")
	}
}

func (openAIAPI) ObserveBody(a *Answer, body []byte) {
	r := gjson.GetManyBytes(body, "id", "model", "choices")
	a.identify(r[0], r[1])
	a.finishReasons(r[2], "finish_reason")
}

func (o openAIAPI) AppendAssembled(dst []byte, a *Assembly) ([]byte, bool) {
	return a.AppendBody(dst, o.chat)
}

// typedAPI is what the APIs of typed events (Messages, Responses) share:
// the OpenAI request members they do not have are left out, their streams
// always carry the usage, and the answer is read from where each puts it.
type typedAPI struct {
	// Where the answer's id and model lie in a stream's events, and its
	// finish reason in the usage event and in a body.
	eventID, eventModel, eventReason, bodyReason string
}

func (typedAPI) InspectRequest(body []byte) Request {
	r := InspectRequest(body)
	r.MultipleChoices, r.Upgradable = false, false
	r.IncludeUsage, r.ContinuousUsage = r.Understood, false
	return r
}

func (typedAPI) AppendAssembled(dst []byte, _ *Assembly) ([]byte, bool) { return dst, false }

// InspectRequest reads a Messages request: vLLM's Anthropic endpoint
// carries no metrics object of its own.
func (m messagesAPI) InspectRequest(body []byte) Request {
	r := m.typedAPI.InspectRequest(body)
	r.NoEngineMetrics = true
	return r
}

func (t typedAPI) ObserveEvent(a *Answer, ev Event) {
	if ev.Data == nil {
		return
	}
	s := view(ev.Data)
	if a.ID == "" {
		a.identify(gjson.Get(s, t.eventID), gjson.Get(s, t.eventModel))
	}
	if ev.Kind == EventUsage {
		a.addReason(gjson.Get(s, t.eventReason))
	}
}

func (t typedAPI) ObserveBody(a *Answer, body []byte) {
	r := gjson.GetManyBytes(body, "id", "model", t.bodyReason)
	a.identify(r[0], r[1])
	a.addReason(r[2])
}

// typedEvent is an event of a typed API with its data and "type" read;
// false for an event without one data line.
func typedEvent(raw []byte) (ev Event, s, typ string, ok bool) {
	at, data := dataLine(raw)
	if data == nil {
		return Event{}, "", "", false
	}
	s = view(data)
	return Event{Data: data, dataAt: at}, s, gjson.Get(s, "type").Str, true
}

type messagesAPI struct{ typedAPI }

// ClassifyEvent: a token is a content_block_delta with non-empty text,
// thinking or partial_json (tool input); message_start's usage gives the
// input tokens; message_delta carries the final usage and takes the
// metrics; ping and the lifecycle events are neither.
func (messagesAPI) ClassifyEvent(raw []byte) Event {
	ev, s, typ, ok := typedEvent(raw)
	if ok {
		classifyMessages(&ev, s, typ)
	}
	return ev
}

type responsesAPI struct{ typedAPI }

// ClassifyEvent: a token is any "response.<...>.delta" event with a
// non-empty delta (output text, reasoning, reasoning summary, function
// call arguments, refusal); response.completed (or .incomplete) carries
// the usage, and the metrics go into its "response" object; the lifecycle
// events (created, in_progress, output_item.added, *.done) are not
// tokens.
func (responsesAPI) ClassifyEvent(raw []byte) Event {
	ev, s, typ, ok := typedEvent(raw)
	if ok {
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
			// The input tokens and the cache's; output_tokens here is a
			// placeholder.
			p := parseUsage(u)
			p.CompletionTokens, p.ReasoningTokens = timing.Count{}, timing.Count{}
			ev.Usage = p
		}
	case "message_delta":
		if u := gjson.Get(s, "usage"); u.IsObject() {
			ev.Kind = EventUsage
			ev.Usage = parseUsage(u)
		}
	case "message_stop":
		ev.ends = true
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
		ev.ends = true
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
