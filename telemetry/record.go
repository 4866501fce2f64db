package telemetry

import (
	"time"

	"github.com/timing-sidecar/timing-sidecar/timing"
)

// Endpoints, as the "endpoint" label names them.
const (
	EndpointChat        = "chat_completions"
	EndpointCompletions = "completions"
	EndpointMessages    = "messages"  // Anthropic's Messages API
	EndpointResponses   = "responses" // OpenAI's Responses API
	EndpointEmbeddings  = "embeddings"
	EndpointPooling     = "pooling"
	EndpointClassify    = "classify"
	EndpointScore       = "score"
	EndpointRerank      = "rerank"
	// OpenAI's audio endpoints, multipart uploads.
	EndpointTranscriptions = "transcriptions"
	EndpointTranslations   = "translations"
	EndpointOther          = "other"
)

// Upstream error kinds, as the "kind" label names them.
const (
	ErrorConnect     = "connect"      // could not connect to the engine
	ErrorTimeout     = "timeout"      // no connection or no response headers in time
	ErrorClosed      = "closed"       // the engine closed or reset the connection before headers
	ErrorBadResponse = "bad_response" // the engine's response headers could not be read (too large)
	ErrorInterrupted = "interrupted"  // the engine's body ended early (closed or reset)
	ErrorIdleTimeout = "idle_timeout" // the engine went silent mid-body past the idle timeout
	ErrorStream      = "stream_error" // the engine's stream carried an error event of a 5xx (or no) code

	// Why a measured request went to the engine unread and unedited, and
	// was answered without the metrics object.
	UnreadRepeated   = "repeated_member" // a member the sidecar reads or edits came twice
	UnreadInvalid    = "not_understood"  // not a JSON object, nested too deep, or a field of the wrong type
	UnreadNoMemory   = "no_memory"       // no room in --max-body-memory
	StatusClientGone = 499               // the status recorded when the client left before the response
)

// Record is what the sidecar knows of one finished request.
type Record struct {
	ID       string
	Method   string
	Path     string
	Endpoint string
	Model    string
	// ResponseModel is the model the response named, when the sidecar
	// read it (traced requests, or with the GenAI metrics on).
	ResponseModel string
	Tenant        string
	// Variant is the request's arm of a latency experiment: the one its
	// variant header named, else the deployment's (--variant).
	Variant string
	// Leg is LegPrefill or LegDecode for one leg of a request a router
	// split over two engines; empty is LegWhole.
	Leg    string
	Stream bool
	// Status is the HTTP status sent, or StatusClientGone.
	Status int
	// Measured says Metrics holds this request's figures.
	Measured bool
	Metrics  timing.Metrics
	BytesIn  int
	BytesOut int
	// UpstreamError is the kind of engine failure, if any.
	UpstreamError string
	// ClientGone says the client left before the response was complete.
	ClientGone bool
	// CutAtShutdown says the sidecar cut the stream when its shutdown
	// grace ran out: the response is incomplete, by neither the client's
	// doing nor the engine's.
	CutAtShutdown bool
	// Unread, for a measured request the sidecar forwarded without
	// reading it, says why: one of the Unread* reasons.
	Unread string
	// Elapsed is arrival to the end of the request, measured or not: how
	// long a client that left had waited, and a failed request's duration
	// when it was not measured. Zero is not known.
	Elapsed time.Duration
	// RelayDelays are the sidecar's own delays on the request's stream
	// events: from each event's arrival from the engine to its hand-over
	// to the client's socket.
	RelayDelays timing.Delays
	// ClientStall is how long writes to the client waited for room in
	// its socket: the client did not read as fast as the engine sent.
	ClientStall time.Duration
	// ClientPaced says the client held the engine's stream back: the
	// engine waited for it (past the stream's read-ahead, or with none),
	// so the marks after that carry the client's pace as much as the
	// engine's. Such a request stays out of the latency histograms and
	// goodput, and is counted apart
	// (timing_sidecar_client_paced_requests_total).
	ClientPaced bool
	// Asked is the objectives the request carried in its headers, unset
	// where it carried none or one that is not an objective (see
	// ParseAskedObjective); AskedInvalid names those: ObjectiveTTFT,
	// ObjectiveITL or both.
	Asked        Objectives
	AskedInvalid AskedObjective
	// Trace is the request's spans, when it is traced.
	Trace Trace
	// UsageID is the request's usage record's id, set when the record's
	// start was spooled (Recorder.StartUsage), and Arrival its time.
	UsageID string
	Arrival time.Time
}

// timeToFirstToken is arrival to first token: the Prometheus definition,
// shared with vLLM's histogram and OpenTelemetry's GenAI metric. The body
// field counts from its origin (timing.Origin), as vLLM's from scheduling.
func (r *Record) timeToFirstToken() (float64, bool) {
	t := r.Metrics.FirstTokenAfterArrival
	return t.Value, t.Set
}

// timeToFirstContent is arrival to the first content (answer) token, past
// any reasoning.
func (r *Record) timeToFirstContent() (float64, bool) {
	t := r.Metrics.FirstContentAfterArrival
	return t.Value, t.Set
}

// The legs of a request, as the leg label, the log and the span say them:
// a request served whole, or the prefill or the decode leg of one a
// router split over two engines (rewrite.Leg's names).
const (
	LegWhole   = "whole"
	LegPrefill = "prefill"
	LegDecode  = "decode"
)

// legOf is r's leg, LegWhole when unset; any other value counts as whole,
// so the label stays bounded.
func legOf(r *Record) string {
	switch r.Leg {
	case LegPrefill, LegDecode:
		return r.Leg
	}
	return LegWhole
}
