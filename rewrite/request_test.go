package rewrite

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/tidwall/gjson"
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
		{"include_usage repeated: the last counts", `{"stream":true,"stream_options":{"include_usage":true,"continuous_usage_stats":false,"include_usage":false,"continuous_usage_stats":true}}`,
			Request{Understood: true, Stream: true, ContinuousUsage: true}},
		{"n=2", `{"n":2}`, Request{Understood: true, MultipleChoices: true}},
		{"n=1", `{"n":1}`, Request{Understood: true}},
		{"several prompts", `{"prompt":["a","b"]}`, Request{Understood: true, MultipleChoices: true}},
		{"several token prompts", `{"prompt":[[1,2],[3]]}`, Request{Understood: true, MultipleChoices: true}},
		{"one prompt in an array", `{"prompt":["a"]}`, Request{Understood: true}},
		{"one token prompt", `{"prompt":[1,2,3]}`, Request{Understood: true}},
		{"a key repeated: read by no one", `{"stream":true,"stream":false}`, Request{Repeated: true}},
		{"model repeated", `{"model":"a","model":"b"}`, Request{Repeated: true}},
		{"not JSON", `{"model":`, Request{}},
		{"not an object", `[1,2]`, Request{}},
		{"include_metrics the engine refuses", `{"include_metrics":"maybe"}`, Request{InvalidIncludeMetrics: true}},
		{"include_metrics a number the engine refuses", `{"include_metrics":2}`, Request{InvalidIncludeMetrics: true}},
		{"include_metrics an object", `{"include_metrics":{}}`, Request{InvalidIncludeMetrics: true}},
		{"include_metrics repeated", `{"include_metrics":"yes","include_metrics":true}`, Request{Repeated: true}},
		{"stream the engine refuses", `{"stream":"sure","include_metrics":true}`, Request{}},
		{"stream a number the engine refuses", `{"stream":2}`, Request{}},
		{"include_usage the engine refuses", `{"stream":true,"stream_options":{"include_usage":"maybe"}}`, Request{}},
		{"continuous_usage_stats the engine refuses", `{"stream":true,"stream_options":{"continuous_usage_stats":[]}}`, Request{}},
		{"include_usage refused, then repeated right: the last counts",
			`{"stream":true,"stream_options":{"include_usage":"maybe","include_usage":0}}`, Request{Understood: true, Stream: true}},
		// Pydantic's lax booleans, as vLLM reads them.
		{"include_metrics \"yes\"", `{"include_metrics":"yes"}`, Request{Understood: true, HasIncludeMetrics: true, IncludeMetrics: true}},
		{"include_metrics 1", `{"include_metrics":1}`, Request{Understood: true, HasIncludeMetrics: true, IncludeMetrics: true}},
		{"include_metrics \"Off\"", `{"include_metrics":"Off"}`, Request{Understood: true, HasIncludeMetrics: true}},
		{"stream \"true\"", `{"stream":"true"}`, Request{Understood: true, Stream: true}},
		{"stream 1.0", `{"stream":1.0}`, Request{Understood: true, Stream: true}},
		{"stream \"0\"", `{"stream":"0","stream_options":{}}`, Request{Understood: true, IncludeUsage: true}},
		{"include_usage 0", `{"stream":true,"stream_options":{"include_usage":0}}`, Request{Understood: true, Stream: true}},
		{"include_usage \"no\"", `{"stream":true,"stream_options":{"include_usage":"no"}}`, Request{Understood: true, Stream: true}},
		{"include_usage \"N\"", `{"stream":true,"stream_options":{"include_usage":"N"}}`, Request{Understood: true, Stream: true}},
		{"continuous_usage_stats \"on\"", `{"stream":true,"stream_options":{"continuous_usage_stats":"on"}}`,
			Request{Understood: true, Stream: true, IncludeUsage: true, ContinuousUsage: true}},
		// Escaped keys, as the engine's JSON decoder unescapes them.
		{"escaped stream_options", `{"stream":true,"\u0073\u0074\u0072\u0065\u0061\u006d\u005f\u006f\u0070\u0074\u0069\u006f\u006e\u0073":{"include_usage":true}}`,
			Request{Understood: true, Stream: true, IncludeUsage: true}},
		{"escaped include_usage", `{"stream":true,"stream_options":{"\u0069\u006e\u0063\u006c\u0075\u0064\u0065\u005f\u0075\u0073\u0061\u0067\u0065":false}}`,
			Request{Understood: true, Stream: true}},
		{"escaped include_metrics", `{"\u0069\u006e\u0063\u006c\u0075\u0064\u0065\u005f\u006d\u0065\u0074\u0072\u0069\u0063\u0073":true}`,
			Request{Understood: true, HasIncludeMetrics: true, IncludeMetrics: true}},
		{"escaped and plain stream: repeated", `{"stream":true,"\u0073tream":false}`, Request{Repeated: true}},
		{"n of the wrong type", `{"n":"2"}`, Request{}},
		{"stream_options of the wrong type", `{"stream":true,"stream_options":true}`, Request{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := InspectRequest([]byte(tt.body))
			got.includeMetrics, got.streamOptions, got.stream = members{}, members{}, members{}
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
		`{"model":"m","messages":[],"stream":"no"}`:           true,  // read as false, as the engine does
		`{"model":"m","prompt":"a","echo":"on"}`:              false, // read as true
		`{"model":"m","messages":[],"stream":"nope"}`:         false, // refused by the engine: not understood
	} {
		if got := InspectRequest([]byte(body)).Upgradable; got != want {
			t.Errorf("Upgradable(%s) = %v, want %v", body, got, want)
		}
	}
}

