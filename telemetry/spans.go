package telemetry

import (
	"math"
	"strconv"
	"time"

	"go.opentelemetry.io/otel/attribute"
	semconv "go.opentelemetry.io/otel/semconv/v1.41.0"

	"github.com/timing-sidecar/timing-sidecar/timing"
)

// What the spans say: pure functions from a finished record to names,
// attributes and events. They read only what the record holds (marks,
// counts, names the client or engine gave), never a prompt, an output or
// a header value.

// operation is gen_ai.operation.name for an endpoint: Completions is
// text_completion; Chat Completions, Messages and Responses are chat;
// embeddings is the conventions' embeddings; the other pooling endpoints
// have no name there and take their own (custom values, as the
// conventions allow).
func operation(endpoint string) attribute.KeyValue {
	switch endpoint {
	case EndpointCompletions:
		return semconv.GenAIOperationNameTextCompletion
	case EndpointEmbeddings:
		return semconv.GenAIOperationNameEmbeddings
	case EndpointPooling, EndpointClassify, EndpointScore, EndpointRerank, EndpointTranscriptions, EndpointTranslations:
		return semconv.GenAIOperationNameKey.String(endpoint)
	}
	return semconv.GenAIOperationNameChat
}

// provider is gen_ai.provider.name: the API the request speaks, as the
// conventions allow for a server reached through a provider's API (the
// model and server.address say which engine answered).
func provider(endpoint string) attribute.KeyValue {
	if endpoint == EndpointMessages {
		return semconv.GenAIProviderNameKey.String("anthropic")
	}
	return semconv.GenAIProviderNameOpenAI
}

// clientSpanName is the CLIENT span's name, the HTTP client convention's
// "{method} {target}".
func clientSpanName(method, path string) string {
	return clean(method) + " " + clean(path)
}

// Attribute names of the sidecar's own figures, and vLLM's names where its
// tracing has the same quantity (seconds, from arrival), so that one query
// finds both the sidecar's and the engine's spans.
const (
	attrPrefix       = "timing_sidecar."
	vllmQueue        = attribute.Key("gen_ai.latency.time_in_queue")
	vllmFirstToken   = attribute.Key("gen_ai.latency.time_to_first_token")
	vllmE2E          = attribute.Key("gen_ai.latency.e2e")
	vllmRequestID    = attribute.Key("gen_ai.request.id")
	attrTenant       = attribute.Key(attrPrefix + "tenant")
	attrVariant      = attribute.Key(attrPrefix + "variant")
	attrStream       = attribute.Key(attrPrefix + "stream")
	attrLeg          = attribute.Key(attrPrefix + "leg")
	attrClientGone   = attribute.Key(attrPrefix + "client_gone")
	attrUpstreamErr  = attribute.Key(attrPrefix + "upstream_error")
	attrCache        = attribute.Key(attrPrefix + "cache")
	attrFirstByte    = attribute.Key(attrPrefix + "time_to_first_byte_ms")
	attrPrefill      = attribute.Key(attrPrefix + "prefill_tokens_per_second")
	eventAccepted    = attrPrefix + "engine_accepted"
	eventFirstToken  = attrPrefix + "first_token"
	eventFirstAnswer = attrPrefix + "first_content_token"
	eventLastToken   = attrPrefix + "last_token"
)

// common appends to a what the SERVER span says of the GenAI request.
func common(a []attribute.KeyValue, r *Record) []attribute.KeyValue {
	a = append(a, operation(r.Endpoint), provider(r.Endpoint), semconv.HTTPRequestMethodKey.String(r.Method))
	if r.Model != "" {
		a = append(a, semconv.GenAIRequestModel(r.Model))
	}
	s := &r.Trace.Sampling
	if s.HasMaxTokens {
		a = append(a, semconv.GenAIRequestMaxTokens(int(s.MaxTokens)))
	}
	if s.HasTemperature {
		a = append(a, semconv.GenAIRequestTemperature(s.Temperature))
	}
	if s.HasTopP {
		a = append(a, semconv.GenAIRequestTopP(s.TopP))
	}
	ans := &r.Trace.Answer
	if ans.ID != "" {
		a = append(a, semconv.GenAIResponseID(clean(ans.ID)))
	}
	if ans.Model != "" {
		a = append(a, semconv.GenAIResponseModel(clean(ans.Model)))
	}
	if len(ans.FinishReasons) > 0 {
		reasons := make([]string, len(ans.FinishReasons))
		for i, fr := range ans.FinishReasons {
			reasons[i] = clean(fr)
		}
		a = append(a, semconv.GenAIResponseFinishReasons(reasons...))
	}
	m := &r.Metrics
	if r.Measured && m.PromptTokens.Set {
		a = append(a, semconv.GenAIUsageInputTokens(int(m.PromptTokens.Value)))
	}
	if r.Measured && m.CompletionTokens.Set {
		a = append(a, semconv.GenAIUsageOutputTokens(int(m.CompletionTokens.Value)))
	}
	if r.Measured && m.Cache != timing.CacheUnknown {
		// Part of gen_ai.usage.input_tokens, as the conventions count it.
		a = append(a, semconv.GenAIUsageCacheReadInputTokens(int(m.CachedTokens.Value)))
	}
	if r.Measured && m.CacheWriteTokens.Set {
		a = append(a, semconv.GenAIUsageCacheCreationInputTokens(int(m.CacheWriteTokens.Value)))
	}
	return a
}

