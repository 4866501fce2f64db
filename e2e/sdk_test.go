package e2e

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/timing-sidecar/timing-sidecar/e2e/emulator"
)

// timing paces the engine so every figure is 20 ms or more.
var timing = emulator.Timing{HeaderDelay: 20 * time.Millisecond, TTFT: 40 * time.Millisecond, ITL: 20 * time.Millisecond,
	TokensPerEvent: 2, OutputTokens: 8}

func sdk(base string) openai.Client {
	return openai.NewClient(option.WithBaseURL(base+"/v1/"), option.WithAPIKey("sk-e2e"), option.WithMaxRetries(0))
}

var chatParams = openai.ChatCompletionNewParams{
	Model:    "emulated",
	Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Tell me about foxes")},
}

var withMetrics = option.WithJSONSet("include_metrics", true)

// streamChat runs a streaming chat and returns the raw metrics of the usage
// chunk, the response id, what the client saw when, and the stream's error.
func streamChat(ctx context.Context, c openai.Client, params openai.ChatCompletionNewParams, opts ...option.RequestOption) (string, string, seen, error) {
	var client seen
	s := c.Chat.Completions.NewStreaming(ctx, params, append(opts, client.stamp())...)
	defer s.Close()
	var raw, id string
	for s.Next() {
		chunk := s.Current()
		f, hasMetrics := chunk.JSON.ExtraFields["metrics"]
		client.read(chatToken(chunk), hasMetrics)
		id = chunk.ID
		if hasMetrics {
			raw = f.Raw()
		}
	}
	return raw, id, client, s.Err()
}

// chatToken tells a chunk that carries generated output (the role chunk
// and the usage chunk do not).
func chatToken(chunk openai.ChatCompletionChunk) bool {
	for _, ch := range chunk.Choices {
		if ch.Delta.Content != "" || len(ch.Delta.ToolCalls) > 0 {
			return true
		}
	}
	return false
}

// TestConfiguredByFlagsOrEnvironment runs the main paths against a sidecar
// configured once by flags and once by environment variables only.
func TestConfiguredByFlagsOrEnvironment(t *testing.T) {
	engine := startEngine(t, emulator.Config{Timing: timing, Strict: true})
	for _, cfg := range []struct {
		name string
		args []string
		env  []string
	}{
		{"flags", []string{"--listen", "127.0.0.1:0", "--upstream", engine.URL()}, nil},
		{"environment", nil, []string{"TIMING_SIDECAR_LISTEN=127.0.0.1:0", "TIMING_SIDECAR_UPSTREAM=" + engine.URL()}},
	} {
		t.Run(cfg.name, func(t *testing.T) {
			c := sdk(startSidecar(t, cfg.args, cfg.env...).base)
			ctx := context.Background()

			t.Run("streaming chat", func(t *testing.T) {
				p := chatParams
				p.StreamOptions = openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}
				raw, id, client, err := streamChat(ctx, c, p, withMetrics)
				if err != nil {
					t.Fatal(err)
				}
				checkStream(t, parseMetrics(t, raw), record(t, engine, id), client)
			})

			t.Run("streaming chat without include_usage", func(t *testing.T) {
				raw, id, client, err := streamChat(ctx, c, chatParams, withMetrics)
				if err != nil {
					t.Fatal(err)
				}
				checkStream(t, parseMetrics(t, raw), record(t, engine, id), client)
			})

			t.Run("continuous usage: metrics only on the final usage chunk", func(t *testing.T) { testContinuousUsage(t, ctx, c, engine) })
			t.Run("streaming completions", func(t *testing.T) { testStreamingCompletions(t, ctx, c, engine) })
			t.Run("non-streaming", func(t *testing.T) { testNonStreamingChat(t, ctx, c, engine) })
			t.Run("n=2 gets metrics null", func(t *testing.T) { testTwoChoicesGetMetricsNull(t, ctx, c) })

			t.Run("upstream 400 passes through", func(t *testing.T) {
				_, err := c.Chat.Completions.New(ctx, chatParams, withMetrics, option.WithHeader(emulator.HeaderStatus, "400"))
				var apiErr *openai.Error
				if !errors.As(err, &apiErr) || apiErr.StatusCode != 400 || !strings.Contains(apiErr.Message, "emulated error 400") {
					t.Fatalf("got %v, want the engine's 400", err)
				}
			})
		})
	}
}