func TestUpgradedBody(t *testing.T) {
	body := []byte(`{"model":"m","include_metrics":true,"messages":[{"role":"user","content":"hi"}],"stream":false}`)
	got, err := upgradedBody(body, InspectRequest(body))
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
			got, err := upstreamBody(body, InspectRequest(body), tt.measured)
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
	// An attacker's body with the key repeated: one pass, not one per
	// copy, and forwarded as it came.
	body := []byte("{" + strings.Repeat(`"include_metrics":true,`, 50000) + `"model":"m"}`)
	start := time.Now()
	r := InspectRequest(body)
	got, _ := upstreamBody(body, r, false)
	if !r.Repeated || string(got) != string(body) {
		t.Fatalf("UpstreamBody = %.100s; repeated %v", got, r.Repeated)
	}
	if d := time.Since(start); d > time.Second {
		t.Fatalf("%d duplicate keys took %v", 50000, d)
	}
}

func TestUpstreamBodyAllocatesNothing(t *testing.T) {
	// Each key once, the common case: edited by offsets, into a reused
	// Edit's room.
	body := []byte(`{"model":"m","stream":true,"include_metrics":true,"stream_options":{"include_usage":false,"continuous_usage_stats":false},"max_tokens":5}`)
	r := InspectRequest(body)
	var e Edit
	UpstreamBody(&e, body, r, true)
	if allocs := testing.AllocsPerRun(100, func() { UpstreamBody(&e, body, r, true) }); allocs != 0 {
		t.Fatalf("UpstreamBody allocates %v times, want 0", allocs)
	}
}

func TestUpstreamBodyUntouchedIsSameBytes(t *testing.T) {
	body := []byte(`{ "model" : "m",  "stream": true }`)
	var e Edit
	if err := UpstreamBody(&e, body, InspectRequest(body), false); err != nil || !e.Unchanged() {
		t.Fatalf("UpstreamBody = %q, %v; want the input unchanged", e.AppendTo(nil), err)
	}
}

// upstreamBody and upgradedBody are the edits as bytes.
func upstreamBody(body []byte, r Request, askUsage bool) ([]byte, error) {
	var e Edit
	err := UpstreamBody(&e, body, r, askUsage)
	return e.AppendTo(nil), err
}

