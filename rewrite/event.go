package rewrite

import (
	"bytes"

	"github.com/tidwall/gjson"

	"github.com/timing-sidecar/timing-sidecar/timing"
)

// EventKind is what an event means for the clock.
type EventKind uint8

const (
	// EventOther is anything that carries no generated output: a comment, a
	// role announcement ("content":""), a finish event with an empty delta,
	// a running-usage-only event, or data that is not JSON.
	EventOther EventKind = iota
	// EventToken carries generated output for at least one choice.
	EventToken
	// EventUsage is the final usage event: "choices":[] and a "usage" object.
	EventUsage
	// EventError is an in-stream error: {"error":{...}} or {"object":"error"}.
	EventError
	// EventDone is "data: [DONE]".
	EventDone
)

// Event is a classified event.
type Event struct {
	Kind EventKind
	// Data is the JSON payload of the event's single data line, a sub-slice
	// of the raw event; nil for an event without exactly one data line.
	Data []byte
	// dataAt is where Data starts in the raw event.
	dataAt int
	// nested, when set, is where in Data the object the metrics go into
	// lies (the Responses API's "response"); otherwise it is Data whole.
	nestedAt, nestedLen int
	// Output says what an EventToken carries: content, reasoning or both.
	Output timing.Output
	// Usage holds the token counts of an EventUsage, or of an event with
	// UsageOnChoices.
	Usage timing.Usage
	// UsageOnChoices: an event that finishes all its choices and carries
	// the usage too, as some engines send it instead of a separate
	// "choices": [] event. Its kind is EventToken or EventOther.
	UsageOnChoices bool
	// Running is the completion count an unfinished choice event carries
	// in a stream with running usage (vLLM's continuous_usage_stats): its
	// rise from the event before is what this event carried.
	Running timing.Count
	// carriesChoices: the data has a non-empty "choices" array.
	carriesChoices bool
	// finishes: at least one choice has a finish_reason that is not null.
	finishes bool
	// ends: the event is the typed APIs' last of a whole answer (see
	// EndsAnswer).
	ends bool
}

// EndsAnswer tells the event after which the engine has nothing more to
// say of the answer: Chat Completions' and Completions' "data: [DONE]",
// the Messages API's message_stop, the Responses API's response.completed
// or response.incomplete. A client that has it has been served, whatever
// it does next.
func (ev Event) EndsAnswer() bool { return ev.Kind == EventDone || ev.ends }

var dataField = []byte("data:")

// utf8BOM is the byte-order mark a stream may begin with.
var utf8BOM = []byte("\ufeff")

// Target is the object of the event's data the metrics go into: the data
// itself, or the object nested in it where the API puts usage (the
// Responses API's "response").
func (ev Event) Target() []byte {
	if ev.nestedLen > 0 {
		return ev.Data[ev.nestedAt : ev.nestedAt+ev.nestedLen]
	}
	return ev.Data
}

// HasDataField tells whether a raw event has a data field at all: an
// event without one is a comment or carries nothing; one with several
// data lines has data that ClassifyEvent does not read.
func HasDataField(raw []byte) bool {
	raw = bytes.TrimPrefix(raw, utf8BOM)
	for len(raw) > 0 {
		line := raw
		if i := bytes.IndexAny(raw, "\r\n"); i >= 0 {
			line, raw = raw[:i], raw[i+1:]
		} else {
			raw = nil
		}
		if bytes.HasPrefix(line, dataField) {
			return true
		}
	}
	return false
}

// ClassifyEvent classifies one raw event (as returned whole by
// EventReader.Next). It reads only the keys it needs and allocates nothing.
//
// An event whose data spans several data lines is classified EventOther:
// LLM engines send one line of compact JSON per event.
func ClassifyEvent(raw []byte) Event {
	at, data := dataLine(raw)
	if data == nil {
		return Event{}
	}
	ev := Event{Data: data, dataAt: at}
	if string(data) == "[DONE]" {
		ev.Kind = EventDone
		return ev
	}
	s := view(data)
	choices := choicesOf(data)
	if !choices.isArray {
		if gjson.Get(s, "error").Exists() || gjson.Get(s, "object").Str == "error" {
			ev.Kind = EventError
		}
		return ev
	}
	if choices.empty {
		if usage := gjson.Get(s, "usage"); usage.IsObject() {
			ev.Kind = EventUsage
			ev.Usage = withCacheTimings(parseUsage(usage), s)
		}
		return ev
	}
	ev.carriesChoices, ev.finishes, ev.Output = true, choices.anyFinished, choices.output
	if ev.Output != 0 {
		ev.Kind = EventToken
	}
	// llama.cpp's server, and others, put the usage on the event that
	// finishes the choices instead of an event of its own, after the
	// choices (as OpenAI, TGI and llama.cpp order their keys). A byte
	// search of what follows the choices keeps the look for it off the
	// path of every other event.
	if !bytes.Contains(data[choices.end:], usageKey) {
		return ev
	}
	if choices.allFinished {
		if usage := gjson.Get(s, "usage"); usage.IsObject() {
			ev.UsageOnChoices = true
			ev.Usage = withCacheTimings(parseUsage(usage), s)
		}
	} else {
		// Running usage: only the count, one key, on every event.
		ev.Running, _ = tokenCount(gjson.Get(s, "usage.completion_tokens"))
	}
	return ev
}