// serverAttributes is the SERVER span's: the request as the client made
// it and as it ended, and every figure of its metrics object.
func serverAttributes(a []attribute.KeyValue, r *Record) []attribute.KeyValue {
	a = common(a, r)
	a = append(a, semconv.URLPath(r.Path), vllmRequestID.String(r.ID), attrStream.Bool(r.Stream), attrLeg.String(legOf(r)))
	if tr := &r.Trace; tr.Address != "" {
		a = append(a, semconv.ServerAddress(clean(tr.Address))) // the client's Host header
		if tr.Port > 0 {
			a = append(a, semconv.ServerPort(tr.Port))
		}
	}
	if r.Status > 0 && r.Status != StatusClientGone {
		a = append(a, semconv.HTTPResponseStatusCode(r.Status))
	}
	if r.Tenant != "" {
		a = append(a, attrTenant.String(r.Tenant))
	}
	if r.Variant != "" {
		a = append(a, attrVariant.String(r.Variant))
	}
	if r.ClientGone {
		a = append(a, attrClientGone.Bool(true))
	}
	if r.UpstreamError != "" {
		a = append(a, attrUpstreamErr.String(r.UpstreamError))
	}
	if kind := errorType(r); kind != "" {
		a = append(a, semconv.ErrorTypeKey.String(kind))
	}
	if !r.Measured {
		return a
	}
	m := &r.Metrics
	seconds := func(k attribute.Key, ms float64, ok bool) {
		if ok {
			a = append(a, k.Float64(ms/1000))
		}
	}
	seconds(vllmQueue, m.QueueTime.Value, m.QueueTime.Set)
	ttft, ok := r.timeToFirstToken()
	seconds(vllmFirstToken, ttft, ok)
	seconds(vllmE2E, m.E2ELatency.Value, m.E2ELatency.Set)
	a = appendMetrics(a, m)
	if n := m.TimeToFirstByte; n.Set {
		a = append(a, attrFirstByte.Float64(round3(n.Value)))
	}
	if m.Cache != timing.CacheUnknown {
		a = append(a, attrCache.String(m.Cache.String()))
	}
	if p := m.PrefillTokensPerSecond; p.Set {
		a = append(a, attrPrefill.Float64(round3(p.Value)))
	}
	if d := &r.RelayDelays; d.Count() > 0 {
		// The sidecar's own delay, apart from the metrics object's fields:
		// a figure about the sidecar, not the engine.
		a = append(a, attribute.Float64(attrPrefix+"relay_delay_p50_ms", roundMilli(d.Median())),
			attribute.Float64(attrPrefix+"relay_delay_max_ms", roundMilli(d.Max())))
	}
	if r.ClientStall > 0 {
		// The client's pace, which the marks after it carry too.
		a = append(a, attribute.Float64(attrPrefix+"client_stall_ms", roundMilli(r.ClientStall)))
	}
	return a
}

// roundMilli is d in ms to three decimals.
func roundMilli(d time.Duration) float64 {
	return math.Round(float64(d)/float64(time.Microsecond)) / 1000
}

// round3 is a figure to three decimals, as the metrics object has them:
// one figure, the same in the body, the log and the trace.
func round3(v float64) float64 { return math.Round(v*1000) / 1000 }

