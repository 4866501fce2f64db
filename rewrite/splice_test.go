package rewrite

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"time"
)

const metricsJSON = `{"time_to_first_token_ms":1.500,"completion_tokens":3}`

func TestAppendWithMetrics(t *testing.T) {
	tests := []struct {
		name string
		obj  string
		want string // exact bytes; "" means "not spliced"
	}{
		{"compact object", `{"a":1}`, `{"a":1,"metrics":` + metricsJSON + `}`},
		{"empty object", `{}`, `{"metrics":` + metricsJSON + `}`},
		{"empty object with space", `{ }`, `{ "metrics":` + metricsJSON + `}`},
		{"trailing whitespace kept", "{\"a\":1}\n", `{"a":1,"metrics":` + metricsJSON + "}\n"},
		{"pretty object", "{\n  \"a\": 1\n}", "{\n  \"a\": 1\n,\"metrics\":" + metricsJSON + "}"},
		{"existing metrics moved to the end", `{"metrics":null,"a":1}`, `{"a":1,"metrics":` + metricsJSON + `}`},
		{"every existing metrics cut", `{"metrics":1,"a":1,"metrics":2}`, `{"a":1,"metrics":` + metricsJSON + `}`},
		{"only existing metrics", `{ "metrics" : 1 }`, `{  "metrics":` + metricsJSON + `}`},
		{"nested metrics kept", `{"a":{"metrics":1},"metrics":2}`, `{"a":{"metrics":1},"metrics":` + metricsJSON + `}`},
		{"array", `[1]`, ""},
		{"invalid", `{"a":`, ""},
		{"string", `"x"`, ""},
		{"empty", ``, ""},
		{"two objects", `{"a":1}{"b":2}`, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			prefix := []byte("data: ")
			got, ok := AppendWithMetrics(prefix, []byte(tt.obj), []byte(metricsJSON))
			if tt.want == "" {
				if ok || string(got) != "data: " {
					t.Fatalf("spliced %q into invalid input: %q", tt.obj, got)
				}
				return
			}
			if !ok || string(got) != "data: "+tt.want {
				t.Fatalf("AppendWithMetrics = %q, %v; want %q", got, ok, "data: "+tt.want)
			}
			if !json.Valid(got[len(prefix):]) {
				t.Fatalf("result is not valid JSON: %s", got)
			}
		})
	}
}

func TestAppendWithMetricsAllocatesNothing(t *testing.T) {
	obj, m := []byte(chatUsage), []byte(metricsJSON)
	buf := make([]byte, 0, 1024)
	if allocs := testing.AllocsPerRun(100, func() { buf, _ = AppendWithMetrics(buf[:0], obj, m) }); allocs != 0 {
		t.Fatalf("AppendWithMetrics allocates %v times, want 0", allocs)
	}
}

