package proxy

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/timing-sidecar/timing-sidecar/rewrite"
)

// startProxy runs a sidecar in front of upstream on a loopback port and
// returns its base URL.
func startProxy(t *testing.T, upstream string, configure func(*Config)) string {
	t.Helper()
	_, base := startSidecar(t, upstream, configure, nil)
	return base
}

// startSidecar runs a sidecar with its access log going to accessLog and
// returns it and its base URL.
func startSidecar(t *testing.T, upstream string, configure func(*Config), accessLog io.Writer) (*Proxy, string) {
	t.Helper()
	cfg := DefaultConfig()
	cfg.Upstream = upstream
	cfg.Listen = "127.0.0.1:0"
	if configure != nil {
		configure(&cfg)
	}
	return serveSidecar(t, cfg, slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn})), accessLog)
}

// serveSidecar runs a sidecar with cfg (its Listen unused), logging to log,
// and returns it and its base URL.
func serveSidecar(t *testing.T, cfg Config, log *slog.Logger, accessLog io.Writer) (*Proxy, string) {
	t.Helper()
	p, err := New(cfg, log, accessLog)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go p.Serve(ln)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		p.Shutdown(ctx)
	})
	return p, "http://" + ln.Addr().String()
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

// client does not ask for gzip, so response bytes compare as sent.
var client = &http.Client{Transport: &http.Transport{DisableCompression: true}}

func post(t *testing.T, url, body string, headers map[string]string) *http.Response {
	t.Helper()
	req, err := http.NewRequest("POST", url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

// sseEvent is one event as the client read it.
type sseEvent struct {
	data string
	at   time.Time
}

// readEvents reads a stream to its end, stamping each event on arrival.
func readEvents(t *testing.T, body io.Reader) ([]sseEvent, error) {
	t.Helper()
	br := bufio.NewReader(body)
	var events []sseEvent
	var data string
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			return events, err
		}
		line = strings.TrimRight(line, "\r\n")
		switch {
		case line == "":
			events = append(events, sseEvent{data, time.Now()})
			data = ""
		case strings.HasPrefix(line, "data:"):
			data = strings.TrimPrefix(strings.TrimPrefix(line, "data:"), " ")
		}
	}
}

