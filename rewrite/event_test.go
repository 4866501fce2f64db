package rewrite

import (
	"testing"

	"github.com/timing-sidecar/timing-sidecar/timing"
)

func TestClassifyEvent(t *testing.T) {
	usage := func(p, c int64) timing.Usage {
		return timing.Usage{PromptTokens: timing.Count{Value: p, Set: true}, CompletionTokens: timing.Count{Value: c, Set: true}}
	}
	tests := []struct {
		name      string
		raw       string
		kind      EventKind
		usage     timing.Usage
		wantData  string
		checkData bool
	}{
		{name: "role announcement is not a token", raw: sse(chatRole), kind: EventOther},
		{name: "content", raw: sse(chatContent), kind: EventToken, wantData: chatContent, checkData: true},
		{name: "several tokens in one event", raw: sse(chatMulti), kind: EventToken},
		{name: "finish with empty delta", raw: sse(chatFinish), kind: EventOther},
		{name: "finish carrying the last text", raw: sse(chatFinishTx), kind: EventToken},
		{name: "reasoning_content", raw: sse(chatReason), kind: EventToken},
		{name: "reasoning", raw: sse(chatReasonV2), kind: EventToken},
		{name: "tool call start", raw: sse(chatTool), kind: EventToken},
		{name: "tool call arguments", raw: sse(chatToolArgs), kind: EventToken},
		{name: "final usage event", raw: sse(chatUsage), kind: EventUsage, usage: usage(17, 10)},
		{name: "continuous usage on a token event", raw: sse(chatRunning), kind: EventToken},
		{name: "second choice of n=2", raw: sse(chatN2First), kind: EventToken},
		{name: "error event", raw: sse(errorEvent), kind: EventError},
		{name: "flat error event", raw: sse(errorFlat), kind: EventError},
		{name: "done", raw: "data: [DONE]\n\n", kind: EventDone},
		{name: "completions text", raw: sse(cmplText), kind: EventToken},
		{name: "completions empty text", raw: sse(cmplEmpty), kind: EventOther},
		{name: "completions usage", raw: sse(cmplUsage), kind: EventUsage, usage: usage(5, 7)},
		{name: "no space after colon", raw: "data:" + chatContent + "\n\n", kind: EventToken, wantData: chatContent, checkData: true},
		{name: "CRLF line endings", raw: "data: " + chatContent + "\r\n\r\n", kind: EventToken, wantData: chatContent, checkData: true},
		{name: "event and id fields around data", raw: "event: message\nid: 7\ndata: " + chatContent + "\n\n", kind: EventToken},
		{name: "comment", raw: ": keep-alive\n\n", kind: EventOther},
		{name: "data that is not JSON", raw: "data: hello\n\n", kind: EventOther},
		{name: "two data lines are not inspected", raw: "data: {\"choices\":\ndata: [{\"text\":\"x\"}]}\n\n", kind: EventOther},
		{name: "usage with non-numeric counts", raw: sse(`{"choices":[],"usage":{"prompt_tokens":"17","completion_tokens":null}}`), kind: EventUsage},
		{name: "usage with a missing count", raw: sse(`{"choices":[],"usage":{"prompt_tokens":4}}`), kind: EventUsage,
			usage: timing.Usage{PromptTokens: timing.Count{Value: 4, Set: true}}},
		{name: "empty choices without usage", raw: sse(`{"choices":[]}`), kind: EventOther},
		{name: "empty tool_calls array", raw: sse(`{"choices":[{"index":0,"delta":{"tool_calls":[]}}]}`), kind: EventOther},
		{name: "null content", raw: sse(`{"choices":[{"index":0,"delta":{"content":null}}]}`), kind: EventOther},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ev := ClassifyEvent([]byte(tt.raw))
			if ev.Kind != tt.kind {
				t.Fatalf("kind = %d, want %d", ev.Kind, tt.kind)
			}
			if ev.Usage != tt.usage {
				t.Errorf("usage = %+v, want %+v", ev.Usage, tt.usage)
			}
			if tt.checkData && string(ev.Data) != tt.wantData {
				t.Errorf("data = %q, want %q", ev.Data, tt.wantData)
			}
		})
	}
}