// testContinuousUsage: with continuous usage stats, (nearly) every chunk
// carries running usage and only the final usage chunk the metrics.
func testContinuousUsage(t *testing.T, ctx context.Context, c openai.Client, engine *emulator.Server) {
	p := chatParams
	p.StreamOptions = openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}
	var client seen
	s := c.Chat.Completions.NewStreaming(ctx, p, withMetrics, option.WithJSONSet("stream_options.continuous_usage_stats", true), client.stamp())
	var raw, id string
	chunks, withUsage := 0, 0
	for s.Next() {
		ch := s.Current()
		f, ok := ch.JSON.ExtraFields["metrics"]
		client.read(chatToken(ch), ok)
		id, chunks = ch.ID, chunks+1
		if ch.Usage.CompletionTokens > 0 {
			withUsage++
		}
		if ok {
			if len(ch.Choices) != 0 || raw != "" {
				t.Errorf("metrics on a chunk other than the final usage chunk: %s", ch.RawJSON())
			}
			raw = f.Raw()
		}
	}
	if err := s.Err(); err != nil {
		t.Fatal(err)
	}
	if withUsage < chunks-1 {
		t.Errorf("only %d of %d chunks carried running usage", withUsage, chunks)
	}
	checkStream(t, parseMetrics(t, raw), record(t, engine, id), client)
}

// testStreamingCompletions: a streamed legacy completion arrives intact,
// with its metrics.
func testStreamingCompletions(t *testing.T, ctx context.Context, c openai.Client, engine *emulator.Server) {
	var client seen
	s := c.Completions.NewStreaming(ctx, openai.CompletionNewParams{
		Model:  "emulated",
		Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String("Once upon a time")},
	}, withMetrics, client.stamp())
	var raw, id string
	var text strings.Builder
	for s.Next() {
		id = s.Current().ID
		token := false
		for _, ch := range s.Current().Choices {
			text.WriteString(ch.Text)
			token = token || ch.Text != ""
		}
		f, ok := s.Current().JSON.ExtraFields["metrics"]
		client.read(token, ok)
		if ok {
			raw = f.Raw()
		}
	}
	if err := s.Err(); err != nil {
		t.Fatal(err)
	}
	if text.String() != " the quick brown fox jumps over the lazy" {
		t.Errorf("text %q", text.String())
	}
	checkStream(t, parseMetrics(t, raw), record(t, engine, id), client)
}

// testNonStreamingChat: a non-streaming chat is parsed intact; its metrics
// have no per-token figures, and its latency and rate fall within what
// the engine and the client saw.
func testNonStreamingChat(t *testing.T, ctx context.Context, c openai.Client, engine *emulator.Server) {
	var client seen
	resp, err := c.Chat.Completions.New(ctx, chatParams, withMetrics, client.stamp())
	end := time.Now()
	if err != nil {
		t.Fatal(err)
	}
	if resp.Choices[0].Message.Content != "the quick brown fox jumps over the lazy" || resp.Usage.CompletionTokens != 8 {
		t.Errorf("response not parsed intact: %+v", resp)
	}
	rec := record(t, engine, resp.ID)
	m := parseMetrics(t, resp.JSON.ExtraFields["metrics"].Raw())
	m.null(t, "time_to_first_token_ms", "generation_time_ms", "queue_time_ms", "mean_itl_ms", "max_itl_ms")
	// From arrival to the whole body: the engine began writing
	// it at HeadersSent, the client had it when the call returned.
	arrival, done := span{client.sent, rec.Received}, span{rec.HeadersSent, end}
	m.during(t, "e2e_latency_ms", arrival, done, 1)
	m.rate(t, "tokens_per_second", arrival, done, 8)
}