// TestMergedMetrics: the engine's metrics object comes through with every
// member as and where the engine put it; the sidecar's members go beside
// them, or under timing_sidecar where the engine has a member of the name.
func TestMergedMetrics(t *testing.T) {
	const ours = `{"time_to_first_token_ms":9.000,"e2e_latency_ms":12.000,"completion_tokens":3}`
	for _, tt := range []struct{ name, engine, want string }{
		{"no engine object", ``, ours},
		{"null", `null`, ours},
		{"not an object", `[1]`, ours},
		{"empty", `{}`, `{"time_to_first_token_ms":9.000,"e2e_latency_ms":12.000,"completion_tokens":3}`},
		{"empty with spaces", ` { } `, `{ "time_to_first_token_ms":9.000,"e2e_latency_ms":12.000,"completion_tokens":3}`},
		{"vLLM's, fields meet", `{"time_to_first_token_ms":7.5,"speculative_decoding":{"num_spec_steps":4}}`,
			`{"time_to_first_token_ms":7.5,"speculative_decoding":{"num_spec_steps":4},"e2e_latency_ms":12.000,"completion_tokens":3,"timing_sidecar":{"time_to_first_token_ms":9.000}}`},
		{"only the engine's other members", `{"speculative_decoding":null}`,
			`{"speculative_decoding":null,"time_to_first_token_ms":9.000,"e2e_latency_ms":12.000,"completion_tokens":3}`},
		{"escaped name", `{"\u00652e_latency_ms":1}`,
			`{"\u00652e_latency_ms":1,"time_to_first_token_ms":9.000,"completion_tokens":3,"timing_sidecar":{"e2e_latency_ms":12.000}}`},
		{"a sidecar's already", `{"time_to_first_token_ms":7.5,"timing_sidecar":{"time_to_first_token_ms":8}}`,
			`{"time_to_first_token_ms":7.5,"timing_sidecar":{"time_to_first_token_ms":8},"e2e_latency_ms":12.000,"completion_tokens":3}`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got := AppendMergedMetrics([]byte("x"), []byte(ours), []byte(tt.engine))
			if string(got) != "x"+tt.want || !json.Valid(got[1:]) {
				t.Fatalf("merged %s; want %s", got[1:], tt.want)
			}
		})
	}
	// Several choices: ours is null, and replaces an engine's object.
	if got := AppendMergedMetrics(nil, []byte("null"), []byte(`{"time_to_first_token_ms":5}`)); string(got) != "null" {
		t.Fatalf("null merged into an engine's object: %s", got)
	}
	if got, ok := InspectBody([]byte(`{"n":2,"metrics":{"a":1}}`)).WithMetrics([]byte(`{"n":2,"metrics":{"a":1}}`), []byte("null")); !ok || string(got) != `{"n":2,"metrics":null}` {
		t.Fatalf("a body of several choices: %s", got)
	}
	buf, m := make([]byte, 0, 1024), []byte(ours)
	engine := []byte(`{"time_to_first_token_ms":7.5,"speculative_decoding":{"num_spec_steps":4}}`)
	if allocs := testing.AllocsPerRun(100, func() { buf = AppendMergedMetrics(buf[:0], m, engine) }); allocs != 0 {
		t.Fatalf("AppendMergedMetrics allocates %v times, want 0", allocs)
	}
}

func TestAppendEventWithMetrics(t *testing.T) {
	tests := []struct {
		name, raw, want string
		ok              bool
	}{
		{"usage event", sse(`{"choices":[],"usage":{"prompt_tokens":1}}`),
			sse(`{"choices":[],"usage":{"prompt_tokens":1},"metrics":` + metricsJSON + `}`), true},
		{"CRLF and no space", "id: 1\r\ndata:{\"a\":1}\r\n\r\n", "id: 1\r\ndata:{\"a\":1,\"metrics\":" + metricsJSON + "}\r\n\r\n", true},
		{"not JSON", "data: [DONE]\n\n", "", false},
		{"no data", ": comment\n\n", "", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			raw := []byte(tt.raw)
			got, ok := AppendEventWithMetrics([]byte("x"), raw, ClassifyEvent(raw), []byte(metricsJSON))
			if ok != tt.ok || (ok && string(got) != "x"+tt.want) || (!ok && string(got) != "x") {
				t.Fatalf("got %q, %v; want %q, %v", got, ok, "x"+tt.want, tt.ok)
			}
		})
	}
}

func TestInspectBody(t *testing.T) {
	for _, tt := range []struct {
		body    string
		usage   int64
		spliced string
	}{
		{`{"id":"x","usage":{"prompt_tokens":3,"completion_tokens":9}}`, 9, `{"id":"x","usage":{"prompt_tokens":3,"completion_tokens":9},"metrics":` + metricsJSON + `}`},
		{`{"metrics":1,"usage":{"completion_tokens":2}}`, 2, `{"metrics":` + metricsJSON + `,"usage":{"completion_tokens":2}}`}, // in its place
		{`{"usage":`, -1, ""},
		{`{"usage":{"completion_tokens":4},"x":NaN}`, 4, ""},
		{`{"usage":null,"usage":{"completion_tokens":9}}`, 0, ""}, // usage twice: passed through
		{`[{"usage":{}}]`, -1, ""},
	} {
		b := InspectBody([]byte(tt.body))
		if tt.usage >= 0 && b.Usage.CompletionTokens.Value != tt.usage {
			t.Errorf("%s: usage %+v", tt.body, b.Usage)
		}
		got, ok := b.WithMetrics([]byte(tt.body), []byte(metricsJSON))
		if ok != (tt.spliced != "") || string(got) != tt.spliced {
			t.Errorf("%s: spliced %q, %v; want %q", tt.body, got, ok, tt.spliced)
		}
	}
}

