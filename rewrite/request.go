package rewrite

import (
	"errors"
	"strings"

	"github.com/tidwall/gjson"
	"github.com/tidwall/sjson"
)

// Request is what the sidecar reads of a chat or completions request body.
type Request struct {
	// Understood is false when the body is not a JSON object, is nested
	// deeper than maxDepth, or a field the sidecar reads has an unexpected
	// type. Such a request is forwarded
	// unchanged and measured without metrics: the upstream answers it as it
	// would without the sidecar.
	Understood bool
	// InvalidIncludeMetrics says "include_metrics" is there but neither a
	// boolean nor null; the request is then not Understood.
	InvalidIncludeMetrics bool
	// HasIncludeMetrics says the body has a boolean "include_metrics" field,
	// the sidecar's (and vLLM's) opt-in; IncludeMetrics is its value.
	HasIncludeMetrics bool
	IncludeMetrics    bool
	// Stream is "stream": true.
	Stream bool
	// IncludeUsage says the engine will send the usage event: a
	// "stream_options" object whose include_usage is not false or null
	// (vLLM defaults it to true).
	IncludeUsage bool
	// ContinuousUsage is "stream_options": {"continuous_usage_stats": true}
	// (vLLM's running usage on every event).
	ContinuousUsage bool
	// Model is the "model" field when it is a string.
	Model string
	// MultipleChoices is n > 1 or several prompts in one completions
	// request: one metrics object cannot describe them, so it is null.
	MultipleChoices bool
	// Upgradable says a non-streaming request may be sent to the engine as
	// a stream and its response reassembled exactly: one choice, and only
	// fields whose effect a stream reproduces (see upgradableField).
	Upgradable bool

	// Where the members UpstreamBody edits lie, so that the common case,
	// each key once, is edited by offsets without a second parse; and how
	// often "stream" comes, for UpgradedBody.
	includeMetrics, streamOptions, stream members
}

// members is where the copies of one top-level key lie in a request body:
// how many there are, and for the last one, where its key (its opening
// quote) and its value start and where the value ends.
type members struct{ count, key, value, end int }

func (m *members) add(key, value gjson.Result) {
	m.count++
	m.key, m.value, m.end = key.Index, value.Index, value.Index+len(value.Raw)
}

// InspectRequest reads the top-level fields the sidecar needs in one pass.
// Where a key repeats, the last one counts, as in the engine's JSON parser.
// A body nested deeper than maxDepth is not Understood (see maxDepth).
func InspectRequest(body []byte) Request {
	s := view(body)
	if !valid(s) {
		return Request{}
	}
	doc := gjson.Parse(s)
	if !doc.IsObject() {
		return Request{}
	}
	r := Request{Understood: true, Upgradable: true}
	doc.ForEach(func(key, value gjson.Result) bool {
		if !upgradableField(key.Str, value) {
			r.Upgradable = false
		}
		switch key.Str {
		case "include_metrics":
			r.includeMetrics.add(key, value)
			// The last one counts, as in the engine's parser: a bad value
			// followed by a good one is fine.
			r.HasIncludeMetrics, r.IncludeMetrics, r.InvalidIncludeMetrics = false, false, false
			switch {
			case value.IsBool():
				r.HasIncludeMetrics, r.IncludeMetrics = true, value.Bool()
			case value.Type != gjson.Null:
				r.InvalidIncludeMetrics = true
			}
		case "stream":
			r.stream.add(key, value)
			r.Stream = value.Type == gjson.True
			if !value.IsBool() && value.Type != gjson.Null {
				r.Understood = false
			}
		case "model":
			r.Model = ""
			if value.Type == gjson.String {
				// A copy: the body's memory is reused after the request.
				r.Model = strings.Clone(value.Str)
			}
		case "stream_options":
			r.streamOptions.add(key, value)
			r.IncludeUsage, r.ContinuousUsage = false, false
			switch {
			case value.IsObject():
				// vLLM's default is true once stream_options is there:
				// only an explicit false or null turns usage off. The
				// last copy of a key counts here too.
				r.IncludeUsage = true
				value.ForEach(func(k, v gjson.Result) bool {
					switch k.Str {
					case "include_usage":
						r.IncludeUsage = v.Type != gjson.False && v.Type != gjson.Null
					case "continuous_usage_stats":
						r.ContinuousUsage = v.Type == gjson.True
					}
					return true
				})
			case value.Type != gjson.Null:
				r.Understood = false
			}
		case "n":
			switch value.Type {
			case gjson.Number:
				r.MultipleChoices = r.MultipleChoices || value.Int() > 1
			case gjson.Null:
			default:
				r.Understood = false
			}
		case "prompt":
			r.MultipleChoices = r.MultipleChoices || multiplePrompts(value)
		}
		return r.Understood
	})
	if r.InvalidIncludeMetrics {
		r.Understood = false
	}
	if !r.Understood {
		return Request{InvalidIncludeMetrics: r.InvalidIncludeMetrics}
	}
	r.Upgradable = r.Upgradable && !r.Stream && !r.MultipleChoices
	return r
}

