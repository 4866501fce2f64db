package rewrite

import (
	"reflect"
	"testing"
)

func TestSamplingOf(t *testing.T) {
	for _, tc := range []struct {
		body string
		want Sampling
	}{
		{`{"model":"m"}`, Sampling{}},
		{`{"max_tokens":64,"temperature":0.7,"top_p":1}`, Sampling{MaxTokens: 64, HasMaxTokens: true, Temperature: 0.7, HasTemperature: true, TopP: 1, HasTopP: true}},
		{`{"max_tokens":64,"max_completion_tokens":32}`, Sampling{MaxTokens: 32, HasMaxTokens: true}},
		{`{"max_output_tokens":100}`, Sampling{MaxTokens: 100, HasMaxTokens: true}},
		{`{"max_tokens":-1,"temperature":"hot","top_p":null}`, Sampling{}},
		{`{"max_tokens":1.5}`, Sampling{}},
		{`not json`, Sampling{}},
	} {
		if got := SamplingOf([]byte(tc.body)); got != tc.want {
			t.Errorf("%s: %+v, want %+v", tc.body, got, tc.want)
		}
	}
}

func observeStream(api API, events ...string) Answer {
	var a Answer
	for _, e := range events {
		api.ObserveEvent(&a, api.ClassifyEvent([]byte("data: "+e+"\n\n")))
	}
	return a
}

func TestAnswerOfStreams(t *testing.T) {
	for _, tc := range []struct {
		name   string
		api    API
		events []string
		want   Answer
	}{
		{"chat", ChatCompletions, []string{
			`{"id":"chatcmpl-1","model":"llama","choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}`,
			`{"id":"chatcmpl-1","model":"llama","choices":[{"index":0,"delta":{"content":"finish_reason stop"},"finish_reason":null}]}`,
			`{"id":"chatcmpl-1","model":"llama","choices":[{"index":0,"delta":{},"finish_reason": "length"}]}`,
			`{"id":"chatcmpl-1","model":"llama","choices":[],"usage":{"prompt_tokens":1,"completion_tokens":2}}`,
			`[DONE]`,
		}, Answer{ID: "chatcmpl-1", Model: "llama", FinishReasons: []string{"length"}}},
		{"empty reasons are none", ChatCompletions, []string{
			`{"id":"c","model":"m","choices":[{"index":0,"delta":{"content":"a"},"finish_reason":""}]}`,
			`{"id":"c","model":"m","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}`,
		}, Answer{ID: "c", Model: "m", FinishReasons: []string{"stop"}}},
		{"two choices", ChatCompletions, []string{
			`{"id":"c","model":"m","choices":[{"index":0,"delta":{"content":"a"},"finish_reason":"stop"}]}`,
			`{"id":"c","model":"m","choices":[{"index":1,"delta":{"content":"b"},"finish_reason":"tool_calls"}]}`,
		}, Answer{ID: "c", Model: "m", FinishReasons: []string{"stop", "tool_calls"}}},
		{"messages", Messages, []string{
			`{"type":"message_start","message":{"id":"msg_1","model":"claude","usage":{"input_tokens":5}}}`,
			`{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"hi"}}`,
			`{"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":3}}`,
		}, Answer{ID: "msg_1", Model: "claude", FinishReasons: []string{"end_turn"}}},
		{"responses", Responses, []string{
			`{"type":"response.created","response":{"id":"resp_1","model":"gpt","status":"in_progress"}}`,
			`{"type":"response.output_text.delta","delta":"hi"}`,
			`{"type":"response.completed","response":{"id":"resp_1","model":"gpt","status":"completed","usage":{"input_tokens":1,"output_tokens":1}}}`,
		}, Answer{ID: "resp_1", Model: "gpt", FinishReasons: []string{"completed"}}},
	} {
		if got := observeStream(tc.api, tc.events...); !reflect.DeepEqual(got, tc.want) {
			t.Errorf("%s: %+v, want %+v", tc.name, got, tc.want)
		}
	}
}

func TestAnswerOfBodies(t *testing.T) {
	for _, tc := range []struct {
		api  API
		body string
		want Answer
	}{
		{ChatCompletions, `{"id":"c","model":"m","choices":[{"finish_reason":"stop"},{"finish_reason":"length"}]}`, Answer{ID: "c", Model: "m", FinishReasons: []string{"stop", "length"}}},
		{Messages, `{"id":"msg","model":"claude","stop_reason":"max_tokens"}`, Answer{ID: "msg", Model: "claude", FinishReasons: []string{"max_tokens"}}},
		{Responses, `{"id":"resp","model":"gpt","status":"incomplete"}`, Answer{ID: "resp", Model: "gpt", FinishReasons: []string{"incomplete"}}},
		{ChatCompletions, `[1,2]`, Answer{}},
	} {
		var a Answer
		tc.api.ObserveBody(&a, []byte(tc.body))
		if !reflect.DeepEqual(a, tc.want) {
			t.Errorf("%s: %+v, want %+v", tc.body, a, tc.want)
		}
	}
}

func TestObservingAStreamAllocatesOnlyForWhatItKeeps(t *testing.T) {
	ev := ClassifyEvent([]byte(`data: {"id":"chatcmpl-1","model":"llama","choices":[{"index":0,"delta":{"content":"tok"},"finish_reason":null}]}` + "\n\n"))
	a := Answer{ID: "chatcmpl-1", Model: "llama"}
	if n := testing.AllocsPerRun(100, func() { ChatCompletions.ObserveEvent(&a, ev) }); n != 0 {
		t.Errorf("%v allocations per token event once the id is known", n)
	}
}
