package timing

import (
	"math"
	"strconv"
	"time"
)

// Number is a metric that may not have been measurable; unset encodes as
// JSON null, never as 0.
type Number struct {
	Value float64
	Set   bool
}

// Count is a token count the engine may not have reported. Value is never
// below zero: the parser leaves such a report unset (rewrite.tokenCount).
type Count struct {
	Value int64
	Set   bool
}

// Usage is the token counts from the engine's "usage" object.
type Usage struct {
	// PromptTokens is the prompt count as the engine reported it: all the
	// prompt's tokens, or, with CacheApart, those past the cache.
	PromptTokens     Count
	CompletionTokens Count
	// ReasoningTokens is the part of CompletionTokens that was reasoning
	// (completion_tokens_details.reasoning_tokens), when reported.
	ReasoningTokens Count
	// CachedTokens is the prompt tokens the engine read from its prefix
	// cache instead of computing them, when reported.
	CachedTokens Count
	// CacheWriteTokens is the prompt tokens the engine computed and
	// wrote to its prefix cache, when reported (vLLM's
	// created_cache_tokens, Anthropic's cache_creation_input_tokens).
	// CacheApart is Anthropic's shape: input_tokens counts neither the
	// tokens read from the cache (cache_read_input_tokens) nor those
	// written to it, which are counted apart.
	CacheWriteTokens Count
	CacheApart       bool
}

// Merge returns u with the counts other has set: an API that reports the
// input tokens at the start and the output tokens at the end (Anthropic's)
// is read event by event. A later prompt count without the cache's keys
// keeps the cache's counts and their shape from the earlier one.
func (u Usage) Merge(other Usage) Usage {
	if other.PromptTokens.Set {
		u.PromptTokens = other.PromptTokens
	}
	if other.CompletionTokens.Set {
		u.CompletionTokens = other.CompletionTokens
	}
	if other.ReasoningTokens.Set {
		u.ReasoningTokens = other.ReasoningTokens
	}
	if other.CachedTokens.Set {
		u.CachedTokens = other.CachedTokens
	}
	if other.CacheWriteTokens.Set {
		u.CacheWriteTokens = other.CacheWriteTokens
	}
	u.CacheApart = u.CacheApart || other.CacheApart
	return u
}

// Prompt is the prompt's whole count, cached tokens included, as every
// API but Anthropic's reports it and as OpenTelemetry's
// gen_ai.usage.input_tokens means it.
func (u Usage) Prompt() Count {
	p := u.PromptTokens
	if u.CacheApart && p.Set {
		p.Value += u.CachedTokens.Value + u.CacheWriteTokens.Value // unset counts are 0
	}
	return p
}

