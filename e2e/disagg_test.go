package e2e

import (
	"bufio"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/timing-sidecar/timing-sidecar/e2e/emulator"
)

// TestDisaggregatedServing: a request split over a prefill and a decode
// engine by a routing proxy that behaves as llm-d's, with a sidecar in
// each of the three places one can stand: in front of the routing proxy
// (what clients reach), between it and the decode engine, and in front of
// the prefill engine. The client-facing sidecar's TTFT is the client's,
// within causal bounds, never near zero; each sidecar labels its leg.
// Once with a decode engine that sends its headers before pulling the KV,
// as vLLM does, once with one that sends them with its first token, as
// llm-d's simulator does. The three sidecars' spans form one trace,
// parented as the request flowed.
func TestDisaggregatedServing(t *testing.T) {
	c := startCollector(t)
	for _, late := range []bool{false, true} {
		name := map[bool]string{false: "decode headers before the KV pull", true: "decode headers with the first token"}[late]
		t.Run(name, func(t *testing.T) {
			prefill := startEngine(t, emulator.Config{Timing: emulator.Timing{TTFT: 150 * time.Millisecond, ITL: 5 * time.Millisecond, TokensPerEvent: 1, OutputTokens: 8}})
			decode := startEngine(t, emulator.Config{LateHeaders: late,
				Timing: emulator.Timing{KVTransfer: 50 * time.Millisecond, ITL: 5 * time.Millisecond, TokensPerEvent: 1, OutputTokens: 8}})
			traced := func(service string) []string {
				return []string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=http://" + c.grpc, "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=grpc",
					"OTEL_SERVICE_NAME=" + service, "OTEL_BSP_SCHEDULE_DELAY=50"}
			}
			prefillSide := startSidecar(t, []string{"--upstream", prefill.URL()}, traced("prefill")...)
			decodeSide := startSidecar(t, []string{"--upstream", decode.URL()}, traced("decode")...)
			router := startRouter(t, decodeSide.base)
			clientSide := startSidecar(t, []string{"--upstream", router}, traced("client")...)

			body := `{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true,"stream_options":{"include_usage":true},"include_metrics":true}`
			req, _ := http.NewRequest(http.MethodPost, clientSide.base+"/v1/chat/completions", strings.NewReader(body))
			req.Header.Set(prefillerHeader, strings.TrimPrefix(prefillSide.base, "http://"))
			req.Header.Set("X-Request-Id", "split")
			traceID, parentID := randomHex(16), randomHex(8)
			req.Header.Set("Traceparent", "00-"+traceID+"-"+parentID+"-01")
			start := time.Now()
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			var firstToken time.Time
			var usage string
			sc := bufio.NewScanner(resp.Body)
			for sc.Scan() {
				data, ok := strings.CutPrefix(sc.Text(), "data: ")
				switch {
				case !ok:
				case firstToken.IsZero() && strings.Contains(data, `"content":"`) && !strings.Contains(data, `"content":""`):
					firstToken = time.Now()
				case strings.Contains(data, `"metrics"`):
					usage = data
				}
			}
			resp.Body.Close()
			if firstToken.IsZero() || usage == "" {
				t.Fatalf("no first token (%v) or no metrics (%q)", firstToken, usage)
			}
			var event struct {
				Metrics json.RawMessage `json:"metrics"`
			}
			json.Unmarshal([]byte(usage), &event)
			m := parseMetrics(t, string(event.Metrics))
			prefillRec, decodeRec := record(t, prefill, "chatcmpl-split"), record(t, decode, "chatcmpl-split")

			// The client-facing sidecar: arrival between the client's
			// send and the prefill engine's read; first token between
			// the decode engine's write and the client's read.
			m.null(t, "queue_time_ms")
			m.during(t, "time_to_first_token_ms", span{start, prefillRec.Received}, span{decodeRec.FirstToken, firstToken}, 1)
			if ttft := m["time_to_first_token_ms"]; ttft != nil && *ttft < 200 {
				t.Errorf("time_to_first_token_ms %.3f, under the 150 ms prefill and the 50 ms KV pull", *ttft)
			}
			t.Logf("client: first token after %.1f ms; client-facing sidecar: ttft %.1f ms", msOf(firstToken.Sub(start)), *m["time_to_first_token_ms"])

			logs := map[string]map[string]any{}
			for name, s := range map[string]*sidecar{"client": clientSide, "decode": decodeSide, "prefill": prefillSide} {
				logs[name] = accessLine(t, s, "/v1/chat/completions")
			}
			for name, want := range map[string][2]string{
				"client":  {"whole", "arrival"},
				"decode":  {"decode", map[bool]string{false: "accepted", true: "arrival"}[late]},
				"prefill": {"prefill", ""},
			} {
				l := logs[name]
				if l["leg"] != want[0] || want[1] != "" && l["ttft_from"] != want[1] {
					t.Errorf("%s sidecar: leg %v, ttft_from %v; want %s, %s", name, l["leg"], l["ttft_from"], want[0], want[1])
				}
				t.Logf("%s sidecar: %v path %v status %v leg %v, ttft_from %v, time_to_first_token_ms %v, queue_time_ms %v, e2e_latency_ms %v", name, l["msg"], l["path"], l["status"],
					l["leg"], l["ttft_from"], l["time_to_first_token_ms"], l["queue_time_ms"], l["e2e_latency_ms"])
			}
			checkOneTrace(t, c.awaitTrace(t, traceID, 6), parentID)
		})
	}
}

// accessLine is the next access-log line of s for path, decoded: the
// readiness probes of the sidecars in front pass through and are logged
// too.
func accessLine(t *testing.T, s *sidecar, path string) map[string]any {
	t.Helper()
	for {
		select {
		case line := <-s.accessLog:
			var l map[string]any
			if err := json.Unmarshal([]byte(line), &l); err != nil {
				t.Fatalf("access log line %q: %v", line, err)
			}
			if l["path"] == path {
				return l
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("no access-log line for %s", path)
			return nil
		}
	}
}

// checkOneTrace checks that a split request's spans are one trace: the
// client-facing sidecar's SERVER span under the client's, and each leg's
// SERVER span under the client-facing sidecar's CLIENT span, whose
// context the router copied to both legs; each SERVER span names its leg.
func checkOneTrace(t *testing.T, tr []otlpSpan, parentID string) {
	t.Helper()
	server, client := map[string]otlpSpan{}, map[string]otlpSpan{}
	for _, s := range tr {
		service, _ := s.Resource["service.name"].(string)
		switch s.Kind {
		case spanKindServer:
			server[service] = s
		case spanKindClient:
			client[service] = s
		}
	}
	if len(server) != 3 || len(client) != 3 {
		t.Fatalf("the trace has SERVER spans of %d sidecars and CLIENT spans of %d, want 3 each", len(server), len(client))
	}
	if server["client"].parent() != parentID {
		t.Errorf("the client-facing SERVER span's parent %s, want the client's %s", server["client"].parent(), parentID)
	}
	for service, leg := range map[string]string{"client": "whole", "decode": "decode", "prefill": "prefill"} {
		if service != "client" && server[service].parent() != client["client"].SpanID {
			t.Errorf("the %s leg's SERVER span's parent %s, want the client-facing CLIENT span %s", service, server[service].parent(), client["client"].SpanID)
		}
		if got := server[service].tag("timing_sidecar.leg"); got != leg {
			t.Errorf("the %s sidecar's SERVER span says leg %v, want %s", service, got, leg)
		}
	}
}
