package telemetry

import (
	"strings"
	"sync"
	"unicode/utf8"
)

// otherLabel is the value every label past the limit counts under.
const otherLabel = "other"

// maxLabelBytes bounds each client-supplied string the sidecar records
// (model, tenant, request id, method, path), in label values and in the
// access log. 256 is far above any real name: Hugging Face ids are at most
// 96 characters and served model names and tenant ids are shorter still;
// yet it keeps a bounded model slot to some tens of KB of exposition
// instead of the megabytes a request body allows.
const maxLabelBytes = 256

// clean returns s as valid UTF-8 of at most maxLabelBytes: each run of
// invalid bytes becomes one U+FFFD (Prometheus refuses such label values
// with a panic) and a longer value is cut on a rune boundary. A value that
// is already clean, the usual case, is returned as is without allocating.
func clean(s string) string {
	if len(s) <= maxLabelBytes && utf8.ValidString(s) {
		return s
	}
	// Only a prefix can survive the cut, so only a prefix is examined:
	// the work is bounded whatever the client sent.
	if len(s) > maxLabelBytes+utf8.UTFMax {
		s = s[:maxLabelBytes+utf8.UTFMax]
	}
	s = strings.ToValidUTF8(s, "\uFFFD")
	if len(s) > maxLabelBytes {
		i := maxLabelBytes
		for !utf8.RuneStart(s[i]) {
			i--
		}
		s = s[:i]
	}
	// A copy, so that a label kept for the life of the process does not
	// pin the whole request body it was cut from.
	return strings.Clone(s)
}

// boundedLabel admits the first max distinct values of a label taken from
// client input (model, tenant, variant) and maps the rest to "other", so
// no client can blow up the series count.
type boundedLabel struct {
	max  int
	mu   sync.RWMutex
	seen map[string]struct{}
}

// newBoundedLabel admits the first max values served, and the values
// given here from the start (the deployment's own variant), whatever max.
func newBoundedLabel(max int, admitted ...string) *boundedLabel {
	b := &boundedLabel{max: max, seen: make(map[string]struct{}, max)}
	for _, v := range admitted {
		if v != "" {
			b.seen[v] = struct{}{}
		}
	}
	return b
}

// value returns v if it is admitted, else "other". An empty value stays
// empty: it means the request did not name one.
//
// A value not yet admitted takes a free slot only if served, that is the
// engine answered 2xx; an admitted value keeps its label whatever the
// status. vLLM answers a model it does not serve with 404, so names made
// up by clients never take a slot from the real models seen afterwards.
// The limit of the rule: behind an engine that accepts any model name (or
// for tenants, which no engine checks) a client with successful requests
// can still fill the slots, and those count as "other" until a restart.
func (b *boundedLabel) value(v string, served bool) string {
	if v == "" {
		return ""
	}
	b.mu.RLock()
	_, ok := b.seen[v]
	n := len(b.seen)
	b.mu.RUnlock()
	if ok {
		return v
	}
	if !served || n >= b.max {
		return otherLabel
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if _, ok := b.seen[v]; ok {
		return v
	}
	if len(b.seen) >= b.max {
		return otherLabel
	}
	b.seen[v] = struct{}{}
	return v
}