// Metrics is the per-request metrics object. The first five fields mirror
// vLLM's --enable-per-request-metrics with the sidecar's external marks.
type Metrics struct {
	TimeToFirstToken Number // first token − the origin (streams)
	GenerationTime   Number // last token − first token (streams)
	QueueTime        Number // the origin − arrival (streams); null from arrival
	MeanITL          Number // generation time / (tokens − 1), tokens as perTokenCount picks (streams)
	TokensPerSecond  Number // tokens / (last token − the origin), or completion tokens / e2e when not streamed
	E2ELatency       Number // done − arrival
	MaxITL           Number // largest gap between consecutive token events (streams)
	PromptTokens     Count
	CompletionTokens Count
	// TokenEvents is set when completion_tokens is fewer than the token
	// events: MeanITL and TokensPerSecond are then over this many events.
	TokenEvents Count
	// TokensPerEvent is completion_tokens over the token events, streams
	// only, when the count is at least the events (an event is not a
	// token: stream intervals, speculative decoding and multi-token
	// prediction send several in one). MaxTokensPerEvent is the most one
	// event carried, known only from running counts (Clock.CountOutput).
	// Neither is part of the JSON object; the log, the span and /metrics
	// have them.
	TokensPerEvent    Number
	MaxTokensPerEvent Count
	// TTFTFrom is the origin TimeToFirstToken is measured from, where
	// QueueTime ends (see origin). Not part of the JSON object, whose top
	// level stays numbers, as a client loop reading vLLM's expects: there
	// a null queue_time_ms beside a time_to_first_token_ms says the TTFT
	// counts from arrival, and a queue_time_ms equal to the engine's says
	// it is the engine's. The log, the span and /metrics name it.
	TTFTFrom Origin
	// FirstTokenAfterArrival and FirstContentAfterArrival are the first
	// token and the first content (not reasoning) event − arrival, for
	// streams: the client's TTFT, whatever the origin. Not part of the
	// JSON object.
	FirstTokenAfterArrival, FirstContentAfterArrival Number
	// TimeToFirstContent is the first content (not reasoning) event −
	// the origin, for streams; not part of the JSON object, where the
	// split holds it for reasoning streams, and TimeToFirstToken for the
	// others.
	TimeToFirstContent Number
	// Split divides the output into reasoning and content, for a stream
	// that carried reasoning (Split.Present).
	Split OutputSplit
	// Engine is the engine's own report of the same request, when the
	// response carried one; Overhead is E2ELatency minus the engine's
	// total, the time spent outside the engine.
	Engine   EngineTiming
	Overhead Number
	// TimeToFirstByte is accepted − arrival for every response, streamed
	// or not: for an answer sent whole (embeddings, rerank), the engine's
	// whole computation. Not part of the JSON object: QueueTime is the
	// same mark for streams.
	TimeToFirstByte Number
	// CachedTokens is the prompt tokens the engine read from its prefix
	// cache, when it said (not part of the JSON object: the client has
	// them in usage); Cache classes the prompt by them.
	CachedTokens Count
	Cache        CacheClass
	// CacheWriteTokens is the prompt tokens the engine wrote to its
	// prefix cache, when it said; not part of the JSON object either.
	CacheWriteTokens Count
	// Sent is the completion tokens the engine sent, as a usage record
	// has them, and SentFrom where the count comes from (see sent); not
	// part of the JSON object, whose completion_tokens is the usage's.
	Sent     Count
	SentFrom CountSource
	// ReasoningTokens is the part of the completion that was reasoning,
	// when the engine's usage says; not part of the JSON object.
	ReasoningTokens Count
	// PrefillTokensPerSecond is the prompt tokens the engine computed
	// (prompt − cached) over PrefillTime, the interval the sidecar saw
	// the prefill in, for streams whose engine reports its cached tokens
	// and that computed MinPrefillTokens or more; EnginePrefillTokensPerSecond
	// the same tokens over the engine's own prefill time (see prefill).
	PrefillTokensPerSecond, PrefillTime Number
	EnginePrefillTokensPerSecond        Number
}

// CountSource says where a token count comes from.
type CountSource uint8

const (
	// CountUnknown: the sidecar has no count.
	CountUnknown CountSource = iota
	// CountUsage: the engine's usage object.
	CountUsage
	// CountCounted: counted from what the engine sent (see sent).
	CountCounted
)

// String is the source as the usage record says it.
func (s CountSource) String() string {
	switch s {
	case CountUsage:
		return "usage"
	case CountCounted:
		return "counted"
	}
	return "unknown"
}

// Origin is the mark a stream's time to first token is measured from,
// and its queue time measured to: the engine's start of work, as well as
// the sidecar can tell it.
type Origin uint8

const (
	// FromAccepted: the upstream's response headers, which came at least
	// HeadersLead before its first output.
	FromAccepted Origin = iota
	// FromEngineQueue: arrival plus the queue time the engine reports,
	// when its headers cannot mark its start.
	FromEngineQueue
	// FromArrival: the client's request; when neither the headers nor
	// the engine tell when the engine started, the split between waiting
	// and prefill is not observable and queue_time_ms is null.
	FromArrival
)