// appendMetrics adds every figure the metrics object would carry, under
// timing_sidecar.<field> with the object's names and units; a figure that
// is null there is absent here.
func appendMetrics(a []attribute.KeyValue, m *timing.Metrics) []attribute.KeyValue {
	num := func(name string, n timing.Number) {
		if n.Set {
			a = append(a, attribute.Float64(name, round3(n.Value)))
		}
	}
	count := func(name string, c timing.Count) {
		if c.Set {
			a = append(a, attribute.Int64(name, c.Value))
		}
	}
	num(attrPrefix+"time_to_first_token_ms", m.TimeToFirstToken)
	num(attrPrefix+"generation_time_ms", m.GenerationTime)
	num(attrPrefix+"queue_time_ms", m.QueueTime)
	if m.FirstTokenAfterArrival.Set {
		a = append(a, attribute.String(attrPrefix+"ttft_from", m.TTFTFrom.String()))
	}
	num(attrPrefix+"mean_itl_ms", m.MeanITL)
	num(attrPrefix+"tokens_per_second", m.TokensPerSecond)
	num(attrPrefix+"e2e_latency_ms", m.E2ELatency)
	num(attrPrefix+"max_itl_ms", m.MaxITL)
	count(attrPrefix+"prompt_tokens", m.PromptTokens)
	count(attrPrefix+"completion_tokens", m.CompletionTokens)
	num(attrPrefix+"tokens_per_event", m.TokensPerEvent)
	count(attrPrefix+"max_tokens_per_event", m.MaxTokensPerEvent)
	if m.Split.Present {
		for _, part := range []struct {
			name string
			p    *timing.SplitPart
		}{{"reasoning", &m.Split.Reasoning}, {"content", &m.Split.Content}} {
			prefix := attrPrefix + "output_token_metrics." + part.name + "."
			count(prefix+"token_count", part.p.TokenCount)
			num(prefix+"time_to_first_token_ms", part.p.TimeToFirstToken)
			num(prefix+"generation_time_ms", part.p.GenerationTime)
			num(prefix+"mean_itl_ms", part.p.MeanITL)
			num(prefix+"tokens_per_second", part.p.TokensPerSecond)
		}
	}
	if e := &m.Engine; e.Reported {
		num(attrPrefix+"overhead_ms", m.Overhead)
		a = append(a, attribute.String(attrPrefix+"engine.source", e.Source))
		num(attrPrefix+"engine.time_to_first_token_ms", e.TimeToFirstToken)
		num(attrPrefix+"engine.generation_time_ms", e.GenerationTime)
		num(attrPrefix+"engine.queue_time_ms", e.QueueTime)
		num(attrPrefix+"engine.mean_itl_ms", e.MeanITL)
		num(attrPrefix+"engine.tokens_per_second", e.TokensPerSecond)
		num(attrPrefix+"engine.total_ms", e.Total)
	}
	// The engine's speculative decoding, reported with or without its
	// timing.
	num(attrPrefix+"engine.speculative_decoding.mean_acceptance_length", m.Engine.AcceptanceLength)
	num(attrPrefix+"engine.speculative_decoding.draft_acceptance_rate", m.Engine.AcceptanceRate)
	return a
}

// clientAttributes is the CLIENT span's: the HTTP exchange with the
// engine, findable by model. The rest of what the request asked and got
// is on its parent alone: every attribute is paid for twice, once to
// record and once to export.
func clientAttributes(a []attribute.KeyValue, r *Record) []attribute.KeyValue {
	a = append(a, operation(r.Endpoint), semconv.HTTPRequestMethodKey.String(r.Method))
	if r.Model != "" {
		a = append(a, semconv.GenAIRequestModel(r.Model))
	}
	tr := &r.Trace
	if tr.EngineAddress != "" {
		a = append(a, semconv.ServerAddress(tr.EngineAddress))
		if tr.EnginePort > 0 {
			a = append(a, semconv.ServerPort(tr.EnginePort))
		}
	}
	if tr.EngineStatus > 0 {
		a = append(a, semconv.HTTPResponseStatusCode(tr.EngineStatus))
	}
	if kind := clientError(r); kind != "" {
		a = append(a, semconv.ErrorTypeKey.String(kind))
	}
	return a
}

// errorType is error.type of a request that failed: the kind of engine
// failure, the client leaving, or the status.
func errorType(r *Record) string {
	switch {
	case r.UpstreamError != "":
		return r.UpstreamError
	case r.ClientGone:
		return "client_disconnected"
	case r.Status >= 400:
		return statusText(r.Status)
	}
	return ""
}

// errorStatuses are the 4xx and 5xx statuses as error.type says them,
// made once: naming a failure allocates nothing.
var errorStatuses = func() (s [200]string) {
	for i := range s {
		s[i] = strconv.Itoa(400 + i)
	}
	return s
}()

// statusText is an HTTP status as error.type says it.
func statusText(status int) string {
	if status >= 400 && status < 600 {
		return errorStatuses[status-400]
	}
	return strconv.Itoa(status)
}

// serverError is the SERVER span's error status: as HTTP servers count, a
// 4xx is the client's doing and not the span's error; a 5xx, an engine
// failure or a client gone is.
func serverError(r *Record) string {
	if r.UpstreamError != "" || r.ClientGone || r.Status >= 500 {
		return errorType(r)
	}
	return ""
}

// clientError is the CLIENT span's error: the engine failed, or answered
// 4xx or 5xx (an HTTP client counts both).
func clientError(r *Record) string {
	switch tr := &r.Trace; {
	case r.UpstreamError != "":
		return r.UpstreamError
	case tr.EngineStatus >= 400:
		return statusText(tr.EngineStatus)
	case tr.EngineStatus == 0 && r.ClientGone:
		return "client_disconnected" // aborted before the engine answered
	}
	return ""
}

type spanEvent struct {
	name string
	at   time.Time
}

// spanEvents are the marks that put a request's phases on the timeline:
// the engine's answer (end of the queue), the first token, the first
// content token past any reasoning, and the last token.
func spanEvents(c *timing.Clock) []spanEvent {
	var evs []spanEvent
	add := func(name string, at time.Time) {
		if !at.IsZero() {
			evs = append(evs, spanEvent{name, at})
		}
	}
	add(eventAccepted, c.Accepted)
	add(eventFirstToken, c.FirstToken)
	// The same moment as the first token unless reasoning came first:
	// there too, so one query finds the answer's start in every trace.
	add(eventFirstAnswer, c.Content.First)
	add(eventLastToken, c.LastToken)
	return evs
}
