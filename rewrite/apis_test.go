package rewrite

import (
	"strings"
	"testing"
)

func TestClassifyMessagesAndResponses(t *testing.T) {
	for _, tt := range []struct {
		name       string
		api        API
		data       string
		kind       EventKind
		prompt     int64 // -1: unset
		completion int64
	}{
		{"message_start: input tokens only", Messages, `{"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant","content":[],"model":"m","stop_reason":null,"usage":{"input_tokens":25,"output_tokens":1}}}`, EventOther, 25, -1},
		{"text delta", Messages, `{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hi"}}`, EventToken, -1, -1},
		{"thinking delta", Messages, `{"type":"content_block_delta","index":0,"delta":{"type":"thinking_delta","thinking":"Let me"}}`, EventToken, -1, -1},
		{"tool input delta", Messages, `{"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":"{\"loc"}}`, EventToken, -1, -1},
		{"empty tool input delta", Messages, `{"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":""}}`, EventOther, -1, -1},
		{"signature delta", Messages, `{"type":"content_block_delta","index":0,"delta":{"type":"signature_delta","signature":"EqQB"}}`, EventOther, -1, -1},
		{"ping", Messages, `{"type": "ping"}`, EventOther, -1, -1},
		{"content_block_start", Messages, `{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}`, EventOther, -1, -1},
		{"message_delta: the final usage", Messages, `{"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":{"output_tokens":15}}`, EventUsage, -1, 15},
		{"message error", Messages, `{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}`, EventError, -1, -1},
		{"response.created", Responses, `{"type":"response.created","sequence_number":0,"response":{"id":"resp_1","object":"response","status":"in_progress","usage":null}}`, EventOther, -1, -1},
		{"output text delta", Responses, `{"type":"response.output_text.delta","item_id":"msg_1","output_index":0,"content_index":0,"delta":"Hi","sequence_number":4}`, EventToken, -1, -1},
		{"reasoning delta", Responses, `{"type":"response.reasoning_text.delta","item_id":"rs_1","output_index":0,"content_index":0,"delta":"Hmm","sequence_number":3}`, EventToken, -1, -1},
		{"function arguments delta", Responses, `{"type":"response.function_call_arguments.delta","item_id":"fc_1","output_index":1,"delta":"{\"a\"","sequence_number":9}`, EventToken, -1, -1},
		{"empty delta", Responses, `{"type":"response.output_text.delta","item_id":"msg_1","output_index":0,"content_index":0,"delta":"","sequence_number":4}`, EventOther, -1, -1},
		{"output_text.done", Responses, `{"type":"response.output_text.done","item_id":"msg_1","output_index":0,"content_index":0,"text":"Hi there","sequence_number":9}`, EventOther, -1, -1},
		{"response.completed", Responses, `{"type":"response.completed","sequence_number":12,"response":{"id":"resp_1","object":"response","status":"completed","usage":{"input_tokens":7,"input_tokens_details":{"cached_tokens":0},"output_tokens":9,"output_tokens_details":{"reasoning_tokens":0},"total_tokens":16}}}`, EventUsage, 7, 9},
		{"response.incomplete", Responses, `{"type":"response.incomplete","sequence_number":12,"response":{"id":"resp_1","status":"incomplete","usage":{"input_tokens":7,"output_tokens":4,"total_tokens":11}}}`, EventUsage, 7, 4},
		{"response.failed", Responses, `{"type":"response.failed","sequence_number":5,"response":{"id":"resp_1","status":"failed","error":{"code":"server_error","message":"boom"}}}`, EventError, -1, -1},
	} {
		t.Run(tt.name, func(t *testing.T) {
			ev := tt.api.ClassifyEvent([]byte("event: x\ndata: " + tt.data + "\n\n"))
			count := func(c int64, set bool) int64 {
				if !set {
					return -1
				}
				return c
			}
			if ev.Kind != tt.kind || count(ev.Usage.PromptTokens.Value, ev.Usage.PromptTokens.Set) != tt.prompt ||
				count(ev.Usage.CompletionTokens.Value, ev.Usage.CompletionTokens.Set) != tt.completion {
				t.Fatalf("kind %d, usage %+v", ev.Kind, ev.Usage)
			}
		})
	}
}

