package emulator

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"
)

func start(t *testing.T, cfg Config) *Server {
	t.Helper()
	s := New(cfg)
	if err := s.Start("127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func call(t *testing.T, s *Server, path, body string, headers ...string) (*http.Response, []string) {
	t.Helper()
	req, _ := http.NewRequest("POST", s.URL()+path, strings.NewReader(body))
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		b, _ := io.ReadAll(resp.Body)
		return resp, []string{string(b)}
	}
	var events []string
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if line := sc.Text(); strings.HasPrefix(line, "data: ") {
			events = append(events, strings.TrimPrefix(line, "data: "))
		}
	}
	return resp, events
}

func TestChatStreamIsVLLMShaped(t *testing.T) {
	s := start(t, Config{Timing: Timing{TokensPerEvent: 2, OutputTokens: 5}})
	_, ev := call(t, s, "/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"hi there"}],"stream":true,"stream_options":{"include_usage":true}}`)
	want := []string{
		`{"id":"chatcmpl-1","object":"chat.completion.chunk","created":C,"model":"emulated/llama-3.1-8b-instruct","choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}`,
		`{"id":"chatcmpl-1","object":"chat.completion.chunk","created":C,"model":"emulated/llama-3.1-8b-instruct","choices":[{"index":0,"delta":{"content":"the quick"},"logprobs":null,"finish_reason":null}]}`,
		`{"id":"chatcmpl-1","object":"chat.completion.chunk","created":C,"model":"emulated/llama-3.1-8b-instruct","choices":[{"index":0,"delta":{"content":" brown fox"},"logprobs":null,"finish_reason":null}]}`,
		`{"id":"chatcmpl-1","object":"chat.completion.chunk","created":C,"model":"emulated/llama-3.1-8b-instruct","choices":[{"index":0,"delta":{"content":" jumps"},"logprobs":null,"finish_reason":"stop","stop_reason":null}]}`,
		`{"id":"chatcmpl-1","object":"chat.completion.chunk","created":C,"model":"emulated/llama-3.1-8b-instruct","choices":[],"usage":{"prompt_tokens":P,"total_tokens":T,"completion_tokens":5}}`,
		`[DONE]`,
	}
	rec, _ := s.Last(context.Background())
	repl := strings.NewReplacer("C", strconv.FormatInt(s.created, 10), "P", strconv.Itoa(rec.PromptTokens), "T", strconv.Itoa(rec.PromptTokens+5))
	if len(ev) != len(want) {
		t.Fatalf("got %d events:\n%s", len(ev), strings.Join(ev, "\n"))
	}
	for i := range want {
		if w := repl.Replace(want[i]); ev[i] != w {
			t.Errorf("event %d:\n got %s\nwant %s", i, ev[i], w)
		}
	}
}

func TestUsageOnlyWhenAsked(t *testing.T) {
	s := start(t, Config{})
	_, ev := call(t, s, "/v1/completions", `{"prompt":"a b","stream":true}`)
	for _, e := range ev {
		if strings.Contains(e, "usage") {
			t.Fatalf("usage sent without include_usage: %s", e)
		}
	}
	_, ev = call(t, s, "/v1/completions", `{"prompt":"a b","stream":true,"max_tokens":3,"stream_options":{"include_usage":true,"continuous_usage_stats":true}}`)
	// 3 token events with running usage, the final usage event, [DONE]
	if len(ev) != 5 || !strings.Contains(ev[0], `"completion_tokens":1}`) || !strings.Contains(ev[2], `"finish_reason":"length"`) ||
		!strings.Contains(ev[3], `"choices":[],"usage":{"prompt_tokens":`) || !strings.Contains(ev[3], `"completion_tokens":3}`) {
		t.Fatalf("continuous usage stream:\n%s", strings.Join(ev, "\n"))
	}
}

// TestRequestsReadAsVLLMReadsThem: lax booleans, exact keys, escapes.
func TestRequestsReadAsVLLMReadsThem(t *testing.T) {
	s := start(t, Config{Timing: Timing{OutputTokens: 2}})
	usage := func(ev []string) bool { return strings.Contains(strings.Join(ev, "\n"), `"choices":[],"usage"`) }
	for _, tt := range []struct {
		name, body string
		status     int
		stream     bool
		usage      bool
	}{
		{"stream \"yes\"", `{"prompt":"a","stream":"yes"}`, 200, true, false},
		{"stream 1.0, usage by default", `{"prompt":"a","stream":1.0,"stream_options":{}}`, 200, true, true},
		{"include_usage 0", `{"prompt":"a","stream":true,"stream_options":{"include_usage":0}}`, 200, true, false},
		{"include_usage \"OFF\"", `{"prompt":"a","stream":true,"stream_options":{"include_usage":"OFF"}}`, 200, true, false},
		{"escaped stream_options", `{"prompt":"a","stream":true,"\u0073tream_options":{"include_usage":true}}`, 200, true, true},
		{"Stream is not stream", `{"prompt":"a","Stream":true}`, 200, false, false},
		{"stream refused", `{"prompt":"a","stream":"nope"}`, 400, false, false},
		{"stream 2 refused", `{"prompt":"a","stream":2}`, 400, false, false},
		{"include_usage refused", `{"prompt":"a","stream":true,"stream_options":{"include_usage":"yeſ"}}`, 400, false, false},
	} {
		resp, ev := call(t, s, "/v1/completions", tt.body)
		stream := strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream")
		if resp.StatusCode != tt.status || stream != tt.stream || (stream && usage(ev) != tt.usage) {
			t.Errorf("%s: status %d, stream %v, events:\n%s", tt.name, resp.StatusCode, stream, strings.Join(ev, "\n"))
		}
	}
}

func TestSeveralChoicesInterleave(t *testing.T) {
	s := start(t, Config{Timing: Timing{OutputTokens: 2}})
	_, ev := call(t, s, "/v1/chat/completions", `{"messages":[{"role":"user","content":"x"}],"n":2,"stream":true,"stream_options":{"include_usage":true}}`)
	var idx []int
	for _, e := range ev[:len(ev)-2] {
		var c struct {
			Choices []struct{ Index int } `json:"choices"`
		}
		json.Unmarshal([]byte(e), &c)
		idx = append(idx, c.Choices[0].Index)
	}
	if got := fmt.Sprint(idx); got != "[0 1 0 1 0 1]" {
		t.Fatalf("choice order %v, want role 0,1 then tokens 0,1,0,1", idx)
	}
	if !strings.Contains(ev[len(ev)-2], `"completion_tokens":4}`) {
		t.Errorf("usage does not count both choices: %s", ev[len(ev)-2])
	}
}

func TestNonStreaming(t *testing.T) {
	s := start(t, Config{Timing: Timing{OutputTokens: 3}})
	resp, body := call(t, s, "/v1/chat/completions", `{"messages":[{"role":"user","content":"x"}]}`)
	var c struct {
		Object  string
		Choices []struct {
			Message      struct{ Role, Content string }
			FinishReason string `json:"finish_reason"`
		}
		Usage struct {
			CompletionTokens int `json:"completion_tokens"`
		}
	}
	if err := json.Unmarshal([]byte(body[0]), &c); err != nil || resp.StatusCode != 200 {
		t.Fatalf("%d %s", resp.StatusCode, body[0])
	}
	if c.Object != "chat.completion" || c.Choices[0].Message.Content != "the quick brown" || c.Usage.CompletionTokens != 3 {
		t.Fatalf("unexpected body %s", body[0])
	}
}

func TestErrors(t *testing.T) {
	s := start(t, Config{Strict: true})
	resp, body := call(t, s, "/v1/chat/completions", `{"messages":[],"include_metrics":true}`)
	if resp.StatusCode != 400 || !strings.Contains(body[0], `"type":"BadRequestError"`) || !strings.Contains(body[0], "include_metrics") {
		t.Errorf("strict server accepted an unknown field: %d %s", resp.StatusCode, body[0])
	}
	for path, req := range map[string]string{
		"/v1/responses": `{"model":"m","input":"x","instructions":"be brief","max_output_tokens":8}`,
		"/v1/messages":  `{"model":"m","system":"be brief","messages":[{"role":"user","content":"x"}],"max_tokens":8,"stop_sequences":["z"]}`,
	} {
		if resp, body := call(t, s, path, req); resp.StatusCode != 200 {
			t.Errorf("strict server refused its own API's fields on %s: %d %s", path, resp.StatusCode, body[0])
		}
	}
	resp, body = call(t, s, "/v1/chat/completions", `{"messages":[]}`, HeaderStatus, "503")
	if resp.StatusCode != 503 || !strings.HasPrefix(body[0], `{"error":{"message":`) {
		t.Errorf("injected status: %d %s", resp.StatusCode, body[0])
	}
	_, ev := call(t, s, "/v1/chat/completions", `{"messages":[{"role":"user","content":"x"}],"stream":true}`, HeaderErrorAfter, "2")
	if n := len(ev); n < 2 || !strings.HasPrefix(ev[n-2], `{"error":{"message":"emulated engine failure","type":"InternalServerError","param":null,"code":500}}`) || ev[n-1] != "[DONE]" {
		t.Errorf("in-stream error:\n%s", strings.Join(ev, "\n"))
	}
}

// TestRecordsTiming: each wait the engine was asked for lies between its
// stamps, and its stamps lie within what its client saw (sent before the
// engine received, read after the engine began writing), so the checks
// hold however late the scheduler runs either side.
func TestRecordsTiming(t *testing.T) {
	s := start(t, Config{Timing: Timing{HeaderDelay: 20 * time.Millisecond, TTFT: 30 * time.Millisecond, ITL: 20 * time.Millisecond, OutputTokens: 3}})
	req, _ := http.NewRequest("POST", s.URL()+"/v1/chat/completions", strings.NewReader(`{"messages":[{"role":"user","content":"x"}],"stream":true}`))
	req.Header.Set(HeaderRequestID, "abc")
	sent := time.Now()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	headers := time.Now()
	var tokens []time.Time // when the client had read each token event
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if strings.Contains(sc.Text(), `"content":"`) && !strings.Contains(sc.Text(), `"content":""`) {
			tokens = append(tokens, time.Now())
		}
	}
	resp.Body.Close()
	rec, err := s.Wait(context.Background(), "chatcmpl-abc")
	if err != nil {
		t.Fatal(err)
	}
	if rec.TokenEvents != 3 || len(tokens) != 3 || !rec.ClientGone.IsZero() {
		t.Fatalf("record %+v, client read %d token events", rec, len(tokens))
	}
	check := func(name string, got, least, most time.Duration) {
		t.Helper()
		if got < least || got > most {
			t.Errorf("%s = %v, want between %v (the wait asked for) and %v (what the client saw)", name, got, least, most)
		}
	}
	check("header delay", rec.HeadersSent.Sub(rec.Received), 20*time.Millisecond, headers.Sub(sent))
	check("ttft", rec.FirstToken.Sub(rec.HeadersSent), 30*time.Millisecond, tokens[0].Sub(sent)-20*time.Millisecond)
	check("generation", rec.LastToken.Sub(rec.FirstToken), 40*time.Millisecond, tokens[2].Sub(sent)-50*time.Millisecond)
	check("largest gap", rec.MaxTokenGap, 20*time.Millisecond, rec.LastToken.Sub(rec.FirstToken))
	check("first token to the client", tokens[0].Sub(rec.FirstToken), 0, time.Hour)
	check("last token to the client", tokens[2].Sub(rec.LastToken), 0, time.Hour)
}

