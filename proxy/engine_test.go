package proxy

import (
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/tidwall/gjson"

	"github.com/timing-sidecar/timing-sidecar/e2e/emulator"
	"github.com/timing-sidecar/timing-sidecar/rewrite"
)

// TestVLLMsOwnMetricsBesideOurs: in front of vLLM with
// --enable-per-request-metrics, the client of mode vllm gets the engine's
// object with every member where the engine put it (a client written for
// vLLM reads vLLM's figures), the sidecar's figures beside them, those
// whose names the engine uses under timing_sidecar, and no "engine"
// repeating what is already there.
func TestVLLMsOwnMetricsBesideOurs(t *testing.T) {
	engine := startEmulator(t, emulator.Config{PerRequestMetrics: true, Strict: true,
		Timing: emulator.Timing{HeaderDelay: 20 * time.Millisecond, TTFT: 30 * time.Millisecond, ITL: 20 * time.Millisecond, OutputTokens: 4}})
	base := startProxy(t, engine.URL(), nil)
	const msgs = `"messages":[{"role":"user","content":"hi"}]`
	for _, tt := range []struct{ name, body string }{
		{"stream", `{"model":"m","stream":true,"stream_options":{"include_usage":true},` + msgs + `}`},
		{"non-streaming", `{"model":"m",` + msgs + `}`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			resp := post(t, base+"/v1/chat/completions", tt.body, nil)
			raw, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			doc := string(raw)
			if tt.name == "stream" {
				events, _ := readEvents(t, strings.NewReader(doc))
				if len(events) < 2 {
					t.Fatalf("stream: %s", doc)
				}
				doc = events[len(events)-2].data // the usage event, before [DONE]
			}
			rec, err := engine.Last(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			m := metricsOf(t, doc)
			if m["timing_sidecar.tokens_per_second"] == nil || m["engine.total_ms"] != nil || m["overhead_ms"] == nil || m["e2e_latency_ms"] == nil {
				t.Fatalf("not the engine's object with ours beside it: %s", doc)
			}
			if tt.name == "stream" {
				// The top level is the engine's own: its scheduling lies
				// between receiving the request and sending headers.
				within(t, m, "queue_time_ms", 0, ms(rec.HeadersSent.Sub(rec.Received)))
				within(t, m, "time_to_first_token_ms", ms(rec.FirstToken.Sub(rec.HeadersSent)), ms(rec.FirstToken.Sub(rec.Received)))
				// The sidecar's, apart: from its own marks.
				within(t, m, "timing_sidecar.time_to_first_token_ms", ms(rec.FirstToken.Sub(rec.HeadersSent)), *m["e2e_latency_ms"])
			} else if m["time_to_first_token_ms"] == nil || !gjson.Get(doc, "metrics.timing_sidecar.time_to_first_token_ms").Exists() {
				// The engine saw its first token; the sidecar, not streamed, did not.
				t.Errorf("non-streaming: %s", doc)
			}
			// Our e2e holds the engine's whole time and a little more.
			total := *m["queue_time_ms"] + *m["time_to_first_token_ms"] + *m["generation_time_ms"]
			if o := *m["overhead_ms"]; o < -1 || o > 50 || math.Abs(*m["e2e_latency_ms"]-total-o) > 0.002 {
				t.Errorf("overhead_ms %v with e2e %v and engine total %v", o, *m["e2e_latency_ms"], total)
			}
		})
	}
	// Where vLLM gives none, neither does mode vllm: a stream whose client
	// asked no usage; in a body of several choices, null.
	resp := post(t, base+"/v1/chat/completions", `{"model":"m","stream":true,`+msgs+`}`, nil)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || strings.Contains(string(body), `"metrics"`) || strings.Contains(string(body), `"choices":[]`) {
		t.Fatalf("a stream without usage: %d %s", resp.StatusCode, body)
	}
	resp = post(t, base+"/v1/chat/completions", `{"model":"m","n":2,`+msgs+`}`, nil)
	body, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if m := gjson.GetBytes(body, "metrics"); resp.StatusCode != 200 || m.Type != gjson.Null || !m.Exists() {
		t.Fatalf("several choices: %d %s", resp.StatusCode, body)
	}
}

