package rewrite

import (
	"errors"
	"strings"

	"github.com/tidwall/gjson"
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
	// Repeated says a top-level member the sidecar reads or edits comes
	// more than once. Which copy an engine reads depends on its parser,
	// so the request is not Understood: forwarded unread and unchanged.
	Repeated bool
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
	// BehindSidecar says another timing-sidecar measured the request
	// on its way here and gives the client its metrics: no mode adds
	// them here unasked (the caller reads it from the request's headers).
	BehindSidecar bool
	// NoEngineMetrics says vLLM's --enable-per-request-metrics gives the
	// request's API no metrics object (Anthropic's Messages): ModeVLLM
	// leaves its answers without one.
	NoEngineMetrics bool
	// Untouched says the request's API never has its bodies edited nor
	// its responses given a metrics object (embeddings, rerank and the
	// other pooling endpoints): measured and counted, passed through as
	// they are.
	Untouched bool
	// Upgradable says a non-streaming request may be sent to the engine as
	// a stream and its response reassembled exactly: one choice, and only
	// fields whose effect a stream reproduces (see upgradableField).
	Upgradable bool
	// Leg is the part of a disaggregated request the body is, as the
	// router that split it marked it.
	Leg Leg
	// Bootstrapped says SGLang's router split the request: it sends the
	// same body, with bootstrap_host and bootstrap_room, to a prefill and
	// a decode server, so which leg it is depends on the server.
	Bootstrapped bool

	// Where the members UpstreamBody edits lie, so that the common case,
	// each key once, is edited by offsets without a second parse; and how
	// often "stream" comes, for UpgradedBody.
	includeMetrics, streamOptions, stream members
}

// members is where the copies of one top-level key lie in a request body:
// how many there are, and for the last one, where its key (its opening
// quote) and its value start and where the value ends.
type members struct{ count, key, value, end int }

func (m *members) add(keyAt int, raw string, at int) {
	m.count++
	m.key, m.value, m.end = keyAt, at, at+len(raw)
}

// InspectRequest reads the top-level fields the sidecar needs in one pass.
// Where a key repeats, the last one counts, as in the engine's JSON parser.
// A body nested deeper than maxDepth is not Understood (see maxDepth). It
// copies nothing of the body but a bounded prefix of "model", whatever its
// size. It reads every member an OpenAI request may have; an API that
// lacks some leaves them out (see API.InspectRequest).
func InspectRequest(body []byte) Request {
	s := view(body)
	if !valid(s) {
		return Request{}
	}
	if i := firstNonSpace(body); body[i] != '{' {
		return Request{}
	}
	in := inspection{r: Request{Understood: true, Upgradable: true}}
	eachMember(s, in.member)
	return in.result()
}

// inspection is InspectRequest's reading of one body, member by member.
type inspection struct {
	r                            Request
	seenModel, seenN, seenPrompt bool
}

// member reads one top-level member; false stops the reading, at a member
// that makes the request not Understood.
func (in *inspection) member(key string, keyAt int, raw string, at int) bool {
	r := &in.r
	value := shallow(raw)
	if !upgradableField(key, value) {
		r.Upgradable = false
	}
	switch key {
	case "include_metrics":
		r.includeMetrics.add(keyAt, raw, at)
		r.readIncludeMetrics(raw)
	case "stream":
		r.stream.add(keyAt, raw, at)
		var ok bool
		if r.Stream, ok = optionalBool(raw); !ok {
			r.Understood = false // the engine refuses it: its answer, untouched
		}
	case "model":
		r.Repeated = r.Repeated || in.seenModel
		in.seenModel = true
		r.Model = ""
		if value.Type == gjson.String {
			r.Model = stringPrefix(raw, MaxModelBytes)
		}
	case "stream_options":
		r.streamOptions.add(keyAt, raw, at)
		r.readStreamOptions(raw)
	case "n":
		r.Repeated = r.Repeated || in.seenN
		in.seenN = true
		r.readN(raw, value)
	case "prompt":
		r.Repeated = r.Repeated || in.seenPrompt
		in.seenPrompt = true
		r.MultipleChoices = r.MultipleChoices || multiplePrompts(raw)
	case "kv_transfer_params":
		r.Leg = legOf(value)
	case "bootstrap_room", "bootstrap_host":
		r.Bootstrapped = r.Bootstrapped || value.Type != gjson.Null
	case "sampling_params":
		// vLLM's generate API carries them in its sampling parameters.
		if r.Leg == LegWhole {
			r.Leg = legOf(gjson.Get(raw, "extra_args.kv_transfer_params"))
		}
	}
	return r.Understood
}

