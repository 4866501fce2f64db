package proxy

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/timing-sidecar/timing-sidecar/e2e/emulator"
	"github.com/timing-sidecar/timing-sidecar/rewrite"
)

// A client that did not ask for usage gets the engine's events and no
// more: the metrics ride on the event that finishes the choices, and the
// usage event the sidecar asks for never reaches it. A "choices": [] event
// the engine would not have sent breaks the usual client loop
// (chunk.choices[0].delta).

// shapeEvent builds a chat chunk (or, with text set, a completions chunk)
// for choice i.
func shapeEvent(i int, delta, text, finish string, extra string) string {
	fr := "null"
	if finish != "" {
		fr = `"` + finish + `"`
	}
	choice := `{"index":` + itoa(i) + `,"delta":` + delta + `,"finish_reason":` + fr + `}`
	object := "chat.completion.chunk"
	if text != "" {
		choice = `{"index":` + itoa(i) + `,"text":"` + text + `","finish_reason":` + fr + `}`
		object = "text_completion"
	}
	return `data: {"id":"c","object":"` + object + `","created":1,"model":"m","choices":[` + choice + `]` + extra + "}\n\n"
}

const shapeUsage = `,"usage":{"prompt_tokens":3,"completion_tokens":2,"total_tokens":5}`

func TestMetricsRideOnTheFinishingEvent(t *testing.T) {
	usageEvent := `data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[]` + shapeUsage + "}\n\n"
	role := shapeEvent(0, `{"role":"assistant","content":""}`, "", "", "")
	for _, tt := range []struct {
		name string
		// events the engine sends before [DONE]; the usage event is sent
		// only to a request that asked for it, as vLLM does.
		events []string
		body   string
		// counts: the metrics carry token counts.
		counts, null bool
	}{
		{"vLLM: a finish event, then the usage asked for",
			[]string{role, shapeEvent(0, `{"content":"a"}`, "", "", ""), shapeEvent(0, `{"content":"b"}`, "", "", ""), shapeEvent(0, `{}`, "", "stop", "")},
			`{"stream":true}`, true, false},
		{"the finish on the last token",
			[]string{role, shapeEvent(0, `{"content":"a"}`, "", "", ""), shapeEvent(0, `{"content":"b"}`, "", "length", "")},
			`{"stream":true}`, true, false},
		{"llama.cpp: the usage on the finish event, always",
			[]string{role, shapeEvent(0, `{"content":"a"}`, "", "", ""), shapeEvent(0, `{"content":"b"}`, "", "", ""), shapeEvent(0, `{}`, "", "stop", shapeUsage)},
			`{"stream":true}`, true, false},
		{"completions",
			[]string{shapeEvent(0, "", "a", "", ""), shapeEvent(0, "", "b", "length", "")},
			`{"stream":true,"prompt":"x"}`, true, false},
		{"two choices: null, on the last to finish",
			[]string{role, shapeEvent(0, `{"content":"a"}`, "", "", ""), shapeEvent(1, `{"content":"x"}`, "", "", ""),
				shapeEvent(0, `{}`, "", "stop", ""), shapeEvent(1, `{"content":"y"}`, "", "", ""), shapeEvent(1, `{}`, "", "stop", "")},
			`{"stream":true,"n":2}`, false, true},
	} {
		engine := newScriptedEngine(t, func(c net.Conn, _ *http.Request, body []byte) {
			defer c.Close()
			var req struct {
				StreamOptions *struct {
					IncludeUsage bool `json:"include_usage"`
				} `json:"stream_options"`
			}
			json.Unmarshal(body, &req)
			out := sseHead
			for _, e := range tt.events {
				out += chunk(e)
			}
			if req.StreamOptions != nil && req.StreamOptions.IncludeUsage {
				out += chunk(usageEvent)
			}
			io.WriteString(c, out+chunk("data: [DONE]\n\n")+"0\r\n\r\n")
		})
		for _, mode := range []struct {
			name string
			mode rewrite.Mode
			body string
		}{
			{"always", rewrite.ModeAlways, tt.body},
			{"opt-in", rewrite.ModeOptIn, strings.Replace(tt.body, `{"stream":true`, `{"stream":true,"include_metrics":true`, 1)},
		} {
			t.Run(tt.name+", "+mode.name, func(t *testing.T) {
				base := startProxy(t, engine.URL(), func(c *Config) { c.Mode = mode.mode })
				direct := post(t, engine.URL()+"/v1/chat/completions", tt.body, nil)
				want, _ := readEvents(t, direct.Body)
				direct.Body.Close()
				resp := post(t, base+"/v1/chat/completions", mode.body, nil)
				got, _ := readEvents(t, resp.Body)
				resp.Body.Close()
				checkMetricsRideOnFinish(t, got, want, tt.null, tt.counts)
			})
		}
	}
}

