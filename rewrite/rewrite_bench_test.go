package rewrite

import (
	"bytes"
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
