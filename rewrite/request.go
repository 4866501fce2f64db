package rewrite

import (
	"strings"

	"github.com/tidwall/gjson"
	"github.com/tidwall/sjson"
)

// Request is what the sidecar reads of a chat or completions request body.
type Request struct {
	// Understood is false when the body is not a JSON object or a field the
	// sidecar reads has an unexpected type. Such a request is forwarded
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

	// includeMetrics is where the include_metrics members lie: the first
	// key's opening quote to its value's end, and how many there are.
	includeMetricsAt, includeMetricsEnd, includeMetricsCount int
}

// InspectRequest reads the top-level fields the sidecar needs in one pass.
// Where a key repeats, the last one counts, as in the engine's JSON parser.
func InspectRequest(body []byte) Request {
	s := view(body)
	if !gjson.Valid(s) {
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
			if r.includeMetricsCount++; r.includeMetricsCount == 1 {
				r.includeMetricsAt, r.includeMetricsEnd = key.Index, value.Index+len(value.Raw)
			}
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
			r.IncludeUsage, r.ContinuousUsage = false, false
			switch {
			case value.IsObject():
				// vLLM's default is true once stream_options is there:
				// only an explicit false or null turns usage off.
				iu := value.Get("include_usage")
				r.IncludeUsage = !iu.Exists() || (iu.Type != gjson.False && iu.Type != gjson.Null)
				r.ContinuousUsage = value.Get("continuous_usage_stats").Type == gjson.True
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

// UpgradedBody returns the body to send upstream for a request the sidecar
// upgrades to a stream: include_metrics removed, "stream": true and
// "stream_options": {"include_usage": true}. r must be Upgradable.
func UpgradedBody(body []byte, r Request) ([]byte, error) {
	out, err := UpstreamBody(nil, body, r, false)
	if err != nil {
		return body, err
	}
	if out, err = sjson.SetRawBytesOptions(out, "stream", []byte("true"), sjsonOptions); err != nil {
		return body, err
	}
	if out, err = sjson.SetRawBytesOptions(out, "stream_options", []byte(`{"include_usage":true}`), sjsonOptions); err != nil {
		return body, err
	}
	return out, nil
}

// UpstreamBody returns the body to send upstream, appended to dst when it
// differs from body. It removes the sidecar's "include_metrics" field
// (strict OpenAI-compatible servers reject unknown fields) and, with
// askUsage, for a stream that did not ask for usage, sets
// stream_options.include_usage so the engine reports exact token counts.
// The client's other stream_options are kept. body is not modified.
func UpstreamBody(dst, body []byte, r Request, askUsage bool) ([]byte, error) {
	var err error
	out := body
	if r.HasIncludeMetrics {
		if r.includeMetricsCount == 1 {
			// The common case: cut the member out, no second parse.
			out = appendWithoutMember(dst, body, r.includeMetricsAt, r.includeMetricsEnd)
		} else {
			out = appendWithoutKey(dst, body, "include_metrics")
		}
	}
	if askUsage && r.Stream && !r.IncludeUsage {
		if gjson.GetBytes(out, "stream_options").Type == gjson.Null {
			out, err = sjson.SetRawBytesOptions(out, "stream_options", []byte(`{"include_usage":true}`), sjsonOptions)
		} else {
			out, err = sjson.SetRawBytesOptions(out, "stream_options.include_usage", []byte("true"), sjsonOptions)
		}
		if err != nil {
			return body, err
		}
	}
	return out, nil
}

// appendWithoutKey appends to dst the valid JSON object obj without any of
// its top-level members named key, in one pass however often key repeats.
func appendWithoutKey(dst, obj []byte, key string) []byte {
	dst = append(dst, '{')
	first := true
	gjson.ParseBytes(obj).ForEach(func(k, v gjson.Result) bool {
		if k.Str == key {
			return true
		}
		if !first {
			dst = append(dst, ',')
		}
		first = false
		dst = append(dst, obj[k.Index:v.Index+len(v.Raw)]...)
		return true
	})
	return append(dst, '}')
}

// appendWithoutMember appends to dst the valid JSON object obj without the
// member from at (its key's opening quote) to end (past its value), taking
// the comma before it, or for the first member the comma after it.
func appendWithoutMember(dst, obj []byte, at, end int) []byte {
	if i := lastNonSpace(obj[:at]); obj[i] == ',' {
		at = i
	} else if j := end + firstNonSpace(obj[end:]); obj[j] == ',' {
		end = j + 1
	}
	dst = append(dst, obj[:at]...)
	return append(dst, obj[end:]...)
}
