// Package rewrite does the byte-level work on OpenAI-compatible bodies:
// it inspects and edits requests, frames and classifies server-sent
// events, and splices the metrics object into JSON, without decoding more
// of a document than the keys it needs.
package rewrite

import (
	"unsafe"

	"github.com/tidwall/sjson"
)

// view returns b as a string without copying, so gjson can read it without
// allocating. The string must not outlive the next change to b.
func view(b []byte) string { return unsafe.String(unsafe.SliceData(b), len(b)) }

// sjsonOptions for the rare edits that go through sjson (request edits, a
// response that already has a "metrics" key). Optimistic only helps when the
// key exists and costs a scan when it does not; ReplaceInPlace would write
// into the caller's buffer and silently skips some string values, so both
// stay off.
var sjsonOptions = &sjson.Options{Optimistic: false, ReplaceInPlace: false}