// TestSpliceLeavesOneMetrics: a client takes the last copy of a key, so
// the spliced event must have one "metrics", ours merged with the copy a
// client read, and every other member as the engine sent it. A
// non-streaming body that repeats "metrics" or "usage" is not spliced into
// at all: it passes through as it came.
func TestSpliceLeavesOneMetrics(t *testing.T) {
	for _, obj := range []string{
		`{"metrics":{"engine":1},"a":1}`,
		`{"metrics":1,"a":1,"metrics":{"engine":2,"completion_tokens":4}}`,
		`{"a":[{"metrics":1}],"metrics":null, "b" : "metrics" }`,
		"{\n  \"metrics\": 1,\n  \"metrics\": 2\n}\n",
	} {
		for name, splice := range map[string]func() ([]byte, bool){
			"AppendWithMetrics": func() ([]byte, bool) { return AppendWithMetrics(nil, []byte(obj), []byte(metricsJSON)) },
			"Body.WithMetrics": func() ([]byte, bool) {
				return InspectBody([]byte(obj)).WithMetrics([]byte(obj), []byte(metricsJSON))
			},
		} {
			got, ok := splice()
			if repeated := countKey([]byte(obj), metricsKey) > 1; name == "Body.WithMetrics" && repeated {
				if ok {
					t.Fatalf("%s(%s) = %s: a body that repeats metrics spliced", name, obj, got)
				}
				continue
			}
			if !ok {
				t.Fatalf("%s(%s) refused", name, obj)
			}
			var out, in map[string]any
			if err := json.Unmarshal(got, &out); err != nil {
				t.Fatalf("%s(%s): invalid JSON %s", name, obj, got)
			}
			json.Unmarshal([]byte(obj), &in)
			if !reflect.DeepEqual(out[metricsKey], mergedMetrics(in[metricsKey], metricsJSON)) || countKey(got, metricsKey) != 1 {
				t.Fatalf("%s(%s) = %s: metrics not ours merged with the engine's", name, obj, got)
			}
			delete(in, metricsKey)
			delete(out, metricsKey)
			if !reflect.DeepEqual(out, in) {
				t.Fatalf("%s(%s) = %s: other members changed", name, obj, got)
			}
		}
	}
}

func TestSpliceRefusesTooDeep(t *testing.T) {
	at, past := []byte(nestedObject(maxDepth)), []byte(nestedObject(maxDepth+1))
	m := []byte(metricsJSON)
	if _, ok := AppendWithMetrics(nil, at, m); !ok {
		t.Error("AppendWithMetrics refused an object maxDepth deep")
	}
	if got, ok := AppendWithMetrics([]byte("x"), past, m); ok || string(got) != "x" {
		t.Errorf("AppendWithMetrics spliced into an object deeper than maxDepth")
	}
	if _, ok := InspectBody(at).WithMetrics(at, m); !ok {
		t.Error("InspectBody: an object maxDepth deep is not an object")
	}
	if b := InspectBody(past); b.object {
		t.Error("InspectBody: an object deeper than maxDepth is an object")
	}
	// 12 MB of nesting, with the usage before it: read, and no stack overflow.
	huge := []byte(`{"usage":{"completion_tokens":4},"x":` + strings.Repeat("[", 6<<20) + strings.Repeat("]", 6<<20) + `}`)
	if b := InspectBody(huge); b.object || b.Usage.CompletionTokens.Value != 4 {
		t.Errorf("InspectBody of a 12 MB nested body = %+v", b)
	}
}