// Leg is the part of a disaggregated request a body is.
type Leg uint8

const (
	// LegWhole is a request served by one engine, or a client's request
	// before a router splits it.
	LegWhole Leg = iota
	// LegPrefill is what a router sends the prefill engine: the prompt, to
	// compute its KV cache and one token (vLLM's kv_transfer_params with
	// do_remote_decode).
	LegPrefill
	// LegDecode is what it then sends the decode engine, which pulls that
	// KV cache before its first token (do_remote_prefill).
	LegDecode
)

// String is the leg as the log, the span and the series say it.
func (l Leg) String() string {
	switch l {
	case LegPrefill:
		return "prefill"
	case LegDecode:
		return "decode"
	}
	return "whole"
}

// LegNamed is the leg String names, LegWhole for any other name.
func LegNamed(s string) Leg {
	switch s {
	case "prefill":
		return LegPrefill
	case "decode":
		return LegDecode
	}
	return LegWhole
}

// legOf reads vLLM's kv_transfer_params: do_remote_prefill marks the
// decode leg (its KV is computed elsewhere), do_remote_decode the prefill
// leg (its decode happens elsewhere).
func legOf(params gjson.Result) Leg {
	if !params.IsObject() {
		return LegWhole
	}
	flags := gjson.GetMany(params.Raw, "do_remote_prefill", "do_remote_decode")
	switch {
	case flags[0].Type == gjson.True:
		return LegDecode
	case flags[1].Type == gjson.True:
		return LegPrefill
	}
	return LegWhole
}

// result is the request as read: a repeated member or one not understood
// leaves nothing the sidecar may act on.
func (in *inspection) result() Request {
	r := in.r
	r.Repeated = r.Repeated || r.includeMetrics.count > 1 || r.stream.count > 1 || r.streamOptions.count > 1
	if r.Repeated {
		return Request{Repeated: true}
	}
	if r.InvalidIncludeMetrics {
		r.Understood = false
	}
	if !r.Understood {
		return Request{InvalidIncludeMetrics: r.InvalidIncludeMetrics}
	}
	r.Upgradable = r.Upgradable && !r.Stream && !r.MultipleChoices
	return r
}

// readIncludeMetrics reads include_metrics as the engine reads it
// (laxBool; null is no opt-in). A value the engine would refuse is the
// sidecar's to refuse, as it removes the field before forwarding.
func (r *Request) readIncludeMetrics(raw string) {
	r.HasIncludeMetrics, r.IncludeMetrics, r.InvalidIncludeMetrics = false, false, false
	if raw[0] == 'n' {
		return
	}
	v, ok := laxBool(raw)
	r.HasIncludeMetrics, r.IncludeMetrics, r.InvalidIncludeMetrics = ok, v, !ok
}