func TestLlamaCppTimingsBesideOurs(t *testing.T) {
	final := `data: {"choices":[{"finish_reason":"stop","index":0,"delta":{}}],"created":1,"id":"c","model":"m","object":"chat.completion.chunk","usage":{"completion_tokens":2,"prompt_tokens":5,"total_tokens":7},"timings":{"prompt_n":5,"prompt_ms":20.5,"prompt_per_token_ms":4.1,"predicted_n":2,"predicted_ms":40.1,"predicted_per_token_ms":20.05,"predicted_per_second":49.875}}` + "\n\n"
	engine := newScriptedEngine(t, func(c net.Conn, _ *http.Request, _ []byte) {
		defer c.Close()
		io.WriteString(c, sseHead+chunk(roleEvent)+chunk(tokenEvent("a"))+chunk(tokenEvent("b"))+chunk(final)+chunk("data: [DONE]\n\n")+"0\r\n\r\n")
	})
	base := startProxy(t, engine.URL(), nil)
	resp := post(t, base+"/v1/chat/completions", `{"stream":true,"include_metrics":true}`, nil)
	events, _ := readEvents(t, resp.Body)
	resp.Body.Close()
	if len(events) != 5 {
		t.Fatalf("%d events", len(events))
	}
	m := metricsOf(t, events[3].data)
	for field, want := range map[string]float64{"engine.time_to_first_token_ms": 20.5, "engine.generation_time_ms": 40.1,
		"engine.mean_itl_ms": 20.05, "engine.tokens_per_second": 49.875, "engine.total_ms": 60.6} {
		if m[field] == nil || math.Abs(*m[field]-want) > 0.0005 {
			t.Errorf("%s = %v, want %v", field, m[field], want)
		}
	}
	if m["overhead_ms"] == nil || math.Abs(*m["overhead_ms"]-(*m["e2e_latency_ms"]-60.6)) > 0.002 {
		t.Errorf("overhead_ms %v, e2e %v", m["overhead_ms"], *m["e2e_latency_ms"])
	}
}

// TestEnginesOwnMetricsMembersStay: vLLM's metrics object is a shared
// namespace (speculative_decoding since 0.28, alone or beside its timing).
// For streams (usage asked or not) and non-streaming bodies, opted in or
// not, with or without --forward-include-metrics, what the engine put
// there arrives unchanged, member by member, beside the sidecar's figures;
// never an "engine" member repeating it.
func TestEnginesOwnMetricsMembersStay(t *testing.T) {
	const spec = `{"mean_acceptance_length":1.23,"draft_acceptance_rate":0.077,"acceptance_histogram":[39,1,0,3],"num_spec_steps":43,"num_accepted_draft_tokens":10,"num_draft_tokens":129,"num_spec_tokens":3}`
	for _, engineMetrics := range []string{
		`{"speculative_decoding":` + spec + `}`,
		`{"time_to_first_token_ms":12.5,"generation_time_ms":30,"queue_time_ms":1,"mean_itl_ms":10,"tokens_per_second":66.7,"speculative_decoding":` + spec + `}`,
	} {
		timed := strings.Contains(engineMetrics, "queue_time_ms")
		usageWithMetrics := `data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[],"usage":{"prompt_tokens":3,"completion_tokens":2,"total_tokens":5},"metrics":` + engineMetrics + "}\n\n"
		body := `{"id":"c","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":2,"total_tokens":5},"metrics":` + engineMetrics + `}`
		engine := newScriptedEngine(t, func(c net.Conn, req *http.Request, _ []byte) {
			defer c.Close()
			if req.Header.Get("X-Stream") == "" {
				fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
				return
			}
			io.WriteString(c, sseHead+chunk(roleEvent)+chunk(tokenEvent("a"))+chunk(shapeEvent(0, `{}`, "", "stop", ""))+chunk(usageWithMetrics)+chunk("data: [DONE]\n\n")+"0\r\n\r\n")
		})
		for _, forward := range []bool{false, true} {
			base := startProxy(t, engine.URL(), func(c *Config) { c.ForwardIncludeMetrics, c.Mode = forward, rewrite.ModeOptIn })
			for _, tc := range []struct{ name, req, stream string }{
				{"non-streaming", `{"include_metrics":true}`, ""},
				{"stream, usage asked", `{"stream":true,"stream_options":{"include_usage":true},"include_metrics":true}`, "1"},
				{"stream, usage not asked", `{"stream":true,"include_metrics":true}`, "1"},
				{"stream, not opted in", `{"stream":true,"stream_options":{"include_usage":true}}`, "1"},
			} {
				resp := post(t, base+"/v1/chat/completions", tc.req, map[string]string{"X-Stream": tc.stream})
				got, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				var doc string
				for _, line := range strings.Split(string(got), "\n") {
					if strings.Contains(line, `"metrics":`) {
						doc = strings.TrimPrefix(line, "data: ")
					}
				}
				m := gjson.Get(doc, "metrics")
				if m.Get("speculative_decoding").Raw != spec {
					t.Errorf("%s, forward %v, timed %v: speculative_decoding %q in %s", tc.name, forward, timed, m.Get("speculative_decoding").Raw, got)
				}
				optedIn := !strings.Contains(tc.name, "not opted in")
				switch {
				case !optedIn && m.Raw != engineMetrics:
					t.Errorf("%s, forward %v: the engine's object changed: %s", tc.name, forward, m.Raw)
				case m.Get("engine").Exists():
					t.Errorf("%s, forward %v, timed %v: an engine member repeats the engine's: %s", tc.name, forward, timed, m.Raw)
				case optedIn && timed && (m.Get("time_to_first_token_ms").Raw != "12.5" || m.Get("timing_sidecar.e2e_latency_ms").Exists() || !m.Get("timing_sidecar.time_to_first_token_ms").Exists()):
					t.Errorf("%s, forward %v: not the engine's figures with ours beside them: %s", tc.name, forward, m.Raw)
				case optedIn && !timed && (m.Get("timing_sidecar").Exists() || !m.Get("time_to_first_token_ms").Exists()):
					t.Errorf("%s, forward %v: ours not on top beside speculative_decoding: %s", tc.name, forward, m.Raw)
				}
			}
		}
	}
}