// In is ev, classified from raw's bytes, for an identical copy of them:
// its data in the copy. A held event keeps its classification so.
func (ev Event) In(raw []byte) Event {
	if ev.Data != nil {
		ev.Data = raw[ev.dataAt : ev.dataAt+len(ev.Data)]
	}
	return ev
}

// CompletionCount is the completion count ev carries, running or final,
// for Clock.CountOutput.
func (ev Event) CompletionCount() timing.Count {
	if ev.Running.Set {
		return ev.Running
	}
	return ev.Usage.CompletionTokens
}

var usageKey = []byte(`usage"`)

// IsKeepAlive tells whether a raw event carries nothing for the client's
// reading of the stream, so that its place among the others does not
// matter: a comment or an event without data, a ping (an "event: ping", or
// data {"type":"ping"}), or an empty object. Servers and gateways send
// these at any moment.
func IsKeepAlive(raw []byte, ev Event) bool {
	if !HasDataField(raw) || bytes.HasPrefix(raw, pingEvent) {
		return true
	}
	if ev.Data == nil {
		return false // data over several lines: unread, so not known to be nothing
	}
	d := bytes.TrimSpace(ev.Data)
	return string(d) == "{}" || (ev.Kind == EventOther && !ev.carriesChoices && gjson.Get(view(d), "type").Str == "ping" && countKeys(d) == 1)
}

var pingEvent = []byte("event: ping\n")

// countKeys is the number of top-level keys of a JSON object.
func countKeys(obj []byte) int {
	n := 0
	gjson.Parse(view(obj)).ForEach(func(_, _ gjson.Result) bool { n++; return true })
	return n
}

// CarriesChoices tells whether an event's data has a non-empty "choices"
// array: a chat or completions chunk, as opposed to a comment, a ping, or
// a usage event.
func CarriesChoices(ev Event) bool { return ev.carriesChoices }

// FinishesChoice tells whether a Chat Completions or Completions event
// finishes at least one of its choices: one has a finish_reason that is
// not null.
func FinishesChoice(ev Event) bool { return ev.finishes }

// BodyUsage reads the token counts of a non-streaming response body.
func BodyUsage(body []byte) timing.Usage {
	s := view(body)
	usage := gjson.Get(s, "usage")
	if !usage.IsObject() {
		return timing.Usage{}
	}
	return withCacheTimings(parseUsage(usage), s)
}

// parseUsage reads the token counts of a "usage" object; a count that is
// missing or not a number stays unset. The cached prompt tokens are read
// from each API's place for them:
//
//   - Chat Completions and Completions (vLLM with
//     --enable-prompt-tokens-details, SGLang with --enable-cache-report,
//     llama.cpp): prompt_tokens_details.cached_tokens, part of
//     prompt_tokens, and those written to the cache, vLLM's
//     created_cache_tokens, also part of it;
//   - Responses: input_tokens_details.cached_tokens, and cache_write_tokens
//     (vLLM's), part of input_tokens;
//   - Anthropic's Messages: cache_read_input_tokens, apart from
//     input_tokens, as cache_creation_input_tokens is (CacheApart).
//
// The shape is the usage's own, not the route's: Anthropic's keys make
// the counts apart only beside input_tokens and without a details
// object, so a gateway's Chat Completions usage that adds them to
// prompt_tokens (LiteLLM's) is not counted twice.
func parseUsage(usage gjson.Result) timing.Usage {
	var u timing.Usage
	var read, written, details, detailsWritten, total timing.Count
	fromInput := false
	usage.ForEach(func(key, v gjson.Result) bool {
		switch key.Str {
		case "completion_tokens_details", "output_tokens_details":
			if c, ok := tokenCount(v.Get("reasoning_tokens")); ok {
				u.ReasoningTokens = c
			}
			return true
		case "prompt_tokens_details", "input_tokens_details":
			if c, ok := tokenCount(v.Get("cached_tokens")); ok {
				details = c
			}
			// Written to the cache, inside the prompt: vLLM's
			// created_cache_tokens, the Responses API's cache_write_tokens.
			if c, ok := tokenCount(v.Get("created_cache_tokens")); ok {
				detailsWritten = c
			} else if c, ok := tokenCount(v.Get("cache_write_tokens")); ok {
				detailsWritten = c
			}
			return true
		}
		// A count is a whole number of tokens, not below zero; anything
		// else is not a count the sidecar can use, so it stays unknown.
		c, ok := tokenCount(v)
		if !ok {
			return true
		}
		switch key.Str {
		case "prompt_tokens": // Chat Completions
			u.PromptTokens, fromInput = c, false
		case "input_tokens": // Responses and Anthropic
			u.PromptTokens, fromInput = c, true
		case "completion_tokens", "output_tokens":
			u.CompletionTokens = c
		case "total_tokens":
			total = c
		case "cache_read_input_tokens":
			read = c
		case "cache_creation_input_tokens":
			written = c
		}
		return true
	})
	return settleCounts(u, usageCounts{read: read, written: written, details: details, detailsWritten: detailsWritten, total: total, fromInput: fromInput})
}