// String is the origin as the object, the log and the span say it.
func (o Origin) String() string {
	switch o {
	case FromEngineQueue:
		return "engine_queue"
	case FromArrival:
		return "arrival"
	}
	return "accepted"
}

// HeadersLead is the least the upstream's headers must arrive before its
// first output to mark when it started the request. Headers written with
// the first output (a server that does not flush before its first chunk,
// a router that answers once the decode starts) arrive in the same read
// or microseconds before it; an engine's prefill takes milliseconds.
const HeadersLead = time.Millisecond

// origin chooses the mark the time to first token counts from: the
// upstream's headers when they came HeadersLead or more before its first
// output, were not sent by a router splitting the request, and give no
// TTFT shorter than the engine's own; else arrival plus the engine's own
// queue time, when it reports one; else arrival. Each choice's TTFT is at
// least the engine's: the sidecar's arrival-to-first-token interval holds
// the engine's queue and TTFT.
func origin(c *Clock, e EngineTiming) (Origin, time.Time) {
	if !c.HeadersLate && !c.Accepted.IsZero() {
		lead, ok := interval(c.Accepted, c.FirstToken)
		switch {
		case c.tokenEvents == 0:
			return FromAccepted, c.Accepted
		case ok && lead >= HeadersLead && !(e.TimeToFirstToken.Set && ms(lead) < e.TimeToFirstToken.Value):
			return FromAccepted, c.Accepted
		}
	}
	// Behind a splitting router the report is the decode engine's, whose
	// queue began after the prefill: no mark of the request's start.
	if q := e.QueueTime; q.Set && q.Value >= 0 && !c.HeadersLate && !c.Arrival.IsZero() {
		// Compared in ms before any conversion: an engine's figure can be
		// past what a Duration holds.
		end := c.FirstToken
		if c.tokenEvents == 0 {
			end = c.Done
		}
		if within, ok := span(c.Arrival, end); ok && q.Value <= within {
			return FromEngineQueue, c.Arrival.Add(time.Duration(q.Value * float64(time.Millisecond)))
		}
	}
	return FromArrival, c.Arrival
}

// CacheClass is how much of a prompt the engine's prefix cache served.
type CacheClass uint8

const (
	CacheUnknown CacheClass = iota // the engine did not say
	CacheNone                      // no token came from the cache
	CachePartial                   // some did
	CacheFull                      // most did, and all but at most FullCacheMargin
	CacheClasses                   // the number of classes
)

// FullCacheMargin is the most prompt tokens a fully cached prompt still
// computes: vLLM's default block size. An engine caches whole blocks and
// always computes the prompt's last token, so a prompt it has seen whole
// leaves up to a block to compute (SGLang and llama.cpp, token by token,
// leave one).
const FullCacheMargin = 16

// String is the class as the "cache" label and the access log say it.
func (c CacheClass) String() string {
	switch c {
	case CacheNone:
		return "none"
	case CachePartial:
		return "partial"
	case CacheFull:
		return "full"
	}
	return "unknown"
}

// cacheClass classes a prompt of prompt tokens, cached of them from the
// cache; a cached count above the prompt's is not one the sidecar can
// use.
func cacheClass(prompt, cached Count) CacheClass {
	switch {
	case !prompt.Set || !cached.Set || cached.Value > prompt.Value:
		return CacheUnknown
	case cached.Value == 0:
		return CacheNone
	case prompt.Value-cached.Value <= FullCacheMargin && cached.Value > prompt.Value-cached.Value:
		// A short prompt's few cached tokens are not a full hit.
		return CacheFull
	}
	return CachePartial
}

