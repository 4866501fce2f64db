package rewrite

import (
	"bytes"
	"encoding/json"
	"io"
	"reflect"
	"strings"
	"testing"

	"github.com/tidwall/gjson"
)

// FuzzEventReader: whatever the bytes and however they are split, the
// pieces put back together are the input, a whole event ends with a blank
// line, and classifying it does not panic.
func FuzzEventReader(f *testing.F) {
	f.Add([]byte(sse(chatRole)+sse(chatContent)+sse(chatUsage)+"data: [DONE]\n\n"), uint8(7))
	f.Add([]byte("data: "+chatFinish+"\r\n\r\n"+sse(errorEvent)), uint8(1))
	f.Add([]byte(": ping\n\ndata:"+cmplText+"\n\ndata: {\"cho"), uint8(64))
	f.Add([]byte("\n\n\r\n\n\r\r\ndata:\n\n"), uint8(2))
	f.Add([]byte("data: "+chatContent+"\r\rdata: [DONE]\r\r"), uint8(3))
	f.Fuzz(func(t *testing.T, stream []byte, chunk uint8) {
		src := &chunkReader{}
		for s, n := stream, int(chunk)+1; len(s) > 0; {
			k := min(n, len(s))
			src.chunks = append(src.chunks, s[:k])
			s = s[k:]
		}
		r := NewEventReader(src, 96)
		var all []byte
		for {
			p, whole, err := r.Next()
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			if whole {
				if !bytes.HasSuffix(p, []byte("\n\n")) && !bytes.HasSuffix(p, []byte("\n\r\n")) && !bytes.HasSuffix(p, []byte("\r\r")) {
					t.Fatalf("whole event without a blank line: %q", p)
				}
				ClassifyEvent(p)
			}
			all = append(all, p...)
		}
		if !bytes.Equal(all, stream) {
			t.Fatalf("pieces %q != input %q", all, stream)
		}
	})
}

// FuzzAppendWithMetrics: splicing into any valid JSON object within
// maxDepth succeeds, yields valid JSON whose one "metrics" is ours merged
// with the engine's, and leaves every other key as a last-wins parser
// reads it.
func FuzzAppendWithMetrics(f *testing.F) {
	for _, s := range []string{
		chatUsage, cmplUsage, `{}`, `{ }`, `{"metrics":1}`, "{\n\"a\" : [1, {\"b\":null}]\n}\n", `[]`, `{"a":`, `"s"`,
		`{"metrics":1,"a":2,"metrics":{"x":[3]}}`, `{ "metrics" : 1 , "metrics":2 }`, `{"a":"\"[{","metrics":null}`,
		`{"metrics":{"time_to_first_token_ms":1,"speculative_decoding":{"num_spec_steps":43}},"id":"c"}`, `{"metrics":{}}`,
		`{"metrics":{"timing_sidecar":1,"e2e_latency_ms":null}}`, `{"metrics":{ "\u0065ngine" :2 } }`,
		nestedObject(maxDepth), nestedObject(maxDepth + 1),
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, obj []byte) {
		out, ok := AppendWithMetrics(nil, obj, []byte(metricsJSON))
		var in map[string]any
		isObject := json.Valid(obj) && json.Unmarshal(obj, &in) == nil && in != nil
		if !ok {
			if isObject && !deeperThan(string(obj), maxDepth) {
				t.Fatalf("refused a valid object %q", obj)
			}
			return
		}
		if !json.Valid(out) {
			t.Fatalf("invalid JSON %q from %q", out, obj)
		}
		var got map[string]any
		if err := json.Unmarshal(out, &got); err != nil {
			t.Fatalf("result is not an object: %q", out)
		}
		if want := mergedMetrics(in["metrics"], metricsJSON); !reflect.DeepEqual(got["metrics"], want) || countKey(out, "metrics") != 1 {
			t.Fatalf("metrics = %v in %q", got["metrics"], out)
		}
		delete(got, "metrics")
		delete(in, "metrics")
		if !reflect.DeepEqual(got, in) {
			t.Fatalf("other keys changed: %q -> %q", obj, out)
		}
	})
}

