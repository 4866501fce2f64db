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
	var seenUsage, seenTimings, seenChoices bool
	var metrics, timings, meta gjson.Result
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
		case "choices":
			if !seenChoices {
				meta = value.Get("0.meta_info") // SGLang's, asked with return_meta_info
			}
			seenChoices = true
		}
		return true
	})
	b.Engine = engineTiming(metrics, timings)
	if !b.Engine.Reported && meta.IsObject() {
		b.Engine = sglangTiming(meta)
	}
	b.Usage = cacheFromTimings(b.Usage, timings)
	if c, ok := tokenCount(meta.Get("cached_tokens")); ok && !b.Usage.CachedTokens.Set {
		b.Usage.CachedTokens = c // SGLang's usage leaves it out when 0, or without --enable-cache-report
	}
	return b
}

// WithMetrics returns the non-streaming response body, which b was read
// from, with the metrics object set as its "metrics" member: where the
// engine's own lies, merged with it (AppendMergedMetrics), or a new one at
// the end.
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
		metrics = AppendMergedMetrics(nil, metrics, body[b.metricsAt:b.metricsEnd])
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
// metrics object, if obj has one, is not the sidecar's to drop: the two
// are merged (AppendMergedMetrics).
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
	e.dst = AppendMergedMetrics(e.dst, metrics, engine)
	return e.done(), true
}

// SidecarNamespace is the member of a merged metrics object that holds
// the sidecar's figures whose names the engine's own object already uses.
const SidecarNamespace = "timing_sidecar"

// AppendMergedMetrics appends to dst the metrics object a response
// carries: the engine's own object engine, every member as and where the
// engine put it, and beside them the sidecar's object ours, member by
// member. An engine's "metrics" is a shared namespace (vLLM's
// --enable-per-request-metrics fills it, and adds output_token_metrics
// and speculative_decoding): a client written for the engine reads the
// engine's figures where the engine writes them, through the sidecar as
// without it. So each of the sidecar's members goes at the top level
// where the engine's object has no member of that name, and under
// "timing_sidecar" where it has; where the engine's object already has a
// "timing_sidecar" (a second sidecar in front of one), those few are left
// out of the object (the log and the span keep them). engine that is
// empty, null or not an object is replaced, as is any engine object by
// ours when ours is null: dst gets ours. ours is otherwise a JSON object
// with unescaped keys (timing.Metrics.AppendJSON's). Nothing
// is allocated given room in dst.
func AppendMergedMetrics(dst, ours, engine []byte) []byte {
	open := firstNonSpace(engine)
	if o := firstNonSpace(ours); open < 0 || engine[open] != '{' || o < 0 || ours[o] != '{' {
		// Nothing to merge into, or ours is null (several choices, as
		// vLLM says it): ours replaces the engine's.
		return append(dst, ours...)
	}
	engine = engine[open : lastNonSpace(engine)+1]
	dst = append(dst, engine[:len(engine)-1]...) // the engine's members, as sent
	members := len(engine) > 2 && firstNonSpace(engine[1:len(engine)-1]) >= 0
	taken, nested := hasMember(engine, SidecarNamespace), false
	eachMember(view(ours), func(key string, keyAt int, raw string, at int) bool {
		if !hasMember(engine, key) {
			if members {
				dst = append(dst, ',')
			}
			dst, members = append(dst, ours[keyAt:at+len(raw)]...), true
		} else {
			nested = true
		}
		return true
	})
	if nested && !taken {
		if members {
			dst = append(dst, ',')
		}
		dst = append(dst, `"`+SidecarNamespace+`":{`...)
		first := true
		eachMember(view(ours), func(key string, keyAt int, raw string, at int) bool {
			if hasMember(engine, key) {
				if !first {
					dst = append(dst, ',')
				}
				dst, first = append(dst, ours[keyAt:at+len(raw)]...), false
			}
			return true
		})
		dst = append(dst, '}')
	}
	return append(dst, '}')
}

// hasMember tells whether the JSON object obj has a member named key,
// escaped or not.
func hasMember(obj []byte, key string) bool {
	found := false
	eachMember(view(obj), func(k string, _ int, _ string, _ int) bool {
		found = k == key
		return !found
	})
	return found
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
