package rewrite

import (
	"bytes"
	"encoding/json"
	"strconv"
	"strings"
	"testing"

	"github.com/timing-sidecar/timing-sidecar/e2e/emulator"
)

func TestLaxBool(t *testing.T) {
	for _, tt := range []struct {
		raw       string
		value, ok bool
	}{
		{`true`, true, true}, {`false`, false, true},
		{`1`, true, true}, {`0`, false, true}, {`-0`, false, true},
		{`1.0`, true, true}, {`0.0`, false, true}, {`-0.0`, false, true}, {`1e0`, true, true}, {`10e-1`, true, true},
		{`1e-400`, false, true},                                                    // underflows to 0.0 in Python too
		{`1.0000000000000001`, true, true}, {`0.99999999999999999999`, true, true}, // round to 1.0
		{`2`, false, false}, {`-1`, false, false}, {`0.5`, false, false}, {`1e400`, false, false},
		{`100000000000000000000`, false, false},
		{`"true"`, true, true}, {`"TRUE"`, true, true}, {`"tRuE"`, true, true}, {`"t"`, true, true}, {`"Y"`, true, true},
		{`"yes"`, true, true}, {`"on"`, true, true}, {`"1"`, true, true},
		{`"false"`, false, true}, {`"F"`, false, true}, {`"n"`, false, true}, {`"No"`, false, true}, {`"OFF"`, false, true},
		{`"0"`, false, true},
		{`"\u0074\u0072\u0075\u0065"`, true, true}, {`"\u0066\u0061\u006c\u0073\u0065"`, false, true},
		{`""`, false, false}, {`" true"`, false, false}, {`"true "`, false, false}, {`"1.0"`, false, false},
		{`"00"`, false, false}, {`"yeſ"`, false, false}, {`"nope"`, false, false}, {`"\u0066\u0061\u006c\u0073\u0065\u0020"`, false, false},
		{`[]`, false, false}, {`{}`, false, false}, {`[true]`, false, false},
	} {
		v, ok := laxBool(tt.raw)
		if v != tt.value || ok != tt.ok {
			t.Errorf("laxBool(%s) = %v, %v; want %v, %v", tt.raw, v, ok, tt.value, tt.ok)
		}
		if ref, refOK := engineBool(json.RawMessage(tt.raw)); ref != tt.value || refOK != tt.ok {
			t.Errorf("the reference reads %s as %v, %v; want %v, %v", tt.raw, ref, refOK, tt.value, tt.ok)
		}
	}
}

// TestEscapedKeysAreRead: every key the sidecar reads is read with each of
// its characters escaped, the longest form the engine decodes it from; and
// no key it reads is longer than the bound eachMember unescapes.
func TestEscapedKeysAreRead(t *testing.T) {
	escape := func(k string) string {
		var b strings.Builder
		for _, c := range k {
			b.WriteString(`\u00`)
			b.WriteString(strconv.FormatInt(int64(c), 16))
		}
		return b.String()
	}
	read := []string{"include_metrics", "stream", "model", "stream_options", "n", "prompt",
		"include_usage", "continuous_usage_stats", "echo", "best_of", "prompt_logprobs"}
	for k := range generationFields {
		read = append(read, k)
	}
	for _, k := range read {
		if len(k) > maxKeyChars {
			t.Errorf("the sidecar reads %q, longer than maxKeyChars (%d): eachMember would not unescape it", k, maxKeyChars)
		}
		var got string
		eachMember(`{"`+escape(k)+`":1}`, func(key string, _ int, _ string, _ int) bool {
			got = key
			return true
		})
		if got != k {
			t.Errorf("%q escaped reads as %q", k, got)
		}
	}
	body := `{"` + escape("stream") + `":true,"` + escape("stream_options") + `":{"` + escape("include_usage") + `":false,"` +
		escape("continuous_usage_stats") + `":true},"` + escape("include_metrics") + `":"yes"}`
	got := InspectRequest([]byte(body))
	if !got.Understood || !got.Stream || got.IncludeUsage || !got.ContinuousUsage || !got.IncludeMetrics {
		t.Fatalf("InspectRequest(%s) = %+v", body, got)
	}
}