// TestEngineMetricsAreTheRecords: the engine's own per-request metrics
// (vLLM's) are computed from the same stamps as its Record, so a test may
// take either for the engine's view.
func TestEngineMetricsAreTheRecords(t *testing.T) {
	s := start(t, Config{PerRequestMetrics: true, Timing: Timing{HeaderDelay: 5 * time.Millisecond, TTFT: 10 * time.Millisecond, ITL: 5 * time.Millisecond, OutputTokens: 4}})
	_, ev := call(t, s, "/v1/chat/completions", `{"messages":[{"role":"user","content":"x"}],"stream":true,"stream_options":{"include_usage":true},"include_metrics":true}`,
		HeaderRequestID, "m")
	var got struct{ Metrics engineMetrics }
	if len(ev) < 2 || json.Unmarshal([]byte(ev[len(ev)-2]), &got) != nil {
		t.Fatalf("no usage event with metrics:\n%s", strings.Join(ev, "\n"))
	}
	rec, err := s.Wait(context.Background(), "chatcmpl-m")
	if err != nil {
		t.Fatal(err)
	}
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	gen := ms(rec.LastToken.Sub(rec.FirstToken))
	want := engineMetrics{QueueTime: ms(rec.HeadersSent.Sub(rec.Received)), TimeToFirstToken: ms(rec.FirstToken.Sub(rec.HeadersSent)),
		GenerationTime: gen, TokensPerSecond: 4 / rec.LastToken.Sub(rec.HeadersSent).Seconds()}
	if got.Metrics.MeanITL == nil || *got.Metrics.MeanITL != gen/3 {
		t.Errorf("mean_itl_ms %v, want %v", got.Metrics.MeanITL, gen/3)
	}
	got.Metrics.MeanITL = nil
	if got.Metrics != want {
		t.Errorf("engine metrics %+v, record says %+v", got.Metrics, want)
	}
}

