package rewrite

import (
	"bytes"
	"strings"

	"github.com/tidwall/gjson"
)

// What a trace records of a request and its response beyond the timing:
// the sampling settings the client asked for, and the id, model and finish
// reasons the engine answered with. Only ever read when tracing is on (and
// the answer's model, for the GenAI metrics, when they are); nothing here
// reads text a client or the model wrote.

// Sampling is the generation settings of a request, as GenAI spans name
// them (gen_ai.request.*). A zero Has* means the field was not sent.
type Sampling struct {
	MaxTokens                             int64
	Temperature, TopP                     float64
	HasMaxTokens, HasTemperature, HasTopP bool
}

// SamplingOf reads a request body's sampling settings. The token limit is
// whichever the API names: max_tokens (Chat Completions, Completions,
// Messages), max_completion_tokens (Chat Completions' newer name, which
// wins), max_output_tokens (Responses).
func SamplingOf(body []byte) Sampling {
	var s Sampling
	r := gjson.GetManyBytes(body, "max_completion_tokens", "max_tokens", "max_output_tokens", "temperature", "top_p")
	for _, limit := range r[:3] {
		if limit.Type == gjson.Number && limit.Num >= 0 && limit.Num == float64(int64(limit.Num)) {
			s.MaxTokens, s.HasMaxTokens = int64(limit.Num), true
			break
		}
	}
	if r[3].Type == gjson.Number {
		s.Temperature, s.HasTemperature = r[3].Num, true
	}
	if r[4].Type == gjson.Number {
		s.TopP, s.HasTopP = r[4].Num, true
	}
	return s
}

// Answer is what a response says of itself: its id, the model that
// answered, and why each choice ended (finish_reason, Anthropic's
// stop_reason, or a Responses response's status).
type Answer struct {
	ID, Model     string
	FinishReasons []string
}

// maxFinishReasons bounds the reasons kept: a request with n in the
// thousands gets the first ones, not an attribute of unbounded size.
const maxFinishReasons = 16

func (a *Answer) identify(id, model gjson.Result) {
	if id.Type == gjson.String {
		a.ID = strings.Clone(id.Str)
	}
	if model.Type == gjson.String && a.Model == "" {
		a.Model = strings.Clone(model.Str)
	}
}

// finishReasons adds the non-null finish reasons of a choices array. A
// chat stream finishes each choice in one event, so each reason is added
// once.
func (a *Answer) finishReasons(choices gjson.Result, key string) {
	if !choices.IsArray() {
		return
	}
	choices.ForEach(func(_, choice gjson.Result) bool {
		a.addReason(choice.Get(key))
		return len(a.FinishReasons) < maxFinishReasons
	})
}

func (a *Answer) addReason(r gjson.Result) {
	// An empty reason is none: some engines send "" until the end.
	if r.Type == gjson.String && r.Str != "" && len(a.FinishReasons) < maxFinishReasons {
		a.FinishReasons = append(a.FinishReasons, strings.Clone(r.Str))
	}
}

var finishReasonKey = []byte(`"finish_reason"`)

// mayFinish tells, without parsing, whether a chunk may carry a finish
// reason: a "finish_reason" key whose value is a string. Every vLLM chunk
// has the key, null until the last; the key's quotes cannot occur inside
// a JSON string (they would be escaped), so nothing that finishes is
// missed.
func mayFinish(data []byte) bool {
	for {
		i := bytes.Index(data, finishReasonKey)
		if i < 0 {
			return false
		}
		data = bytes.TrimLeft(data[i+len(finishReasonKey):], " \t\r\n")
		if len(data) > 0 && data[0] == ':' {
			data = bytes.TrimLeft(data[1:], " \t\r\n")
			if len(data) > 0 && data[0] == '"' {
				return true
			}
		}
	}
}