// FuzzRequestAsTheEngineReadsIt holds InspectRequest's reading of stream,
// stream_options and include_metrics to a reference model of a FastAPI
// engine's: encoding/json in place of Python's json (escapes decoded, the
// last copy of a key taken), then pydantic's lax bool as the emulated
// engine reads it (emulator.LaxBool). Where the sidecar
// reads the request, it reads what the engine reads; where it refuses
// include_metrics, the engine refuses it too; and it leaves a request
// unread only where the engine refuses it, or a top-level key it reads
// repeats, or it is nested deeper than maxDepth, or n is not a number.
func FuzzRequestAsTheEngineReadsIt(f *testing.F) {
	for _, s := range []string{
		`{"stream":true,"include_metrics":true}`, `{"stream":"yes","stream_options":{"include_usage":0}}`,
		`{"stream":1,"stream_options":{"include_usage":"no","include_usage":"on","continuous_usage_stats":"F"}}`,
		`{"\u0073\u0074\u0072\u0065\u0061\u006d\u005f\u006f\u0070\u0074\u0069\u006f\u006e\u0073":{"include_usage":true},"stream":true}`,
		`{"stream":true,"\u0073tream":false}`, `{"include_metrics":"maybe"}`, `{"include_metrics":1e-400}`,
		`{"include_metrics":"yeſ","stream":-0.0}`, `{"stream":"\u0054rue","n":"2"}`, `{"stream_options":[],"stream":true}`,
		`{"stream":null,"stream_options":null,"include_metrics":null}`, `[]`, `{"stream":tru`, `{"n":2,"prompt":["a","b"]}`,
		`{"include_metrics":2,"stream":"x"}`, `{"stream":"x","include_metrics":2}`, `{"stream":1.0000000000000001}`,
		`{"stream":true,"stream_options":{"continuous_usage_stats":true}}`, // include_usage defaults to true
		nestedObject(maxDepth + 1),
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		got := InspectRequest(body)
		ref := engineReading(body)
		switch {
		case got.Understood:
			if !ref.object || ref.repeated || !ref.streamOK || !ref.optionsOK || !ref.metricsOK {
				t.Fatalf("read %q, which the engine refuses or reads ambiguously: %+v", body, ref)
			}
			if got.Stream != ref.stream || got.IncludeUsage != ref.usage || got.ContinuousUsage != ref.continuous ||
				got.HasIncludeMetrics != ref.hasMetrics || got.IncludeMetrics != ref.metrics {
				t.Fatalf("%q: the sidecar read %+v, the engine %+v", body, got, ref)
			}
		case got.InvalidIncludeMetrics:
			if ref.metricsOK {
				t.Fatalf("refused include_metrics in %q, which the engine reads: %+v", body, ref)
			}
		case !ref.object, ref.repeated, ref.deep, ref.oddN, !ref.streamOK, !ref.optionsOK:
		default:
			t.Fatalf("left %q unread, which the engine reads: %+v", body, ref)
		}
	})
}

// engineRead is the reference model's reading of a request.
type engineRead struct {
	object   bool // decodes to a JSON object
	deep     bool // nested deeper than maxDepth
	repeated bool // a top-level key the sidecar reads comes twice
	oddN     bool // n is neither a number nor null

	stream, streamOK               bool
	usage, continuous, optionsOK   bool
	hasMetrics, metrics, metricsOK bool
}

// engineReading is the reference model's reading of body: the last copy
// of each top-level key, each field read as the engine reads it.
func engineReading(body []byte) engineRead {
	r := engineRead{streamOK: true, optionsOK: true, metricsOK: true}
	if !json.Valid(body) || bytes.TrimSpace(body)[0] != '{' {
		return r
	}
	r.object, r.deep = true, depth(body) > maxDepth
	last, seen := topLevelMembers(body)
	for _, k := range []string{"stream", "stream_options", "include_metrics", "model", "n", "prompt"} {
		r.repeated = r.repeated || seen[k] > 1
	}
	if n, ok := last["n"]; ok {
		r.oddN = n[0] != 'n' && n[0] != '-' && (n[0] < '0' || n[0] > '9')
	}
	if v, ok := last["stream"]; ok {
		r.stream, r.streamOK = engineBool(v)
	}
	if v, ok := last["include_metrics"]; ok && string(v) != "null" {
		r.metrics, r.metricsOK = engineBool(v)
		r.hasMetrics = r.metricsOK
	}
	if v, ok := last["stream_options"]; ok && string(v) != "null" {
		r.usage, r.continuous, r.optionsOK = engineStreamOptions(v)
	}
	return r
}

// topLevelMembers decodes a valid JSON object's members, as Python's json
// does: last is each key's last value, escapes decoded; seen counts each
// key's copies.
func topLevelMembers(body []byte) (last map[string]json.RawMessage, seen map[string]int) {
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.Token() //nolint:errcheck // '{'
	last, seen = map[string]json.RawMessage{}, map[string]int{}
	for dec.More() {
		k, _ := dec.Token()
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			panic(err) // valid JSON
		}
		key := k.(string)
		seen[key]++
		last[key] = v
	}
	return last, seen
}

// engineStreamOptions is the engine's reading of a stream_options that is
// not null: vLLM's StreamOptions, whose include_usage defaults to true.
// ok is false for a value it refuses; usage and continuous are then false.
func engineStreamOptions(v json.RawMessage) (usage, continuous, ok bool) {
	var o map[string]json.RawMessage
	if json.Unmarshal(v, &o) != nil || o == nil {
		return false, false, false
	}
	usage = true
	ok1, ok2 := true, true
	if u, has := o["include_usage"]; has {
		usage, ok1 = engineBool(u)
	}
	if c, has := o["continuous_usage_stats"]; has {
		continuous, ok2 = engineBool(c)
	}
	return usage, continuous, ok1 && ok2
}

// engineBool is the emulated engine's reading of an Optional[bool] field
// (null is false); ok is false for a value it refuses.
func engineBool(raw json.RawMessage) (value, ok bool) {
	var b emulator.LaxBool
	err := json.Unmarshal(raw, &b)
	return bool(b), err == nil
}

// depth is how deep arrays and objects nest in valid JSON, by its tokens.
func depth(body []byte) int {
	dec := json.NewDecoder(bytes.NewReader(body))
	d, deepest := 0, 0
	for {
		tok, err := dec.Token()
		if err != nil { // io.EOF at the end
			return deepest
		}
		switch tok {
		case json.Delim('{'), json.Delim('['):
			d++
			deepest = max(deepest, d)
		case json.Delim('}'), json.Delim(']'):
			d--
		}
	}
}
