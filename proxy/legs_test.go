package proxy

import (
	"cmp"
	"encoding/json"
	"io"
	"testing"
)

// TestLegs: a request a router split over two engines is labelled with
// its leg, read from the kv_transfer_params the router added, in the
// access log and the series; a decode leg's cached tokens, which count
// the KV pulled from the prefill engine, are no prefix-cache hit.
func TestLegs(t *testing.T) {
	engine := newFakeEngine(t)
	var accessLog syncBuffer
	p, base := startSidecar(t, engine.URL(), nil, &accessLog)
	for _, tc := range []struct{ id, body string }{
		{"whole", `{"model":"m","stream":true,"stream_options":{"include_usage":true},"messages":[]}`},
		{"prefill", `{"model":"m","max_tokens":1,"messages":[],"kv_transfer_params":{"do_remote_decode":true,"do_remote_prefill":false}}`},
		{"decode", `{"model":"m","stream":true,"stream_options":{"include_usage":true},"messages":[],"kv_transfer_params":{"do_remote_decode":false,"do_remote_prefill":true,"remote_block_ids":[1]}}`},
		// A whole request a router behind splits: the answer is a decode
		// engine's.
		{"split", `{"model":"m","stream":true,"stream_options":{"include_usage":true},"messages":[]}`},
	} {
		resp := post(t, base+"/v1/chat/completions", tc.body, map[string]string{"X-Fake-Cached": "2", "X-Request-Id": tc.id, prefillerHeader: map[bool]string{true: "10.0.0.7:8000"}[tc.id == "split"]})
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		<-engine.next(t).Finished
	}
	p.telemetry.Flush()
	seen := map[string]bool{}
	for _, line := range accessLog.lines() {
		var l struct {
			ID    string `json:"request_id"`
			Leg   string `json:"leg"`
			Cache string `json:"cache"`
		}
		if err := json.Unmarshal([]byte(line), &l); err != nil || l.ID == "" {
			continue
		}
		seen[l.ID] = true
		if want := map[string]string{"split": "whole"}[l.ID]; l.Leg != cmp.Or(want, l.ID) {
			t.Errorf("request %s logged as leg %q", l.ID, l.Leg)
		}
		if want := map[string]string{"whole": "partial", "prefill": "partial", "decode": "unknown", "split": "unknown"}[l.ID]; l.Cache != want {
			t.Errorf("leg %s: cache %q, want %q", l.ID, l.Cache, want)
		}
	}
	if len(seen) != 4 {
		t.Fatalf("access log lines for %v, want the four requests", seen)
	}
	counted := requestsBy(t, p, "leg")
	if counted["whole"] != 2 || counted["prefill"] != 1 || counted["decode"] != 1 {
		t.Errorf("requests_total by leg %v, want one each", counted)
	}
}

// TestSGLangLegs: a request SGLang's router split (bootstrap_room) is the
// leg the configured engine serves; without the setting, whole.
func TestSGLangLegs(t *testing.T) {
	engine := newFakeEngine(t)
	for _, leg := range []string{"", "prefill", "decode"} {
		var accessLog syncBuffer
		p, base := startSidecar(t, engine.URL(), func(c *Config) { c.DisaggregationLeg = leg }, &accessLog)
		resp := post(t, base+"/v1/chat/completions", `{"model":"m","messages":[],"bootstrap_host":"10.0.0.9","bootstrap_room":12345}`, nil)
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		<-engine.next(t).Finished
		p.telemetry.Flush()
		want := leg
		if want == "" {
			want = "whole"
		}
		found := false
		for _, line := range accessLog.lines() {
			var l struct {
				Path, Leg string
			}
			if json.Unmarshal([]byte(line), &l) == nil && l.Path == "/v1/chat/completions" {
				found = true
				if l.Leg != want {
					t.Errorf("disaggregation leg %q: logged %q, want %q", leg, l.Leg, want)
				}
			}
		}
		if !found {
			t.Errorf("disaggregation leg %q: no access-log line", leg)
		}
	}
}