// mergedMetrics is what a client decodes of the metrics the sidecar's
// object ours makes beside the engine's (as a client decoded it): the
// engine's members as they are, the sidecar's beside them, or under its
// namespace where the names meet.
func mergedMetrics(engine any, ours string) any {
	var want map[string]any
	json.Unmarshal([]byte(ours), &want)
	theirs, ok := engine.(map[string]any)
	if !ok {
		return want
	}
	merged, nested := map[string]any{}, map[string]any{}
	for k, v := range theirs {
		merged[k] = v
	}
	for k, v := range want {
		if _, taken := theirs[k]; !taken {
			merged[k] = v
		} else {
			nested[k] = v
		}
	}
	if _, taken := theirs[SidecarNamespace]; len(nested) > 0 && !taken {
		merged[SidecarNamespace] = nested
	}
	return merged
}

// FuzzUpstreamBody: whatever request the sidecar understood, the body it
// sends upstream is valid JSON without include_metrics, with one
// stream_options whose include_usage is true when usage was asked for, and
// with every other top-level member as a last-wins parser reads it in what
// the client sent.
func FuzzUpstreamBody(f *testing.F) {
	for _, s := range []string{
		`{"model":"m","include_metrics":true}`, `{ "include_metrics" : false , "stream":true}`,
		`{"include_metrics":true}`, "{\"a\":[1,{\"include_metrics\":1}],\n\"include_metrics\":true\n}",
		`{"include_metrics":true,"include_metrics":false}`, `{"stream":true,"stream_options":{"include_usage":false}}`,
		`{"stream":true,"stream_options":{"include_usage":true},"stream_options":{"include_usage":false,"x":1}}`,
		`{"stream_options":null,"include_metrics":true,"stream":true,"stream_options":null,"stream":true}`,
		`{"stream":true,"stream_options":{"include_usage":true,"include_usage":null}}`,
		`{ "include_metrics" : true , "stream_options" : null , "stream":true}`,
		strings.Replace(nestedObject(maxDepth+1), `{`, `{"include_metrics":true,`, 1),
	} {
		f.Add([]byte(s), true)
	}
	f.Fuzz(func(t *testing.T, body []byte, askUsage bool) {
		req := InspectRequest(body)
		if !req.Understood {
			return
		}
		in := string(body)
		out, err := upstreamBody(body, req, askUsage)
		if string(body) != in {
			t.Fatalf("input modified: %q", in)
		}
		if err != nil {
			t.Fatalf("UpstreamBody(%q): %v", body, err)
		}
		var got, want map[string]any
		if err := json.Unmarshal(out, &got); err != nil {
			t.Fatalf("invalid JSON %q from %q", out, body)
		}
		if req.HasIncludeMetrics && countKey(out, "include_metrics") != 0 {
			t.Fatalf("include_metrics left in %q", out)
		}
		if askUsage && req.Stream && !req.IncludeUsage {
			opts, _ := got["stream_options"].(map[string]any)
			if opts["include_usage"] != true || countKey(out, "stream_options") != 1 {
				t.Fatalf("usage not asked for in %q", out)
			}
		}
		if json.Unmarshal(body, &want) != nil {
			return
		}
		if req.HasIncludeMetrics {
			delete(want, "include_metrics")
		}
		delete(got, "stream_options")
		delete(want, "stream_options")
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("other members changed: %q -> %q", body, out)
		}
	})
}

// FuzzValid: valid is gjson.Valid with a limit on nesting, whatever the
// strings, escapes and brackets: checked with a small limit against the
// depth gjson's own parser finds.
func FuzzValid(f *testing.F) {
	for _, s := range []string{
		`[[1]]`, `[[[1]]]`, `{"a":"[[[{{{"}`, `["\"[[[", "]]]"]`, `["\\", [[1]]]`, `["\\\"[[[", 1]`,
		`{"[[":{"]]":[{}]}}`, `]]][[[`, `[["[[[[`, `["\u005b", [[]]]`, ` [ [ ] ] `,
	} {
		f.Add(s)
	}
	const limit = 2
	f.Fuzz(func(t *testing.T, s string) {
		got := validWithin(s, limit)
		if !gjson.Valid(s) {
			if got {
				t.Fatalf("validWithin(%q) true, gjson.Valid false", s)
			}
			return
		}
		if want := nesting(gjson.Parse(s)) <= limit; got != want {
			t.Fatalf("validWithin(%q, %d) = %v, nesting %d", s, limit, got, nesting(gjson.Parse(s)))
		}
	})
}

// nesting is how deep arrays and objects nest in v, by recursion.
func nesting(v gjson.Result) int {
	if !v.IsArray() && !v.IsObject() {
		return 0
	}
	d := 0
	v.ForEach(func(_, e gjson.Result) bool {
		d = max(d, nesting(e))
		return true
	})
	return d + 1
}

