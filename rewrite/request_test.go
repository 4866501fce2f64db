package rewrite

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"time"
)

func TestInspectRequest(t *testing.T) {
	tests := []struct {
		name string
		body string
		want Request
	}{
		{"plain chat", `{"model":"m","messages":[{"role":"user","content":"hi"}]}`, Request{Understood: true, Model: "m"}},
		{"opted-in stream", `{"model":"m","stream":true,"include_metrics":true}`,
			Request{Understood: true, HasIncludeMetrics: true, IncludeMetrics: true, Stream: true, Model: "m"}},
		{"model not a string", `{"model":7}`, Request{Understood: true}},
		{"include_metrics false", `{"include_metrics":false}`, Request{Understood: true, HasIncludeMetrics: true}},
		{"include_metrics null is not ours", `{"include_metrics":null}`, Request{Understood: true}},
		{"stream with usage", `{"stream":true,"stream_options":{"include_usage":true,"continuous_usage_stats":true}}`,
			Request{Understood: true, Stream: true, IncludeUsage: true, ContinuousUsage: true}},
		{"stream_options null", `{"stream":true,"stream_options":null}`, Request{Understood: true, Stream: true}},
		{"stream_options without include_usage: vLLM's default is true", `{"stream":true,"stream_options":{}}`,
			Request{Understood: true, Stream: true, IncludeUsage: true}},
		{"include_usage false", `{"stream":true,"stream_options":{"include_usage":false}}`, Request{Understood: true, Stream: true}},
		{"include_usage null", `{"stream":true,"stream_options":{"include_usage":null}}`, Request{Understood: true, Stream: true}},
		{"n=2", `{"n":2}`, Request{Understood: true, MultipleChoices: true}},
		{"n=1", `{"n":1}`, Request{Understood: true}},
		{"several prompts", `{"prompt":["a","b"]}`, Request{Understood: true, MultipleChoices: true}},
		{"several token prompts", `{"prompt":[[1,2],[3]]}`, Request{Understood: true, MultipleChoices: true}},
		{"one prompt in an array", `{"prompt":["a"]}`, Request{Understood: true}},
		{"one token prompt", `{"prompt":[1,2,3]}`, Request{Understood: true}},
		{"last duplicate key wins", `{"stream":true,"stream":false}`, Request{Understood: true}},
		{"not JSON", `{"model":`, Request{}},
		{"not an object", `[1,2]`, Request{}},
		{"include_metrics of the wrong type", `{"include_metrics":"yes"}`, Request{InvalidIncludeMetrics: true}},
		{"a good include_metrics after a bad one", `{"include_metrics":"yes","include_metrics":true}`, Request{Understood: true, HasIncludeMetrics: true, IncludeMetrics: true}},
		{"a bad include_metrics after a good one", `{"include_metrics":true,"include_metrics":2}`, Request{InvalidIncludeMetrics: true}},
		{"stream of the wrong type", `{"stream":"true","include_metrics":true}`, Request{}},
		{"n of the wrong type", `{"n":"2"}`, Request{}},
		{"stream_options of the wrong type", `{"stream":true,"stream_options":true}`, Request{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := InspectRequest([]byte(tt.body))
			got.includeMetricsAt, got.includeMetricsEnd, got.includeMetricsCount = 0, 0, 0
			got.Upgradable = false // TestUpgradable
			if got != tt.want {
				t.Fatalf("InspectRequest = %+v, want %+v", got, tt.want)
			}
		})
	}
}

func TestUpgradable(t *testing.T) {
	for body, want := range map[string]bool{
		`{"model":"m","messages":[],"max_tokens":5,"temperature":0.2,"logprobs":true,"top_logprobs":2,"tools":[],"include_metrics":true}`: true,
		`{"model":"m","prompt":"a","logprobs":3,"echo":false,"best_of":1,"stream":false,"stream_options":null,"n":1}`:                     true,
		`{"model":"m","messages":[],"stream":true}`:           false, // already a stream
		`{"model":"m","messages":[],"n":2}`:                   false, // one metrics object cannot describe two
		`{"model":"m","prompt":["a","b"]}`:                    false,
		`{"model":"m","prompt":"a","echo":true}`:              false, // the echoed prompt is not streamed back the same way
		`{"model":"m","prompt":"a","best_of":3}`:              false,
		`{"model":"m","prompt":"a","prompt_logprobs":1}`:      false, // not in a stream
		`{"model":"m","messages":[],"stream_options":{}}`:     false, // the engine refuses it without stream
		`{"model":"m","messages":[],"kv_transfer_params":{}}`: false,
		`{"model":"m","messages":[],"some_new_field":1}`:      false, // unknown: not risked
		`{"model":"m","messages":[],"stream":"no"}`:           false, // not understood
	} {
		if got := InspectRequest([]byte(body)).Upgradable; got != want {
			t.Errorf("Upgradable(%s) = %v, want %v", body, got, want)
		}
	}
}