// TestSpeculativeDecodingInTheRecord: the engine's acceptance length and
// rate reach the access log, for the operators who look there.
func TestSpeculativeDecodingInTheRecord(t *testing.T) {
	body := `{"id":"c","object":"chat.completion","model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":2,"total_tokens":5},"metrics":{"speculative_decoding":{"mean_acceptance_length":1.23,"draft_acceptance_rate":0.077}}}`
	engine := newScriptedEngine(t, func(c net.Conn, _ *http.Request, _ []byte) {
		defer c.Close()
		fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
	})
	var log syncBuffer
	p, base := startSidecar(t, engine.URL(), nil, &log)
	resp := post(t, base+"/v1/chat/completions", `{"include_metrics":true}`, nil)
	io.ReadAll(resp.Body)
	resp.Body.Close()
	p.telemetry.Flush()
	line := log.lines()[0]
	if !strings.Contains(line, `"spec_acceptance_length":1.23,"spec_acceptance_rate":0.077`) {
		t.Fatalf("the record lacks the engine's speculative decoding: %s", line)
	}
}

// TestEmulatedVLLMSpeculativeDecoding: against the emulated engine playing
// vLLM 0.28 (--per-request-spec-decode-metrics in both forms, with and
// without its timing), the client gets the engine's speculative_decoding,
// per-step fields included, beside the sidecar's metrics, in streams and
// bodies; the sidecar's timing under timing_sidecar only when the engine
// reported its own.
func TestEmulatedVLLMSpeculativeDecoding(t *testing.T) {
	for _, timed := range []bool{false, true} {
		for _, form := range []string{"summary", "detailed"} {
			engine := startEmulator(t, emulator.Config{PerRequestMetrics: timed, SpecDecodeMetrics: form, Strict: true,
				Timing: emulator.Timing{OutputTokens: 8}})
			base := startProxy(t, engine.URL(), func(c *Config) { c.ForwardIncludeMetrics = true })
			for _, stream := range []bool{false, true} {
				resp := post(t, base+"/v1/chat/completions", fmt.Sprintf(`{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":%v,"include_metrics":true}`, stream), nil)
				got, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				var m gjson.Result
				for _, line := range strings.Split(string(got), "\n") {
					if r := gjson.Get(strings.TrimPrefix(line, "data: "), "metrics"); r.IsObject() {
						m = r
					}
				}
				sd := m.Get("speculative_decoding")
				if !sd.Get("mean_acceptance_length").Exists() || sd.Get("per_step_accepted_tokens").Exists() != (form == "detailed") {
					t.Errorf("timed %v, %s, stream %v: speculative_decoding %s", timed, form, stream, sd.Raw)
				}
				if m.Get("engine").Exists() || m.Get("timing_sidecar").Exists() != timed || !m.Get("e2e_latency_ms").Exists() {
					t.Errorf("timed %v, %s, stream %v: metrics %s", timed, form, stream, m.Raw)
				}
			}
		}
	}
}