// upgradableField tells whether a request field's effect is the same in a
// streamed response reassembled as in a non-streaming one. Fields that only
// shape what is generated (sampling, penalties, stops, tools, formats,
// templates) are; fields that add to a non-streaming response what a stream
// does not carry (prompt_logprobs, echo, best_of > 1, kv_transfer_params)
// are not, and neither is a field the sidecar does not know.
func upgradableField(key string, v gjson.Result) bool {
	switch key {
	case "model", "messages", "prompt", "suffix", "max_tokens", "max_completion_tokens",
		"temperature", "top_p", "top_k", "min_p", "frequency_penalty", "presence_penalty",
		"repetition_penalty", "length_penalty", "stop", "stop_token_ids", "seed", "logprobs",
		"top_logprobs", "logit_bias", "user", "n", "include_metrics", "tools", "tool_choice",
		"parallel_tool_calls", "response_format", "structured_outputs", "guided_json",
		"guided_regex", "guided_choice", "guided_grammar", "guided_decoding_backend",
		"ignore_eos", "min_tokens", "skip_special_tokens", "spaces_between_special_tokens",
		"include_stop_str_in_output", "chat_template", "chat_template_kwargs",
		"add_generation_prompt", "continue_final_message", "add_special_tokens", "documents",
		"mm_processor_kwargs", "priority", "request_id", "reasoning_effort", "metadata",
		"truncate_prompt_tokens", "bad_words", "allowed_token_ids", "return_tokens_as_token_ids",
		"cache_salt":
		return true
	case "stream", "echo":
		return v.Type == gjson.False || v.Type == gjson.Null
	case "stream_options", "prompt_logprobs":
		return v.Type == gjson.Null
	case "best_of":
		return v.Type == gjson.Null || (v.Type == gjson.Number && v.Num <= 1)
	}
	return false
}

// multiplePrompts tells whether a completions prompt holds several prompts:
// an array of strings or of token arrays with more than one element. An
// array of numbers is one tokenised prompt.
func multiplePrompts(p gjson.Result) bool {
	if !p.IsArray() {
		return false
	}
	n, several := 0, false
	p.ForEach(func(_, v gjson.Result) bool {
		n++
		several = n > 1 && (v.Type == gjson.String || v.IsArray())
		return !several
	})
	return several
}

// errNotUnderstood refuses to edit a body InspectRequest did not
// understand: the offsets and fields the edit relies on are not there.
var errNotUnderstood = errors.New("the request body was not understood")

