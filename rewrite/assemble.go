package rewrite

import (
	"errors"
	"strconv"

	"github.com/tidwall/gjson"
)

// Assembly rebuilds the non-streaming response a client asked for from the
// events of the stream the sidecar asked the engine for instead (see
// --upgrade-non-streaming). It keeps raw JSON: string pieces are joined
// inside one pair of quotes, array pieces inside one pair of brackets, so
// escapes and numbers come out exactly as the engine wrote them, and a
// character split across events is whole again.
//
// Chat choices become {"index","message":{"role","content",
// ["reasoning_content"],["reasoning"],"tool_calls"},"logprobs",
// "finish_reason","stop_reason"} (vLLM's shape: tool_calls is [] when there
// are none, content is null when the message is only tool calls);
// completions choices {"index","text","logprobs","finish_reason",
// "stop_reason"}. Tool-call fragments without an index (some servers leave
// it out) start a new call when they carry an id and continue the last one
// otherwise. Fields the engine sends as null in a non-streaming body
// and not at all in a stream (vLLM: refusal, annotations, audio,
// function_call, prompt_logprobs, service_tier) are absent.
type Assembly struct {
	limit int // bytes the assembly may hold
	size  int

	id, object, created, model, fingerprint []byte // raw JSON values
	usage                                   []byte // the last usage object
	errorEvent                              []byte // an in-stream error event's data
	choices                                 []choiceAssembly
}

type choiceAssembly struct {
	seen    bool
	role    []byte // raw JSON string
	content joined // chat delta.content, or completions text
	// reasoning under each name the engine used: reasoning_content (vLLM
	// before 0.10), reasoning, or both, which newer vLLM keeps equal.
	reasoningContent, reasoning joined
	tools                       []toolAssembly
	logprobs                    joined    // chat: the elements of logprobs.content
	textLogprobs                [4]joined // completions: text_offset, token_logprobs, tokens, top_logprobs
	hasLogprobs                 bool
	finish, stop                []byte // raw; stop also when null, once a finish reason came
	hasStop                     bool
}

type toolAssembly struct {
	id, typ, name []byte // raw JSON strings, the first one sent
	args          joined
}

// joined is string contents or array elements gathered across events.
type joined struct {
	b   []byte
	set bool
}

// maxChoices bounds the choice index an event may name.
const maxChoices = 128

// Errors that end an assembly.
var (
	ErrAssemblyTooLarge = errors.New("the response is larger than the buffering limit")
	ErrNotAnEvent       = errors.New("an event is not a JSON object with a choices array")
)

// NewAssembly starts an assembly that holds at most limit bytes.
func NewAssembly(limit int) *Assembly { return &Assembly{limit: limit} }

// Add takes the data of one event (not [DONE]). An in-stream error is kept
// whole: see Error.
// Size is how much the assembly holds, in bytes of the events' data.
func (a *Assembly) Size() int { return a.size }

func (a *Assembly) Add(data []byte) error {
	// Not validated here: AppendBody validates what it builds, once, which
	// costs a fraction of checking every event.
	doc := gjson.Parse(view(data))
	if !doc.IsObject() {
		return ErrNotAnEvent
	}
	if e := doc.Get("error"); e.Exists() || doc.Get("object").Str == "error" {
		a.errorEvent = append(a.errorEvent[:0], data...)
		return nil
	}
	a.size += len(data)
	if a.size > a.limit {
		return ErrAssemblyTooLarge
	}
	var err error
	doc.ForEach(func(key, v gjson.Result) bool {
		switch key.Str {
		case "id":
			a.id = keepFirst(a.id, v)
		case "object":
			a.object = keepFirst(a.object, v)
		case "created":
			a.created = keepFirst(a.created, v)
		case "model":
			a.model = keepFirst(a.model, v)
		case "system_fingerprint":
			if v.Type != gjson.Null {
				a.fingerprint = append(a.fingerprint[:0], v.Raw...)
			}
		case "usage":
			if v.IsObject() {
				a.usage = append(a.usage[:0], v.Raw...)
			}
		case "choices":
			if !v.IsArray() {
				err = ErrNotAnEvent
				return false
			}
			v.ForEach(func(_, choice gjson.Result) bool {
				err = a.addChoice(choice)
				return err == nil
			})
		}
		return err == nil
	})
	return err
}

func keepFirst(dst []byte, v gjson.Result) []byte {
	if dst != nil || !v.Exists() {
		return dst
	}
	return append([]byte{}, v.Raw...)
}