func TestClassifyEventAllocatesNothing(t *testing.T) {
	for _, raw := range []string{sse(chatContent), sse(chatUsage), sse(chatRole), sse(errorEvent), "data: [DONE]\n\n"} {
		b := []byte(raw)
		if allocs := testing.AllocsPerRun(100, func() { ClassifyEvent(b) }); allocs != 0 {
			t.Errorf("ClassifyEvent(%.40q...) allocates %v times, want 0", raw, allocs)
		}
	}
}

// TestClassifyUsageOnTheFinishingEvent: the usage a finishing event
// carries is the request's; one on an unfinished event is a running count.
func TestClassifyUsageOnTheFinishingEvent(t *testing.T) {
	for _, tt := range []struct {
		name, data string
		kind       EventKind
		onChoices  bool
		completion int64
		running    int64 // -1: none
	}{
		{"llama.cpp: empty delta, finish, usage and timings", `{"choices":[{"finish_reason":"stop","index":0,"delta":{}}],"created":1,"id":"c","model":"m","system_fingerprint":"b6097","object":"chat.completion.chunk","usage":{"completion_tokens":247,"prompt_tokens":1085,"total_tokens":1332},"timings":{"prompt_n":1085,"prompt_ms":203.378,"predicted_n":247,"predicted_ms":933.63}}`,
			EventOther, true, 247, -1},
		{"last token with finish and usage", `{"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"."},"finish_reason":"length"}],"usage":{"prompt_tokens":3,"completion_tokens":9,"total_tokens":12}}`,
			EventToken, true, 9, -1},
		{"running usage mid-stream", `{"id":"c","choices":[{"index":0,"delta":{"content":"a"},"finish_reason":null}],"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}}`,
			EventToken, false, 0, 1},
		{"one of two choices finished", `{"id":"c","choices":[{"index":0,"delta":{},"finish_reason":"stop"},{"index":1,"delta":{"content":"b"}}],"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}}`,
			EventToken, false, 0, 1},
		{"OpenAI's usage null", `{"id":"c","choices":[{"index":0,"delta":{},"finish_reason":"stop"}],"usage":null}`,
			EventOther, false, 0, -1},
		{"the word usage in the text", `{"id":"c","choices":[{"index":0,"delta":{"content":"usage\""},"finish_reason":"stop"}]}`,
			EventToken, false, 0, -1},
	} {
		t.Run(tt.name, func(t *testing.T) {
			ev := ClassifyEvent([]byte("data: " + tt.data + "\n\n"))
			if ev.Kind != tt.kind || ev.UsageOnChoices != tt.onChoices || ev.Usage.CompletionTokens.Value != tt.completion {
				t.Fatalf("got kind %d, on choices %v, completion %v", ev.Kind, ev.UsageOnChoices, ev.Usage.CompletionTokens)
			}
			if running := (timing.Count{Value: max(tt.running, 0), Set: tt.running >= 0}); ev.Running != running {
				t.Fatalf("running count %+v, want %+v", ev.Running, running)
			}
		})
	}
}

func TestClassifyOutputKinds(t *testing.T) {
	for _, tt := range []struct {
		delta string
		want  timing.Output
	}{
		{`{"content":"a"}`, timing.OutputContent},
		{`{"reasoning_content":"hm"}`, timing.OutputReasoning},
		{`{"reasoning":"hm"}`, timing.OutputReasoning},
		{`{"reasoning":"hm","content":"a"}`, timing.OutputReasoning | timing.OutputContent},
		{`{"tool_calls":[{"index":0,"function":{"arguments":"{"}}]}`, timing.OutputContent},
		{`{"reasoning_content":"","content":""}`, 0},
		{`{"reasoning":null,"content":"a"}`, timing.OutputContent},
	} {
		ev := ClassifyEvent([]byte(`data: {"choices":[{"index":0,"delta":` + tt.delta + `}]}` + "\n\n"))
		if ev.Output != tt.want || (ev.Kind == EventToken) != (tt.want != 0) {
			t.Errorf("%s: output %b, kind %d", tt.delta, ev.Output, ev.Kind)
		}
	}
	u := BodyUsage([]byte(`{"usage":{"prompt_tokens":1,"completion_tokens":9,"completion_tokens_details":{"reasoning_tokens":4}}}`))
	if !u.ReasoningTokens.Set || u.ReasoningTokens.Value != 4 {
		t.Errorf("reasoning tokens %+v", u.ReasoningTokens)
	}
	u = BodyUsage([]byte(`{"usage":{"input_tokens":1,"output_tokens":9,"output_tokens_details":{"reasoning_tokens":3}}}`))
	if !u.ReasoningTokens.Set || u.ReasoningTokens.Value != 3 || u.CompletionTokens.Value != 9 {
		t.Errorf("Responses usage %+v", u)
	}
}