// testTwoChoicesGetMetricsNull: with n=2, streamed or not, metrics is null.
func testTwoChoicesGetMetricsNull(t *testing.T, ctx context.Context, c openai.Client) {
	p := chatParams
	p.N = openai.Int(2)
	resp, err := c.Chat.Completions.New(ctx, p, withMetrics)
	if err != nil {
		t.Fatal(err)
	}
	if got := resp.JSON.ExtraFields["metrics"].Raw(); got != "null" || len(resp.Choices) != 2 {
		t.Errorf("metrics %s with %d choices", got, len(resp.Choices))
	}
	p.StreamOptions = openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}
	raw, _, _, err := streamChat(ctx, c, p, withMetrics)
	if err != nil || raw != "null" {
		t.Errorf("stream: metrics %q, %v", raw, err)
	}
}

// TestOptedOutRequestMatchesDirectBytes: what gets no metrics comes
// through byte for byte: in mode opt-in, requests that do not ask; in mode
// vllm, a stream whose client asked no usage, and one of several choices.
func TestOptedOutRequestMatchesDirectBytes(t *testing.T) {
	engine := startEngine(t, emulator.Config{Timing: emulator.Timing{ITL: time.Millisecond, OutputTokens: 6}})
	optIn := startSidecar(t, []string{"--listen", "127.0.0.1:0", "--upstream", engine.URL(), "--per-request-metrics", "opt-in"})
	vllm := startSidecar(t, []string{"--listen", "127.0.0.1:0", "--upstream", engine.URL()})
	for _, tc := range []struct {
		sc   *sidecar
		body string
	}{
		{optIn, `{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true,"stream_options":{"include_usage":true}}`},
		{optIn, `{"model":"m","messages":[{"role":"user","content":"hi"}]}`},
		{optIn, `{"model":"m","prompt":["a","b"],"stream":true,"n":2}`},
		{vllm, `{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true}`},
		{vllm, `{"model":"m","prompt":["a","b"],"stream":true,"stream_options":{"include_usage":true}}`},
	} {
		body := tc.body
		get := func(base string) (int, string, string) {
			req, _ := http.NewRequest("POST", base+"/v1/"+map[bool]string{true: "completions", false: "chat/completions"}[strings.Contains(body, "prompt")], strings.NewReader(body))
			req.Header.Set(emulator.HeaderRequestID, "same")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			return resp.StatusCode, resp.Header.Get("Content-Type"), string(b)
		}
		ds, dct, direct := get(engine.URL())
		ps, pct, proxied := get(tc.sc.base)
		if ds != ps || dct != pct || direct != proxied {
			t.Errorf("through the sidecar %d %s\n%s\ndirect %d %s\n%s", ps, pct, proxied, ds, dct, direct)
		}
	}
}

func TestEngineKilledMidStream(t *testing.T) {
	engine := startEngine(t, emulator.Config{Timing: timing})
	c := sdk(startSidecar(t, []string{"--listen", "127.0.0.1:0", "--upstream", engine.URL()}).base)
	s := c.Chat.Completions.NewStreaming(context.Background(), chatParams, withMetrics, option.WithHeader(emulator.HeaderCutAfter, "2"))
	defer s.Close()
	var text strings.Builder
	for s.Next() {
		for _, ch := range s.Current().Choices {
			text.WriteString(ch.Delta.Content)
		}
	}
	if s.Err() == nil {
		t.Fatal("a stream the engine dropped ended without an error")
	}
	if text.String() != "the quick brown fox" {
		t.Errorf("client got %q before the failure, want the two events the engine sent", text.String())
	}
}