// MinPrefillTokens is the fewest prompt tokens computed (prompt − cached)
// a prefill speed is given for. Before its first token a request spends a
// few milliseconds the sidecar cannot take out: the engine reading the
// HTTP request, applying the chat template, tokenizing, looking the prefix
// up (5 to 12 ms from a llama.cpp server on a small model, where the
// prefill ran at 16,000 tokens a second; a few ms in vLLM's API server).
// The speed is within a factor of two of the engine's own while the
// prefill lasts at least that long: tokens ≥ speed × overhead, 96 to 192
// tokens for that llama.cpp, 100 to 250 for a GPU at 50,000 a second with
// 2 to 5 ms. A full cache hit (at most 16 computed) is never measured: it
// would measure the overhead and read as a slow prefill.
const MinPrefillTokens = 256

// prefill derives the cache's figures from the counts and the marks: the
// prompt tokens the engine computed, prompt − cached, over the time from
// arrival to the first token event (the TTFT the histogram and goodput
// use), less the engine's own queue time when it reports one (vLLM's
// queue_time_ms): PrefillTime, the engine's prefill with what the sidecar
// cannot tell apart from it (the network, HTTP, the template, the
// tokenizer). Only from MinPrefillTokens computed. It needs a stream (a
// first token) and the engine's cached count: without the count, the
// tokens computed are not known. Where the engine reports its own
// prefill (Engine.TimeToFirstToken: llama.cpp's prompt_ms, vLLM's
// scheduling to first token, SGLang's prefill, x-vllm-prefill-time), the
// same tokens over it are EnginePrefillTokensPerSecond, whatever their
// number: the two compare over the same tokens.
func (m *Metrics) prefill() {
	m.Cache = cacheClass(m.PromptTokens, m.CachedTokens)
	m.PrefillTokensPerSecond, m.PrefillTime, m.EnginePrefillTokensPerSecond = Number{}, Number{}, Number{}
	if m.Cache == CacheUnknown {
		return
	}
	computed := m.PromptTokens.Value - m.CachedTokens.Value
	if e := m.Engine.TimeToFirstToken; e.Set && e.Value > 0 && computed > 0 {
		m.EnginePrefillTokensPerSecond = Number{float64(computed) / (e.Value / 1000), true}
	}
	if !m.FirstTokenAfterArrival.Set || computed < MinPrefillTokens {
		return
	}
	ms := m.FirstTokenAfterArrival.Value
	if q := m.Engine.QueueTime; q.Set && q.Value < ms {
		ms -= q.Value
	}
	if ms > 0 {
		m.PrefillTime = Number{ms, true}
		m.PrefillTokensPerSecond = Number{float64(computed) / (ms / 1000), true}
	}
}

// OutputSplit is vLLM's output_token_metrics: the reasoning and the
// content of a response measured apart.
type OutputSplit struct {
	Present            bool
	Reasoning, Content SplitPart
}

// SplitPart is one kind of output's figures.
type SplitPart struct {
	TokenCount       Count
	TimeToFirstToken Number // first of the kind − the origin
	GenerationTime   Number // last of the kind − first of the kind
	MeanITL          Number // generation time / (tokens − 1), tokens as perTokenCount picks
	TokensPerSecond  Number // tokens / generation time
	// TokenEvents is set when TokenCount is fewer than the kind's events:
	// MeanITL and TokensPerSecond are then over this many events.
	TokenEvents Count
}

// splitPart computes one part from its marks and token count, by the rule
// the top-level figures follow (perTokenCount).
func splitPart(from time.Time, s Span, count Count) SplitPart {
	p := SplitPart{TokenCount: count}
	if s.events == 0 {
		// No event of this kind: no tokens, whatever else is unknown.
		p.TokenCount = Count{0, true}
		return p
	}
	p.TimeToFirstToken = number(span(from, s.First))
	p.GenerationTime = number(span(s.First, s.Last))
	n, fromEvents := perTokenCount(count, s.events)
	if fromEvents {
		p.TokenEvents = n
	}
	if gen, ok := interval(s.First, s.Last); ok && n.Set {
		p.MeanITL = meanITL(gen, n.Value)
		p.TokensPerSecond = perSecond(n.Value, gen)
	}
	return p
}