// metricsOf returns the number fields of the "metrics" member of a JSON
// object (a null field maps to nil); those of nested objects (the engine's
// report, the output split) under dotted names, "engine.total_ms".
func metricsOf(t *testing.T, doc string) map[string]*float64 {
	t.Helper()
	var v struct {
		Metrics map[string]json.RawMessage `json:"metrics"`
	}
	if err := json.Unmarshal([]byte(doc), &v); err != nil {
		t.Fatalf("invalid JSON %q: %v", doc, err)
	}
	if v.Metrics == nil {
		t.Fatalf("no metrics in %s", doc)
	}
	out := map[string]*float64{}
	var flatten func(prefix string, fields map[string]json.RawMessage)
	flatten = func(prefix string, fields map[string]json.RawMessage) {
		for k, raw := range fields {
			var nested map[string]json.RawMessage
			if json.Unmarshal(raw, &nested) == nil && nested != nil {
				flatten(prefix+k+".", nested)
				continue
			}
			var f *float64
			if err := json.Unmarshal(raw, &f); err != nil {
				var s string
				if json.Unmarshal(raw, &s) == nil {
					continue // a name, such as engine.source
				}
				t.Fatalf("metrics.%s%s is not a number: %s", prefix, k, raw)
			}
			out[prefix+k] = f
		}
	}
	flatten("", v.Metrics)
	return out
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func isNull(t *testing.T, m map[string]*float64, fields ...string) {
	t.Helper()
	for _, f := range fields {
		if _, ok := m[f]; !ok {
			t.Errorf("%s missing, want null", f)
		} else if m[f] != nil {
			t.Errorf("%s = %v, want null", f, *m[f])
		}
	}
}

func TestStreamMetricsMatchTheEngine(t *testing.T) {
	engine := newFakeEngine(t)
	base := startProxy(t, engine.URL(), nil)
	for _, tc := range []struct {
		name, path string
		perEvent   int
	}{
		{"chat, one token per event", "/v1/chat/completions", 1},
		{"completions, three tokens per event", "/v1/completions", 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			start, headers, events, fr := timedStream(t, engine, base+tc.path, `{"model":"m","stream":true,"include_metrics":true,"stream_options":{"include_usage":true},"prompt":"x","messages":[]}`, map[string]string{
				"X-Fake-Header-Delay": "30", "X-Fake-TTFT": "40", "X-Fake-ITL": "20", "X-Fake-Tokens": "5",
				"X-Fake-Per-Event": strconv.Itoa(tc.perEvent),
			})
			if strings.Contains(string(fr.Body), "include_metrics") {
				t.Errorf("include_metrics reached the engine: %s", fr.Body)
			}
			if last := events[len(events)-1].data; last != "[DONE]" {
				t.Fatalf("last event %q, want [DONE]", last)
			}
			usage := events[len(events)-2].data
			if !strings.Contains(usage, `"choices":[]`) {
				t.Fatalf("no usage event before [DONE]: %q", usage)
			}
			m := metricsOf(t, usage)
			tokens := float64(5 * tc.perEvent)
			arrival, accepted := span{start, fr.Received}, span{fr.HeadersSent, headers}
			var marks []span
			for i, sent := range fr.TokenSent {
				marks = append(marks, span{sent, received(t, events, fmt.Sprintf(" t%d", i))})
			}
			first, last := marks[0], marks[len(marks)-1]
			during(t, m, "queue_time_ms", arrival, accepted)
			during(t, m, "time_to_first_token_ms", accepted, first)
			during(t, m, "generation_time_ms", first, last)
			perToken(t, m, "mean_itl_ms", first, last, tokens-1)
			largestGap(t, m, "max_itl_ms", marks)
			during(t, m, "e2e_latency_ms", arrival, span{fr.UsageSent, events[len(events)-2].at})
			rate(t, m, "tokens_per_second", accepted, last, tokens)
			if *m["prompt_tokens"] != 7 || *m["completion_tokens"] != tokens {
				t.Errorf("token counts = %v/%v, want 7/%v", *m["prompt_tokens"], *m["completion_tokens"], tokens)
			}
			for _, e := range events[:len(events)-2] {
				if strings.Contains(e.data, "metrics") {
					t.Errorf("metrics outside the usage event: %s", e.data)
				}
			}
		})
	}
}

func TestStreamEventsArriveAsTheEngineSendsThem(t *testing.T) {
	// The engine sends the role and the first token, then waits until the
	// client has read them: a sidecar that held either back would leave
	// both waiting for good.
	release := make(chan struct{})
	engine := newScriptedEngine(t, func(c net.Conn, _ *http.Request, _ []byte) {
		defer c.Close()
		io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream; charset=utf-8\r\nTransfer-Encoding: chunked\r\n\r\n"+
			chunk(roleEvent)+chunk(tokenEvent("first")))
		select {
		case <-release:
		case <-time.After(10 * time.Second):
			return
		}
		io.WriteString(c, chunk(tokenEvent("second"))+chunk("data: [DONE]\n\n")+"0\r\n\r\n")
	})
	base := startProxy(t, engine.URL(), nil)
	resp := post(t, base+"/v1/chat/completions", `{"stream":true,"include_metrics":true}`, nil)
	defer resp.Body.Close()
	if got := resp.Header.Get("Content-Type"); got != "text/event-stream; charset=utf-8" {
		t.Errorf("Content-Type = %q", got)
	}
	br := bufio.NewReader(resp.Body)
	for want := 0; want < 2; {
		line, err := br.ReadString('\n')
		if err != nil {
			t.Fatalf("the first token did not arrive while the engine waited: %v", err)
		}
		if line == "\n" {
			want++
		}
	}
	close(release)
	rest, _ := io.ReadAll(br)
	if !strings.Contains(string(rest), "second") {
		t.Fatalf("the rest of the stream: %q", rest)
	}
}