func TestResponsesMetricsGoInTheResponseObject(t *testing.T) {
	raw := []byte("event: response.completed\ndata: {\"type\":\"response.completed\",\"sequence_number\":3,\"response\":{\"id\":\"r\",\"usage\":{\"input_tokens\":1,\"output_tokens\":2}}}\n\n")
	ev := Responses.ClassifyEvent(raw)
	out, ok := AppendEventWithMetrics(nil, raw, ev, []byte(`{"e2e_latency_ms":1.000}`))
	want := "event: response.completed\ndata: {\"type\":\"response.completed\",\"sequence_number\":3,\"response\":{\"id\":\"r\",\"usage\":{\"input_tokens\":1,\"output_tokens\":2},\"metrics\":{\"e2e_latency_ms\":1.000}}}\n\n"
	if !ok || string(out) != want {
		t.Fatalf("got %q", out)
	}
}

func TestEachAPIReadsOnlyTheRequestMembersItHas(t *testing.T) {
	body := []byte(`{"model":"m","n":2,"stream":true}`)
	for _, tt := range []struct {
		name                    string
		api                     API
		multiple, usage, upgrad bool
	}{
		{"chat", ChatCompletions, true, false, false},
		{"completions", Completions, true, false, false},
		{"messages: usage always comes, no n", Messages, false, true, false},
		{"responses: usage always comes, no n", Responses, false, true, false},
	} {
		r := tt.api.InspectRequest(body)
		if !r.Understood || !r.Stream || r.MultipleChoices != tt.multiple || r.IncludeUsage != tt.usage || r.Upgradable != tt.upgrad {
			t.Errorf("%s: %+v", tt.name, r)
		}
	}
	one := []byte(`{"model":"m","prompt":"x"}`)
	if !Completions.InspectRequest(one).Upgradable || Messages.InspectRequest(one).Upgradable {
		t.Error("only the OpenAI APIs may be upgraded to a stream")
	}
	if _, ok := Messages.AppendAssembled([]byte("keep"), NewAssembly(1<<20)); ok {
		t.Error("Messages reassembled a stream")
	}
}

func TestEveryAPIClassifiesWithoutAllocating(t *testing.T) {
	for _, tt := range []struct {
		name string
		api  API
		raw  string
	}{
		{"chat", ChatCompletions, `data: {"choices":[{"index":0,"delta":{"content":"hi"},"finish_reason":null}]}` + "\n\n"},
		{"completions", Completions, `data: {"choices":[{"index":0,"text":"hi","finish_reason":null}]}` + "\n\n"},
		{"messages", Messages, "event: content_block_delta\ndata: " + `{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hi"}}` + "\n\n"},
		{"responses", Responses, "event: response.output_text.delta\ndata: " + `{"type":"response.output_text.delta","delta":"Hi","sequence_number":4}` + "\n\n"},
	} {
		raw := []byte(tt.raw)
		if tt.api.ClassifyEvent(raw).Kind != EventToken {
			t.Fatalf("%s: not a token", tt.name)
		}
		if n := testing.AllocsPerRun(100, func() { tt.api.ClassifyEvent(raw) }); n != 0 {
			t.Errorf("%s: %v allocations per event", tt.name, n)
		}
	}
}

func TestTakesMetricsAgreesWithTheSplice(t *testing.T) {
	for _, data := range []string{
		`{"choices":[],"usage":{"prompt_tokens":1}}`,
		`{"choices":[],"usage":{"prompt_tokens":1},}`, // read leniently, not valid JSON
		`{"choices":[],"usage":{"prompt_tokens":1}`,   // cut short
		`[1,2]`,
		`"text"`,
	} {
		raw := []byte("data: " + data + "\n\n")
		ev := ChatCompletions.ClassifyEvent(raw)
		_, spliced := AppendEventWithMetrics(nil, raw, ev, []byte(`{"e2e_latency_ms":1.000}`))
		if takes := TakesMetrics(ev); takes != spliced {
			t.Errorf("%s: TakesMetrics %v, the splice %v", data, takes, spliced)
		}
	}
	raw := []byte("data: {\"type\":\"response.completed\",\"response\":{\"id\":\"r\",\"usage\":{\"input_tokens\":1}}}\n\n")
	if !TakesMetrics(Responses.ClassifyEvent(raw)) {
		t.Error("a Responses usage event does not take the metrics")
	}
}

