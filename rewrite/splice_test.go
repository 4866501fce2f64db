package rewrite

import (
	"encoding/json"
	"testing"
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
		{"existing metrics replaced", `{"metrics":null,"a":1}`, `{"metrics":` + metricsJSON + `,"a":1}`},
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
		{`{"metrics":1,"usage":{"completion_tokens":2}}`, 2, `{"metrics":` + metricsJSON + `,"usage":{"completion_tokens":2}}`},
		{`{"usage":`, -1, ""},
		{`{"usage":{"completion_tokens":4},"x":NaN}`, 4, ""},
		{`{"usage":null,"usage":{"completion_tokens":9}}`, 0, `{"usage":null,"usage":{"completion_tokens":9},"metrics":` + metricsJSON + `}`},
		{`[{"usage":{}}]`, -1, ""},
	} {
		b := InspectBody([]byte(tt.body))
		if tt.usage >= 0 && b.Usage.CompletionTokens.Value != tt.usage {
			t.Errorf("%s: usage %+v", tt.body, b.Usage)
		}
		got, ok := b.AppendWithMetrics(nil, []byte(tt.body), []byte(metricsJSON))
		if ok != (tt.spliced != "") || string(got) != tt.spliced {
			t.Errorf("%s: spliced %q, %v; want %q", tt.body, got, ok, tt.spliced)
		}
	}
}
