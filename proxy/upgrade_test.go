package proxy

import (
	"encoding/json"
	"io"
	"net"
	"net/http"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/timing-sidecar/timing-sidecar/e2e/emulator"
)

// withoutNulls drops null members from objects, recursively: a stream does
// not carry the fields an engine sends as null in a non-streaming body, and
// clients read absent and null alike.
func withoutNulls(v any) any {
	switch t := v.(type) {
	case map[string]any:
		for k, e := range t {
			if e == nil {
				delete(t, k)
			} else {
				t[k] = withoutNulls(e)
			}
		}
	case []any:
		for i, e := range t {
			t[i] = withoutNulls(e)
		}
	}
	return v
}

func postJSON(t *testing.T, url, body string, headers map[string]string) (int, map[string]any, string) {
	t.Helper()
	resp := post(t, url, body, headers)
	raw, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var doc map[string]any
	if err := json.Unmarshal(raw, &doc); err != nil {
		t.Fatalf("%d, not JSON: %s", resp.StatusCode, raw)
	}
	return resp.StatusCode, doc, string(raw)
}

// startEmulator runs the emulated engine for one test.
func startEmulator(t *testing.T, cfg emulator.Config) *emulator.Server {
	t.Helper()
	e := emulator.New(cfg)
	if err := e.Start("127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	return e
}

func startUpgradingProxy(t *testing.T, engine interface{ URL() string }) string {
	return startProxy(t, engine.URL(), func(c *Config) { c.UpgradeNonStreaming = true })
}

func TestUpgradedResponsesEqualDirectOnes(t *testing.T) {
	engine := startEmulator(t, emulator.Config{Timing: emulator.Timing{TTFT: 20 * time.Millisecond, ITL: 2 * time.Millisecond, OutputTokens: 12}})
	base := startUpgradingProxy(t, engine)
	const chat, cmpl = "/v1/chat/completions", "/v1/completions"
	const msgs = `"messages":[{"role":"user","content":"hi"}]`
	tests := []struct {
		name, path, body string
		headers          map[string]string
	}{
		{"chat", chat, `{"model":"m",` + msgs + `}`, nil},
		{"chat cut by length", chat, `{"model":"m",` + msgs + `,"max_tokens":5}`, nil},
		{"chat, several tokens per event", chat, `{"model":"m",` + msgs + `}`, map[string]string{emulator.HeaderTokensPerEvent: "3"}},
		{"chat reasoning_content", chat, `{"model":"m",` + msgs + `}`, map[string]string{emulator.HeaderOutput: emulator.OutputReasoning}},
		{"chat reasoning under both names", chat, `{"model":"m",` + msgs + `}`, map[string]string{emulator.HeaderOutput: emulator.OutputReasoningField}},
		{"chat reasoning cut by length", chat, `{"model":"m",` + msgs + `,"max_tokens":3}`, map[string]string{emulator.HeaderOutput: emulator.OutputReasoning}},
		{"chat tool call", chat, `{"model":"m",` + msgs + `,"tools":[{"type":"function","function":{"name":"get_weather"}}]}`,
			map[string]string{emulator.HeaderOutput: emulator.OutputTools}},
		{"chat logprobs", chat, `{"model":"m",` + msgs + `,"logprobs":true,"top_logprobs":2}`, nil},
		{"chat unicode split across events", chat, `{"model":"m",` + msgs + `}`, map[string]string{emulator.HeaderOutput: emulator.OutputUnicode}},
		{"completions", cmpl, `{"model":"m","prompt":"hi"}`, nil},
		{"completions cut by length", cmpl, `{"model":"m","prompt":"hi","max_tokens":4}`, nil},
		{"completions logprobs", cmpl, `{"model":"m","prompt":"hi","logprobs":2}`, map[string]string{emulator.HeaderTokensPerEvent: "2"}},
		{"completions unicode", cmpl, `{"model":"m","prompt":"hi"}`, map[string]string{emulator.HeaderOutput: emulator.OutputUnicode}},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			headers := map[string]string{"X-Request-Id": "direct-" + string(rune('a'+i))}
			for k, v := range tt.headers {
				headers[k] = v
			}
			status, direct, directRaw := postJSON(t, engine.URL()+tt.path, tt.body, headers)
			if status != 200 {
				t.Fatalf("direct: %d %s", status, directRaw)
			}
			withMetrics := strings.Replace(tt.body, `{"model":"m",`, `{"model":"m","include_metrics":true,`, 1)
			status, upgraded, upgradedRaw := postJSON(t, base+tt.path, withMetrics, headers)
			if status != 200 {
				t.Fatalf("upgraded: %d %s", status, upgradedRaw)
			}
			rec, err := engine.Last(t.Context())
			if err != nil || !rec.Stream {
				t.Fatalf("the engine was not asked for a stream (%v)", err)
			}
			m := metricsOf(t, upgradedRaw)
			for _, field := range []string{"queue_time_ms", "time_to_first_token_ms", "generation_time_ms", "mean_itl_ms", "tokens_per_second", "completion_tokens"} {
				if m[field] == nil {
					t.Errorf("metrics.%s is null in %s", field, upgradedRaw)
				}
			}
			delete(upgraded, "metrics")
			if !reflect.DeepEqual(withoutNulls(direct), withoutNulls(upgraded)) {
				t.Fatalf("bodies differ\ndirect:   %s\nupgraded: %s", directRaw, upgradedRaw)
			}
		})
	}
}