// checkMetricsRideOnFinish checks the events a client got, got, against
// those the engine sends direct, want: the same events, each with its
// choices, one of them, the last to finish, carrying the metrics (null
// for several choices; with the engine's counts if counts), and the others
// as sent.
func checkMetricsRideOnFinish(t *testing.T, got, want []sseEvent, null, counts bool) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%d events, the engine sends %d direct", len(got), len(want))
	}
	carried := 0
	for i, e := range got {
		if e.data == "[DONE]" {
			continue
		}
		var doc struct {
			Choices []json.RawMessage `json:"choices"`
			Metrics json.RawMessage   `json:"metrics"`
		}
		if err := json.Unmarshal([]byte(e.data), &doc); err != nil || len(doc.Choices) == 0 {
			t.Fatalf("event %d has no choices: %s", i, e.data)
		}
		if doc.Metrics == nil {
			if e.data != want[i].data {
				t.Errorf("event %d changed:\n got %s\nwant %s", i, e.data, want[i].data)
			}
			continue
		}
		carried++
		if i != len(got)-2 || !strings.Contains(e.data, `"finish_reason":"`) {
			t.Errorf("metrics on event %d, not the last to finish: %s", i, e.data)
		}
		checkCarriedMetrics(t, e.data, want[i].data, doc.Metrics, null, counts)
	}
	if carried != 1 {
		t.Fatalf("%d events carry metrics, want one", carried)
	}
}

// checkCarriedMetrics checks the event that carries the metrics, data,
// against the engine's, want: null metrics and otherwise as sent if null;
// the engine's counts and a TTFT, the rest as sent, if counts.
func checkCarriedMetrics(t *testing.T, data, want string, metrics json.RawMessage, null, counts bool) {
	t.Helper()
	switch {
	case null:
		if strings.Replace(data, `,"metrics":null`, "", 1) != want {
			t.Errorf("metrics %s, want null for several choices, the event otherwise as sent", metrics)
		}
	case counts:
		equalWithoutMetrics(t, []byte(data), []byte(want), "")
		if m := metricsOf(t, data); m["completion_tokens"] == nil || *m["completion_tokens"] != 2 || m["time_to_first_token_ms"] == nil {
			t.Errorf("metrics without the engine's counts: %s", data)
		}
	}
}

func TestMetricsWithoutUsageFromTheEngine(t *testing.T) {
	// An engine that never sends usage, asked or not: the metrics still
	// ride on the finishing event, without counts, once [DONE] shows no
	// usage is coming.
	engine := newScriptedEngine(t, func(c net.Conn, _ *http.Request, _ []byte) {
		defer c.Close()
		io.WriteString(c, sseHead+chunk(roleEvent)+chunk(tokenEvent("a"))+chunk(shapeEvent(0, `{}`, "", "stop", ""))+chunk("data: [DONE]\n\n")+"0\r\n\r\n")
	})
	base := startProxy(t, engine.URL(), nil)
	resp := post(t, base+"/v1/chat/completions", `{"stream":true,"include_metrics":true}`, nil)
	events, _ := readEvents(t, resp.Body)
	resp.Body.Close()
	if len(events) != 4 {
		t.Fatalf("%d events, want the engine's 4", len(events))
	}
	m := metricsOf(t, events[2].data)
	isNull(t, m, "completion_tokens", "prompt_tokens")
	if m["time_to_first_token_ms"] == nil {
		t.Fatalf("no timing in %s", events[2].data)
	}
}