func TestClientCancelMidStreamAbortsTheEngine(t *testing.T) {
	engine := startEngine(t, emulator.Config{Timing: emulator.Timing{ITL: 20 * time.Millisecond, OutputTokens: 500}})
	c := sdk(startSidecar(t, []string{"--listen", "127.0.0.1:0", "--upstream", engine.URL()}).base)
	ctx, cancel := context.WithCancel(context.Background())
	s := c.Chat.Completions.NewStreaming(ctx, chatParams, withMetrics)
	var id string
	for i := 0; i < 4 && s.Next(); i++ {
		id = s.Current().ID
	}
	left := time.Now()
	cancel()
	s.Close()
	rec := record(t, engine, id)
	if rec.ClientGone.IsZero() {
		t.Fatal("the engine never saw its client leave")
	}
	// The promise is "within 100 ms" (the accuracy report measures it);
	// the test holds what no scheduler can break: after the client left,
	// long before the stream's 10 s were out.
	if d := rec.ClientGone.Sub(left); d < 0 || d > 2*time.Second {
		t.Fatalf("the engine saw the client leave %v after it did, want between 0 and 2s", d)
	}
	if rec.TokenEvents >= 500 {
		t.Fatal("the engine generated the whole response for nobody")
	}
}

func TestModes(t *testing.T) {
	engine := startEngine(t, emulator.Config{Timing: timing})
	ctx := context.Background()
	t.Run("off", func(t *testing.T) {
		c := sdk(startSidecar(t, []string{"--listen", "127.0.0.1:0", "--upstream", engine.URL(), "--per-request-metrics", "off"}).base)
		resp, err := c.Chat.Completions.New(ctx, chatParams, withMetrics)
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := resp.JSON.ExtraFields["metrics"]; ok {
			t.Error("metrics added in off mode")
		}
		if rec := record(t, engine, resp.ID); !strings.Contains(string(rec.Body), `"include_metrics":true`) {
			t.Errorf("off mode changed the request: %s", rec.Body)
		}
	})
	t.Run("always", func(t *testing.T) {
		c := sdk(startSidecar(t, nil, "TIMING_SIDECAR_LISTEN=127.0.0.1:0", "TIMING_SIDECAR_UPSTREAM="+engine.URL(),
			"TIMING_SIDECAR_PER_REQUEST_METRICS=always").base)
		raw, id, client, err := streamChat(ctx, c, chatParams)
		if err != nil {
			t.Fatal(err)
		}
		checkStream(t, parseMetrics(t, raw), record(t, engine, id), client)
	})
}

func TestUnreachableEngineThenRecovery(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	// A refused connection is answered at once, not after the connect
	// timeout: the timeout is far longer than any scheduler's pause.
	const connectTimeout = time.Minute
	c := sdk(startSidecar(t, []string{"--listen", "127.0.0.1:0", "--upstream", "http://" + addr,
		"--upstream-connect-timeout", connectTimeout.String()}).base)
	start := time.Now()
	_, err = c.Chat.Completions.New(context.Background(), chatParams, withMetrics)
	var apiErr *openai.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != 502 || apiErr.Code != "upstream_unavailable" || apiErr.Type != "upstream_error" {
		t.Fatalf("got %v, want a JSON 502", err)
	}
	if d := time.Since(start); d > connectTimeout/4 {
		t.Errorf("the 502 took %v: the refusal waited for the %v connect timeout", d, connectTimeout)
	}
	engine := emulator.New(emulator.Config{Timing: timing})
	if err := engine.Start(addr); err != nil {
		t.Skipf("the freed port was taken meanwhile: %v", err)
	}
	t.Cleanup(func() { engine.Close() })
	resp, err := c.Chat.Completions.New(context.Background(), chatParams, withMetrics)
	if err != nil {
		t.Fatalf("no recovery once the engine is up: %v", err)
	}
	parseMetrics(t, resp.JSON.ExtraFields["metrics"].Raw())
}