func (a *Assembly) addChoice(choice gjson.Result) error {
	idx := choice.Get("index")
	if idx.Type != gjson.Number || idx.Num < 0 || idx.Num >= maxChoices || idx.Num != float64(int(idx.Num)) {
		return ErrNotAnEvent
	}
	i := int(idx.Num)
	for len(a.choices) <= i {
		a.choices = append(a.choices, choiceAssembly{})
	}
	c := &a.choices[i]
	c.seen = true
	choice.ForEach(func(key, v gjson.Result) bool {
		switch key.Str {
		case "delta":
			v.ForEach(func(k, dv gjson.Result) bool {
				switch k.Str {
				case "role":
					if dv.Type == gjson.String {
						c.role = append(c.role[:0], dv.Raw...)
					}
				case "content":
					c.content.addString(dv)
				case "reasoning_content":
					c.reasoningContent.addString(dv)
				case "reasoning":
					c.reasoning.addString(dv)
				case "tool_calls":
					dv.ForEach(func(_, t gjson.Result) bool {
						c.addToolCall(t)
						return true
					})
				}
				return true
			})
		case "text":
			c.content.addString(v)
		case "logprobs":
			if v.IsObject() {
				c.hasLogprobs = true
				c.logprobs.addElements(v.Get("content"))
				for j, name := range textLogprobKeys {
					c.textLogprobs[j].addElements(v.Get(name))
				}
			}
		case "finish_reason":
			if v.Type != gjson.Null {
				c.finish = append(c.finish[:0], v.Raw...)
			}
		case "stop_reason":
			c.stop, c.hasStop = append(c.stop[:0], v.Raw...), true
		}
		return true
	})
	return nil
}

var textLogprobKeys = [4]string{"text_offset", "token_logprobs", "tokens", "top_logprobs"}

func (c *choiceAssembly) addToolCall(t gjson.Result) {
	idx := t.Get("index")
	if idx.Exists() && (idx.Type != gjson.Number || idx.Num < 0 || idx.Num >= maxChoices) {
		return
	}
	var i int
	switch {
	case idx.Type == gjson.Number:
		i = int(idx.Num)
	case t.Get("id").Type == gjson.String:
		i = len(c.tools) // no index, an id: a new call (servers that leave index out)
	default:
		i = max(len(c.tools)-1, 0) // no index, no id: the call being sent
	}
	for len(c.tools) <= i {
		c.tools = append(c.tools, toolAssembly{})
	}
	tc := &c.tools[i]
	if v := t.Get("id"); v.Type == gjson.String && tc.id == nil {
		tc.id = append([]byte{}, v.Raw...)
	}
	if v := t.Get("type"); v.Type == gjson.String && tc.typ == nil {
		tc.typ = append([]byte{}, v.Raw...)
	}
	fn := t.Get("function")
	if v := fn.Get("name"); v.Type == gjson.String && tc.name == nil {
		tc.name = append([]byte{}, v.Raw...)
	}
	tc.args.addString(fn.Get("arguments"))
}

// addString joins the contents of a JSON string.
func (j *joined) addString(v gjson.Result) {
	if v.Type != gjson.String {
		return
	}
	j.set = true
	j.b = append(j.b, v.Raw[1:len(v.Raw)-1]...)
}

// addElements joins the elements of a JSON array.
func (j *joined) addElements(v gjson.Result) {
	if !v.IsArray() {
		return
	}
	j.set = true
	v.ForEach(func(_, e gjson.Result) bool {
		if len(j.b) > 0 {
			j.b = append(j.b, ',')
		}
		j.b = append(j.b, e.Raw...)
		return true
	})
}

// Finished tells whether every choice seen has its finish reason: a
// stream cut short without [DONE] would not.
func (a *Assembly) Finished() bool {
	seen := false
	for i := range a.choices {
		if c := &a.choices[i]; c.seen {
			if c.finish == nil {
				return false
			}
			seen = true
		}
	}
	return seen
}

// Error returns the data of an in-stream error event and the HTTP status
// the engine would have answered a non-streaming request with
// (ErrorStatus). ok is false when the stream carried no error.
func (a *Assembly) Error() (body []byte, status int, ok bool) {
	if a.errorEvent == nil {
		return nil, 0, false
	}
	return a.errorEvent, ErrorStatus(a.errorEvent), true
}

// ErrorStatus is the HTTP status an in-stream error event's data stands
// for: its code (error.code, or code) when that is an HTTP error status,
// else 500.
func ErrorStatus(data []byte) int {
	doc := gjson.ParseBytes(data)
	code := doc.Get("error.code")
	if !code.Exists() {
		code = doc.Get("code")
	}
	if code.Type == gjson.Number && code.Num >= 400 && code.Num < 600 && code.Num == float64(int(code.Num)) {
		return int(code.Num)
	}
	return 500
}