// TestClientLoopsReadTheMetrics runs the official openai-go SDK's plain
// streaming loop and its accumulator through the sidecar in front of the
// emulated engine: every chunk has a choice, there are as many chunks as
// direct, and the metrics are on the chunk that finishes the choice.
func TestClientLoopsReadTheMetrics(t *testing.T) {
	engine := startEmulator(t, emulator.Config{Strict: true})
	sdkClient := func(base string) openai.Client {
		return openai.NewClient(option.WithBaseURL(base+"/v1/"), option.WithAPIKey("sk-test"), option.WithMaxRetries(0))
	}
	params := openai.ChatCompletionNewParams{Model: "m", Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")}}
	type result struct {
		chunks  int
		content string
		metrics string // the raw metrics, from the chunk that finished
	}
	stream := func(t *testing.T, c openai.Client, opts ...option.RequestOption) result {
		t.Helper()
		var r result
		var acc openai.ChatCompletionAccumulator
		s := c.Chat.Completions.NewStreaming(context.Background(), params, opts...)
		defer s.Close()
		for s.Next() {
			chunk := s.Current()
			r.chunks++
			if len(chunk.Choices) == 0 {
				t.Fatalf("a chunk without choices: %s", chunk.RawJSON())
			}
			_ = chunk.Choices[0].Delta.Content // the usual loop
			acc.AddChunk(chunk)
			if f, ok := chunk.JSON.ExtraFields["metrics"]; ok {
				if r.metrics != "" || chunk.Choices[0].FinishReason == "" {
					t.Errorf("metrics on a chunk that does not finish the choice, or twice: %s", chunk.RawJSON())
				}
				r.metrics = f.Raw()
			}
		}
		if err := s.Err(); err != nil {
			t.Fatal(err)
		}
		if len(acc.Choices) != 1 {
			t.Fatalf("the accumulator has %d choices", len(acc.Choices))
		}
		r.content = acc.Choices[0].Message.Content
		return r
	}
	direct := stream(t, sdkClient(engine.URL()))
	for _, tt := range []struct {
		name string
		mode rewrite.Mode
		opts []option.RequestOption
	}{
		{"always", rewrite.ModeAlways, nil},
		{"opt-in without stream_options", rewrite.ModeOptIn, []option.RequestOption{option.WithJSONSet("include_metrics", true)}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			base := startProxy(t, engine.URL(), func(c *Config) { c.Mode = tt.mode })
			got := stream(t, sdkClient(base), tt.opts...)
			if got.chunks != direct.chunks || got.content != direct.content {
				t.Fatalf("%d chunks, %q; direct %d chunks, %q", got.chunks, got.content, direct.chunks, direct.content)
			}
			var m map[string]*float64
			if err := json.Unmarshal([]byte(got.metrics), &m); err != nil || m["completion_tokens"] == nil || m["time_to_first_token_ms"] == nil {
				t.Fatalf("metrics %q", got.metrics)
			}
		})
	}
}

func TestAPingBetweenTheFinishAndTheUsage(t *testing.T) {
	// Servers and gateways send comments and pings at any moment; one
	// between the finishing event and the usage must not leave the
	// metrics with nothing to ride on.
	usageEvent := `data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[]` + shapeUsage + "}\n\n"
	for _, ping := range []string{": keep-alive\n\n", "event: ping\ndata: {}\n\n"} {
		engine := newScriptedEngine(t, func(c net.Conn, _ *http.Request, body []byte) {
			defer c.Close()
			out := sseHead + chunk(roleEvent) + chunk(tokenEvent("a")) + chunk(shapeEvent(0, `{}`, "", "stop", "")) + chunk(ping)
			if strings.Contains(string(body), `"include_usage":true`) {
				out += chunk(usageEvent)
			}
			io.WriteString(c, out+chunk("data: [DONE]\n\n")+"0\r\n\r\n")
		})
		base := startProxy(t, engine.URL(), nil)
		resp := post(t, base+"/v1/chat/completions", `{"stream":true,"include_metrics":true}`, nil)
		got, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if n := strings.Count(string(got), `"metrics":{`); n != 1 || strings.Contains(string(got), `"choices":[]`) {
			t.Fatalf("ping %q: %d events carry metrics, want the finishing one:\n%s", ping, n, got)
		}
		finish := strings.Index(string(got), `"finish_reason":"stop"`)
		if metrics := strings.Index(string(got), `"metrics":{`); metrics < finish || !strings.Contains(string(got), strings.TrimSpace(ping)) {
			t.Fatalf("ping %q: the metrics are not on the finishing event, or the ping is lost:\n%s", ping, got)
		}
	}
}