func TestNonStreamingMetrics(t *testing.T) {
	engine := newFakeEngine(t)
	base := startProxy(t, engine.URL(), nil)
	start := time.Now()
	resp := post(t, base+"/v1/chat/completions", `{"model":"m","include_metrics":true}`, map[string]string{
		"X-Fake-TTFT": "60", "X-Fake-ITL": "10", "X-Fake-Tokens": "5",
	})
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	end := time.Now()
	fr := engine.next(t)
	<-fr.Finished
	if resp.ContentLength != int64(len(body)) {
		t.Errorf("Content-Length %d for a %d-byte body", resp.ContentLength, len(body))
	}
	m := metricsOf(t, string(body))
	isNull(t, m, "time_to_first_token_ms", "generation_time_ms", "queue_time_ms", "mean_itl_ms", "max_itl_ms")
	// Done is the engine's whole body, which follows its headers at once.
	during(t, m, "e2e_latency_ms", span{start, fr.Received}, span{fr.HeadersSent, end})
	e2e := m["e2e_latency_ms"]
	if e2e == nil {
		t.FailNow()
	}
	if got, want := *m["tokens_per_second"], 5/(*e2e/1000); math.Abs(got-want) > 0.01 {
		t.Errorf("tokens_per_second = %v, want %v", got, want)
	}
	var doc map[string]any
	json.Unmarshal(body, &doc)
	if doc["id"] != "cmpl-1" || doc["usage"] == nil || doc["choices"] == nil {
		t.Errorf("the engine's fields were not kept: %s", body)
	}
}

func TestStreamAsksForUsageAndKeepsClientOptions(t *testing.T) {
	engine := newFakeEngine(t)
	base := startProxy(t, engine.URL(), nil)
	// Opted in without usage: the engine is asked for it, the client's
	// other options kept.
	resp := post(t, base+"/v1/chat/completions", `{"stream":true,"include_metrics":true,"stream_options":{"include_usage":false,"x":1}}`, nil)
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	var sent struct {
		StreamOptions map[string]any `json:"stream_options"`
		Include       *bool          `json:"include_metrics"`
	}
	fr := engine.next(t)
	json.Unmarshal(fr.Body, &sent)
	if sent.StreamOptions["include_usage"] != true || sent.StreamOptions["x"] != 1.0 || sent.Include != nil {
		t.Fatalf("engine got %s", fr.Body)
	}
	// Running usage asked for with usage off: asking for usage would put
	// it on every event, so the request goes as the client sent it, and
	// the metrics come without token counts.
	resp = post(t, base+"/v1/chat/completions", `{"stream":true,"include_metrics":true,"stream_options":{"continuous_usage_stats":true,"include_usage":false}}`, nil)
	events, _ := readEvents(t, resp.Body)
	resp.Body.Close()
	fr = engine.next(t)
	if !strings.Contains(string(fr.Body), `"stream_options":{"continuous_usage_stats":true,"include_usage":false}`) {
		t.Fatalf("engine got %s", fr.Body)
	}
	isNull(t, metricsOf(t, events[len(events)-2].data), "completion_tokens", "prompt_tokens")
}

func TestSeveralChoicesGetNullMetrics(t *testing.T) {
	engine := newFakeEngine(t)
	base := startProxy(t, engine.URL(), nil)
	for _, body := range []string{`{"n":2,"include_metrics":true}`, `{"prompt":["a","b"],"include_metrics":true}`} {
		resp := post(t, base+"/v1/completions", body, nil)
		got, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if !bytes.HasSuffix(got, []byte(`,"metrics":null}`)) {
			t.Errorf("%s: got %s, want metrics null", body, got)
		}
	}
}

