package proxy

import (
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/timing-sidecar/timing-sidecar/e2e/emulator"
)

func TestReasoningAndContentMeasuredApart(t *testing.T) {
	engine := startEmulator(t, emulator.Config{Timing: emulator.Timing{HeaderDelay: 10 * time.Millisecond,
		TTFT: 30 * time.Millisecond, ITL: 20 * time.Millisecond, OutputTokens: 6}})
	p, base := startSidecar(t, engine.URL(), nil, nil)
	// stream returns the metrics, the usage event, the engine's record,
	// the client's events and when it had the response headers.
	stream := func(t *testing.T, output, extra string) (map[string]*float64, string, emulator.Record, []sseEvent, time.Time) {
		t.Helper()
		resp := post(t, base+"/v1/chat/completions", `{"model":"m","stream":true,"include_metrics":true`+extra+`,"messages":[{"role":"user","content":"hi"}]}`,
			map[string]string{emulator.HeaderOutput: output})
		headers := time.Now()
		events, _ := readEvents(t, resp.Body)
		resp.Body.Close()
		rec, err := engine.Last(t.Context())
		if err != nil || len(events) < 2 {
			t.Fatalf("%d events, %v", len(events), err)
		}
		usage := events[len(events)-2].data
		return metricsOf(t, usage), usage, rec, events, headers
	}
	t.Run("reasoning then content", func(t *testing.T) {
		m, raw, rec, events, headers := stream(t, emulator.OutputReasoning, "")
		if *m["output_token_metrics.reasoning.token_count"] != 3 || *m["output_token_metrics.content.token_count"] != 3 {
			t.Fatalf("counts in %s", raw)
		}
		accepted := span{rec.HeadersSent, headers}
		firstReasoning := span{rec.FirstReasoning, firstReceived(t, events, isReasoningDelta)}
		firstContent := span{rec.FirstContent, firstReceived(t, events, isContentDelta)}
		last := span{rec.LastToken, lastReceived(t, events, isTextDelta)}
		during(t, m, "output_token_metrics.reasoning.time_to_first_token_ms", accepted, firstReasoning)
		during(t, m, "output_token_metrics.content.time_to_first_token_ms", accepted, firstContent)
		during(t, m, "output_token_metrics.content.generation_time_ms", firstContent, last)
		perToken(t, m, "output_token_metrics.content.mean_itl_ms", firstContent, last, 2)
		// The top level still counts from the first token of either kind.
		during(t, m, "time_to_first_token_ms", accepted, span{rec.FirstToken, firstReceived(t, events, isTextDelta)})
	})
	t.Run("reasoning only, cut by length", func(t *testing.T) {
		m, raw, _, _, _ := stream(t, emulator.OutputReasoning, `,"max_tokens":2`)
		if *m["output_token_metrics.reasoning.token_count"] != 2 || *m["output_token_metrics.content.token_count"] != 0 {
			t.Fatalf("counts in %s", raw)
		}
		isNull(t, m, "output_token_metrics.content.time_to_first_token_ms", "output_token_metrics.content.generation_time_ms",
			"output_token_metrics.content.mean_itl_ms", "output_token_metrics.content.tokens_per_second")
	})
	t.Run("the newer field name, usage without details", func(t *testing.T) {
		m, raw, rec, events, headers := stream(t, emulator.OutputReasoningField, "")
		isNull(t, m, "output_token_metrics.reasoning.token_count", "output_token_metrics.content.token_count",
			"output_token_metrics.reasoning.mean_itl_ms", "output_token_metrics.content.tokens_per_second")
		if m["output_token_metrics.reasoning.time_to_first_token_ms"] == nil {
			t.Fatalf("no reasoning timing in %s", raw)
		}
		during(t, m, "output_token_metrics.content.time_to_first_token_ms",
			span{rec.HeadersSent, headers}, span{rec.FirstContent, firstReceived(t, events, isContentDelta)})
	})
	t.Run("content only: no split", func(t *testing.T) {
		_, raw, _, _, _ := stream(t, emulator.OutputText, "")
		if strings.Contains(raw, "output_token_metrics") {
			t.Fatalf("a plain stream got a split: %s", raw)
		}
	})
	// Time to first content token, from arrival, in Prometheus: one per
	// stream above with content (three of four).
	if n, _ := histogramCount(t, p, "timing_sidecar_time_to_first_content_token_seconds",
		map[string]string{"endpoint": "chat_completions", "model": "m"}); n != 3 {
		t.Fatalf("time to first content token observed %d times, want 3", n)
	}
}

func TestReasoningInterleavedWithToolCalls(t *testing.T) {
	ev := func(delta string) string {
		return `data: {"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":` + delta + `,"finish_reason":null}]}` + "\n\n"
	}
	release := make(chan struct{})
	truth := make(chan [4]time.Time, 1) // when the engine sent each output event
	engine := newScriptedEngine(t, func(c net.Conn, _ *http.Request, _ []byte) {
		defer c.Close()
		var sent [4]time.Time
		defer func() { truth <- sent }()
		io.WriteString(c, sseHead+chunk(roleEvent))
		sent[0] = time.Now() // each stamped before it is written
		io.WriteString(c, chunk(ev(`{"reasoning":"think"}`)))
		for i, delta := range []string{
			`{"tool_calls":[{"index":0,"id":"t","type":"function","function":{"name":"f","arguments":""}}]}`,
			`{"reasoning":"more"}`,
			`{"content":"answer"}`,
		} {
			<-release // paced by the test, so the marks are apart
			sent[i+1] = time.Now()
			io.WriteString(c, chunk(ev(delta)))
		}
		io.WriteString(c, chunk(`data: {"id":"c","choices":[],"usage":{"prompt_tokens":1,"completion_tokens":4,"total_tokens":5,"completion_tokens_details":{"reasoning_tokens":2}}}`+"\n\n")+chunk("data: [DONE]\n\n")+"0\r\n\r\n")
	})
	base := startProxy(t, engine.URL(), nil)
	go func() {
		for i := 0; i < 3; i++ {
			time.Sleep(20 * time.Millisecond) // the engine's pace, not synchronisation
			release <- struct{}{}
		}
	}()
	resp := post(t, base+"/v1/chat/completions", `{"stream":true,"include_metrics":true,"stream_options":{"include_usage":true}}`, nil)
	events, _ := readEvents(t, resp.Body)
	resp.Body.Close()
	m := metricsOf(t, events[len(events)-2].data)
	sent := <-truth
	r, c := "output_token_metrics.reasoning.", "output_token_metrics.content."
	if *m[r+"token_count"] != 2 || *m[c+"token_count"] != 2 {
		t.Fatalf("counts %v %v", *m[r+"token_count"], *m[c+"token_count"])
	}
	// Tool-call arguments are content: the content began (with the tool
	// call) before the reasoning ended.
	if *m[c+"time_to_first_token_ms"] >= *m[r+"time_to_first_token_ms"]+*m[r+"generation_time_ms"] {
		t.Fatalf("the tool call did not count as content: %s", events[len(events)-2].data)
	}
	var marks [4]span
	for i, text := range []string{"think", "tool_calls", "more", "answer"} {
		marks[i] = span{sent[i], received(t, events, text)}
	}
	during(t, m, r+"generation_time_ms", marks[0], marks[2])
	during(t, m, c+"generation_time_ms", marks[1], marks[3])
}
