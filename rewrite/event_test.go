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
