package rewrite

import (
	"encoding/json"
	"strings"
	"testing"
)

// The shapes engines send take the one-pass reading, and it agrees with
// gjson's.
func TestScanChoicesReadsWhatEnginesSend(t *testing.T) {
	for _, data := range []string{
		chatRole, chatContent, chatMulti, chatFinish, chatFinishTx, chatReason, chatReasonV2, chatTool, chatToolArgs, chatN2First,
		chatUsage, chatRunning, errorEvent, errorFlat, cmplText, cmplEmpty, cmplUsage,
		`{}`, ` { "choices" : [ ] } `, `{"choices":null}`, `{"choices":[1,"x",null,[]]}`,
		`{"choices":[{"delta":{"content":"a"},"finish_reason":"stop"},{"delta":{},"finish_reason":null}]}`,
		`{"choices":[{"delta":"x","text":"t"}]}`, `{"choices":[{"text":"","delta":{"reasoning":"r"}}]}`,
		`{"choices":[{"delta":{"content":"\"}]"},"logprobs":{"content":[{"token":"\\","bytes":[92]}]},"finish_reason":null}]}`,
		`{"choices":[{"delta":{"tool_calls":[ ]}}, {"delta":{"tool_calls":[{}]},"finish_reason":-1.5e3}]}`,
		`{"choices":[{"finish_reason":"stop","finish_reason":null}],"usage":{"completion_tokens":1}}`,
		`{"a":{"choices":[]},"choices":[{"delta":{"content":"x","content":""}}],"choices":[]}`,
	} {
		if !json.Valid([]byte(data)) {
			t.Fatalf("fixture is not JSON: %s", data)
		}
		got, ok := scanChoices([]byte(data))
		if !ok {
			t.Errorf("scanChoices(%s) fell back to gjson", data)
			continue
		}
		if want := choicesByGJSON([]byte(data)); got != want {
			t.Errorf("scanChoices(%s) = %+v, gjson reads %+v", data, got, want)
		}
	}
}

// Shapes outside the one-pass reading go to gjson.
func TestScanChoicesLeavesTheRestToGJSON(t *testing.T) {
	for _, data := range []string{
		`[1]`, `x{"choices":[]}`, `{"cho\u0069ces":[{"text":"a"}]}`, `{"choices":[{"text":"a"}`,
		`{"choices" [{"text":"a"}]}`, `{"a":1 "choices":[]}`, `{"a":nul,"choices":[]}`,
		`{"choices":[{"finish_reason":nope}]}`, `{"choices":[{"text":"a"} {"text":"b"}]}`, `{"a":"`,
	} {
		if f, ok := scanChoices([]byte(data)); ok {
			t.Errorf("scanChoices(%s) = %+v, want a fall back to gjson", data, f)
		}
	}
}

// FuzzScanChoices holds the one-pass reading to gjson's on every input it
// reads.
func FuzzScanChoices(f *testing.F) {
	for _, s := range []string{
		chatRole, chatContent, chatFinish, chatReason, chatToolArgs, chatUsage, cmplText, errorEvent,
		`{"choices":[{"delta":{"content":"\"}]"},"logprobs":{"c":[{"t":"\\"}]},"finish_reason":null}]}`,
		`{"choices":[{"finish_reason":"stop","finish_reason":null},2,[{}]],"usage":{}}`,
		`{"choices":[{"delta":{"tool_calls":[ ]}},{"delta":{"tool_calls":[{}]},"finish_reason":-1e3}]}`,
		strings.Repeat(`{"a":`, 50) + `1` + strings.Repeat(`}`, 50),
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		got, ok := scanChoices(data)
		if !ok {
			return
		}
		if want := choicesByGJSON(data); got != want {
			t.Fatalf("scanChoices(%q) = %+v, gjson reads %+v", data, got, want)
		}
	})
}