// readStreamOptions reads stream_options as vLLM's StreamOptions model:
// include_usage defaults to true once stream_options is there, and only a
// value read as false, or null, turns usage off; continuous_usage_stats
// defaults to false. Where a key repeats the last copy counts, as in
// Python's json, so each is read once the object is through. A value the
// engine refuses, or stream_options neither an object nor null, leaves
// the request not Understood.
func (r *Request) readStreamOptions(raw string) {
	r.IncludeUsage, r.ContinuousUsage = false, false
	switch raw[0] {
	case 'n':
		return
	case '{':
	default:
		r.Understood = false
		return
	}
	usage, continuous := "true", "false"
	eachMember(raw, func(k string, _ int, v string, _ int) bool {
		switch k {
		case "include_usage":
			usage = v
		case "continuous_usage_stats":
			continuous = v
		}
		return true
	})
	var ok1, ok2 bool
	r.IncludeUsage, ok1 = optionalBool(usage)
	r.ContinuousUsage, ok2 = optionalBool(continuous)
	r.Understood = r.Understood && ok1 && ok2
}

// readN reads n: a number above 1 asks for several choices.
func (r *Request) readN(raw string, value gjson.Result) {
	switch value.Type {
	case gjson.Number:
		r.MultipleChoices = r.MultipleChoices || gjson.Parse(raw).Int() > 1
	case gjson.Null:
	default:
		r.Understood = false
	}
}

// shallow is the gjson result of a raw value without reading into it:
// its type, and a number's value; a string's text and a container's
// members are not parsed, so that a value of megabytes costs nothing.
func shallow(raw string) gjson.Result {
	switch raw[0] {
	case '"':
		return gjson.Result{Type: gjson.String, Raw: raw}
	case '{', '[':
		return gjson.Result{Type: gjson.JSON, Raw: raw}
	}
	return gjson.Parse(raw)
}

// stringPrefix is the text of the raw JSON string, cut to at most limit
// bytes of its escaped form before unescaping: a copy of no more than
// limit however long the string. The cut falls between escapes.
func stringPrefix(raw string, limit int) string {
	if len(raw) <= limit+2 {
		// A copy: raw is the body's memory, which is reused.
		return strings.Clone(gjson.Parse(raw).Str)
	}
	i := 1
	for {
		step := 1
		if raw[i] == '\\' {
			step = 2
			if raw[i+1] == 'u' {
				step = 6
			}
		}
		if i+step > 1+limit {
			break
		}
		i += step
	}
	return gjson.Parse(raw[:i] + `"`).Str
}

// MaxModelBytes is as much of "model" as Request keeps: telemetry's cut
// of every recorded string (256 bytes) and room for a character cut there.
const MaxModelBytes = 256 + 4

// upgradableField tells whether a request field's effect is the same in a
// streamed response reassembled as in a non-streaming one. Fields that only
// shape what is generated (sampling, penalties, stops, tools, formats,
// templates) are; fields that add to a non-streaming response what a stream
// does not carry (prompt_logprobs, echo, best_of > 1, kv_transfer_params)
// are not, and neither is a field the sidecar does not know.
func upgradableField(key string, v gjson.Result) bool {
	if generationFields[key] {
		return true
	}
	switch key {
	case "stream", "echo":
		on, ok := optionalBool(v.Raw)
		return ok && !on
	case "stream_options", "prompt_logprobs":
		return v.Type == gjson.Null
	case "best_of":
		return v.Type == gjson.Null || (v.Type == gjson.Number && v.Num <= 1)
	}
	return false
}

// generationFields are the request fields that only shape what is
// generated, or that the sidecar reads itself: a stream reassembled
// answers them as a non-streaming response does.
var generationFields = keySet(
	"model", "messages", "prompt", "suffix", "max_tokens", "max_completion_tokens",
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
	"cache_salt")

// keySet is a set of the keys given.
func keySet(keys ...string) map[string]bool {
	m := make(map[string]bool, len(keys))
	for _, k := range keys {
		m[k] = true
	}
	return m
}

// multiplePrompts tells whether a completions prompt holds several prompts:
// an array of strings or of token arrays with more than one element. An
// array of numbers is one tokenised prompt.
func multiplePrompts(raw string) bool {
	if raw[0] != '[' {
		return false
	}
	n, several := 0, false
	eachMember(raw, func(_ string, _ int, v string, _ int) bool {
		n++
		several = n > 1 && (v[0] == '"' || v[0] == '[')
		return !several
	})
	return several
}