func TestAdminEndpointsAndAccessLog(t *testing.T) {
	engine := startEngine(t, emulator.Config{Timing: timing})
	sc := startSidecar(t, []string{"--listen", "127.0.0.1:0", "--upstream", engine.URL(), "--readiness-interval", "50ms"})
	c := sdk(sc.base)
	if _, _, _, err := streamChat(context.Background(), c, chatParams); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Chat.Completions.New(context.Background(), chatParams, withMetrics); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 2; i++ {
		select {
		case line := <-sc.accessLog:
			if !contains(line, `"msg":"request"`, `"path":"/v1/chat/completions"`, `"status":200`, `"completion_tokens":8`) {
				t.Errorf("access log line %s", line)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("no access-log line on stdout")
		}
	}
	get := func(path string) (int, string) {
		resp, err := http.Get(sc.admin + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, body := get("/metrics"); code != 200 || !contains(body,
		`timing_sidecar_requests_total{endpoint="chat_completions",leg="whole",model="emulated",status="200",stream="true"} 1`,
		`timing_sidecar_generation_tokens_total{endpoint="chat_completions",leg="whole",model="emulated"} 16`,
		`timing_sidecar_time_to_first_token_seconds_count{cache="unknown",endpoint="chat_completions",leg="whole",model="emulated"} 1`) {
		t.Errorf("/metrics %d:\n%s", code, body)
	}
	deadline := time.Now().Add(5 * time.Second)
	for code, _ := get("/readyz"); code != 200; code, _ = get("/readyz") {
		if time.Now().After(deadline) {
			t.Fatal("/readyz never became ready with the engine up")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if code, _ := get("/healthz"); code != 200 {
		t.Errorf("/healthz %d", code)
	}
}

func TestUpgradeNonStreamingWithTheSDK(t *testing.T) {
	engine := startEngine(t, emulator.Config{Timing: timing})
	ctx := context.Background()
	directClient := sdk(engine.URL())
	direct, err := directClient.Chat.Completions.New(ctx, chatParams)
	if err != nil {
		t.Fatal(err)
	}
	sc := startSidecar(t, nil, "TIMING_SIDECAR_LISTEN=127.0.0.1:0", "TIMING_SIDECAR_UPSTREAM="+engine.URL(),
		"TIMING_SIDECAR_UPGRADE_NON_STREAMING=true")
	c := sdk(sc.base)
	var client seen
	resp, err := c.Chat.Completions.New(ctx, chatParams, withMetrics, client.stamp())
	end := time.Now()
	if err != nil {
		t.Fatal(err)
	}
	rec := record(t, engine, resp.ID)
	if !rec.Stream {
		t.Fatal("the engine was not asked for a stream")
	}
	got, want := resp.Choices[0], direct.Choices[0]
	if got.Message.Content != want.Message.Content || got.FinishReason != want.FinishReason || resp.Usage.CompletionTokens != direct.Usage.CompletionTokens {
		t.Fatalf("upgraded %q/%s/%d, direct %q/%s/%d", got.Message.Content, got.FinishReason, resp.Usage.CompletionTokens,
			want.Message.Content, want.FinishReason, direct.Usage.CompletionTokens)
	}
	f, ok := resp.JSON.ExtraFields["metrics"]
	if !ok {
		t.Fatal("no metrics")
	}
	// The client sees nothing before the reassembled body: every mark's
	// upper bound is the call's return.
	checkStream(t, parseMetrics(t, f.Raw()), rec, client.whole(end, rec.TokenEvents))
}

// TestParallelismIsLogged: the start log names the sidecar's parallelism
// and where it came from: the CPU request passed in, or the user's
// GOMAXPROCS.
func TestParallelismIsLogged(t *testing.T) {
	engine := startEngine(t, emulator.Config{Timing: timing})
	for _, tc := range []struct {
		env  []string
		want string
	}{
		{[]string{"TIMING_SIDECAR_CPU_REQUEST=500m"}, `"parallelism":1,"parallelism_from":"cpu_request"`},
		{[]string{"GOMAXPROCS=64"}, `"parallelism":64,"parallelism_from":"GOMAXPROCS"`},
	} {
		s := startSidecar(t, []string{"--upstream", engine.URL()}, tc.env...)
		s.mu.Lock()
		logs := strings.Join(s.logs, "\n")
		s.mu.Unlock()
		if !strings.Contains(logs, tc.want) {
			t.Errorf("%v: the start log lacks %s:\n%s", tc.env, tc.want, logs)
		}
	}
}
