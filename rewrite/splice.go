package rewrite

import (
	"github.com/tidwall/gjson"
	"github.com/tidwall/sjson"

	"github.com/timing-sidecar/timing-sidecar/timing"
)

// metricsKey is where the metrics object goes, as in vLLM's responses.
const metricsKey = "metrics"

// AppendWithMetrics appends to dst the JSON object obj with the member
// "metrics": metrics added at its end, and reports whether it could: obj
// must be a valid JSON object (surrounding whitespace allowed) nested at
// most maxDepth deep. The member is inserted before the closing brace
// without allocating (given room in dst); any "metrics" members obj had
// are cut, since a client reads the last copy of a key and must read ours.
// On false, dst is returned unchanged and the caller forwards obj as it
// was, so the sidecar never emits invalid JSON.
func AppendWithMetrics(dst, obj, metrics []byte) ([]byte, bool) {
	s := view(obj)
	if !valid(s) {
		return dst, false
	}
	return appendMember(dst, obj, metrics, gjson.Get(s, metricsKey).Exists())
}

// Body is what the sidecar reads of a non-streaming response: one pass to
// validate it and one over its top-level keys.
type Body struct {
	// Usage holds the engine's token counts.
	Usage timing.Usage
	// Engine is the engine's own timing report, as EngineTimingOf reads
	// it, taken in the same pass over the keys.
	Engine     timing.EngineTiming
	object     bool // a valid JSON object
	hasMetrics bool
	// repeated: "usage" or "metrics" comes more than once. Which copy a
	// client reads depends on its parser, so such a body is not one to
	// splice into: it passes through as it came, without metrics.
	repeated bool
	// metricsAt and metricsEnd are where the engine's metrics value lies
	// in the body, for the members of it the sidecar keeps.
	metricsAt, metricsEnd int
}

// InspectBody reads a non-streaming response body. Usage is read as
// BodyUsage reads it (the first "usage" key, leniently), so the counts do
// not depend on whether metrics are spliced in. A body nested deeper than
// maxDepth is not an object to splice into.
func InspectBody(body []byte) Body {
	s := view(body)
	if !valid(s) {
		return Body{Usage: BodyUsage(body), Engine: EngineTimingOf(body)}
	}
	doc := gjson.Parse(s)
	if !doc.IsObject() {
		return Body{}
	}
	b := Body{object: true}
	var seenUsage, seenTimings bool
	var metrics, timings gjson.Result
	doc.ForEach(func(key, value gjson.Result) bool {
		switch key.Str {
		case "usage":
			if !seenUsage && value.IsObject() {
				b.Usage = parseUsage(value)
			}
			b.repeated = b.repeated || seenUsage
			seenUsage = true
		case metricsKey:
			if !b.hasMetrics {
				metrics = value
				b.metricsAt, b.metricsEnd = value.Index, value.Index+len(value.Raw)
			}
			b.repeated = b.repeated || b.hasMetrics
			b.hasMetrics = true
		case "timings":
			if !seenTimings {
				timings = value
			}
			seenTimings = true
		}
		return true
	})
	b.Engine = engineTiming(metrics, timings)
	b.Usage = cacheFromTimings(b.Usage, timings)
	return b
}

// WithMetrics returns the non-streaming response body, which b was read
// from, with the metrics object set as its "metrics" member: the engine's
// own member replaced where it lies, keeping the engine's members the
// sidecar does not write (AppendEngineMembers), or a new one at the end.
// sjson does the edit, as the design has it: once per request (the
// per-event splice, which must not allocate, is objectEdit's). The result
// is sjson's new document, the caller's to keep: a response of megabytes
// is held twice (the engine's and the spliced), never copied a third time.
// A body that is not a JSON object, or repeats "usage" or "metrics", is
// not spliced into: false, and the caller passes it on as it came.
func (b Body) WithMetrics(body, metrics []byte) ([]byte, bool) {
	if !b.object || b.repeated {
		return nil, false
	}
	if b.hasMetrics {
		metrics = AppendEngineMembers(append([]byte(nil), metrics...), body[b.metricsAt:b.metricsEnd])
	}
	out, err := sjson.SetRawBytesOptions(body, metricsKey, metrics, &spliceOptions)
	if err != nil {
		return nil, false
	}
	return out, true
}

// SplicedSize bounds the size of what WithMetrics makes of the body b was
// read from, n bytes, with a metrics object of m bytes (the engine's
// members kept in it included): room to take before making it.
func (b Body) SplicedSize(n, m int) int {
	return n + m + (b.metricsEnd - b.metricsAt) + len(`,"":`) + len(metricsKey)
}

// spliceOptions are the options of the body splice's sjson edit.
// Optimistic stays off: it pays only when the key exists, and an engine's
// body usually has no "metrics". ReplaceInPlace stays off: it writes into
// the input, the engine's body, which the caller still holds.
var spliceOptions = sjson.Options{}