func TestOtherRoutes(t *testing.T) {
	s := start(t, Config{})
	for _, path := range []string{"/v1/models", "/health", "/metrics"} {
		resp, err := http.Get(s.URL() + path)
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("%s: %v %v", path, resp, err)
		}
		resp.Body.Close()
	}
	resp, _ := http.Get(s.URL() + "/metrics")
	b, _ := io.ReadAll(resp.Body)
	if !strings.Contains(string(b), `emulator_requests_total{path="/health"} 1`) {
		t.Errorf("metrics: %s", b)
	}
}

func TestOutputs(t *testing.T) {
	s := start(t, Config{Timing: Timing{OutputTokens: 6}})
	body := `{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true}`
	_, ev := call(t, s, "/v1/chat/completions", body, HeaderOutput, OutputUnicode)
	all := strings.Join(ev, "\n")
	if !strings.Contains(all, `"content":" \ud83d"}`) || !strings.Contains(all, `"content":"\ude80"}`) {
		t.Errorf("the emoji is not split across two events:\n%s", all)
	}
	_, ev = call(t, s, "/v1/chat/completions", body, HeaderOutput, OutputTools)
	all = strings.Join(ev, "\n")
	if !strings.Contains(all, `"tool_calls":[{"index":0,"id":"chatcmpl-tool-`) || !strings.Contains(all, `"finish_reason":"tool_calls"`) ||
		strings.Count(all, `"arguments":`) < 5 {
		t.Errorf("tool call events:\n%s", all)
	}
	_, ev = call(t, s, "/v1/chat/completions", body, HeaderOutput, OutputReasoningField)
	all = strings.Join(ev, "\n")
	if !strings.Contains(all, `"delta":{"reasoning_content":"the","reasoning":"the"}`) || !strings.Contains(all, `"delta":{"content":"fox"}`) {
		t.Errorf("reasoning events:\n%s", all)
	}
	resp, ev := call(t, s, "/v1/completions", `{"model":"m","prompt":"hi","stream":true}`, HeaderOutput, OutputTools)
	if resp.StatusCode != 400 {
		t.Errorf("tools on completions: %d %v", resp.StatusCode, ev)
	}
}

