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
			if i = stringEnd(s, i); i < 0 {
				return false // unterminated: gjson.Valid stops here
			}
		}
	}
	return false
}

// stringEnd returns the index of the quote that ends the string whose
// opening quote is s[i], or -1 when it does not end: the next quote not
// escaped, that is not after an odd run of backslashes.
func stringEnd(s string, i int) int {
	for {
		j := strings.IndexByte(s[i+1:], '"')
		if j < 0 {
			return -1
		}
		i += 1 + j
		k := i - 1
		for s[k] == '\\' { // stops at the opening quote at the latest
			k--
		}
		if (i-1-k)%2 == 0 {
			return i
		}
	}
}

// valueEnd returns the index past the JSON value that starts at s[i], in
// a document already valid.
func valueEnd(s string, i int) int {
	switch s[i] {
	case '"':
		return stringEnd(s, i) + 1
	case '{', '[':
		d := 0
		for ; i < len(s); i++ {
			switch s[i] {
			case '{', '[':
				d++
			case '}', ']':
				if d--; d == 0 {
					return i + 1
				}
			case '"':
				i = stringEnd(s, i)
			}
		}
		return len(s)
	}
	for ; i < len(s); i++ {
		switch s[i] {
		case ',', '}', ']', ' ', '\t', '\n', '\r':
			return i
		}
	}
	return i
}

// maxKeyBytes bounds the keys eachMember unescapes, as sent with their
// quotes. The engine decodes every escape in a key ("\u0073tream" is
// "stream" to Python's json), so the sidecar must too, for every key that
// could decode to one it reads. None it reads is longer than maxKeyChars
// characters, and an ASCII character takes at most six bytes escaped
// (\u0073), so a longer key is none of them, whatever it decodes to: it is
// left as sent, which matches nothing. TestEscapedKeysAreRead holds the
// longest key read to this bound.
const (
	maxKeyChars = 32
	maxKeyBytes = maxKeyChars*len(`\u0000`) + 2
)

// eachMember calls fn with each member of the valid JSON object s, or each
// element of the array s (key ""), until fn returns false: the key's text
// and where its opening quote lies, and the value's raw text and where it
// starts. Unlike gjson's ForEach it unescapes no value, only short keys: a
// completions prompt of megabytes with a newline in it would otherwise be
// copied whole to be skipped. Values the sidecar reads are parsed by gjson
// one by one.
func eachMember(s string, fn func(key string, keyAt int, raw string, at int) bool) {
	i := 0
	for i < len(s) && isSpace(s[i]) {
		i++
	}
	if i == len(s) {
		return
	}
	object := s[i] == '{'
	for i++; i < len(s); {
		for i < len(s) && (isSpace(s[i]) || s[i] == ',') {
			i++
		}
		if i >= len(s) || s[i] == '}' || s[i] == ']' {
			return
		}
		key, keyAt := "", i
		if object {
			end := stringEnd(s, i) + 1
			key = s[i+1 : end-1]
			if strings.IndexByte(key, '\\') >= 0 && end-i <= maxKeyBytes {
				key = gjson.Parse(s[i:end]).Str
			}
			i = end
			for i < len(s) && (isSpace(s[i]) || s[i] == ':') {
				i++
			}
		}
		end := valueEnd(s, i)
		if !fn(key, keyAt, s[i:end], i) {
			return
		}
		i = end
	}
}

// objectEdit edits a valid JSON object, cutting members out in the order
// they appear and appending new ones at its end. Parsers take the last copy
// of a repeated key (Python's json, JSON.parse, encoding/json), so a member
// the sidecar sets goes last and every other copy of it goes.
//
// It writes its output one of two ways: copied into dst, for events and
// response bodies, which are small and go out as one write; or as an Edit
// that refers to the object's bytes, for request bodies, which may be tens
// of megabytes (out set; obj is then out's body).
//
// objectEdit does what sjson cannot as these callers need: reach every
// copy of a repeated key in one pass (sjson reaches the first), edit into
// a reused buffer without allocating, which UpstreamBody and the metrics
// splice are tested for (sjson.SetRawBytes: about 0.6 µs and 3
// allocations on a 300-byte event, against 16-28 ns and none here), and
// edit without copying a body (sjson returns a new document).
type objectEdit struct {
	dst   []byte
	out   *Edit
	base  int // where obj begins in out's body
	obj   []byte
	from  int  // obj[from:] is not written yet
	close int  // obj's closing brace
	last  byte // the last byte other than space written from obj
}

func newObjectEdit(dst, obj []byte) objectEdit {
	return objectEdit{dst: dst, obj: obj, close: lastNonSpace(obj)}
}

// newBodyEdit starts an edit of out's body, written to out.
func newBodyEdit(out *Edit) objectEdit {
	out.parts, out.own, out.n = out.parts[:0], out.own[:0], 0
	return objectEdit{out: out, obj: out.src, close: lastNonSpace(out.src)}
}

// newMemberEdit starts an edit of the object out's body holds at
// [from, to) (a member's value), written to out after what is there.
func newMemberEdit(out *Edit, from, to int) objectEdit {
	obj := out.src[from:to]
	return objectEdit{out: out, base: from, obj: obj, close: lastNonSpace(obj)}
}

// keep writes obj[from:to] and moves past it.
func (e *objectEdit) keep(to int) {
	seg := e.obj[e.from:to]
	if i := lastNonSpace(seg); i >= 0 {
		e.last = seg[i]
	}
	if e.out != nil {
		e.out.keep(e.base+e.from, e.base+to)
	} else {
		e.dst = append(e.dst, seg...)
	}
	e.from = to
}

// add writes the sidecar's bytes b.
func (e *objectEdit) add(b []byte) {
	if e.out != nil {
		e.out.add(b)
	} else {
		e.dst = append(e.dst, b...)
	}
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
	e.keep(at)
	e.from = end
}

// cutKeys leaves out every top-level member whose key drop selects, in one
// pass however often a key repeats.
func (e *objectEdit) cutKeys(drop func(key string) bool) {
	eachMember(view(e.obj), func(key string, keyAt int, raw string, at int) bool {
		if drop(key) {
			e.cut(keyAt, at+len(raw))
		}
		return true
	})
}

// toEnd writes the rest of the object up to its closing brace, and a comma
// when a member is left, so that the caller can add one.
func (e *objectEdit) toEnd() {
	e.keep(e.close)
	if e.last != '{' {
		e.add(comma)
	}
}

var comma = []byte{','}

// done writes the rest of obj and returns dst.
func (e *objectEdit) done() []byte {
	e.keep(len(e.obj))
	return e.dst
}