// TestHeldFinishKeepsTheEnginesOrder: while the finishing event waits for
// the usage, only what carries nothing for the client (a comment, a ping)
// may pass it. An error event after the finish reaches the client after
// it, as the engine sent them, and the finishing event carries the
// metrics measured so far: nothing after it may.
func TestHeldFinishKeepsTheEnginesOrder(t *testing.T) {
	errorEvent := `data: {"error":{"object":"error","message":"engine failed after the finish","type":"InternalServerError","code":500}}` + "\n\n"
	engine := newScriptedEngine(t, func(c net.Conn, _ *http.Request, body []byte) {
		defer c.Close()
		out := sseHead + chunk(roleEvent) + chunk(tokenEvent("a")) + chunk(shapeEvent(0, `{}`, "", "stop", "")) + chunk(errorEvent)
		io.WriteString(c, out+chunk("data: [DONE]\n\n")+"0\r\n\r\n")
	})
	base := startProxy(t, engine.URL(), nil)
	resp := post(t, base+"/v1/chat/completions", `{"stream":true,"include_metrics":true}`, nil)
	got, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	s := string(got)
	finish, failure, done := strings.Index(s, `"finish_reason":"stop"`), strings.Index(s, `"engine failed after the finish"`), strings.Index(s, "[DONE]")
	if finish < 0 || failure < 0 || done < 0 || !(finish < failure && failure < done) {
		t.Fatalf("want the finish, the error, [DONE] in the engine's order:\n%s", s)
	}
	if n := strings.Count(s, `"metrics":{`); n != 1 || strings.Index(s, `"metrics":{`) > failure {
		t.Fatalf("want the metrics once, on the finishing event:\n%s", s)
	}
}

// TestUnterminatedUsageAtTheEndStaysHidden: an engine that closes the
// stream after a usage event without its blank line. SSE clients drop such
// a tail, but its bytes would still reach a client that never asked for
// usage; the sidecar asked, so the client does not get them, and their
// counts still go into the metrics.
func TestUnterminatedUsageAtTheEndStaysHidden(t *testing.T) {
	usage := `data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[]` + shapeUsage + "}\n"
	engine := newScriptedEngine(t, func(c net.Conn, _ *http.Request, _ []byte) {
		defer c.Close()
		io.WriteString(c, sseHead+chunk(roleEvent)+chunk(tokenEvent("a"))+chunk(shapeEvent(0, `{}`, "", "stop", ""))+chunk(usage)+"0\r\n\r\n")
	})
	base := startProxy(t, engine.URL(), nil)
	resp := post(t, base+"/v1/chat/completions", `{"stream":true,"include_metrics":true}`, nil)
	got, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	s := string(got)
	if strings.Contains(s, `"choices":[]`) {
		t.Fatalf("the usage event the client did not ask for reached it:\n%s", s)
	}
	i := strings.Index(s, `"metrics":`)
	if i < 0 || i < strings.Index(s, `"finish_reason":"stop"`) {
		t.Fatalf("no metrics on the finishing event:\n%s", s)
	}
	if m := metricsOf(t, strings.TrimPrefix(strings.Split(s[strings.LastIndex(s[:i], "data: "):], "\n")[0], "data: ")); m["completion_tokens"] == nil || *m["completion_tokens"] != 2 {
		t.Fatalf("the tail's counts are not in the metrics:\n%s", s)
	}
}

