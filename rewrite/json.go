// Package rewrite does the byte-level work on OpenAI-compatible bodies:
// it inspects and edits requests, frames and classifies server-sent
// events, and splices the metrics object into JSON, without decoding more
// of a document than the keys it needs.
package rewrite

import (
	"strings"
	"unsafe"

	"github.com/tidwall/gjson"
)

// view returns b as a string without copying, so gjson can read it without
// allocating. The string must not outlive the next change to b.
func view(b []byte) string { return unsafe.String(unsafe.SliceData(b), len(b)) }

// maxDepth is the deepest nesting of arrays and objects the sidecar reads.
// gjson.Valid recurses once per level, so a request of a few megabytes of
// "[[[[" would exhaust the stack. Python's json, which the FastAPI-based
// engines parse with, fails near its recursion limit of 1000, so no engine
// serves a deeper request: refusing one costs nothing. A request nested
// deeper is not Understood, so the proxy forwards it unread and unchanged
// and the engine answers it as it would without the sidecar; a response
// nested deeper is treated as not JSON and passed on without metrics.
const maxDepth = 1000

// valid is gjson.Valid for documents nested at most maxDepth deep; deeper
// ones are not valid. Every validation in the package goes through it.
func valid(s string) bool { return validWithin(s, maxDepth) }

func validWithin(s string, depth int) bool {
	// Nesting cannot be deeper than the number of opening brackets, which
	// a vectorised count finds faster than a scan: most documents have
	// fewer than depth and skip the scan.
	if strings.Count(s, "[")+strings.Count(s, "{") > depth && deeperThan(s, depth) {
		return false
	}
	return gjson.Valid(s)
}

// deeperThan tells whether s nests arrays and objects more than depth
// deep, iteratively and without allocating; brackets inside strings do not
// count. When s is not valid JSON it answers for the part gjson.Valid reads
// before it stops, which is all that matters for its recursion.
func deeperThan(s string, depth int) bool {
	d := 0
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '[', '{':
			if d++; d > depth {
				return true
			}
		case ']', '}':
			if d--; d < 0 {
				return false // invalid: gjson.Valid stops here
			}
		case '"':
			// The string ends at the next quote not escaped, that is not
			// after an odd run of backslashes.
			for {
				j := strings.IndexByte(s[i+1:], '"')
				if j < 0 {
					return false // unterminated: gjson.Valid stops here
				}
				i += 1 + j
				k := i - 1
				for s[k] == '\\' { // stops at the opening quote at the latest
					k--
				}
				if (i-1-k)%2 == 0 {
					break
				}
			}
		}
	}
	return false
}

// objectEdit copies a valid JSON object into dst, cutting members out in
// the order they appear and appending new ones at its end. Parsers take the
// last copy of a repeated key (Python's json, JSON.parse, encoding/json), so
// a member the sidecar sets goes last and every other copy of it goes.
//
// sjson does the edits it can (UpgradedBody, each key once). objectEdit
// does what sjson cannot as these callers need: reach every copy of a
// repeated key in one pass (sjson reaches the first), and edit into a
// reused buffer without allocating, which UpstreamBody and the metrics
// splice are tested for (sjson.SetRawBytes: about 0.6 µs and 3 allocations
// on a 300-byte event, against 16-28 ns and none here).
type objectEdit struct {
	dst, obj []byte
	start    int // where the copy begins in dst
	from     int // obj[from:] is not copied yet
	close    int // obj's closing brace
}

func newObjectEdit(dst, obj []byte) objectEdit {
	return objectEdit{dst: dst, obj: obj, start: len(dst), close: lastNonSpace(obj)}
}

// cut leaves out the member from at (its key's opening quote) to end (past
// its value), with the comma before it, or when there is none or it is
// already cut, the comma after it. Cuts must come in order.
func (e *objectEdit) cut(at, end int) {
	if i := lastNonSpace(e.obj[:at]); e.obj[i] == ',' && i >= e.from {
		at = i
	} else if j := end + firstNonSpace(e.obj[end:]); e.obj[j] == ',' {
		end = j + 1
	}
	e.dst = append(e.dst, e.obj[e.from:at]...)
	e.from = end
}

// cutKeys leaves out every top-level member whose key drop selects, in one
// pass however often a key repeats.
func (e *objectEdit) cutKeys(drop func(key string) bool) {
	gjson.Parse(view(e.obj)).ForEach(func(k, v gjson.Result) bool {
		if drop(k.Str) {
			e.cut(k.Index, v.Index+len(v.Raw))
		}
		return true
	})
}

// toEnd copies the rest of the object up to its closing brace, and a comma
// when a member is left, so that the caller can append one.
func (e *objectEdit) toEnd() {
	e.dst = append(e.dst, e.obj[e.from:e.close]...)
	e.from = e.close
	if i := lastNonSpace(e.dst[e.start:]); e.dst[e.start+i] != '{' {
		e.dst = append(e.dst, ',')
	}
}

// done copies the rest of obj and returns dst.
func (e *objectEdit) done() []byte { return append(e.dst, e.obj[e.from:]...) }
