package rewrite

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
)

// event300 is a 300-byte content event, the size of a typical vLLM chunk.
var event300 = func() []byte {
	e := sse(chatContent)
	pad := 300 - len(e)
	return []byte(sse(strings.Replace(chatContent, `" Hello"`, `" Hello`+strings.Repeat("o", pad)+`"`, 1)))
}()

func BenchmarkClassifyEvent300B(b *testing.B) {
	b.SetBytes(int64(len(event300)))
	b.ReportAllocs()
	for b.Loop() {
		if ClassifyEvent(event300).Kind != EventToken {
			b.Fatal("not a token")
		}
	}
}

// BenchmarkFrameAndClassify300B is the per-event work of a stream: find the
// event's end in the upstream bytes and classify it.
func BenchmarkFrameAndClassify300B(b *testing.B) {
	stream := bytes.Repeat(event300, 64)
	src := bytes.NewReader(stream)
	r := NewEventReader(src, 64<<10)
	b.SetBytes(int64(len(event300)))
	b.ReportAllocs()
	for b.Loop() {
		p, whole, err := r.Next()
		if err != nil {
			src.Reset(stream)
			r.Reset(src)
			continue
		}
		if !whole || ClassifyEvent(p).Kind != EventToken {
			b.Fatal("bad event")
		}
	}
}

// body2K is a 2 KB non-streaming chat completion.
var body2K = []byte(`{"id":"chatcmpl-1","object":"chat.completion","created":1767225600,"model":"meta-llama/Llama-3.1-8B-Instruct","choices":[{"index":0,"message":{"role":"assistant","content":"` +
	strings.Repeat("lorem ipsum ", 150) + `","tool_calls":[]},"logprobs":null,"finish_reason":"stop","stop_reason":null}],"usage":{"prompt_tokens":17,"total_tokens":81,"completion_tokens":64},"prompt_logprobs":null}`)

func BenchmarkSpliceInto2KB(b *testing.B) {
	m := []byte(metricsJSON)
	buf := make([]byte, 0, 4096)
	b.SetBytes(int64(len(body2K)))
	b.ReportAllocs()
	for b.Loop() {
		var ok bool
		if buf, ok = AppendWithMetrics(buf[:0], body2K, m); !ok {
			b.Fatal("not spliced")
		}
	}
}

func BenchmarkInspectRequest2KB(b *testing.B) {
	body := []byte(`{"model":"m","messages":[{"role":"user","content":"` + strings.Repeat("tell me more ", 150) +
		`"}],"stream":true,"stream_options":{"include_usage":true},"include_metrics":true,"max_tokens":64}`)
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		if !InspectRequest(body).IncludeMetrics {
			b.Fatal("not opted in")
		}
	}
}

// chatRequest is a streamed chat request of about size bytes as an agent
// sends it: a system prompt, a tool schema, then turns of prose and code.
// The code's brackets sit inside strings, where the depth check must skip
// them.
func chatRequest(size int) []byte {
	type message struct {
		Role    string `json:"role"`
		Content string `json:"content"`
	}
	req := map[string]any{
		"model":           "meta-llama/Llama-3.1-8B-Instruct",
		"stream":          true,
		"stream_options":  map[string]any{"include_usage": true},
		"include_metrics": true,
		"max_tokens":      512,
		"temperature":     0.2,
		"tools": []any{map[string]any{"type": "function", "function": map[string]any{
			"name": "run_tests", "description": "Run the test suite and return failures.",
			"parameters": map[string]any{"type": "object", "properties": map[string]any{
				"paths": map[string]any{"type": "array", "items": map[string]any{"type": "string"}},
			}},
		}}},
	}
	msgs := []message{{"system", "You are a careful senior engineer. Answer with code when it helps, and explain it briefly."}}
	prose := "Why does this return the wrong total when the list is empty? I expected zero, and the caller checks for it. "
	code := "```python\ndef total(xs: list[dict[str, int]]) -> int:\n    return sum(x[\"n\"] for x in xs if x.get(\"ok\", [True])[0])\n```\n"
	for n := 0; n < size; {
		m := message{"user", prose + code}
		if len(msgs)%2 == 0 {
			m = message{"assistant", "The generator is fine; the caller passes {\"items\": []} rather than [], so:\n" + code}
		}
		msgs = append(msgs, m)
		b, _ := json.Marshal(msgs)
		n = len(b) + 400
	}
	req["messages"] = msgs
	b, err := json.Marshal(req)
	if err != nil {
		panic(err)
	}
	return b
}

func BenchmarkInspectRequest4KB(b *testing.B)   { benchmarkInspectRequest(b, chatRequest(4<<10)) }
func BenchmarkInspectRequest100KB(b *testing.B) { benchmarkInspectRequest(b, chatRequest(100<<10)) }

func benchmarkInspectRequest(b *testing.B, body []byte) {
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		if !InspectRequest(body).IncludeMetrics {
			b.Fatal("not opted in")
		}
	}
}

// vllmChunk is a content chunk exactly as vLLM streams it.
var vllmChunk = []byte(`data: {"id":"chatcmpl-a977446b8709d3d1","object":"chat.completion.chunk","created":1796281608,"model":"meta-llama/Llama-3.1-8B-Instruct","choices":[{"index":0,"delta":{"content":" quick"},"logprobs":null,"finish_reason":null}]}` + "\n\n")

// BenchmarkClassifyVLLMChunk is what the relay asks of every event of a
// stream whose metrics ride on the finishing event: its kind and output,
// and whether it finishes a choice.
func BenchmarkClassifyVLLMChunk(b *testing.B) {
	b.SetBytes(int64(len(vllmChunk)))
	b.ReportAllocs()
	for b.Loop() {
		ev := ClassifyEvent(vllmChunk)
		if ev.Kind != EventToken || FinishesChoice(ev) {
			b.Fatal("misread")
		}
	}
}

// chunkSource returns one event per Read, as the engine's chunked body
// does: each event is one HTTP chunk, and a read stops at its end.
type chunkSource struct {
	event []byte
	left  []byte
}

func (c *chunkSource) Read(p []byte) (int, error) {
	if len(c.left) == 0 {
		c.left = c.event
	}
	n := copy(p, c.left)
	c.left = c.left[n:]
	return n, nil
}

// BenchmarkNextOneEventPerRead frames events that arrive one per read, with
// the default 1 KiB buffer: the reading pattern of a real stream.
func BenchmarkNextOneEventPerRead(b *testing.B) {
	r := NewEventReader(&chunkSource{event: event300}, 64<<10)
	b.SetBytes(int64(len(event300)))
	b.ReportAllocs()
	for b.Loop() {
		if _, whole, err := r.Next(); err != nil || !whole {
			b.Fatal("bad event")
		}
	}
}

// BenchmarkBodySplice2KB is a non-streaming response's splice as the proxy
// does it, once per request: inspect the body, then put the metrics in.
func BenchmarkBodySplice2KB(b *testing.B) {
	m := []byte(metricsJSON)
	b.SetBytes(int64(len(body2K)))
	b.ReportAllocs()
	for b.Loop() {
		if _, ok := InspectBody(body2K).WithMetrics(body2K, m); !ok {
			b.Fatal("not spliced")
		}
	}
}