// AppendBody appends the non-streaming response. chat selects the chat
// shape; otherwise completions. On false, when the events held something
// that is not JSON (or nested deeper than maxDepth), dst is returned
// unchanged.
func (a *Assembly) AppendBody(dst []byte, chat bool) ([]byte, bool) {
	n := len(dst)
	dst = a.appendBody(dst, chat)
	if !valid(view(dst[n:])) {
		return dst[:n], false
	}
	return dst, true
}

func (a *Assembly) appendBody(dst []byte, chat bool) []byte {
	dst = append(dst, `{"id":`...)
	dst = appendRawOr(dst, a.id, `""`)
	if chat {
		dst = append(dst, `,"object":"chat.completion"`...)
	} else {
		dst = append(dst, `,"object":"text_completion"`...)
	}
	dst = append(dst, `,"created":`...)
	dst = appendRawOr(dst, a.created, "0")
	dst = append(dst, `,"model":`...)
	dst = appendRawOr(dst, a.model, `""`)
	dst = append(dst, `,"choices":[`...)
	first := true
	for i := range a.choices {
		c := &a.choices[i]
		if !c.seen {
			continue
		}
		if !first {
			dst = append(dst, ',')
		}
		first = false
		dst = append(dst, `{"index":`...)
		dst = strconv.AppendInt(dst, int64(i), 10)
		if chat {
			dst = c.appendMessage(dst)
		} else {
			dst = append(dst, `,"text":"`...)
			dst = append(dst, c.content.b...)
			dst = append(dst, '"')
		}
		dst = append(dst, `,"logprobs":`...)
		dst = c.appendLogprobs(dst, chat)
		dst = append(dst, `,"finish_reason":`...)
		dst = appendRawOr(dst, c.finish, "null")
		if c.hasStop {
			dst = append(dst, `,"stop_reason":`...)
			dst = append(dst, c.stop...)
		}
		dst = append(dst, '}')
	}
	dst = append(dst, ']')
	if a.fingerprint != nil {
		dst = append(dst, `,"system_fingerprint":`...)
		dst = append(dst, a.fingerprint...)
	}
	dst = append(dst, `,"usage":`...)
	dst = appendRawOr(dst, a.usage, "null")
	return append(dst, '}')
}

func (c *choiceAssembly) appendMessage(dst []byte) []byte {
	dst = append(dst, `,"message":{"role":`...)
	dst = appendRawOr(dst, c.role, `"assistant"`)
	dst = append(dst, `,"content":`...)
	// vLLM's content is null, not "", when the message is only tool calls
	// or only reasoning (its parsers return content or None); the role
	// event's "" does not make it text.
	onlyOther := len(c.tools) > 0 || c.reasoningContent.set || c.reasoning.set
	if len(c.content.b) == 0 && (onlyOther || !c.content.set) {
		dst = append(dst, "null"...)
	} else {
		dst = append(dst, '"')
		dst = append(dst, c.content.b...)
		dst = append(dst, '"')
	}
	for _, r := range [...]struct {
		key string
		j   *joined
	}{{"reasoning_content", &c.reasoningContent}, {"reasoning", &c.reasoning}} {
		if r.j.set {
			dst = append(dst, `,"`...)
			dst = append(dst, r.key...)
			dst = append(dst, `":"`...)
			dst = append(dst, r.j.b...)
			dst = append(dst, '"')
		}
	}
	dst = append(dst, `,"tool_calls":[`...)
	for i := range c.tools {
		t := &c.tools[i]
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = append(dst, `{"id":`...)
		dst = appendRawOr(dst, t.id, `""`)
		dst = append(dst, `,"type":`...)
		dst = appendRawOr(dst, t.typ, `"function"`)
		dst = append(dst, `,"function":{"name":`...)
		dst = appendRawOr(dst, t.name, `""`)
		dst = append(dst, `,"arguments":"`...)
		dst = append(dst, t.args.b...)
		dst = append(dst, `"}}`...)
	}
	return append(dst, "]}"...)
}

func (c *choiceAssembly) appendLogprobs(dst []byte, chat bool) []byte {
	if !c.hasLogprobs {
		return append(dst, "null"...)
	}
	if chat {
		dst = append(dst, `{"content":[`...)
		dst = append(dst, c.logprobs.b...)
		return append(dst, "]}"...)
	}
	dst = append(dst, '{')
	for j, name := range textLogprobKeys {
		if j > 0 {
			dst = append(dst, ',')
		}
		dst = append(dst, '"')
		dst = append(dst, name...)
		dst = append(dst, `":[`...)
		dst = append(dst, c.textLogprobs[j].b...)
		dst = append(dst, ']')
	}
	return append(dst, '}')
}

func appendRawOr(dst, raw []byte, otherwise string) []byte {
	if raw == nil {
		return append(dst, otherwise...)
	}
	return append(dst, raw...)
}