// usageCounts is what parseUsage reads beside the usage's own counts: the
// cache's, in each API's place, and the total.
type usageCounts struct {
	read, written, details, detailsWritten, total timing.Count
	fromInput                                     bool // the prompt came as input_tokens
}

// settleCounts settles u's prompt and cache counts by the usage's shape:
// rerank's total alone is all input; a details object (OpenAI's,
// Responses') has the cached count inside the prompt; Anthropic's keys
// beside input_tokens, or alone in a final usage, count apart from it;
// beside prompt_tokens (a gateway's chat usage), inside it.
func settleCounts(u timing.Usage, c usageCounts) timing.Usage {
	if !u.PromptTokens.Set && !u.CompletionTokens.Set && c.total.Set {
		u.PromptTokens = c.total
	}
	anthropic := c.read.Set || c.written.Set
	switch {
	case c.details.Set || c.detailsWritten.Set:
		u.CachedTokens, u.CacheWriteTokens = c.details, c.detailsWritten
	case anthropic && (c.fromInput || !u.PromptTokens.Set):
		u.CachedTokens, u.CacheWriteTokens, u.CacheApart = c.read, c.written, true
	case c.read.Set:
		u.CachedTokens = c.read
	}
	return u
}

// withCacheTimings completes u, read from the object s, with llama.cpp's
// count of cached prompt tokens (timings.cache_n, beside the usage in the
// same object) where the usage did not report one: llama.cpp's server
// before it reported prompt_tokens_details.
func withCacheTimings(u timing.Usage, s string) timing.Usage {
	if u.CachedTokens.Set {
		return u // no look for timings on the usage events of other engines
	}
	return cacheFromTimings(u, gjson.Get(s, "timings"))
}

// cacheFromTimings completes u with the cached count of llama.cpp's
// timings object, where u has none.
func cacheFromTimings(u timing.Usage, timings gjson.Result) timing.Usage {
	if !u.CachedTokens.Set && timings.IsObject() {
		if c, ok := tokenCount(timings.Get("cache_n")); ok {
			u.CachedTokens = c
		}
	}
	return u
}

// tokenCount reads a token count: a whole number, not below zero.
func tokenCount(v gjson.Result) (timing.Count, bool) {
	if v.Type != gjson.Number || v.Num < 0 || v.Num != float64(int64(v.Num)) {
		return timing.Count{}, false
	}
	return timing.Count{Value: v.Int(), Set: true}, true
}

func isEmptyArray(raw string) bool {
	for i := 1; i < len(raw)-1; i++ {
		if !isSpace(raw[i]) {
			return false
		}
	}
	return len(raw) >= 2
}

// dataLine returns the value of the event's only data field, and where it
// starts in raw, with the one optional space after "data:" removed and the
// line ending trimmed; nil if the event has no data line or more than one.
func dataLine(raw []byte) (int, []byte) {
	var data []byte
	at, pos := 0, 0
	if bytes.HasPrefix(raw, utf8BOM) {
		// A stream may begin with a byte-order mark, which SSE parsers
		// strip (WHATWG): the first event's first line follows it.
		pos = len(utf8BOM)
	}
	for pos < len(raw) {
		line := raw[pos:]
		next := len(raw)
		if i := bytes.IndexByte(line, '\n'); i >= 0 {
			line, next = line[:i], pos+i+1
		}
		if i := bytes.IndexByte(line, '\r'); i >= 0 && i < len(line)-1 {
			line, next = line[:i], pos+i+1 // a lone CR ends the line
		}
		line = bytes.TrimSuffix(line, []byte{'\r'})
		if bytes.HasPrefix(line, dataField) {
			if data != nil {
				return 0, nil
			}
			at, data = pos+len(dataField), line[len(dataField):]
			if len(data) > 0 && data[0] == ' ' {
				at, data = at+1, data[1:]
			}
		}
		pos = next
	}
	return at, data
}
