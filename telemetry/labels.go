// Package telemetry turns each finished request into Prometheus series and
// one access-log line. Recording is O(1) per request and nothing runs per
// stream event.
package telemetry

import "sync"

// otherLabel is the value every label past the limit counts under.
const otherLabel = "other"

// boundedLabel admits the first max distinct values of a label taken from
// client input (model, tenant) and maps the rest to "other", so no client
// can blow up the series count.
type boundedLabel struct {
	max  int
	mu   sync.RWMutex
	seen map[string]struct{}
}

func newBoundedLabel(max int) *boundedLabel {
	return &boundedLabel{max: max, seen: make(map[string]struct{}, max)}
}

// value returns v if it is admitted, else "other". An empty value stays
// empty: it means the request did not name one.
func (b *boundedLabel) value(v string) string {
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
	if n >= b.max {
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