// FuzzInspectBody holds InspectBody's one-pass reading of the engine's
// timing to EngineTimingOf's.
func FuzzInspectBody(f *testing.F) {
	for _, s := range []string{
		chatUsage, `{"metrics":{"queue_time_ms":1,"time_to_first_token_ms":2,"generation_time_ms":3}}`,
		`{"metrics":1,"timings":{"prompt_ms":2,"predicted_ms":3},"metrics":{"queue_time_ms":1}}`,
		`{"timings":null,"timings":{"prompt_ms":2}}`, `{"metrics":{"mean_itl_ms":-1},"x":NaN}`, `[]`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		if got, want := InspectBody(body).Engine, EngineTimingOf(body); got != want {
			t.Fatalf("InspectBody(%q) read %+v, EngineTimingOf %+v", body, got, want)
		}
	})
}

// FuzzUpgradedBody: the upgrade's edit, by offsets where each key comes once
// and in one pass where one repeats, always gives valid JSON with exactly
// one "stream": true and one stream_options asking for usage, without
// include_metrics when it was to go, and every other member as it was.
func FuzzUpgradedBody(f *testing.F) {
	for _, s := range []string{
		`{"model":"m","include_metrics":true,"messages":[]}`, `{ "stream" : false , "include_metrics":false }`,
		`{"stream":false,"stream":false,"include_metrics":true}`, `{"stream_options":null,"stream_options":{"x":1}}`,
		"{\n\"model\":\"m\",\n\"stream_options\":{\"include_usage\":false}\n}", `{}`, ` { } `,
		`{"include_metrics":true,"include_metrics":false,"m":"é\"\\"}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		req := InspectRequest(body)
		if !req.Understood {
			return
		}
		in := string(body)
		out, err := upgradedBody(body, req)
		if string(body) != in {
			t.Fatalf("input modified: %q", in)
		}
		if err != nil {
			t.Fatalf("UpgradedBody(%q): %v", body, err)
		}
		var got, want map[string]any
		if err := json.Unmarshal(out, &got); err != nil {
			t.Fatalf("invalid JSON %q from %q", out, body)
		}
		opts, _ := got["stream_options"].(map[string]any)
		if got["stream"] != true || opts["include_usage"] != true || countKey(out, "stream") != 1 || countKey(out, "stream_options") != 1 {
			t.Fatalf("not upgraded: %q from %q", out, body)
		}
		if req.HasIncludeMetrics && countKey(out, "include_metrics") != 0 {
			t.Fatalf("include_metrics left in %q", out)
		}
		if json.Unmarshal(body, &want) != nil {
			return
		}
		if req.HasIncludeMetrics {
			delete(want, "include_metrics")
		}
		for _, k := range []string{"stream", "stream_options"} {
			delete(got, k)
			delete(want, k)
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("other members changed: %q -> %q", body, out)
		}
	})
}

// FuzzEachMember: the sidecar's member walk sees what gjson's ForEach does
// in a valid document: the same keys, values and offsets, in order.
func FuzzEachMember(f *testing.F) {
	for _, s := range []string{
		`{"a":1,"b":"x\"y","c":[1,{"d":"]"}],"e":{"f":null},"g":true}`, ` [ 1 , "a" , [ ] , { } ] `,
		`{"k\u0065y":"\\","":-1.5e3}`, `{}`, `[]`, `{"a" : "b" }`,
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		doc := gjson.Parse(s)
		if !valid(s) || !doc.IsObject() && !doc.IsArray() {
			return
		}
		type member struct {
			key       string
			keyAt, at int
			raw       string
		}
		var want, got []member
		doc.ForEach(func(k, v gjson.Result) bool {
			m := member{raw: v.Raw, at: v.Index}
			if doc.IsObject() {
				m.key, m.keyAt = k.Str, k.Index
			}
			want = append(want, m)
			return true
		})
		eachMember(s, func(key string, keyAt int, raw string, at int) bool {
			m := member{key: key, raw: raw, at: at}
			if doc.IsObject() {
				m.keyAt = keyAt
			}
			got = append(got, m)
			return true
		})
		for i := range want {
			if i < len(got) && len(want[i].key) > maxKeyBytes/6 {
				got[i].key = want[i].key // long keys are passed as sent
			}
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("eachMember(%q) = %+v, ForEach %+v", s, got, want)
		}
	})
}