// TestPoolingReadsTheModelAndEditsNothing: the pooling endpoints' requests
// are read for their model and marked untouched, whatever include_metrics
// holds.
func TestPoolingReadsTheModelAndEditsNothing(t *testing.T) {
	// The generation APIs' members, whatever their values or copies, are
	// the engine's to judge: the model is read all the same.
	for _, body := range []string{`{"model":"bge","input":"x"}`, `{"model":"bge","input":"x","include_metrics":"yes please"}`,
		`{"model":"bge","input":"x","stream":true}`, `{"model":"bge","stream":"maybe","n":1,"n":2,"prompt":1,"prompt":2}`} {
		r := Pooling.InspectRequest([]byte(body))
		if !r.Understood || !r.Untouched || r.Repeated || r.Model != "bge" || r.Stream || r.IncludeMetrics || r.HasIncludeMetrics || r.InvalidIncludeMetrics {
			t.Errorf("%s: %+v", body, r)
		}
	}
	// Not an object, or a model repeated: nothing read, still untouched.
	for body, repeated := range map[string]bool{`[1]`: false, `{"model":`: false, `{"model":"a","model":"b"}`: true} {
		if r := Pooling.InspectRequest([]byte(body)); r.Understood || r.Model != "" || !r.Untouched || r.Repeated != repeated {
			t.Errorf("%s: %+v", body, r)
		}
	}
}

// TestTranscriptionFormFields: the model and stream fields are read from a
// multipart form, also when only its first bytes are there.
func TestTranscriptionFormFields(t *testing.T) {
	form := func(fields ...string) string {
		var b strings.Builder
		for i := 0; i+1 < len(fields); i += 2 {
			if fields[i] == "file" {
				b.WriteString("--XyZ\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.wav\"\r\nContent-Type: audio/wav\r\n\r\n" + fields[i+1] + "\r\n")
				continue
			}
			b.WriteString("--XyZ\r\nContent-Disposition: form-data; name=\"" + fields[i] + "\"\r\n\r\n" + fields[i+1] + "\r\n")
		}
		b.WriteString("--XyZ--\r\n")
		return b.String()
	}
	audio := strings.Repeat("RIFF", 1000)
	for _, tc := range []struct {
		name, body string
		model      string
		stream     bool
		understood bool
	}{
		{"fields before the file", form("model", "whisper", "stream", "true", "file", audio), "whisper", true, true},
		{"fields after the file", form("file", audio, "model", "whisper", "stream", "True"), "whisper", true, true},
		{"only the first bytes, fields first", form("model", "whisper", "stream", "1", "file", audio)[:300], "whisper", true, true},
		{"only the first bytes, fields after the file", form("file", audio, "model", "whisper")[:300], "", false, true},
		{"no model", form("file", audio), "", false, true},
		{"stream off", form("model", "w", "stream", "false", "file", "x"), "w", false, true},
		{"not a form", `{"model":"whisper"}`, "", false, false},
	} {
		r := Transcriptions.InspectRequest([]byte(tc.body))
		if r.Model != tc.model || r.Stream != tc.stream || r.Understood != tc.understood || !r.Untouched {
			t.Errorf("%s: %+v", tc.name, r)
		}
	}
}

// TestEachAPINamesTheEventThatEndsTheAnswer: after it a client has been
// served, whatever it does next; no other event says so.
func TestEachAPINamesTheEventThatEndsTheAnswer(t *testing.T) {
	for _, tt := range []struct {
		api  API
		raw  string
		ends bool
	}{
		{ChatCompletions, "data: [DONE]\n\n", true},
		{Completions, "data: [DONE]\n\n", true},
		{ChatCompletions, `data: {"choices":[],"usage":{"prompt_tokens":1,"completion_tokens":1}}` + "\n\n", false},
		{ChatCompletions, `data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}` + "\n\n", false},
		{Messages, "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n", true},
		{Messages, "event: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":1}}\n\n", false},
		{Messages, "data: [DONE]\n\n", false},
		{Responses, "event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"status\":\"completed\"}}\n\n", true},
		{Responses, "event: response.incomplete\ndata: {\"type\":\"response.incomplete\",\"response\":{\"status\":\"incomplete\"}}\n\n", true},
		{Responses, "event: response.failed\ndata: {\"type\":\"response.failed\",\"response\":{\"status\":\"failed\"}}\n\n", false},
		{Responses, "event: response.output_text.done\ndata: {\"type\":\"response.output_text.done\",\"text\":\"a\"}\n\n", false},
	} {
		if got := tt.api.ClassifyEvent([]byte(tt.raw)).EndsAnswer(); got != tt.ends {
			t.Errorf("%T %q: EndsAnswer %v, want %v", tt.api, tt.raw, got, tt.ends)
		}
	}
}