// TestHeldFinishWaitsOnlyTheBound: an engine that sends the usage long
// after the finishing event (here: not until the client has the finish)
// does not hold the client's last token: past --max-event-hold the
// finishing event goes with the metrics measured so far, the counts the
// engine has not sent null. The usage, when it comes, is still removed,
// and its counts reach the record. The hold is the sidecar's own delay.
func TestHeldFinishWaitsOnlyTheBound(t *testing.T) {
	const hold = 50 * time.Millisecond
	usage := `data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[]` + shapeUsage + "}\n\n"
	release := make(chan struct{})
	var once sync.Once
	releaseUsage := func() { once.Do(func() { close(release) }) }
	// Without the bound, the finish would come only after the usage:
	// the engine sends it after 10 s anyway, so the test fails, not hangs.
	time.AfterFunc(10*time.Second, releaseUsage)
	engine := newScriptedEngine(t, func(c net.Conn, _ *http.Request, _ []byte) {
		defer c.Close()
		io.WriteString(c, sseHead+chunk(roleEvent)+chunk(tokenEvent("a"))+chunk(shapeEvent(0, `{}`, "", "stop", "")))
		<-release
		io.WriteString(c, chunk(usage)+chunk("data: [DONE]\n\n")+"0\r\n\r\n")
	})
	var log syncBuffer
	p, base := startSidecar(t, engine.URL(), func(c *Config) { c.MaxEventHold = hold }, &log)
	resp := post(t, base+"/v1/chat/completions", `{"stream":true,"include_metrics":true}`, nil)
	defer resp.Body.Close()
	lines := bufio.NewReader(resp.Body)
	for {
		line, err := lines.ReadString('\n')
		if err != nil {
			t.Fatalf("the stream ended without the finishing event: %v", err)
		}
		if strings.Contains(line, `"finish_reason":"stop"`) {
			m := metricsOf(t, strings.TrimPrefix(strings.TrimSpace(line), "data: "))
			if m["completion_tokens"] != nil || m["time_to_first_token_ms"] == nil {
				t.Errorf("want the metrics so far, the counts null, before the engine sent the usage: %s", line)
			}
			break
		}
	}
	releaseUsage()
	rest, _ := io.ReadAll(lines)
	if strings.Contains(string(rest), `"choices":[]`) || !strings.Contains(string(rest), "[DONE]") {
		t.Fatalf("after the finish, want [DONE] and no usage event:\n%s", rest)
	}
	p.telemetry.Flush()
	var rec struct {
		Completion *int     `json:"completion_tokens"`
		RelayMax   *float64 `json:"relay_delay_max_ms"`
	}
	all := log.lines()
	json.Unmarshal([]byte(all[len(all)-1]), &rec)
	if rec.Completion == nil || *rec.Completion != 2 {
		t.Errorf("the record lacks the late usage's counts: %s", all[len(all)-1])
	}
	if rec.RelayMax == nil || *rec.RelayMax < float64(hold/time.Millisecond) {
		t.Errorf("the hold is not the sidecar's own delay: %s", all[len(all)-1])
	}
}

// TestLoneCRStreamsAreRelayedEventByEvent: an engine whose SSE lines end
// in a lone CR (WHATWG allows it) gets each event to the client when it is
// sent, not when 64 KiB have gathered, and its stream measured as any.
func TestLoneCRStreamsAreRelayedEventByEvent(t *testing.T) {
	cr := func(ev string) string { return strings.ReplaceAll(ev, "\n", "\r") }
	usage := `data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[]` + shapeUsage + "}\n\n"
	delivered := make(chan struct{})
	var once sync.Once
	deliver := func() { once.Do(func() { close(delivered) }) }
	time.AfterFunc(10*time.Second, deliver) // held events: the test fails, not hangs
	engine := newScriptedEngine(t, func(c net.Conn, _ *http.Request, _ []byte) {
		defer c.Close()
		io.WriteString(c, sseHead+chunk(cr(roleEvent))+chunk(cr(tokenEvent("a"))))
		<-delivered
		io.WriteString(c, chunk(cr(shapeEvent(0, `{}`, "", "stop", "")))+chunk(cr(usage))+chunk("data: [DONE]\r\r")+"0\r\n\r\n")
	})
	base := startProxy(t, engine.URL(), nil)
	resp := post(t, base+"/v1/chat/completions", `{"stream":true,"include_metrics":true}`, nil)
	defer resp.Body.Close()
	var got []byte
	buf := make([]byte, 4096)
	for !strings.Contains(string(got), `"content":"a"`) {
		n, err := resp.Body.Read(buf)
		got = append(got, buf[:n]...)
		if err != nil {
			t.Fatalf("the stream ended before the token event: %v", err)
		}
		select {
		case <-delivered:
			t.Fatalf("the token event was held until the engine sent more:\n%q", got)
		default:
		}
	}
	deliver()
	rest, _ := io.ReadAll(resp.Body)
	s := string(got) + string(rest)
	if strings.Contains(s, `"choices":[]`) || !strings.Contains(s, "[DONE]") {
		t.Fatalf("want the engine's events, the usage removed:\n%q", s)
	}
	i := strings.Index(s, `"finish_reason":"stop"`)
	if m := strings.Index(s, `"metrics":{`); i < 0 || m < i {
		t.Fatalf("no metrics on the finishing event:\n%q", s)
	}
}