// perTokenCount picks the count the per-token figures (mean ITL, tokens
// per second) divide by, from the engine's count and the events that
// carried output; fromEvents says it is the events'.
//
// The engine's count whenever it is at least the events: vLLM's figures,
// unchanged, and a mean over that many tokens is at most the mean gap
// between events, itself at most the largest gap, so mean_itl_ms never
// exceeds max_itl_ms. An engine's event carries one token or more (stream
// intervals, speculative decoding), so a count below the events cannot be
// the tokens they carried (a usage that is not cumulative, a count of
// something else, an intermediary that re-chunks text); dividing by it
// would put the mean above every gap, or give 0 tokens/s for a stream that
// sent output. The events are then the count, and the object says so
// (token_events): a figure measured at the events' grain, where null would
// hide a slow stream from the ITL objective. An absent count stays absent:
// counts are never guessed from events alone.
func perTokenCount(engine Count, events int) (n Count, fromEvents bool) {
	if engine.Set && engine.Value < int64(events) {
		return Count{int64(events), true}, true
	}
	return engine, false
}

// meanITL is gen / (n − 1), for n above 1. It divides whole nanoseconds
// before scaling to ms as ms() scales the largest gap: the exact quotient
// is then at most that gap, a whole number of nanoseconds, and rounding
// (monotonic) cannot lift the mean above max_itl_ms.
func meanITL(gen time.Duration, n int64) Number {
	if n <= 1 {
		return Number{}
	}
	return Number{float64(gen) / float64(n-1) / float64(time.Millisecond), true}
}

// perSecond is n over d, for d above 0.
func perSecond(n int64, d time.Duration) Number {
	if d <= 0 {
		return Number{}
	}
	return Number{float64(n) / (ms(d) / 1000), true}
}

// EngineTiming is an engine's report of its own timing for a request,
// mapped onto the sidecar's field names (see rewrite.EngineTimingOf for the
// engines read).
type EngineTiming struct {
	Reported bool   // the response carried a report
	Source   string // where it came from: "vllm", "tgi", "sglang" or "llama.cpp"
	// InMetrics says the figures are all members of the engine's own
	// "metrics" object (vLLM's), which the client gets as the engine sent
	// it: the sidecar's object does not repeat them in its "engine".
	InMetrics        bool
	QueueTime        Number
	TimeToFirstToken Number
	GenerationTime   Number
	MeanITL          Number
	TokensPerSecond  Number
	// Total is the engine's whole time for the request: its own report
	// (x-vllm-total-time), or the sum of its parts when they are all
	// reported.
	Total Number
	// InferenceTime is the engine's time from scheduling the request to
	// its last token (x-vllm-inference-time): prefill and decode.
	InferenceTime Number
	// AcceptanceLength and AcceptanceRate are the engine's speculative
	// decoding statistics for the request (vLLM's mean_acceptance_length
	// and draft_acceptance_rate), when it reported them; they may come
	// without timing (Reported false).
	AcceptanceLength, AcceptanceRate Number
}

// WithHeaders returns e, read from the response body, completed by h,
// read from the engine's timing headers: each figure the body lacks is
// the headers', and the headers' total, the engine's own measure of its
// whole time (tokenizing and detokenizing included), is preferred to one
// the body's parts add up to.
func (e EngineTiming) WithHeaders(h EngineTiming) EngineTiming {
	if !h.Reported {
		return e
	}
	if !e.Reported {
		e.Reported, e.Source = true, h.Source
	}
	e.InMetrics = false // the headers' figures are nowhere else in the body
	for _, f := range []struct{ dst, src *Number }{
		{&e.QueueTime, &h.QueueTime}, {&e.TimeToFirstToken, &h.TimeToFirstToken},
		{&e.GenerationTime, &h.GenerationTime}, {&e.MeanITL, &h.MeanITL},
		{&e.TokensPerSecond, &h.TokensPerSecond}, {&e.InferenceTime, &h.InferenceTime},
	} {
		if !f.dst.Set {
			*f.dst = *f.src
		}
	}
	if h.Total.Set {
		e.Total = h.Total
	}
	return e
}

