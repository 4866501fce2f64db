package proxy

import (
	"fmt"
	"testing"
)

// TestTTFTOrigin: where a stream's TTFT counts from, through the proxy.
// From the engine's response headers when they lead its first token; from
// arrival, with no queue time, when they come with the first token (a
// server that does not flush first) or when a router behind the sidecar
// will split the request (x-prefiller-host-port on a whole request): the
// object never says a TTFT of about zero for a first token that came after
// the engine's whole wait. Each figure within causal bounds.
func TestTTFTOrigin(t *testing.T) {
	engine := newFakeEngine(t)
	base := startProxy(t, engine.URL(), nil)
	const whole = `"messages":[]`
	const decodeLeg = `"messages":[],"kv_transfer_params":{"do_remote_prefill":true,"do_remote_decode":false}`
	for _, tc := range []struct {
		name        string
		headers     map[string]string
		members     string
		fromArrival bool
	}{
		{"headers before the first token", map[string]string{}, whole, false},
		{"headers with the first token", map[string]string{"X-Fake-Late-Headers": "1"}, whole, true},
		{"a router behind will split the request", map[string]string{prefillerHeader: "10.0.0.7:8000"}, whole, true},
		{"a decode leg's headers are its engine's", map[string]string{prefillerHeader: "10.0.0.7:8000"}, decodeLeg, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.headers["X-Fake-Header-Delay"], tc.headers["X-Fake-TTFT"], tc.headers["X-Fake-Tokens"] = "20", "40", "3"
			body := `{"model":"m","stream":true,"include_metrics":true,"stream_options":{"include_usage":true},` + tc.members + `}`
			start, headers, events, fr := timedStream(t, engine, base+"/v1/chat/completions", body, tc.headers)
			m := metricsOf(t, events[len(events)-2].data)
			arrival := span{start, fr.Received}
			first := span{fr.TokenSent[0], received(t, events, fmt.Sprintf(" t%d", 0))}
			if tc.fromArrival {
				isNull(t, m, "queue_time_ms")
				during(t, m, "time_to_first_token_ms", arrival, first)
				// The engine waited 60 ms before its first token: no
				// TTFT near zero.
				if ttft := m["time_to_first_token_ms"]; ttft != nil && *ttft < 60 {
					t.Errorf("time_to_first_token_ms %.3f under the engine's 60 ms wait", *ttft)
				}
				return
			}
			accepted := span{fr.HeadersSent, headers}
			during(t, m, "queue_time_ms", arrival, accepted)
			during(t, m, "time_to_first_token_ms", accepted, first)
		})
	}
}