// TestFinishingEventTooLargeToInspect: in always mode, a finishing event
// larger than --max-event-size passes in pieces, uninspected, so the
// metrics cannot ride on it. The shape wins: the client gets the engine's
// events whole and in order, and no usage event it did not ask for; the
// stream carries no metrics object, as one whose engine sends no finish
// reason, and the record still has the request's counts.
func TestFinishingEventTooLargeToInspect(t *testing.T) {
	usage := `data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[]` + shapeUsage + "}\n\n"
	large := shapeEvent(0, `{"content":"`+strings.Repeat("x", 3000)+`"}`, "", "stop", "")
	engine := newScriptedEngine(t, func(c net.Conn, _ *http.Request, _ []byte) {
		defer c.Close()
		io.WriteString(c, sseHead+chunk(roleEvent)+chunk(tokenEvent("a"))+chunk(large)+chunk(usage)+chunk("data: [DONE]\n\n")+"0\r\n\r\n")
	})
	var log syncBuffer
	p, base := startSidecar(t, engine.URL(), func(c *Config) { c.Mode, c.MaxEventSize = rewrite.ModeAlways, 1024 }, &log)
	resp := post(t, base+"/v1/chat/completions", `{"stream":true}`, nil)
	got, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	want := roleEvent + tokenEvent("a") + large + "data: [DONE]\n\n"
	if err != nil || string(got) != want {
		t.Fatalf("want the engine's events without the usage, unchanged (%v):\n%s", err, got)
	}
	p.telemetry.Flush()
	all := log.lines()
	if !strings.Contains(all[len(all)-1], `"completion_tokens":2`) {
		t.Errorf("the record lacks the usage's counts: %s", all[len(all)-1])
	}
}

// The metrics are computed once: the record holds the figures the client
// got, although the stream ends well after the usage event took them.
func TestTheRecordHoldsTheMetricsTheClientGot(t *testing.T) {
	usage := `data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[]` + shapeUsage + "}\n\n"
	engine := newScriptedEngine(t, func(c net.Conn, _ *http.Request, _ []byte) {
		defer c.Close()
		io.WriteString(c, sseHead+chunk(roleEvent)+chunk(tokenEvent("a"))+chunk(shapeEvent(0, `{}`, "", "stop", ""))+chunk(usage))
		time.Sleep(30 * time.Millisecond) // a gap the end of the stream would add to a second computation
		io.WriteString(c, chunk("data: [DONE]\n\n")+"0\r\n\r\n")
	})
	var log syncBuffer
	p, base := startSidecar(t, engine.URL(), nil, &log)
	resp := post(t, base+"/v1/chat/completions", `{"stream":true,"include_metrics":true,"stream_options":{"include_usage":true}}`, nil)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	got := lastStreamMetrics(t, body)
	if got == nil || got["e2e_latency_ms"] == nil {
		t.Fatalf("no metrics in the stream:\n%s", body)
	}
	p.telemetry.Flush()
	var rec struct {
		E2E *float64 `json:"e2e_latency_ms"`
	}
	all := log.lines()
	json.Unmarshal([]byte(all[len(all)-1]), &rec)
	if rec.E2E == nil || *rec.E2E != *got["e2e_latency_ms"] {
		t.Errorf("the record's e2e latency is not the client's %v: %s", *got["e2e_latency_ms"], all[len(all)-1])
	}
}