func TestUpgradeMeasuresLikeAStream(t *testing.T) {
	engine := newFakeEngine(t)
	base := startUpgradingProxy(t, engine)
	start := time.Now()
	_, _, raw := postJSON(t, base+"/v1/chat/completions", `{"include_metrics":true}`,
		map[string]string{"X-Fake-Header-Delay": "30", "X-Fake-TTFT": "40", "X-Fake-ITL": "20", "X-Fake-Tokens": "4"})
	end := time.Now()
	fr := engine.next(t)
	<-fr.Finished
	m := metricsOf(t, raw)
	for _, f := range []string{"queue_time_ms", "time_to_first_token_ms", "generation_time_ms", "mean_itl_ms"} {
		if m[f] == nil {
			t.Fatalf("%s is null: %s", f, raw)
		}
	}
	// The client sees nothing before the reassembled body, so only the
	// engine bounds the marks from below, and the whole exchange from
	// above: the sums of the figures, each from arrival to one mark,
	// fall between the engine's writing that byte and the client's
	// having the response.
	arrival := span{start, fr.Received}
	queue, ttft, gen := *m["queue_time_ms"], *m["time_to_first_token_ms"], *m["generation_time_ms"]
	for _, c := range []struct {
		name   string
		sum    float64
		marked time.Time
	}{
		{"queue_time_ms (arrival to headers)", queue, fr.HeadersSent},
		{"queue + time to first token (arrival to the first token)", queue + ttft, fr.FirstToken},
		{"queue + ttft + generation (arrival to the last token)", queue + ttft + gen, fr.LastToken},
	} {
		lo, hi := between(arrival, span{c.marked, end})
		if c.sum < lo-3*rounding || c.sum > hi+3*rounding {
			t.Errorf("%s = %.3f, want between %.3f and %.3f (causal bounds)", c.name, c.sum, lo, hi)
		}
	}
	within(t, m, "mean_itl_ms", gen/3, gen/3) // four token events, one token each
}

func TestRequestsNotUpgraded(t *testing.T) {
	engine := startEmulator(t, emulator.Config{})
	base := startUpgradingProxy(t, engine)
	for _, body := range []string{
		`{"model":"m","messages":[{"role":"user","content":"hi"}],"n":2}`,
		`{"model":"m","prompt":"hi","echo":true}`,
		`{"model":"m","prompt":"hi","prompt_logprobs":1}`,
		`{"model":"m","messages":[{"role":"user","content":"hi"}],"a_field_the_sidecar_does_not_know":1}`,
	} {
		path := "/v1/chat/completions"
		if strings.Contains(body, "prompt") {
			path = "/v1/completions"
		}
		resp := post(t, base+path, body, nil)
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if rec, err := engine.Last(t.Context()); err != nil || rec.Stream {
			t.Errorf("%s was upgraded to a stream", body)
		}
	}
}