// TestSeveralTokensPerEvent: an engine that sends three tokens an event
// (a stream interval, speculative decoding). The mean ITL is per token,
// the largest gap between events; the record says how many tokens an
// event carried: the mean from the count, the largest only where every
// event carried the running count.
func TestSeveralTokensPerEvent(t *testing.T) {
	engine := startEmulator(t, emulator.Config{Timing: emulator.Timing{TTFT: 5 * time.Millisecond, ITL: 6 * time.Millisecond, TokensPerEvent: 3, OutputTokens: 12}})
	var log syncBuffer
	p, base := startSidecar(t, engine.URL(), nil, &log)
	const req = `{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}],"stream_options":{"include_usage":true%s}}`
	for i, tt := range []struct {
		options string
		max     string
	}{
		{``, `null`},
		{`,"continuous_usage_stats":true`, `3`},
	} {
		resp := post(t, base+"/v1/chat/completions", fmt.Sprintf(req, tt.options), nil)
		events, _ := readEvents(t, resp.Body)
		resp.Body.Close()
		m := metricsOf(t, events[len(events)-2].data)
		if *m["completion_tokens"] != 12 || m["token_events"] != nil {
			t.Fatalf("%s: counts %v", tt.options, events[len(events)-2].data)
		}
		// Per token: 4 events, 12 tokens; the gaps are between events.
		if gen, mean := *m["generation_time_ms"], *m["mean_itl_ms"]; math.Abs(mean-gen/11) > 0.002 || *m["max_itl_ms"] < gen/3-0.002 {
			t.Errorf("%s: mean_itl_ms %v, max_itl_ms %v over generation %v", tt.options, mean, *m["max_itl_ms"], gen)
		}
		p.telemetry.Flush()
		line := log.lines()[i]
		if !strings.Contains(line, `"tokens_per_event":3,"max_tokens_per_event":`+tt.max+`,`) {
			t.Errorf("%s: the record says %s", tt.options, line)
		}
	}
}

// TestSidecarBehindSidecar: a sidecar in front of another (one in front
// of a router, one in front of each engine) leaves the client's metrics to
// the outer one, whose figures are not taken for an engine's.
func TestSidecarBehindSidecar(t *testing.T) {
	engine := startEmulator(t, emulator.Config{Timing: emulator.Timing{OutputTokens: 3}})
	inner := startProxy(t, engine.URL(), nil)
	outer := startProxy(t, inner, nil)
	for _, body := range []string{
		`{"model":"m","messages":[{"role":"user","content":"hi"}]}`,
		`{"model":"m","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"hi"}]}`,
	} {
		resp := post(t, outer+"/v1/chat/completions", body, nil)
		got, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if strings.Count(string(got), `"metrics":{`) != 1 || strings.Contains(string(got), rewrite.SidecarNamespace) {
			t.Errorf("%s: %s", body, got)
		}
	}
}

// TestSGLangMetaInfoBesideOurs: SGLang's non-streaming answer to
// "return_meta_info": true carries meta_info on its choice, in seconds
// (e2e_latency always; queue, forward entry, prefill and inference times
// with --enable-metrics). They come under metrics.engine on vLLM's names,
// and its cached tokens fill a usage that leaves them out.
func TestSGLangMetaInfoBesideOurs(t *testing.T) {
	meta := `{"id":"c","finish_reason":{"type":"stop"},"prompt_tokens":40,"completion_tokens":3,"cached_tokens":32,"e2e_latency":0.0425,` +
		`"queue_time":0.002,"forward_entry_time":1796434000.100,"prefill_finished_time":1796434000.1125,"inference_time":0.0385,"decode_throughput":115.3}`
	body := `{"id":"c","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop","meta_info":` + meta + `}],` +
		`"usage":{"prompt_tokens":40,"completion_tokens":3,"total_tokens":43,"prompt_tokens_details":null}}`
	engine := newScriptedEngine(t, func(c net.Conn, _ *http.Request, _ []byte) {
		defer c.Close()
		fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
	})
	var log syncBuffer
	p, base := startSidecar(t, engine.URL(), nil, &log)
	resp := post(t, base+"/v1/chat/completions", `{"model":"m","return_meta_info":true,"messages":[]}`, nil)
	got, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	m := gjson.GetBytes(got, "metrics")
	for field, want := range map[string]float64{"engine.total_ms": 42.5, "engine.queue_time_ms": 2, "engine.time_to_first_token_ms": 12.5,
		"engine.inference_time_ms": 38.5, "engine.generation_time_ms": 26} {
		if v := m.Get(field); v.Type != gjson.Number || math.Abs(v.Num-want) > 0.01 {
			t.Errorf("%s = %s, want %v", field, v.Raw, want)
		}
	}
	if m.Get("engine.source").Str != "sglang" || m.Get("engine.mean_itl_ms").Type != gjson.Null ||
		math.Abs(m.Get("overhead_ms").Num-(m.Get("e2e_latency_ms").Num-42.5)) > 0.002 {
		t.Errorf("metrics %s", m.Raw)
	}
	if gjson.GetBytes(got, "choices.0.meta_info").Raw != meta {
		t.Errorf("meta_info changed: %s", got)
	}
	p.telemetry.Flush()
	if line := log.lines()[0]; !strings.Contains(line, `"cached_tokens":32,`) {
		t.Errorf("SGLang's cached tokens not read: %s", line)
	}
}