// appendMember does the splice on a valid JSON document. The engine's own
// metrics object, if obj has one, is not the sidecar's to drop: its
// members the sidecar does not write go on in the sidecar's object
// (AppendEngineMembers).
func appendMember(dst, obj, metrics []byte, hasMetrics bool) ([]byte, bool) {
	open, close := firstNonSpace(obj), lastNonSpace(obj)
	if open < 0 || obj[open] != '{' || obj[close] != '}' {
		return dst, false
	}
	e := newObjectEdit(dst, obj)
	var engine []byte
	if hasMetrics {
		e.cutKeys(func(key string) bool { return key == metricsKey })
		eachMember(view(obj), func(key string, _ int, raw string, at int) bool {
			if key == metricsKey {
				engine = obj[at : at+len(raw)] // the last copy, as parsers read it
			}
			return true
		})
	}
	e.toEnd()
	e.dst = append(e.dst, `"`+metricsKey+`":`...)
	e.dst = AppendEngineMembers(append(e.dst, metrics...), engine)
	return e.done(), true
}

// AppendEngineMembers adds to metrics, a JSON object that ends dst (the
// sidecar's metrics object), the members of the engine's own metrics
// object engine that the sidecar does not write: vLLM's
// speculative_decoding, and whatever an engine adds there. An engine's
// object is a shared namespace: a client that opts in must not lose what
// the engine reported. The sidecar's members win where both have one (the
// engine's figures are in its "engine" member). engine may be empty, null
// or not an object: then dst is returned as it is. Nothing is allocated
// given room in dst.
func AppendEngineMembers(dst, engine []byte) []byte {
	if n := firstNonSpace(engine); n < 0 || engine[n] != '{' || len(dst) == 0 || dst[len(dst)-1] != '}' {
		return dst
	}
	eachMember(view(engine), func(key string, keyAt int, raw string, at int) bool {
		if !sidecarMetricsKey(key) {
			dst[len(dst)-1] = ','
			if dst[len(dst)-2] == '{' {
				dst = dst[:len(dst)-1] // the object was empty
			}
			dst = append(dst, engine[keyAt:at+len(raw)]...)
			dst = append(dst, '}')
		}
		return true
	})
	return dst
}

// sidecarMetricsKey tells the members the sidecar writes in its metrics
// object (timing.Metrics.AppendJSON).
func sidecarMetricsKey(key string) bool {
	switch key {
	case "time_to_first_token_ms", "generation_time_ms", "queue_time_ms", "mean_itl_ms", "tokens_per_second",
		"e2e_latency_ms", "max_itl_ms", "prompt_tokens", "completion_tokens", "output_token_metrics",
		"overhead_ms", "engine":
		return true
	}
	return false
}

// EngineMetrics returns the engine's own metrics object in obj (a
// response object, or an event's), raw, or nil: the first copy, as
// EngineTimingOf reads it.
func EngineMetrics(obj []byte) []byte {
	m := gjson.GetBytes(obj, metricsKey)
	if !m.IsObject() || m.Index <= 0 {
		return nil
	}
	return obj[m.Index : m.Index+len(m.Raw)]
}

// TakesMetrics tells whether ev's data (or the object in it the API puts
// them in) is an object the metrics can be spliced into:
// AppendEventWithMetrics succeeds exactly when it does. The caller asks
// before computing what it would splice.
func TakesMetrics(ev Event) bool {
	if ev.Data == nil {
		return false
	}
	obj := ev.Target()
	open, close := firstNonSpace(obj), lastNonSpace(obj)
	return open >= 0 && obj[open] == '{' && obj[close] == '}' && valid(view(obj))
}

// AppendEventWithMetrics appends to dst the raw event with the metrics
// spliced into its data (or the object in it the API puts them in), which
// ev (from an API's ClassifyEvent(raw)) located. On false, dst
// is returned unchanged and the caller forwards raw as it was.
func AppendEventWithMetrics(dst, raw []byte, ev Event, metrics []byte) ([]byte, bool) {
	if ev.Data == nil {
		return dst, false
	}
	at, end := ev.dataAt, ev.dataAt+len(ev.Data)
	if ev.nestedLen > 0 {
		at, end = ev.dataAt+ev.nestedAt, ev.dataAt+ev.nestedAt+ev.nestedLen
	}
	n := len(dst)
	dst = append(dst, raw[:at]...)
	dst, ok := AppendWithMetrics(dst, raw[at:end], metrics)
	if !ok {
		return dst[:n], false
	}
	return append(dst, raw[end:]...), true
}

func firstNonSpace(b []byte) int {
	for i, c := range b {
		if !isSpace(c) {
			return i
		}
	}
	return -1
}

func lastNonSpace(b []byte) int {
	for i := len(b) - 1; i >= 0; i-- {
		if !isSpace(b[i]) {
			return i
		}
	}
	return -1
}

func isSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }
