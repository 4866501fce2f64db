package rewrite

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
)

func assembleAll(t *testing.T, events ...string) *Assembly {
	t.Helper()
	a := NewAssembly(1 << 20)
	for _, e := range events {
		if err := a.Add([]byte(e)); err != nil {
			t.Fatalf("Add(%s): %v", e, err)
		}
	}
	return a
}

func TestAssemblyKeepsChoicesApart(t *testing.T) {
	a := assembleAll(t,
		`{"id":"x","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":1,"delta":{"role":"assistant","content":""}}]}`,
		`{"id":"x","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}`,
		`{"id":"x","choices":[{"index":1,"delta":{"content":"b1"}},{"index":0,"delta":{"content":"a1"}}]}`,
		`{"id":"x","choices":[{"index":0,"delta":{"content":" a2"},"finish_reason":"stop","stop_reason":null}]}`,
		`{"id":"x","choices":[{"index":1,"delta":{},"finish_reason":"length","stop_reason":"</s>"}]}`,
		`{"id":"x","system_fingerprint":"fp","choices":[],"usage":{"prompt_tokens":2,"completion_tokens":3,"total_tokens":5}}`,
	)
	body, ok := a.AppendBody(nil, true)
	got := string(body)
	want := `{"id":"x","object":"chat.completion","created":1,"model":"m","choices":[` +
		`{"index":0,"message":{"role":"assistant","content":"a1 a2","tool_calls":[]},"logprobs":null,"finish_reason":"stop","stop_reason":null},` +
		`{"index":1,"message":{"role":"assistant","content":"b1","tool_calls":[]},"logprobs":null,"finish_reason":"length","stop_reason":"</s>"}],` +
		`"system_fingerprint":"fp","usage":{"prompt_tokens":2,"completion_tokens":3,"total_tokens":5}}`
	if !ok || got != want {
		t.Fatalf("got  %s\nwant %s", got, want)
	}
}

func TestAssemblyToolCallsByIndex(t *testing.T) {
	a := assembleAll(t,
		`{"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}`,
		`{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"c0","type":"function","function":{"name":"f","arguments":""}}]}}]}`,
		`{"choices":[{"index":0,"delta":{"tool_calls":[{"index":1,"id":"c1","type":"function","function":{"name":"g","arguments":"{\"b\""}}]}}]}`,
		`{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{\"a\":"}}]}}]}`,
		`{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"1}"}},{"index":1,"function":{"arguments":":2}"}}]},"finish_reason":"tool_calls"}]}`,
	)
	body, ok := a.AppendBody(nil, true)
	got := string(body)
	if !ok || !strings.Contains(got, `"content":null,"tool_calls":[{"id":"c0","type":"function","function":{"name":"f","arguments":"{\"a\":1}"}},{"id":"c1","type":"function","function":{"name":"g","arguments":"{\"b\":2}"}}]`) {
		t.Fatalf("got %s", got)
	}
}

func TestAssemblyErrors(t *testing.T) {
	for _, tt := range []struct {
		event  string
		status int
	}{
		{`{"error":{"message":"boom","type":"InternalServerError","param":null,"code":500}}`, 500},
		{`{"error":{"message":"too long","type":"BadRequestError","code":400}}`, 400},
		{`{"object":"error","message":"old style","type":"BadRequestError","code":422}`, 422},
		{`{"error":{"message":"no code"}}`, 500},
		{`{"error":{"message":"odd code","code":"oops"}}`, 500},
	} {
		a := assembleAll(t, `{"choices":[{"index":0,"delta":{"content":"x"}}]}`, tt.event)
		body, status, ok := a.Error()
		if !ok || status != tt.status || string(body) != tt.event {
			t.Errorf("%s: %v %d %s", tt.event, ok, status, body)
		}
	}
	a := NewAssembly(1 << 20)
	for _, bad := range []string{`not json`, `[1]`, `{"choices":{}}`, `{"choices":[{"index":-1}]}`, `{"choices":[{"delta":{}}]}`} {
		if err := a.Add([]byte(bad)); !errors.Is(err, ErrNotAnEvent) {
			t.Errorf("Add(%s) = %v, want ErrNotAnEvent", bad, err)
		}
	}
	broken := assembleAll(t, `{"choices":[{"index":0,"delta":{"content":"\x"}}]}`)
	if body, ok := broken.AppendBody([]byte("keep"), true); ok || string(body) != "keep" {
		t.Errorf("an invalid string piece gave %q, %v", body, ok)
	}
	small := NewAssembly(100)
	ev := []byte(`{"choices":[{"index":0,"delta":{"content":"` + strings.Repeat("x", 60) + `"}}]}`)
	if err := small.Add(ev); !errors.Is(err, ErrAssemblyTooLarge) {
		t.Errorf("over the limit: %v", err)
	}
}

// FuzzAssembly: whatever events arrive, the reassembled body is valid JSON.
func FuzzAssembly(f *testing.F) {
	f.Add(chatRole+"\n"+chatContent+"\n"+chatFinish+"\n"+chatUsage, true)
	f.Add(`{"choices":[{"index":0,"text":"a\"b","logprobs":{"tokens":["a"],"text_offset":[0]}}]}`+"\n"+cmplUsage, false)
	f.Add(`{"choices":[{"index":0,"delta":{"reasoning":"\ud83d"}}]}`+"\n"+`{"choices":[{"index":0,"delta":{"reasoning":"\ude80","tool_calls":[{"index":2,"function":{"arguments":"\\"}}]}}]}`, true)
	f.Fuzz(func(t *testing.T, events string, chat bool) {
		a := NewAssembly(1 << 16)
		for _, e := range strings.Split(events, "\n") {
			if a.Add([]byte(e)) != nil {
				continue // a stream the sidecar would answer 502 for
			}
		}
		if body, ok := a.AppendBody(nil, chat); ok && !json.Valid(body) {
			t.Fatalf("invalid JSON %s from %q", body, events)
		}
	})
}

func BenchmarkAssemble100Events(b *testing.B) {
	events := [][]byte{[]byte(chatRole)}
	for i := 0; i < 100; i++ {
		events = append(events, []byte(chatContent))
	}
	events = append(events, []byte(chatFinish), []byte(chatUsage))
	b.ReportAllocs()
	var out []byte
	for b.Loop() {
		a := NewAssembly(1 << 20)
		for _, e := range events {
			if err := a.Add(e); err != nil {
				b.Fatal(err)
			}
		}
		out, _ = a.AppendBody(out[:0], true)
	}
}

func TestAssemblyToolCallsWithoutIndex(t *testing.T) {
	a := assembleAll(t,
		`{"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}`,
		`{"choices":[{"index":0,"delta":{"tool_calls":[{"id":"c0","type":"function","function":{"name":"f","arguments":"{\"a\""}}]}}]}`,
		`{"choices":[{"index":0,"delta":{"tool_calls":[{"function":{"arguments":":1}"}}]}}]}`,
		`{"choices":[{"index":0,"delta":{"tool_calls":[{"id":"c1","type":"function","function":{"name":"g","arguments":"{}"}}]},"finish_reason":"tool_calls"}]}`,
	)
	body, ok := a.AppendBody(nil, true)
	if !ok || !strings.Contains(string(body), `"tool_calls":[{"id":"c0","type":"function","function":{"name":"f","arguments":"{\"a\":1}"}},{"id":"c1","type":"function","function":{"name":"g","arguments":"{}"}}]`) {
		t.Fatalf("got %s", body)
	}
}