// Compute derives the metrics from a clock, the engine's usage and the
// engine's own report of its timing (e, when the response carried one).
// streamed says whether the response was an event stream: a non-streaming
// response shows nothing before it is complete, so the stream-only fields
// stay null. A request's metrics are computed once, when it is done; what
// carries them and its record get the same value.
func Compute(c *Clock, u Usage, streamed bool, e EngineTiming) Metrics {
	var m Metrics
	ComputeInto(&m, c, &u, streamed, &e)
	return m
}

// ComputeInto is Compute, into m: the metrics object is 784 bytes, and a
// caller on a deep path (a stream's last event) keeps it, its arguments
// and its copies off the stack.
func ComputeInto(m *Metrics, c *Clock, u *Usage, streamed bool, e *EngineTiming) {
	*m = Metrics{}
	m.Engine = *e
	m.E2ELatency = number(span(c.Arrival, c.Done))
	m.TimeToFirstByte = number(span(c.Arrival, c.Accepted))
	if e.Reported && e.Total.Set && m.E2ELatency.Set {
		m.Overhead = Number{m.E2ELatency.Value - e.Total.Value, true}
	}
	if streamed {
		var from time.Time
		m.TTFTFrom, from = origin(c, *e)
		if m.TTFTFrom != FromArrival {
			m.QueueTime = number(span(c.Arrival, from))
		}
		if c.tokenEvents > 0 {
			m.TimeToFirstToken = number(span(from, c.FirstToken))
			m.GenerationTime = number(span(c.FirstToken, c.LastToken))
			m.TimeToFirstContent = number(span(from, c.Content.First))
			m.FirstTokenAfterArrival = number(span(c.Arrival, c.FirstToken))
			m.FirstContentAfterArrival = number(span(c.Arrival, c.Content.First))
		}
		if c.tokenEvents > 1 {
			m.MaxITL = Number{ms(c.maxGap), true}
		}
	}
	m.count(c, *u, streamed)
}

// from is the origin's mark on c, as Compute chose it.
func (m *Metrics) from(c *Clock) time.Time {
	switch m.TTFTFrom {
	case FromEngineQueue:
		return c.Arrival.Add(time.Duration(m.Engine.QueueTime.Value * float64(time.Millisecond)))
	case FromArrival:
		return c.Arrival
	}
	return c.Accepted
}

// CountLate completes metrics computed before the engine's usage came (a
// finishing event sent when its hold's bound passed) with the usage's
// counts and the figures made from them, for the record; the marks stay
// those the metrics were computed with.
func (m *Metrics) CountLate(c *Clock, u Usage, streamed bool) { m.count(c, u, streamed) }

// count sets the token counts and the figures made from them, each
// object's mean ITL and rate over the one count perTokenCount picks. It
// clears what an earlier count made first: late counts give what they
// would have given in time, even where that is null.
func (m *Metrics) count(c *Clock, u Usage, streamed bool) {
	m.countTokens(c, u, streamed)
	m.prefill()
}