func TestUpgradedStreamFailures(t *testing.T) {
	engine := startEmulator(t, emulator.Config{Timing: emulator.Timing{OutputTokens: 6}})
	base := startUpgradingProxy(t, engine)
	body := `{"model":"m","messages":[{"role":"user","content":"hi"}],"include_metrics":true}`

	// An error event in the stream: the status and body the engine gives
	// an unstreamed request that fails.
	status, _, raw := postJSON(t, base+"/v1/chat/completions", body, map[string]string{emulator.HeaderErrorAfter: "2"})
	if status != 500 || raw != `{"error":{"message":"emulated engine failure","type":"InternalServerError","param":null,"code":500}}` {
		t.Fatalf("in-stream error became %d %s", status, raw)
	}
	// An error status before the stream: passed as it is.
	status, _, raw = postJSON(t, base+"/v1/chat/completions", body, map[string]string{emulator.HeaderStatus: "429"})
	if status != 429 || !strings.Contains(raw, `"code":429`) {
		t.Fatalf("error status became %d %s", status, raw)
	}
	// The engine drops the stream: a 502, never a partial body.
	resp := post(t, base+"/v1/chat/completions", body, map[string]string{emulator.HeaderCutAfter: "2"})
	openAIError(t, resp, http.StatusBadGateway, "upstream_interrupted")
}

// Newer vLLM sends "reasoning" and "reasoning_content" alike in each
// delta: each is reassembled once, under its own name.
func TestUpgradeKeepsBothReasoningNames(t *testing.T) {
	ev := func(s string) string {
		return `data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"reasoning":"` + s + `","reasoning_content":"` + s + `"},"finish_reason":null}]}` + "\n\n"
	}
	fin := `data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":"ok"},"finish_reason":"stop","stop_reason":null}]}` + "\n\n"
	engine := newScriptedEngine(t, func(c net.Conn, _ *http.Request, _ []byte) {
		defer c.Close()
		io.WriteString(c, sseHead+chunk(roleEvent)+chunk(ev("ab"))+chunk(ev("cd"))+chunk(fin)+chunk("data: [DONE]\n\n")+"0\r\n\r\n")
	})
	base := startUpgradingProxy(t, engine)
	_, doc, raw := postJSON(t, base+"/v1/chat/completions", `{"model":"m","messages":[]}`, nil)
	msg := doc["choices"].([]any)[0].(map[string]any)["message"].(map[string]any)
	if msg["reasoning"] != "abcd" || msg["reasoning_content"] != "abcd" {
		t.Fatalf("reasoning assembled wrong: %s", raw)
	}
}

