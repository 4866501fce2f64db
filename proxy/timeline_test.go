package proxy

import (
	"io"
	"strings"
	"testing"
	"time"
)

// The proxy's timing tests check each figure against causal bounds, never
// against another clock within a tolerance: a mark the sidecar takes on a
// piece of the exchange lies after the engine began writing that piece and
// before the client had read it, so a figure from mark a to mark b lies
// between b.from − a.to and b.to − a.from whatever the scheduler does. On
// an idle machine the bounds are a few milliseconds apart, so a mark taken
// on the wrong event still fails; on a busy one they widen, and nothing
// fails by luck. The arithmetic is tested exactly in timing/, which event
// sets which mark in rewrite/; the tight accuracy figures come from the
// accuracy report (README, Accuracy).

// span is when the sidecar must have taken one mark.
type span struct{ from, to time.Time }

// between bounds, in ms, the time from mark a to mark b.
func between(a, b span) (lo, hi float64) { return ms(b.from.Sub(a.to)), ms(b.to.Sub(a.from)) }

// rounding is what the metrics' three decimals may add or take.
const rounding = 0.0015

// within checks that a figure lies in [lo, hi] ms.
func within(t *testing.T, m map[string]*float64, field string, lo, hi float64) {
	t.Helper()
	got := m[field]
	switch {
	case got == nil:
		t.Errorf("%s = null, want between %.3f and %.3f", field, lo, hi)
	case *got < lo-rounding || *got > hi+rounding:
		t.Errorf("%s = %.3f, want between %.3f and %.3f (causal bounds)", field, *got, lo, hi)
	}
}

// during checks a figure that measures the time from mark a to mark b.
func during(t *testing.T, m map[string]*float64, field string, a, b span) {
	t.Helper()
	lo, hi := between(a, b)
	within(t, m, field, lo, hi)
}

// perToken checks a figure that is the time from mark a to mark b divided
// among n gaps (a mean inter-token latency).
func perToken(t *testing.T, m map[string]*float64, field string, a, b span, n float64) {
	t.Helper()
	lo, hi := between(a, b)
	within(t, m, field, lo/n, hi/n)
}

// rate checks tokens per second over the time from mark a to mark b.
func rate(t *testing.T, m map[string]*float64, field string, a, b span, tokens float64) {
	t.Helper()
	lo, hi := between(a, b)
	if lo <= 0 {
		lo = 1e-9 // the fastest rate is then unbounded
	}
	got := m[field]
	if got == nil || *got < tokens/(hi/1000)*(1-1e-6)-rounding || *got > tokens/(lo/1000)*(1+1e-6)+rounding {
		t.Errorf("%s = %v, want between %.3f and %.3f (causal bounds)", field, got, tokens/(hi/1000), tokens/(lo/1000))
	}
}

// largestGap checks the largest gap between consecutive marks.
func largestGap(t *testing.T, m map[string]*float64, field string, marks []span) {
	t.Helper()
	var lo, hi float64
	for i := 1; i < len(marks); i++ {
		l, h := between(marks[i-1], marks[i])
		lo, hi = max(lo, l), max(hi, h)
	}
	within(t, m, field, lo, hi)
}

// received is when the client had read the first event holding text.
func received(t *testing.T, events []sseEvent, text string) time.Time {
	t.Helper()
	return firstReceived(t, events, func(data string) bool { return strings.Contains(data, text) })
}

// firstReceived and lastReceived are when the client had read the first
// and the last event that is.
func firstReceived(t *testing.T, events []sseEvent, is func(data string) bool) time.Time {
	t.Helper()
	for _, e := range events {
		if is(e.data) {
			return e.at
		}
	}
	t.Fatal("the client got no such event")
	return time.Time{}
}

func lastReceived(t *testing.T, events []sseEvent, is func(data string) bool) time.Time {
	t.Helper()
	for i := len(events) - 1; i >= 0; i-- {
		if is(events[i].data) {
			return events[i].at
		}
	}
	t.Fatal("the client got no such event")
	return time.Time{}
}

// isTextDelta tells an event carrying generated text in any API the
// emulated engine speaks: a non-empty delta of Chat Completions, the
// Messages API or the Responses API.
func isTextDelta(data string) bool {
	return hasText(data, `"content":"`, `"text":"`, `"delta":"`, `"reasoning_content":"`, `"reasoning":"`)
}

func isReasoningDelta(data string) bool {
	return hasText(data, `"reasoning_content":"`, `"reasoning":"`)
}

func isContentDelta(data string) bool { return hasText(data, `"content":"`) }

// hasText tells whether data has one of the string keys with a non-empty
// value.
func hasText(data string, keys ...string) bool {
	for _, key := range keys {
		if i := strings.Index(data, key); i >= 0 && i+len(key) < len(data) && data[i+len(key)] != '"' {
			return true
		}
	}
	return false
}

// timedStream posts a stream and reads it to its end, stamping when the
// client began and when it had the response headers, and returns the
// engine's record once the engine has finished the request.
func timedStream(t *testing.T, engine *fakeEngine, url, body string, headers map[string]string) (start, gotHeaders time.Time, events []sseEvent, fr *fakeRequest) {
	t.Helper()
	start = time.Now()
	resp := post(t, url, body, headers)
	gotHeaders = time.Now()
	defer resp.Body.Close()
	events, err := readEvents(t, resp.Body)
	if err != io.EOF {
		t.Fatalf("stream ended with %v", err)
	}
	fr = engine.next(t)
	<-fr.Finished
	return start, gotHeaders, events, fr
}