// countTokens sets the counts, and the per-token figures made from them.
func (m *Metrics) countTokens(c *Clock, u Usage, streamed bool) {
	m.PromptTokens, m.CompletionTokens, m.CachedTokens = u.Prompt(), u.CompletionTokens, u.CachedTokens
	m.CacheWriteTokens = u.CacheWriteTokens
	m.MeanITL, m.TokensPerSecond, m.TokenEvents, m.Split = Number{}, Number{}, Count{}, OutputSplit{}
	m.TokensPerEvent, m.MaxTokensPerEvent = Number{}, Count{}
	m.Sent, m.SentFrom = sent(c, u, streamed)
	m.ReasoningTokens = u.ReasoningTokens
	tokens := u.CompletionTokens
	if !streamed {
		// No events to check the count against: the engine's, as is.
		if e2e, ok := interval(c.Arrival, c.Done); ok && tokens.Set {
			m.TokensPerSecond = perSecond(tokens.Value, e2e)
		}
		return
	}
	if c.tokenEvents == 0 {
		return
	}
	if !c.Reasoning.First.IsZero() {
		// Counts from the engine only: the reasoning tokens it reports,
		// and the rest of the completion as content.
		var content Count
		if u.ReasoningTokens.Set && tokens.Set && tokens.Value >= u.ReasoningTokens.Value {
			content = Count{tokens.Value - u.ReasoningTokens.Value, true}
		}
		m.Split = OutputSplit{Present: true,
			Reasoning: splitPart(m.from(c), c.Reasoning, u.ReasoningTokens),
			Content:   splitPart(m.from(c), c.Content, content)}
	}
	n, fromEvents := perTokenCount(tokens, c.tokenEvents)
	if fromEvents {
		m.TokenEvents = n
	} else if n.Set {
		m.TokensPerEvent = Number{float64(n.Value) / float64(c.tokenEvents), true}
		if c.countedEvents == c.tokenEvents && c.lastTokenCount == n.Value {
			// Every token event carried the running count that ended at
			// the engine's total.
			m.MaxTokensPerEvent = Count{c.maxEventTokens, true}
		}
	}
	if !n.Set {
		return
	}
	if gen, ok := interval(c.FirstToken, c.LastToken); ok {
		m.MeanITL = meanITL(gen, n.Value)
	}
	if decode, ok := interval(m.from(c), c.LastToken); ok {
		m.TokensPerSecond = perSecond(n.Value, decode)
	}
}

// sent is the completion tokens the engine sent: its usage's count where
// the usage came; else, for a stream (one its client, the engine or a
// shutdown cut, or an engine that sends no usage), counted from the events
// the sidecar read: the engine's running count where its events carry one
// (vLLM's continuous_usage_stats: exact when every token event does), and
// at least one token per token event (exact where the engine sends a
// token an event, vLLM's, SGLang's and llama.cpp's default; a lower bound
// where an event carries several). An unstreamed answer without usage is
// unknown.
func sent(c *Clock, u Usage, streamed bool) (Count, CountSource) {
	switch {
	case u.CompletionTokens.Set:
		return u.CompletionTokens, CountUsage
	case !streamed:
		return Count{}, CountUnknown
	}
	return Count{max(c.running, int64(c.tokenEvents)), true}, CountCounted
}

func number(v float64, ok bool) Number { return Number{v, ok} }