func TestContextLength(t *testing.T) {
	chat := func(fields string) string {
		return `{"model":"m","messages":[{"role":"user","content":"hi there"}]` + fields + `}` // 2 prompt tokens
	}
	tooLarge := func(asked, limit int) string {
		return fmt.Sprintf("'max_tokens' or 'max_completion_tokens' is too large: %d. This model's maximum context length is %d tokens "+
			"and your request has 2 input tokens (%d > %d - 2).", asked, limit, asked, limit)
	}
	for _, tc := range []struct {
		name   string
		limit  int // Config.MaxModelLen
		body   string
		status int
		msg    string // the 400's message
	}{
		{"prompt and output fill the default context", 0, chat(`,"max_tokens":8190`), 200, ""},
		{"one token more", 0, chat(`,"max_tokens":8191`), 400, tooLarge(8191, DefaultMaxModelLen)},
		{"max_completion_tokens counts alike", 0, chat(`,"max_completion_tokens":8191`), 400, tooLarge(8191, DefaultMaxModelLen)},
		{"a stream is refused before its headers", 0, chat(`,"stream":true,"max_tokens":5000000`), 400, tooLarge(5000000, DefaultMaxModelLen)},
		{"the largest int", 0, chat(`,"max_tokens":9223372036854775807`), 400, tooLarge(9223372036854775807, DefaultMaxModelLen)},
		{"a configured context", 100, chat(`,"max_tokens":98`), 200, ""},
		{"beyond a configured context", 100, chat(`,"max_tokens":99`), 400, tooLarge(99, 100)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := start(t, Config{MaxModelLen: tc.limit})
			resp, body := call(t, s, "/v1/chat/completions", tc.body)
			if resp.StatusCode != tc.status {
				t.Fatalf("status %d, want %d: %s", resp.StatusCode, tc.status, body[0])
			}
			if tc.status != 400 {
				return
			}
			var e apiError
			if err := json.Unmarshal([]byte(body[0]), &e); err != nil || !strings.HasPrefix(body[0], `{"error":{"message":`) {
				t.Fatalf("not an OpenAI error body: %s", body[0])
			}
			if e.Error.Message != tc.msg || e.Error.Type != "BadRequestError" || e.Error.Param != nil || e.Error.Code != 400 {
				t.Errorf("error %+v, want message %q", e.Error, tc.msg)
			}
		})
	}
	t.Run("models reports the context", func(t *testing.T) {
		s := start(t, Config{MaxModelLen: 100})
		resp, err := http.Get(s.URL() + "/v1/models")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var m struct {
			Data []struct {
				MaxModelLen int `json:"max_model_len"`
			}
		}
		if err := json.NewDecoder(resp.Body).Decode(&m); err != nil || len(m.Data) != 1 || m.Data[0].MaxModelLen != 100 {
			t.Errorf("models: %+v %v", m, err)
		}
	})
}

// The engine keeps the latest records only: a long run does not grow it
// by every request's body and headers.
func TestTheEngineKeepsTheLatestRecords(t *testing.T) {
	s := start(t, Config{Timing: Timing{OutputTokens: 2}})
	s.keep = 3
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for i := 1; i <= 5; i++ {
		id := fmt.Sprint("r", i)
		call(t, s, "/v1/completions", `{"model":"m","prompt":"hi"}`, HeaderRequestID, id)
		if _, err := s.Wait(ctx, "cmpl-"+id); err != nil {
			t.Fatal(err)
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, kept := range []bool{false, false, true, true, true} {
		if _, ok := s.records[fmt.Sprint("cmpl-r", i+1)]; ok != kept {
			t.Errorf("request %d: kept %v, want %v", i+1, ok, kept)
		}
	}
	if len(s.order) != 3 {
		t.Errorf("%d records in order, want 3", len(s.order))
	}
}