func upgradedBody(body []byte, r Request) ([]byte, error) {
	var e Edit
	err := UpgradedBody(&e, body, r)
	return e.AppendTo(nil), err
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

func TestInspectRequestDeepNesting(t *testing.T) {
	// 12 MB of nested arrays overflowed the stack of a recursive check.
	deep := strings.Repeat("[", 6<<20) + strings.Repeat("]", 6<<20)
	for name, body := range map[string]string{
		"nested arrays":              deep,
		"nested arrays in an object": `{"model":"m","include_metrics":true,"messages":` + deep + `}`,
	} {
		if got := InspectRequest([]byte(body)); got != (Request{}) {
			t.Errorf("%s: InspectRequest = %+v, want not Understood", name, got)
		}
	}
	at := []byte(strings.Replace(nestedObject(maxDepth), `{`, `{"include_metrics":true,`, 1))
	if r := InspectRequest(at); !r.Understood || !r.IncludeMetrics {
		t.Errorf("a request maxDepth deep is not understood: %+v", r)
	}
	past := []byte(strings.Replace(nestedObject(maxDepth+1), `{`, `{"include_metrics":true,`, 1))
	if r := InspectRequest(past); r.Understood {
		t.Errorf("a request deeper than maxDepth is understood: %+v", r)
	}
}

// TestRequestEditsLastCopy: the body sent upstream has one copy of each
// key the sidecar sets, at the end of the object, where a parser that
// takes the last copy (Python's json, as the engine does) reads the
// sidecar's value; the other members are as the client sent them. A
// request that repeats a key the sidecar reads or edits is not edited at
// all: which copy an engine reads depends on its parser (issue 28).
func TestRequestEditsLastCopy(t *testing.T) {
	usage := func(body []byte) ([]byte, error) { return upstreamBody(body, InspectRequest(body), true) }
	tests := []struct {
		name string
		edit func([]byte) ([]byte, error)
		body string
		key  string
		want string // the value a last-wins parser reads at key
	}{
		{"stream_options repeated", usage,
			`{"stream":true,"stream_options":{"include_usage":true},"model":"m","stream_options":{"include_usage":false,"continuous_usage_stats":false}}`,
			"stream_options", `{"include_usage":true,"continuous_usage_stats":false}`},
		{"stream_options repeated, the last null", usage,
			`{"stream_options":{"include_usage":false},"stream":true,"stream_options":null}`,
			"stream_options", `{"include_usage":true}`},
		{"stream_options repeated, include_metrics cut too", usage,
			`{"stream_options":null,"include_metrics":true,"stream":true,"stream_options":{"x":1,"include_usage":null}}`,
			"stream_options", `{"x":1,"include_usage":true}`},
		{"include_usage repeated inside", usage,
			`{"stream":true,"stream_options":{"include_usage":true,"include_usage":false,"x":[1]}}`,
			"stream_options", `{"x":[1],"include_usage":true}`},
		{"stream_options before include_metrics", usage,
			`{"stream_options":{"include_usage":false},"include_metrics":true,"stream":true}`,
			"stream_options", `{"include_usage":true}`},
		{"include_metrics and stream_options the first two", usage,
			`{ "include_metrics" : true , "stream_options" : null , "stream":true}`,
			"stream_options", `{"include_usage":true}`},
		{"include_metrics and stream_options the last two", usage,
			`{"stream":true,"stream_options":null,"include_metrics":true}`,
			"stream_options", `{"include_usage":true}`},
		{"include_metrics and stream_options the only two", func(body []byte) ([]byte, error) {
			r := InspectRequest(body)
			r.Stream = true // the edit on its own, however it came to be asked for
			return upstreamBody(body, r, true)
		}, `{"stream_options":null,"include_metrics":true}`, "stream_options", `{"include_usage":true}`},
		{"stream_options absent", usage,
			`{"model":"m","stream":true}`, "stream_options", `{"include_usage":true}`},
		{"upgrade with stream repeated", func(body []byte) ([]byte, error) { return upgradedBody(body, InspectRequest(body)) },
			`{"stream":false,"model":"m","stream":false,"include_metrics":true,"stream_options":null,"messages":[]}`,
			"stream", `true`},
		{"upgrade sets stream_options", func(body []byte) ([]byte, error) { return upgradedBody(body, InspectRequest(body)) },
			`{"stream_options":null,"model":"m","stream":null,"stream_options":null}`,
			"stream_options", `{"include_usage":true}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			body := []byte(tt.body)
			if r := InspectRequest(body); r.Repeated {
				if got, err := tt.edit(body); string(got) != tt.body {
					t.Fatalf("a request repeating a key edited: %s, %v", got, err)
				}
				return
			}
			got, err := tt.edit(body)
			if err != nil {
				t.Fatal(err)
			}
			if string(body) != tt.body {
				t.Fatalf("input modified: %s", body)
			}
			var out, in map[string]any
			if err := json.Unmarshal(got, &out); err != nil {
				t.Fatalf("invalid JSON %s: %v", got, err)
			}
			if !jsonEqual(t, mustMarshal(t, out[tt.key]), []byte(tt.want)) {
				t.Fatalf("%s reads %v in %s, want %s", tt.key, out[tt.key], got, tt.want)
			}
			for _, k := range []string{"include_metrics", "stream", "stream_options"} {
				if n := countKey(got, k); n > 1 {
					t.Fatalf("%d copies of %s in %s", n, k, got)
				}
			}
			json.Unmarshal(body, &in)
			for _, k := range []string{"include_metrics", "stream", "stream_options"} {
				delete(in, k)
				delete(out, k)
			}
			if !reflect.DeepEqual(out, in) {
				t.Fatalf("other members changed: %s -> %s", body, got)
			}
		})
	}
}

func TestUpgradedBodyKeepsForwardedIncludeMetrics(t *testing.T) {
	body := []byte(`{"model":"m","include_metrics":true,"messages":[]}`)
	r := InspectRequest(body)
	r.HasIncludeMetrics = false // --forward-include-metrics: the engine gets it
	got, err := upgradedBody(body, r)
	if err != nil {
		t.Fatal(err)
	}
	if !jsonEqual(t, got, []byte(`{"model":"m","include_metrics":true,"messages":[],"stream":true,"stream_options":{"include_usage":true}}`)) {
		t.Fatalf("UpgradedBody = %s", got)
	}
}

func TestRequestEditsRefuseWhatWasNotUnderstood(t *testing.T) {
	body := []byte(`[1]`)
	r := Request{Stream: true, HasIncludeMetrics: true}
	if got, err := upstreamBody(body, r, true); err == nil || string(got) != `[1]` {
		t.Errorf("UpstreamBody = %s, %v; want the body and an error", got, err)
	}
	if got, err := upgradedBody(body, r); err == nil || string(got) != `[1]` {
		t.Errorf("UpgradedBody = %s, %v; want the body and an error", got, err)
	}
}

// countKey counts the top-level members named key.
func countKey(obj []byte, key string) int {
	n := 0
	gjson.ParseBytes(obj).ForEach(func(k, _ gjson.Result) bool {
		if k.Str == key {
			n++
		}
		return true
	})
	return n
}

func mustMarshal(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestLeg: the leg a router marked a request as, at the root or in the
// generate API's sampling parameters; anything else is a whole request.
func TestLeg(t *testing.T) {
	for _, tc := range []struct {
		body string
		want Leg
	}{
		{`{"model":"m","messages":[]}`, LegWhole},
		{`{"model":"m","kv_transfer_params":{"do_remote_decode":true,"do_remote_prefill":false,"remote_engine_id":null}}`, LegPrefill},
		{`{"model":"m","kv_transfer_params":{"do_remote_decode":false,"do_remote_prefill":true,"remote_block_ids":[1,2]}}`, LegDecode},
		{`{"model":"m","sampling_params":{"max_tokens":1,"extra_args":{"kv_transfer_params":{"do_remote_decode":true}}}}`, LegPrefill},
		{`{"model":"m","kv_transfer_params":{"do_remote_decode":"true"}}`, LegWhole},
		{`{"model":"m","kv_transfer_params":null}`, LegWhole},
		{`{"model":"m","kv_transfer_params":[{"do_remote_prefill":true}]}`, LegWhole},
	} {
		if got := InspectRequest([]byte(tc.body)).Leg; got != tc.want {
			t.Errorf("%s: leg %v, want %v", tc.body, got, tc.want)
		}
	}
}

// TestBootstrapped: SGLang's router marks a split request with its
// bootstrap fields.
func TestBootstrapped(t *testing.T) {
	for body, want := range map[string]bool{
		`{"model":"m","bootstrap_host":"10.0.0.9","bootstrap_port":8998,"bootstrap_room":42}`: true,
		`{"model":"m","bootstrap_room":42}`:                                                   true,
		`{"model":"m","bootstrap_room":null}`:                                                 false,
		`{"model":"m"}`:                                                                       false,
	} {
		if got := InspectRequest([]byte(body)).Bootstrapped; got != want {
			t.Errorf("%s: bootstrapped %v, want %v", body, got, want)
		}
	}
}
