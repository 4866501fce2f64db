package proxy

import (
	"encoding/json"
	"io"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/timing-sidecar/timing-sidecar/e2e/emulator"
)

// TestMessagesAndResponsesAPIs runs Anthropic's Messages API and OpenAI's
// Responses API through the sidecar, streamed and not: the metrics within
// tolerance of the engine's own marks, in the place each API puts usage,
// and every other byte as the engine sent it.
func TestMessagesAndResponsesAPIs(t *testing.T) {
	engine := startEmulator(t, emulator.Config{Timing: emulator.Timing{HeaderDelay: 20 * time.Millisecond,
		TTFT: 40 * time.Millisecond, ITL: 20 * time.Millisecond, OutputTokens: 5}})
	base := startProxy(t, engine.URL(), nil)
	for _, tt := range []struct {
		name, path, body string
		stream           bool
		metricsIn        string // the event type whose data (or data.response) takes the metrics
	}{
		{"messages stream", "/v1/messages", `{"model":"m","max_tokens":5,"stream":true,"messages":[{"role":"user","content":"hi"}]}`, true, "message_delta"},
		{"messages", "/v1/messages", `{"model":"m","max_tokens":5,"messages":[{"role":"user","content":"hi"}]}`, false, ""},
		{"responses stream", "/v1/responses", `{"model":"m","stream":true,"input":"hi"}`, true, "response.completed"},
		{"responses", "/v1/responses", `{"model":"m","input":"hi"}`, false, ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			id := map[string]string{"X-Request-Id": strings.ReplaceAll(tt.name, " ", "-")}
			direct := post(t, engine.URL()+tt.path, tt.body, id)
			want, _ := io.ReadAll(direct.Body)
			direct.Body.Close()
			withMetrics := strings.Replace(tt.body, `{"model":"m",`, `{"model":"m","include_metrics":true,`, 1)
			start := time.Now()
			resp := post(t, base+tt.path, withMetrics, id)
			headers := time.Now()
			var got []byte
			var gotEvents []sseEvent
			if tt.stream {
				gotEvents, _ = readEvents(t, resp.Body) // each stamped as it arrives
			} else {
				got, _ = io.ReadAll(resp.Body)
			}
			end := time.Now()
			resp.Body.Close()
			rec, err := engine.Last(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			if strings.Contains(string(rec.Body), "include_metrics") || strings.Contains(string(rec.Body), "stream_options") {
				t.Errorf("the engine got %s", rec.Body)
			}
			if !tt.stream {
				m := metricsOf(t, string(got))
				during(t, m, "e2e_latency_ms", span{start, rec.Received}, span{rec.HeadersSent, end})
				if *m["completion_tokens"] != 5 || *m["prompt_tokens"] != float64(rec.PromptTokens) {
					t.Errorf("token counts %v %v", *m["completion_tokens"], *m["prompt_tokens"])
				}
				equalWithoutMetrics(t, got, want, "")
				return
			}
			wantEvents, _ := readEvents(t, strings.NewReader(string(want)))
			if len(gotEvents) != len(wantEvents) {
				t.Fatalf("%d events, the engine sent %d", len(gotEvents), len(wantEvents))
			}
			found := false
			for i := range gotEvents {
				g, w := gotEvents[i].data, wantEvents[i].data
				if !strings.Contains(w, `"type":"`+tt.metricsIn+`"`) {
					if g != w {
						t.Errorf("event %d changed:\n got %s\nwant %s", i, g, w)
					}
					continue
				}
				found = true
				nested := ""
				if tt.path == "/v1/responses" {
					nested = "response"
				}
				equalWithoutMetrics(t, []byte(g), []byte(w), nested)
				doc := g
				if nested != "" {
					var outer map[string]json.RawMessage
					json.Unmarshal([]byte(g), &outer)
					doc = string(outer[nested])
				}
				m := metricsOf(t, doc)
				accepted := span{rec.HeadersSent, headers}
				first := span{rec.FirstToken, firstReceived(t, gotEvents, isTextDelta)}
				last := span{rec.LastToken, lastReceived(t, gotEvents, isTextDelta)}
				during(t, m, "queue_time_ms", span{start, rec.Received}, accepted)
				during(t, m, "time_to_first_token_ms", accepted, first)
				during(t, m, "generation_time_ms", first, last)
				if *m["completion_tokens"] != 5 || m["prompt_tokens"] == nil || *m["prompt_tokens"] != float64(rec.PromptTokens) {
					t.Errorf("token counts in %s", doc)
				}
			}
			if !found {
				t.Fatalf("no %s event", tt.metricsIn)
			}
		})
	}
}

// equalWithoutMetrics compares two JSON objects apart from the "metrics"
// member (of the member nested, if set).
func equalWithoutMetrics(t *testing.T, got, want []byte, nested string) {
	t.Helper()
	var g, w map[string]any
	if json.Unmarshal(got, &g) != nil || json.Unmarshal(want, &w) != nil {
		t.Fatalf("not JSON objects:\n%s\n%s", got, want)
	}
	target := g
	if nested != "" {
		target, _ = g[nested].(map[string]any)
	}
	if target == nil || target["metrics"] == nil {
		t.Fatalf("no metrics in %s", got)
	}
	delete(target, "metrics")
	if !reflect.DeepEqual(g, w) {
		t.Errorf("changed apart from metrics:\n got %s\nwant %s", got, want)
	}
}