// errNotUnderstood refuses to edit a body InspectRequest did not
// understand: the offsets and fields the edit relies on are not there.
var errNotUnderstood = errors.New("the request body was not understood")

// UpgradedBody sets e to the body to send upstream for a request the
// sidecar upgrades to a stream: include_metrics removed (unless r says
// there is none to remove), "stream": true and "stream_options":
// {"include_usage": true}. Every copy of those keys goes and the new
// members end the object, where a parser that takes the last copy reads
// them. r must be InspectRequest(body), Upgradable. On error e is the body
// as it came.
func UpgradedBody(e *Edit, body []byte, r Request) error {
	e.Reset(body)
	if !r.Understood {
		return errNotUnderstood
	}
	cutMetrics := r.HasIncludeMetrics && r.includeMetrics.count > 0
	ed := newBodyEdit(e)
	var metrics members
	if cutMetrics {
		metrics = r.includeMetrics
	}
	cutMembers(&ed, metrics, r.stream, r.streamOptions)
	ed.toEnd()
	ed.add(upgradeMembers)
	ed.done()
	return nil
}

var upgradeMembers = []byte(`"stream":true,"stream_options":{"include_usage":true}`)

// cutMembers cuts the members ms, each the one copy of a key InspectRequest
// found (a request that repeats one is not edited), by their offsets,
// without a second parse. A member with count 0 is not there.
func cutMembers(e *objectEdit, ms ...members) {
	// In the order they lie (at most three: an insertion sort).
	for i := 1; i < len(ms); i++ {
		for j := i; j > 0 && ms[j].key < ms[j-1].key; j-- {
			ms[j], ms[j-1] = ms[j-1], ms[j]
		}
	}
	for _, m := range ms {
		if m.count > 0 {
			e.cut(m.key, m.end)
		}
	}
}

// UpstreamBody sets e to the body to send upstream. It removes the
// sidecar's "include_metrics" field (strict OpenAI-compatible servers
// reject unknown fields) and, with askUsage, for a stream that did not ask
// for usage, sets stream_options.include_usage so the engine reports exact
// token counts. The client's other stream_options are kept; the edited
// stream_options ends the object and is the only copy, so that a parser
// that takes the last copy of a key reads it. r must be
// InspectRequest(body). body is not modified, and not copied: e refers to
// it. On error e is the body as it came.
func UpstreamBody(e *Edit, body []byte, r Request, askUsage bool) error {
	e.Reset(body)
	cutMetrics := r.HasIncludeMetrics
	setUsage := askUsage && r.Stream && !r.IncludeUsage
	if !cutMetrics && !setUsage {
		return nil
	}
	if !r.Understood {
		return errNotUnderstood
	}
	ed := newBodyEdit(e)
	var metrics, options members
	if cutMetrics {
		metrics = r.includeMetrics
	}
	if setUsage {
		options = r.streamOptions
	}
	cutMembers(&ed, metrics, options)
	if setUsage {
		// The edited stream_options ends the object: the client's own
		// (a JSON object), referred to where it lies, with include_usage
		// true as its only include_usage; or, for none or null, the
		// sidecar's.
		ed.toEnd()
		e.add(streamOptionsKey)
		if v, end := r.streamOptions.value, r.streamOptions.end; end > v && body[v] == '{' {
			opts := newMemberEdit(e, v, end)
			opts.cutKeys(func(key string) bool { return key == "include_usage" }) // every copy: the sidecar's is the one
			opts.toEnd()
			opts.add(includeUsage)
			opts.done()
		} else {
			e.add(usageOptions)
		}
	}
	ed.done()
	return nil
}

var (
	streamOptionsKey = []byte(`"stream_options":`)
	includeUsage     = []byte(`"include_usage":true`)
	usageOptions     = []byte(`{"include_usage":true}`)
)
