package rewrite

import (
	"bytes"
	"io"
	"runtime"
	"strings"
	"testing"
	"testing/iotest"
)

// TestEditReadsAsWritten: the edit's reader gives the bytes AppendTo does,
// read in any sizes (iotest checks reads of one byte and the io.Reader
// contract), and through WriteTo; a second Reader starts over.
func TestEditReadsAsWritten(t *testing.T) {
	body := []byte(`{"include_metrics":true,"model":"m","stream":true,"stream_options":{"x":1},"messages":[]}`)
	var e Edit
	if err := UpstreamBody(&e, body, InspectRequest(body), true); err != nil {
		t.Fatal(err)
	}
	want := e.AppendTo(nil)
	if e.Len() != len(want) || e.Unchanged() {
		t.Fatalf("Len %d, Unchanged %v for %s", e.Len(), e.Unchanged(), want)
	}
	if err := iotest.TestReader(e.Reader(), want); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	r := e.Reader()
	head := make([]byte, 7)
	io.ReadFull(r, head)
	out.Write(head)
	if _, err := io.Copy(&out, r); err != nil || out.String() != string(want) {
		t.Fatalf("read then copied %q, %v; want %q", out.String(), err, want)
	}
	out.Reset()
	if _, err := io.Copy(&out, e.Reader()); err != nil || out.String() != string(want) {
		t.Fatalf("second reader gave %q, %v", out.String(), err)
	}
}

// allocatedBy is how many bytes fn allocates.
func allocatedBy(fn func()) uint64 {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	fn()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

// TestLargeBodiesAreNotCopied: reading and editing a request of megabytes
// copies none of it, whatever holds the bulk: an escaped completions
// prompt (gjson's ForEach would unescape it whole), a "model" string, a
// messages array, or a repeated key that sends the edit to a full pass.
func TestLargeBodiesAreNotCopied(t *testing.T) {
	big := strings.Repeat(`line \"quoted\"\n`, 1<<19) // 8 MiB escaped
	for _, body := range []string{
		`{"model":"m","prompt":"` + big + `","stream":true,"include_metrics":true}`,
		`{"model":"` + big + `","stream":true,"include_metrics":true}`,
		`{"messages":[{"role":"user","content":"` + big + `"}],"stream":false,"include_metrics":true}`,
		`{"prompt":"` + big + `","stream":true,"stream_options":{"x":"` + big + `"},"include_metrics":true}`,
		`{"model":"m","stream":true,"stream_options":{"x":"` + big + `","include_usage":false}}`,
	} {
		b := []byte(body)
		var r Request
		if n := allocatedBy(func() { r = InspectRequest(b) }); n > 64<<10 || !r.Understood {
			t.Errorf("InspectRequest of %.40s… allocated %d bytes (understood %v)", body, n, r.Understood)
		}
		if len(r.Model) > MaxModelBytes {
			t.Errorf("model kept %d bytes", len(r.Model))
		}
		var e Edit
		edit := func() { UpstreamBody(&e, b, r, true) }
		if r.Upgradable {
			edit = func() { UpgradedBody(&e, b, r) }
		}
		if n := allocatedBy(edit); n > 64<<10 {
			t.Errorf("editing %.40s… allocated %d bytes", body, n)
		}
		if e.Unchanged() || e.Len() < len(big) {
			t.Errorf("not edited: %d bytes", e.Len())
		}
	}
}

func TestStringPrefixCutsBetweenEscapes(t *testing.T) {
	for _, tt := range []struct {
		raw   string
		limit int
		want  string
	}{
		{`"abcd"`, 4, "abcd"},
		{`"abcdefgh"`, 4, "abcd"},
		{`"ab\ndefgh"`, 4, "ab\n"},   // the escape ends at the limit
		{`"abc\ndefgh"`, 4, "abc"},   // it would cross it
		{`"ab\u00e9defgh"`, 4, "ab"}, // so would this one
		{`"a\\\\bcdefg"`, 4, `a\`},   // backslashes escaped
		{`"\u00e9\u00e9xx"`, 8, "é"},
	} {
		if got := stringPrefix(tt.raw, tt.limit); got != tt.want {
			t.Errorf("stringPrefix(%s, %d) = %q, want %q", tt.raw, tt.limit, got, tt.want)
		}
	}
}
