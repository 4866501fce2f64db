package timing

import "time"

// Clock holds the marks of one request, all read from the monotonic clock.
// The zero time means "not marked". A Clock is owned by one goroutine at a
// time; it does no locking.
type Clock struct {
	// Arrival is when the sidecar held the complete client request
	// (the external twin of the engine's "queued").
	Arrival time.Time
	// Accepted is when the upstream's status line and headers arrived
	// (the external twin of the engine's "scheduled", where the upstream
	// sends its headers before its work: see HeadersLead).
	Accepted time.Time
	// HeadersLate says the upstream's headers cannot mark when it started
	// the request whatever they lead by: a router in front of it splits
	// the request over two engines and answers once the second starts.
	HeadersLate bool
	// FirstToken is when the first event carrying generated output arrived.
	FirstToken time.Time
	// LastToken is when the latest event carrying generated output arrived.
	LastToken time.Time
	// Done is when the last upstream byte the metrics describe had arrived:
	// the whole body of a non-streaming response, or the event that carries
	// the metrics in a stream.
	Done time.Time

	// Reasoning and Content are the first and last marks of each kind of
	// output: reasoning (delta.reasoning_content or delta.reasoning, and
	// the other APIs' thinking) and content (text, tool calls).
	Reasoning, Content Span

	// maxGap is the largest gap between two consecutive token events.
	maxGap time.Duration
	// tokenEvents counts token-bearing events; it is not a token count.
	tokenEvents int
	// The running completion counts some streams carry on every event
	// (vLLM's continuous_usage_stats): the latest, how many token events
	// carried one, and the largest rise at a token event, the most tokens
	// one event carried.
	running        int64
	countedEvents  int
	maxEventTokens int64
	// lastTokenCount is the running count the latest token event carried.
	lastTokenCount int64
	// SeveralChoices says the stream interleaves several choices, whose
	// running counts are each choice's: no rise between two events is
	// what one event carried.
	SeveralChoices bool
}

// Span is the first and last mark of one kind of output.
type Span struct {
	First, Last time.Time
	// events counts the events that carried the kind; not a token count.
	events int
}

func (s *Span) mark(now time.Time) {
	if s.First.IsZero() {
		s.First = now
	}
	s.Last = now
	s.events++
}

// Output says what kind of output a token event carries.
type Output uint8

const (
	OutputContent   Output = 1 << iota // text, tool calls
	OutputReasoning                    // reasoning
)

// MarkOutput records an event that carries generated output of the kinds
// in out.
func (c *Clock) MarkOutput(now time.Time, out Output) {
	if out&OutputReasoning != 0 {
		c.Reasoning.mark(now)
	}
	if out&OutputContent != 0 {
		c.Content.mark(now)
	}
	c.MarkToken(now)
}

// MarkToken records an event that carries generated output.
func (c *Clock) MarkToken(now time.Time) {
	if c.tokenEvents == 0 {
		c.FirstToken = now
	} else if gap := now.Sub(c.LastToken); gap > c.maxGap {
		c.maxGap = gap
	}
	c.LastToken = now
	c.tokenEvents++
}

// CountOutput takes the completion count an event carried, tokenEvent
// saying whether the event carried output (MarkOutput first). A count on
// every token event is a running one: each rise is what that event
// carried (MaxTokensPerEvent). A count only at the end (the usual usage
// event) says nothing of single events.
func (c *Clock) CountOutput(completion Count, tokenEvent bool) {
	if !completion.Set || c.SeveralChoices {
		return
	}
	if tokenEvent {
		c.countedEvents++
		c.maxEventTokens = max(c.maxEventTokens, completion.Value-c.running)
		c.lastTokenCount = completion.Value
	}
	c.running = completion.Value
}

// span returns to − from in milliseconds, or false when either mark is
// missing or the marks are out of order: a negative time is never reported.
func span(from, to time.Time) (float64, bool) {
	d, ok := interval(from, to)
	return ms(d), ok
}

// interval is span as a duration, for figures that divide it exactly.
func interval(from, to time.Time) (time.Duration, bool) {
	if from.IsZero() || to.IsZero() || to.Before(from) {
		return 0, false
	}
	return to.Sub(from), true
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
