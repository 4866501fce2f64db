package rewrite

import "testing"

func TestClassifyEventForMessagesAndResponses(t *testing.T) {
	for _, tt := range []struct {
		name       string
		api        API
		data       string
		kind       EventKind
		prompt     int64 // -1: unset
		completion int64
	}{
		{"message_start: input tokens only", APIMessages, `{"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant","content":[],"model":"m","stop_reason":null,"usage":{"input_tokens":25,"output_tokens":1}}}`, EventOther, 25, -1},
		{"text delta", APIMessages, `{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hi"}}`, EventToken, -1, -1},
		{"thinking delta", APIMessages, `{"type":"content_block_delta","index":0,"delta":{"type":"thinking_delta","thinking":"Let me"}}`, EventToken, -1, -1},
		{"tool input delta", APIMessages, `{"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":"{\"loc"}}`, EventToken, -1, -1},
		{"empty tool input delta", APIMessages, `{"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":""}}`, EventOther, -1, -1},
		{"signature delta", APIMessages, `{"type":"content_block_delta","index":0,"delta":{"type":"signature_delta","signature":"EqQB"}}`, EventOther, -1, -1},
		{"ping", APIMessages, `{"type": "ping"}`, EventOther, -1, -1},
		{"content_block_start", APIMessages, `{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}`, EventOther, -1, -1},
		{"message_delta: the final usage", APIMessages, `{"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":{"output_tokens":15}}`, EventUsage, -1, 15},
		{"message error", APIMessages, `{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}`, EventError, -1, -1},
		{"response.created", APIResponses, `{"type":"response.created","sequence_number":0,"response":{"id":"resp_1","object":"response","status":"in_progress","usage":null}}`, EventOther, -1, -1},
		{"output text delta", APIResponses, `{"type":"response.output_text.delta","item_id":"msg_1","output_index":0,"content_index":0,"delta":"Hi","sequence_number":4}`, EventToken, -1, -1},
		{"reasoning delta", APIResponses, `{"type":"response.reasoning_text.delta","item_id":"rs_1","output_index":0,"content_index":0,"delta":"Hmm","sequence_number":3}`, EventToken, -1, -1},
		{"function arguments delta", APIResponses, `{"type":"response.function_call_arguments.delta","item_id":"fc_1","output_index":1,"delta":"{\"a\"","sequence_number":9}`, EventToken, -1, -1},
		{"empty delta", APIResponses, `{"type":"response.output_text.delta","item_id":"msg_1","output_index":0,"content_index":0,"delta":"","sequence_number":4}`, EventOther, -1, -1},
		{"output_text.done", APIResponses, `{"type":"response.output_text.done","item_id":"msg_1","output_index":0,"content_index":0,"text":"Hi there","sequence_number":9}`, EventOther, -1, -1},
		{"response.completed", APIResponses, `{"type":"response.completed","sequence_number":12,"response":{"id":"resp_1","object":"response","status":"completed","usage":{"input_tokens":7,"input_tokens_details":{"cached_tokens":0},"output_tokens":9,"output_tokens_details":{"reasoning_tokens":0},"total_tokens":16}}}`, EventUsage, 7, 9},
		{"response.incomplete", APIResponses, `{"type":"response.incomplete","sequence_number":12,"response":{"id":"resp_1","status":"incomplete","usage":{"input_tokens":7,"output_tokens":4,"total_tokens":11}}}`, EventUsage, 7, 4},
		{"response.failed", APIResponses, `{"type":"response.failed","sequence_number":5,"response":{"id":"resp_1","status":"failed","error":{"code":"server_error","message":"boom"}}}`, EventError, -1, -1},
	} {
		t.Run(tt.name, func(t *testing.T) {
			ev := ClassifyEventFor(tt.api, []byte("event: x\ndata: "+tt.data+"\n\n"))
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
	ev := ClassifyEventFor(APIResponses, raw)
	out, ok := AppendEventWithMetrics(nil, raw, ev, []byte(`{"e2e_latency_ms":1.000}`))
	want := "event: response.completed\ndata: {\"type\":\"response.completed\",\"sequence_number\":3,\"response\":{\"id\":\"r\",\"usage\":{\"input_tokens\":1,\"output_tokens\":2},\"metrics\":{\"e2e_latency_ms\":1.000}}}\n\n"
	if !ok || string(out) != want {
		t.Fatalf("got %q", out)
	}
}