func TestUpgradedBody(t *testing.T) {
	body := []byte(`{"model":"m","include_metrics":true,"messages":[{"role":"user","content":"hi"}],"stream":false}`)
	got, err := UpgradedBody(body, InspectRequest(body))
	if err != nil {
		t.Fatal(err)
	}
	if !jsonEqual(t, got, []byte(`{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true,"stream_options":{"include_usage":true}}`)) {
		t.Fatalf("UpgradedBody = %s", got)
	}
}

func TestUpstreamBody(t *testing.T) {
	tests := []struct {
		name     string
		body     string
		measured bool
		want     string // compared as JSON values
	}{
		{"removes include_metrics", `{"model":"m","include_metrics":true,"stream":false}`, true, `{"model":"m","stream":false}`},
		{"removes include_metrics false", `{"model":"m","include_metrics":false}`, false, `{"model":"m"}`},
		{"removes a first member", `{ "include_metrics" : true , "model":"m"}`, false, `{"model":"m"}`},
		{"removes the only member", `{"include_metrics":true}`, false, `{}`},
		{"removes a spaced last member", "{\"model\":\"m\" ,\n \"include_metrics\":\ttrue\n}", false, `{"model":"m"}`},
		{"removes every duplicate", `{"include_metrics":false,"model":"m","include_metrics":true}`, false, `{"model":"m"}`},
		{"asks for usage on a measured stream", `{"model":"m","stream":true,"include_metrics":true}`, true,
			`{"model":"m","stream":true,"stream_options":{"include_usage":true}}`},
		{"keeps the client's stream options", `{"stream":true,"stream_options":{"continuous_usage_stats":true,"include_usage":false}}`, true,
			`{"stream":true,"stream_options":{"continuous_usage_stats":true,"include_usage":true}}`},
		{"stream options imply usage", `{"stream":true,"stream_options":{"continuous_usage_stats":true}}`, true,
			`{"stream":true,"stream_options":{"continuous_usage_stats":true}}`},
		{"overrides include_usage false", `{"stream":true,"stream_options":{"include_usage":false}}`, true,
			`{"stream":true,"stream_options":{"include_usage":true}}`},
		{"replaces null stream options", `{"stream":true,"stream_options":null}`, true,
			`{"stream":true,"stream_options":{"include_usage":true}}`},
		{"unmeasured stream untouched", `{"stream":true}`, false, `{"stream":true}`},
		{"usage already asked", `{"stream":true,"stream_options":{"include_usage":true}}`, true,
			`{"stream":true,"stream_options":{"include_usage":true}}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			body := []byte(tt.body)
			got, err := UpstreamBody(nil, body, InspectRequest(body), tt.measured)
			if err != nil {
				t.Fatal(err)
			}
			if string(body) != tt.body {
				t.Fatalf("input modified: %s", body)
			}
			if !jsonEqual(t, got, []byte(tt.want)) {
				t.Fatalf("UpstreamBody = %s, want %s", got, tt.want)
			}
		})
	}
}

func TestUpstreamBodyManyDuplicatesIsLinear(t *testing.T) {
	// An attacker's body with the key repeated: one pass, not one per copy.
	body := []byte("{" + strings.Repeat(`"include_metrics":true,`, 50000) + `"model":"m"}`)
	start := time.Now()
	got, err := UpstreamBody(nil, body, InspectRequest(body), false)
	if err != nil || string(got) != `{"model":"m"}` {
		t.Fatalf("UpstreamBody = %.100s, %v", got, err)
	}
	if d := time.Since(start); d > time.Second {
		t.Fatalf("%d duplicate keys took %v", 50000, d)
	}
}

func TestUpstreamBodyUntouchedIsSameBytes(t *testing.T) {
	body := []byte(`{ "model" : "m",  "stream": true }`)
	got, err := UpstreamBody(nil, body, InspectRequest(body), false)
	if err != nil || string(got) != string(body) {
		t.Fatalf("UpstreamBody = %q, %v; want the input bytes", got, err)
	}
}

func jsonEqual(t *testing.T, a, b []byte) bool {
	t.Helper()
	var x, y any
	if err := json.Unmarshal(a, &x); err != nil {
		t.Fatalf("invalid JSON %s: %v", a, err)
	}
	if err := json.Unmarshal(b, &y); err != nil {
		t.Fatalf("invalid JSON %s: %v", b, err)
	}
	return reflect.DeepEqual(x, y)
}