// AppendJSON appends the metrics as a compact JSON object. It allocates
// nothing when dst has room, so it can run on the per-event path.
func (m *Metrics) AppendJSON(dst []byte) []byte {
	dst = append(dst, `{"time_to_first_token_ms":`...)
	dst = m.TimeToFirstToken.appendJSON(dst)
	dst = append(dst, `,"generation_time_ms":`...)
	dst = m.GenerationTime.appendJSON(dst)
	dst = append(dst, `,"queue_time_ms":`...)
	dst = m.QueueTime.appendJSON(dst)
	dst = append(dst, `,"mean_itl_ms":`...)
	dst = m.MeanITL.appendJSON(dst)
	dst = append(dst, `,"tokens_per_second":`...)
	dst = m.TokensPerSecond.appendJSON(dst)
	dst = append(dst, `,"e2e_latency_ms":`...)
	dst = m.E2ELatency.appendJSON(dst)
	dst = append(dst, `,"max_itl_ms":`...)
	dst = m.MaxITL.appendJSON(dst)
	dst = append(dst, `,"prompt_tokens":`...)
	dst = m.PromptTokens.appendJSON(dst)
	dst = append(dst, `,"completion_tokens":`...)
	dst = m.CompletionTokens.appendJSON(dst)
	if m.TokenEvents.Set {
		// Only when the figures are over the events: says which count.
		dst = append(dst, `,"token_events":`...)
		dst = m.TokenEvents.appendJSON(dst)
	}
	if m.Split.Present {
		dst = append(dst, `,"output_token_metrics":{"reasoning":`...)
		dst = m.Split.Reasoning.appendJSON(dst)
		dst = append(dst, `,"content":`...)
		dst = m.Split.Content.appendJSON(dst)
		dst = append(dst, '}')
	}
	if e := &m.Engine; e.Reported {
		// Only when the engine reported: other responses keep their shape.
		dst = append(dst, `,"overhead_ms":`...)
		dst = m.Overhead.appendJSON(dst)
	}
	if e := &m.Engine; e.Reported && !e.InMetrics {
		dst = append(dst, `,"engine":{"source":"`...)
		dst = append(dst, e.Source...)
		dst = append(dst, `","time_to_first_token_ms":`...)
		dst = e.TimeToFirstToken.appendJSON(dst)
		dst = append(dst, `,"generation_time_ms":`...)
		dst = e.GenerationTime.appendJSON(dst)
		dst = append(dst, `,"queue_time_ms":`...)
		dst = e.QueueTime.appendJSON(dst)
		dst = append(dst, `,"mean_itl_ms":`...)
		dst = e.MeanITL.appendJSON(dst)
		dst = append(dst, `,"tokens_per_second":`...)
		dst = e.TokensPerSecond.appendJSON(dst)
		dst = append(dst, `,"total_ms":`...)
		dst = e.Total.appendJSON(dst)
		if e.InferenceTime.Set {
			// Only from the headers that report it.
			dst = append(dst, `,"inference_time_ms":`...)
			dst = e.InferenceTime.appendJSON(dst)
		}
		if p := m.EnginePrefillTokensPerSecond; p.Set {
			// The prompt tokens computed over the engine's own prefill,
			// time_to_first_token_ms here: where the sidecar's speed
			// (the log's) can be held against it.
			dst = append(dst, `,"prefill_tokens_per_second":`...)
			dst = p.appendJSON(dst)
		}
		dst = append(dst, '}')
	}
	return append(dst, '}')
}

// Three decimals: microsecond resolution for milliseconds, which is as fine
// as a proxy's marks mean anything.
func (n Number) appendJSON(dst []byte) []byte {
	if !n.Set || math.IsNaN(n.Value) || math.IsInf(n.Value, 0) {
		// No JSON for them: unknown rather than invalid output.
		return append(dst, "null"...)
	}
	return strconv.AppendFloat(dst, n.Value, 'f', 3, 64)
}

func (c Count) appendJSON(dst []byte) []byte {
	if !c.Set {
		return append(dst, "null"...)
	}
	return strconv.AppendInt(dst, c.Value, 10)
}

func (p *SplitPart) appendJSON(dst []byte) []byte {
	dst = append(dst, `{"token_count":`...)
	dst = p.TokenCount.appendJSON(dst)
	dst = append(dst, `,"time_to_first_token_ms":`...)
	dst = p.TimeToFirstToken.appendJSON(dst)
	dst = append(dst, `,"generation_time_ms":`...)
	dst = p.GenerationTime.appendJSON(dst)
	dst = append(dst, `,"mean_itl_ms":`...)
	dst = p.MeanITL.appendJSON(dst)
	dst = append(dst, `,"tokens_per_second":`...)
	dst = p.TokensPerSecond.appendJSON(dst)
	if p.TokenEvents.Set {
		dst = append(dst, `,"token_events":`...)
		dst = p.TokenEvents.appendJSON(dst)
	}
	return append(dst, '}')
}