// Several choices get "metrics": null, and their metrics are computed at
// the request's end, for the record: a finishing event sent at its hold's
// bound does not cut the record short of the choices still streaming.
func TestSeveralChoicesAreRecordedToTheirEnd(t *testing.T) {
	const gap = 150 * time.Millisecond
	usage := `data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[]` + shapeUsage + "}\n\n"
	engine := newScriptedEngine(t, func(c net.Conn, _ *http.Request, _ []byte) {
		defer c.Close()
		io.WriteString(c, sseHead+chunk(shapeEvent(0, `{"content":"a"}`, "", "", ""))+chunk(shapeEvent(0, `{}`, "", "stop", "")))
		time.Sleep(gap) // past the hold's bound: choice 0's finish goes out first
		io.WriteString(c, chunk(shapeEvent(1, `{"content":"b"}`, "", "", ""))+chunk(shapeEvent(1, `{}`, "", "stop", ""))+
			chunk(usage)+chunk("data: [DONE]\n\n")+"0\r\n\r\n")
	})
	var log syncBuffer
	p, base := startSidecar(t, engine.URL(), func(c *Config) { c.MaxEventHold = 20 * time.Millisecond }, &log)
	resp := post(t, base+"/v1/chat/completions", `{"stream":true,"n":2,"include_metrics":true}`, nil)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(body), `"metrics":null`) {
		t.Fatalf("want metrics null for two choices:\n%s", body)
	}
	p.telemetry.Flush()
	var rec struct {
		E2E        *float64 `json:"e2e_latency_ms"`
		Generation *float64 `json:"generation_time_ms"`
		Completion *int     `json:"completion_tokens"`
	}
	all := log.lines()
	json.Unmarshal([]byte(all[len(all)-1]), &rec)
	// The engine sent choice 1's token gap after choice 0's: a causal
	// lower bound on both figures.
	floor := float64(gap / time.Millisecond)
	if rec.E2E == nil || *rec.E2E < floor || rec.Generation == nil || *rec.Generation < floor || rec.Completion == nil || *rec.Completion != 2 {
		t.Errorf("the record stops short of the second choice (want e2e and generation ≥ %v ms, 2 tokens): %s", floor, all[len(all)-1])
	}
}

// A usage event that cannot take the metrics (data read leniently, not
// valid JSON) passes as it came, and leaves them to the next one, computed
// then: with its counts, not the first one's.
func TestAUsageEventThatCannotTakeTheMetricsLeavesThemUncomputed(t *testing.T) {
	bad := `data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[],"usage":{"prompt_tokens":8,"completion_tokens":8},}` + "\n\n"
	good := `data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[]` + shapeUsage + "}\n\n"
	engine := newScriptedEngine(t, func(c net.Conn, _ *http.Request, _ []byte) {
		defer c.Close()
		io.WriteString(c, sseHead+chunk(tokenEvent("a"))+chunk(shapeEvent(0, `{}`, "", "stop", ""))+chunk(bad)+chunk(good)+chunk("data: [DONE]\n\n")+"0\r\n\r\n")
	})
	_, base := startSidecar(t, engine.URL(), nil, nil)
	resp := post(t, base+"/v1/chat/completions", `{"stream":true,"include_metrics":true,"stream_options":{"include_usage":true}}`, nil)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	got := lastStreamMetrics(t, body)
	if !strings.Contains(string(body), strings.TrimSuffix(bad, "\n\n")) {
		t.Errorf("the event that cannot take the metrics was changed:\n%s", body)
	}
	if got == nil || got["completion_tokens"] == nil || *got["completion_tokens"] != 2 {
		t.Errorf("want the metrics on the valid usage event, with its counts:\n%s", body)
	}
}

// lastStreamMetrics is the metrics object of the last event of a stream
// that has one; nil if none has.
func lastStreamMetrics(t *testing.T, stream []byte) map[string]*float64 {
	t.Helper()
	var got map[string]*float64
	for _, line := range strings.Split(string(stream), "\n") {
		if strings.Contains(line, `"metrics"`) {
			got = metricsOf(t, strings.TrimPrefix(line, "data: "))
		}
	}
	return got
}