func TestRequestsWithoutMetricsPassByteForByte(t *testing.T) {
	engine := newFakeEngine(t)
	tests := []struct {
		name        string
		mode        rewrite.Mode
		path        string
		body        string
		injectUsage bool
	}{
		{"not opted in, stream, usage not injected", rewrite.ModeOptIn, "/v1/chat/completions", `{"model":"m", "stream":true}`, false},
		{"not opted in, stream with its own usage", rewrite.ModeOptIn, "/v1/chat/completions", `{"stream":true,"stream_options":{"include_usage":true}}`, true},
		{"not opted in, unary", rewrite.ModeOptIn, "/v1/completions", `{"model":"m","prompt":"hi"}`, true},
		{"off mode keeps include_metrics", rewrite.ModeOff, "/v1/chat/completions", `{"stream":true,"include_metrics":true}`, true},
		{"not JSON", rewrite.ModeAlways, "/v1/chat/completions", `{"stream":true,`, true},
		{"stream the engine refuses", rewrite.ModeOptIn, "/v1/chat/completions", `{"stream":"maybe","include_metrics":true}`, true},
		{"running usage without include_usage", rewrite.ModeOptIn, "/v1/chat/completions", `{"stream":true,"stream_options":{"continuous_usage_stats":true,"include_usage":false}}`, true},
		{"stream options without include_usage (vLLM sends usage)", rewrite.ModeOptIn, "/v1/chat/completions", `{"stream":true,"stream_options":{}}`, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			base := startProxy(t, engine.URL(), func(c *Config) { c.Mode, c.InjectUsage = tt.mode, tt.injectUsage })
			resp := post(t, base+tt.path, tt.body, map[string]string{"Accept-Encoding": "identity"})
			got, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			if err != nil {
				t.Fatal(err)
			}
			fr := engine.next(t)
			<-fr.Finished
			if string(fr.Body) != tt.body {
				t.Errorf("engine got %q, want %q", fr.Body, tt.body)
			}
			if fr.Header.Get("Accept-Encoding") != "identity" {
				t.Errorf("Accept-Encoding changed to %q", fr.Header.Get("Accept-Encoding"))
			}
			if !bytes.Equal(got, fr.Sent.Bytes()) {
				t.Errorf("client got\n%s\nengine sent\n%s", got, fr.Sent.Bytes())
			}
		})
	}
}

// TestHiddenUsageLeavesTheClientsBytes: for a stream that did not ask for
// usage, the sidecar asks the engine for it and removes the usage event, so
// the client gets exactly what the engine would have sent it.
func TestHiddenUsageLeavesTheClientsBytes(t *testing.T) {
	engine := newFakeEngine(t)
	base := startProxy(t, engine.URL(), nil)
	resp := post(t, base+"/v1/chat/completions", `{"model":"m","stream":true,"stream_options":{"include_usage":false,"x":1}}`, nil)
	got, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	fr := engine.next(t)
	<-fr.Finished
	var edited struct {
		StreamOptions map[string]any `json:"stream_options"`
	}
	if json.Unmarshal(fr.Body, &edited) != nil || edited.StreamOptions["include_usage"] != true || edited.StreamOptions["x"] != 1.0 {
		t.Fatalf("engine got %s, want include_usage set and the client's other options kept", fr.Body)
	}
	sent := fr.Sent.String()
	usage := sent[strings.Index(sent, `data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[],"usage"`):]
	usage = usage[:strings.Index(usage, "\n\n")+2]
	if want := strings.Replace(sent, usage, "", 1); string(got) != want {
		t.Fatalf("client got\n%s\nwant the engine's stream without its usage event\n%s", got, want)
	}
}

func TestAlwaysModeMeasuresEveryRequest(t *testing.T) {
	engine := newFakeEngine(t)
	base := startProxy(t, engine.URL(), func(c *Config) { c.Mode = rewrite.ModeAlways })
	resp := post(t, base+"/v1/chat/completions", `{"model":"m","include_metrics":false}`, nil)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	metricsOf(t, string(body))
	if fr := engine.next(t); strings.Contains(string(fr.Body), "include_metrics") {
		t.Errorf("include_metrics reached the engine: %s", fr.Body)
	}
}

func TestUpstreamErrorsPassThroughUnchanged(t *testing.T) {
	engine := newFakeEngine(t)
	base := startProxy(t, engine.URL(), nil)
	for _, stream := range []string{"true", "false"} {
		resp := post(t, base+"/v1/chat/completions", `{"include_metrics":true,"stream":`+stream+`}`, map[string]string{"X-Fake-Status": "400"})
		got, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		fr := engine.next(t)
		<-fr.Finished
		if resp.StatusCode != 400 || !bytes.Equal(got, fr.Sent.Bytes()) {
			t.Errorf("stream=%s: got %d %s, want 400 %s", stream, resp.StatusCode, got, fr.Sent.Bytes())
		}
	}
}