// With the engine computing its own metrics, an upgraded response gets
// the engine's object, with the sidecar's beside it, as a streamed one
// does.
func TestUpgradeKeepsTheEnginesMetrics(t *testing.T) {
	engine := startEmulator(t, emulator.Config{PerRequestMetrics: true, Timing: emulator.Timing{TTFT: 10 * time.Millisecond, ITL: 2 * time.Millisecond, OutputTokens: 4}})
	base := startProxy(t, engine.URL(), func(c *Config) { c.UpgradeNonStreaming = true })
	_, _, raw := postJSON(t, base+"/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"hi"}]}`, nil)
	if m := metricsOf(t, raw); m["time_to_first_token_ms"] == nil || m["timing_sidecar.time_to_first_token_ms"] == nil || m["overhead_ms"] == nil {
		t.Fatalf("not the engine's metrics with the sidecar's beside them on an upgraded response: %s", raw)
	}
}

// An event over several data lines is not read; reassembling without it
// would lose output, so the client gets a 502, not a short 200.
func TestUpgradeRefusesEventsItCannotRead(t *testing.T) {
	split := "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\ndata: \"choices\":[{\"index\":0,\"delta\":{\"content\":\"LOST\"},\"finish_reason\":null}]}\n\n"
	fin := `data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":"!"},"finish_reason":"stop"}]}` + "\n\n"
	engine := newScriptedEngine(t, func(c net.Conn, _ *http.Request, _ []byte) {
		defer c.Close()
		io.WriteString(c, sseHead+chunk(roleEvent)+chunk(split)+chunk(fin)+chunk("data: [DONE]\n\n")+"0\r\n\r\n")
	})
	base := startUpgradingProxy(t, engine)
	status, _, raw := postJSON(t, base+"/v1/chat/completions", `{"model":"m","messages":[]}`, nil)
	if status == 200 && !strings.Contains(raw, "LOST") {
		t.Fatalf("200 with content silently dropped: %s", raw)
	}
}

// A close-delimited stream that stops mid-generation ends cleanly as far
// as HTTP goes; without [DONE] or finish reasons it is a 502, not a 200.
func TestUpgradeNoticesAStreamCutShort(t *testing.T) {
	engine := newScriptedEngine(t, func(c net.Conn, _ *http.Request, _ []byte) {
		io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n"+roleEvent+tokenEvent("a"))
		c.Close()
	})
	base := startUpgradingProxy(t, engine)
	status, _, raw := postJSON(t, base+"/v1/chat/completions", `{"model":"m","messages":[]}`, nil)
	var d struct {
		Choices []struct {
			FinishReason *string `json:"finish_reason"`
		}
	}
	json.Unmarshal([]byte(raw), &d)
	if status == 200 && (len(d.Choices) == 0 || d.Choices[0].FinishReason == nil) {
		t.Fatalf("truncated stream answered 200: %s", raw)
	}
}

// TestUpgradeToleratesWhatClientsTolerate: a byte-order mark before the
// stream's first event (WHATWG's SSE parser strips it), and a last event
// without its blank line after every choice has finished, are what a
// streaming client reads without a fault: the upgraded response is whole.
// An in-stream error goes out with its status's own reason phrase.
func TestUpgradeToleratesWhatClientsTolerate(t *testing.T) {
	w := func(s, finish string) string {
		fr := "null"
		if finish != "" {
			fr = `"` + finish + `"`
		}
		return `data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":"` + s + `"},"finish_reason":` + fr + `}]}` + "\n\n"
	}
	for _, tc := range []struct{ name, stream string }{
		{"a byte-order mark first", "\ufeff" + w("w0 ", "") + w("w1 ", "") + w("end", "stop") + "data: [DONE]\n\n"},
		{"[DONE] without its blank line", w("w0 ", "") + w("w1 ", "") + w("end", "stop") + "data: [DONE]\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			engine := newScriptedEngine(t, func(c net.Conn, _ *http.Request, _ []byte) {
				defer c.Close()
				io.WriteString(c, sseHead+chunk(tc.stream)+"0\r\n\r\n")
			})
			base := startUpgradingProxy(t, engine)
			status, doc, raw := postJSON(t, base+"/v1/chat/completions", `{"model":"m","messages":[],"include_metrics":true}`, nil)
			if status != 200 {
				t.Fatalf("%d %s", status, raw)
			}
			msg := doc["choices"].([]any)[0].(map[string]any)["message"].(map[string]any)
			if msg["content"] != "w0 w1 end" {
				t.Fatalf("content %q, want the whole answer: %s", msg["content"], raw)
			}
			if m := metricsOf(t, raw); m["time_to_first_token_ms"] == nil {
				t.Errorf("the first token was not marked: %s", raw)
			}
		})
	}
	t.Run("an in-stream error's status line", func(t *testing.T) {
		engine := startEmulator(t, emulator.Config{Timing: emulator.Timing{OutputTokens: 6}})
		base := startUpgradingProxy(t, engine)
		resp, _ := rawExchange(t, base, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"+
			emulator.HeaderErrorAfter+": 2\r\nContent-Length: 48\r\n\r\n"+`{"model":"m","messages":[{"role":"user","c":1}]}`)
		if resp.StatusCode != 500 || resp.Status != "500 Internal Server Error" {
			t.Fatalf("status line %q, want 500 Internal Server Error", resp.Status)
		}
	})
}