// InspectBody reads the engine's own timing in its one pass over the keys,
// as EngineTimingOf reads it on its own.
func TestInspectBodyReadsTheEngineTiming(t *testing.T) {
	vllm := `{"id":"x","metrics":{"queue_time_ms":1,"time_to_first_token_ms":2,"generation_time_ms":3,"mean_itl_ms":0.5,"tokens_per_second":9}}`
	llama := `{"id":"x","timings":{"prompt_ms":2,"predicted_ms":3,"predicted_per_token_ms":0.5,"predicted_per_second":9}}`
	for _, tt := range []struct {
		body   string
		source string
		total  float64
	}{
		{vllm, "vllm", 6},
		{llama, "llama.cpp", 5},
		{`{"metrics":{"queue_time_ms":1},"timings":{"prompt_ms":2}}`, "vllm", 0},
		{`{"metrics":1,"timings":{"prompt_ms":2,"predicted_ms":3},"metrics":{"queue_time_ms":1}}`, "llama.cpp", 5},
		{`{"timings":null,"timings":{"prompt_ms":2}}`, "", 0},
		{`{"usage":{}}`, "", 0},
		{`{"metrics":{"queue_time_ms":1},"x":NaN}`, "vllm", 0},
	} {
		got := InspectBody([]byte(tt.body)).Engine
		if want := EngineTimingOf([]byte(tt.body)); got != want {
			t.Errorf("%s: InspectBody read %+v, EngineTimingOf %+v", tt.body, got, want)
		}
		if got.Source != tt.source || got.Total.Value != tt.total {
			t.Errorf("%s: source %q total %v, want %q %v", tt.body, got.Source, got.Total.Value, tt.source, tt.total)
		}
	}
}

// A number JSON allows but float64 cannot hold is unknown, not +Inf: the
// metrics object must stay JSON.
func TestEngineTimingRefusesNumbersWithoutJSON(t *testing.T) {
	for _, body := range []string{
		`{"metrics":{"queue_time_ms":1e999,"time_to_first_token_ms":-1e999,"mean_itl_ms":2}}`,
		`{"metrics":{"queue_time_ms":NAN,"mean_itl_ms":2}`,
	} {
		e := EngineTimingOf([]byte(body))
		if e.QueueTime.Set || e.TimeToFirstToken.Set || !e.MeanITL.Set {
			t.Errorf("%s: read %+v", body, e)
		}
	}
}

// TestBodySpliceKeepsItsPlace: the body splice (sjson) merges with the
// engine's one "metrics" where it lies, the engine's members first and as
// sent, and leaves every other byte as it was; a body that repeats
// "usage" passes through.
func TestBodySpliceKeepsItsPlace(t *testing.T) {
	body := []byte(`{"id":"c", "metrics":{"speculative_decoding":{"num_spec_steps":4},"queue_time_ms":1}, "usage":{"prompt_tokens":1}}`)
	got, ok := InspectBody(body).WithMetrics(body, []byte(`{"queue_time_ms":0.500,"e2e_latency_ms":2.000}`))
	want := `{"id":"c", "metrics":{"speculative_decoding":{"num_spec_steps":4},"queue_time_ms":1,"e2e_latency_ms":2.000,"timing_sidecar":{"queue_time_ms":0.500}}, "usage":{"prompt_tokens":1}}`
	if !ok || string(got) != want {
		t.Fatalf("spliced %s, %v; want %s", got, ok, want)
	}
	twice := []byte(`{"usage":{"prompt_tokens":1},"usage":{"prompt_tokens":2}}`)
	if got, ok := InspectBody(twice).WithMetrics(twice, []byte(`{}`)); ok {
		t.Fatalf("a body with usage twice spliced: %s", got)
	}
}

// TestBodySpliceIsLinear: the worst body within the buffering limit for
// the splice, 16 MB of repeated "metrics" members, is refused in one pass.
func TestBodySpliceIsLinear(t *testing.T) {
	body := []byte("{" + strings.Repeat(`"metrics":{"x":1},`, (16<<20)/18) + `"id":"c"}`)
	start := time.Now()
	if _, ok := InspectBody(body).WithMetrics(body, []byte(`{}`)); ok {
		t.Fatal("a body repeating metrics spliced")
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("%d repeated members took %v", (16<<20)/18, d)
	}
}
