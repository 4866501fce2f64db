package rewrite

import (
	"bytes"
	"encoding/json"
	"io"
	"reflect"
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
				if !bytes.HasSuffix(p, []byte("\n\n")) && !bytes.HasSuffix(p, []byte("\n\r\n")) {
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

// FuzzAppendWithMetrics: splicing into any valid JSON object succeeds,
// yields valid JSON, and leaves every other key as it was.
func FuzzAppendWithMetrics(f *testing.F) {
	for _, s := range []string{chatUsage, cmplUsage, `{}`, `{ }`, `{"metrics":1}`, "{\n\"a\" : [1, {\"b\":null}]\n}\n", `[]`, `{"a":`, `"s"`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, obj []byte) {
		out, ok := AppendWithMetrics(nil, obj, []byte(metricsJSON))
		var in map[string]any
		isObject := json.Valid(obj) && json.Unmarshal(obj, &in) == nil && in != nil
		if !ok {
			if isObject && !hasDuplicateKeys(obj) {
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
		var want map[string]any
		json.Unmarshal([]byte(metricsJSON), &want)
		if !reflect.DeepEqual(got["metrics"], any(want)) {
			t.Fatalf("metrics = %v in %q", got["metrics"], out)
		}
		delete(got, "metrics")
		delete(in, "metrics")
		if !hasDuplicateKeys(obj) && !reflect.DeepEqual(got, in) {
			t.Fatalf("other keys changed: %q -> %q", obj, out)
		}
	})
}

// hasDuplicateKeys tells whether a top-level key repeats: encoding/json and
// gjson then disagree about which one counts, which is not the splice's
// concern.
func hasDuplicateKeys(obj []byte) bool {
	seen := map[string]bool{}
	dup := false
	gjson.ParseBytes(obj).ForEach(func(key, _ gjson.Result) bool {
		dup = seen[key.String()]
		seen[key.String()] = true
		return !dup
	})
	return dup
}

// FuzzUpstreamBody: whatever request the sidecar understood, the body it
// sends upstream is valid JSON without include_metrics and with every other
// top-level member as the client sent it.
func FuzzUpstreamBody(f *testing.F) {
	for _, s := range []string{
		`{"model":"m","include_metrics":true}`, `{ "include_metrics" : false , "stream":true}`,
		`{"include_metrics":true}`, "{\"a\":[1,{\"include_metrics\":1}],\n\"include_metrics\":true\n}",
		`{"include_metrics":true,"include_metrics":false}`, `{"stream":true,"stream_options":{"include_usage":false}}`,
	} {
		f.Add([]byte(s), true)
	}
	f.Fuzz(func(t *testing.T, body []byte, askUsage bool) {
		req := InspectRequest(body)
		if !req.Understood {
			return
		}
		in := string(body)
		out, err := UpstreamBody(nil, body, req, askUsage)
		if string(body) != in {
			t.Fatalf("input modified: %q", in)
		}
		if err != nil {
			return
		}
		var got, want map[string]any
		if err := json.Unmarshal(out, &got); err != nil {
			t.Fatalf("invalid JSON %q from %q", out, body)
		}
		if req.HasIncludeMetrics && gjson.GetBytes(out, "include_metrics").Exists() {
			t.Fatalf("include_metrics left in %q", out)
		}
		if hasDuplicateKeys(body) || json.Unmarshal(body, &want) != nil {
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