// UpgradedBody returns the body to send upstream for a request the sidecar
// upgrades to a stream: include_metrics removed (unless r says there is
// none to remove), "stream": true and "stream_options":
// {"include_usage": true}. Every copy of those keys goes and the new
// members end the object, where a parser that takes the last copy reads
// them. r must be InspectRequest(body), Upgradable.
func UpgradedBody(body []byte, r Request) ([]byte, error) {
	if !r.Understood {
		return body, errNotUnderstood
	}
	cutMetrics := r.HasIncludeMetrics && r.includeMetrics.count > 0
	if r.stream.count > 1 || r.streamOptions.count > 1 || cutMetrics && r.includeMetrics.count > 1 {
		// A key repeated: sjson reaches only its first copy, and the
		// engine reads the last. One pass cuts every copy and ends the
		// object with the sidecar's own.
		e := newObjectEdit(nil, body)
		e.cutKeys(func(key string) bool {
			return key == "stream" || key == "stream_options" || key == "include_metrics" && r.HasIncludeMetrics
		})
		e.toEnd()
		e.dst = append(e.dst, `"stream":true,"stream_options":{"include_usage":true}`...)
		return e.done(), nil
	}
	// Each key at most once: sjson's edits, into a new body (the client's
	// stays as it came). Once per upgraded request, off the per-event path.
	out := body
	var err error
	if cutMetrics {
		if out, err = sjson.DeleteBytes(out, "include_metrics"); err != nil {
			return body, err
		}
	}
	if out, err = sjson.SetRawBytesOptions(out, "stream", []byte("true"), &editOptions); err != nil {
		return body, err
	}
	if out, err = sjson.SetRawBytesOptions(out, "stream_options", []byte(`{"include_usage":true}`), &editOptions); err != nil {
		return body, err
	}
	return out, nil
}

// editOptions are the options of the sidecar's sjson edits. Optimistic
// stays off: it only pays when the key exists, and these keys are usually
// absent. ReplaceInPlace stays off: it writes into the input, which is the
// client's body, and with some string values silently sets nothing.
var editOptions = sjson.Options{}

// UpstreamBody returns the body to send upstream, appended to dst when it
// differs from body. It removes the sidecar's "include_metrics" field
// (strict OpenAI-compatible servers reject unknown fields) and, with
// askUsage, for a stream that did not ask for usage, sets
// stream_options.include_usage so the engine reports exact token counts.
// The client's other stream_options are kept; the edited stream_options
// ends the object and is the only copy, so that a parser that takes the
// last copy of a key reads it. r must be InspectRequest(body). body is not
// modified.
func UpstreamBody(dst, body []byte, r Request, askUsage bool) ([]byte, error) {
	cutMetrics := r.HasIncludeMetrics
	setUsage := askUsage && r.Stream && !r.IncludeUsage
	if !cutMetrics && !setUsage {
		return body, nil
	}
	if !r.Understood {
		return body, errNotUnderstood
	}
	e := newObjectEdit(dst, body)
	if cutMetrics && r.includeMetrics.count > 1 || setUsage && r.streamOptions.count > 1 {
		// Repeated keys: one pass, however many copies.
		e.cutKeys(func(key string) bool {
			return cutMetrics && key == "include_metrics" || setUsage && key == "stream_options"
		})
	} else {
		// The common case: each key at most once, cut where InspectRequest
		// found it, without a second parse. Cuts go in order; a key not
		// there (or not cut) has count 0 and sorts first.
		var a, b members
		if cutMetrics {
			a = r.includeMetrics
		}
		if setUsage {
			b = r.streamOptions
		}
		if b.key < a.key {
			a, b = b, a
		}
		for _, m := range [2]members{a, b} {
			if m.count > 0 {
				e.cut(m.key, m.end)
			}
		}
	}
	if setUsage {
		e.toEnd()
		e.dst = append(e.dst, `"stream_options":`...)
		e.dst = appendWithUsage(e.dst, body[r.streamOptions.value:r.streamOptions.end])
	}
	return e.done(), nil
}

// appendWithUsage appends the client's stream_options (a JSON object, null,
// or empty when absent) with include_usage true as its only include_usage.
func appendWithUsage(dst, opts []byte) []byte {
	if len(opts) == 0 || opts[0] != '{' {
		return append(dst, `{"include_usage":true}`...)
	}
	e := newObjectEdit(dst, opts)
	e.cutKeys(func(key string) bool { return key == "include_usage" })
	e.toEnd()
	e.dst = append(e.dst, `"include_usage":true`...)
	return e.done()
}