func TestFinishesChoice(t *testing.T) {
	for _, tt := range []struct {
		data string
		want bool
	}{
		{`{"choices":[{"index":0,"delta":{"content":"a"},"finish_reason":null}]}`, false},
		{`{"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}`, true},
		{`{"choices":[{"index":0,"delta":{"content":"b"},"finish_reason":"length"}]}`, true},
		{`{"choices":[{"index":0,"text":"b","finish_reason":"length"}]}`, true},
		{`{"choices":[{"index":0,"delta":{}},{"index":1,"delta":{},"finish_reason":"stop"}]}`, true},
		{`{"choices":[{"index":0,"delta":{"content":"a"}}]}`, false},
		{`{"choices":[],"usage":{"prompt_tokens":1}}`, false},
	} {
		if got := FinishesChoice(ClassifyEvent([]byte("data: " + tt.data + "\n\n"))); got != tt.want {
			t.Errorf("FinishesChoice(%s) = %v, want %v", tt.data, got, tt.want)
		}
	}
}

func TestCarriesChoices(t *testing.T) {
	for raw, want := range map[string]bool{
		"data: {\"choices\":[{\"index\":0,\"delta\":{}}]}\n\n":       true,
		"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":1}}\n\n": false,
		": keep-alive\n\n":          false,
		"event: ping\ndata: {}\n\n": false,
		"data: [DONE]\n\n":          false,
	} {
		if got := CarriesChoices(ClassifyEvent([]byte(raw))); got != want {
			t.Errorf("CarriesChoices(%q) = %v, want %v", raw, got, want)
		}
	}
}

func TestIsKeepAlive(t *testing.T) {
	for raw, want := range map[string]bool{
		": keep-alive\n\n":                          true,
		"event: ping\ndata: {}\n\n":                 true,
		"event: ping\n\n":                           true,
		"data: {}\n\n":                              true,
		"data: {\"type\":\"ping\"}\n\n":             true,
		"id: 7\n\n":                                 true,
		"data: {\"type\":\"ping\",\"x\":1}\n\n":     false,
		"data: {\"error\":{\"message\":\"x\"}}\n\n": false,
		"data: [DONE]\n\n":                          false,
		"data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"a\"},\"finish_reason\":null}]}\n\n": false,
		"data: {\"a\":\n\ndata: 1}\n\n": false,
		"data: a\ndata: b\n\n":          false,
	} {
		if got := IsKeepAlive([]byte(raw), ClassifyEvent([]byte(raw))); got != want {
			t.Errorf("IsKeepAlive(%q) = %v, want %v", raw, got, want)
		}
	}
}

// A stream may begin with a byte-order mark (WHATWG's parser strips it):
// its first event is still read, and the splice still lands in its data.
func TestByteOrderMarkBeforeTheFirstEvent(t *testing.T) {
	raw := []byte("\ufeffdata: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"w0\"},\"finish_reason\":null}]}\n\n")
	ev := ClassifyEvent(raw)
	if ev.Kind != EventToken || !HasDataField(raw) {
		t.Fatalf("kind %v, data field %v: the first event was not read", ev.Kind, HasDataField(raw))
	}
	if string(ev.Data) != `{"choices":[{"index":0,"delta":{"content":"w0"},"finish_reason":null}]}` {
		t.Fatalf("data %q", ev.Data)
	}
}
