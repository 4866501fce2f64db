package telemetry

import (
	"strconv"
	"strings"
	"time"
)

// Objectives are the latency objectives a request should meet
// (--slo-ttft, --slo-itl, --slo-e2e); zero leaves one unset. A request
// meets its objectives when every set one holds; the share that does is
// goodput, as `vllm bench serve --goodput` reports it for a benchmark,
// here from live traffic per model and tenant.
type Objectives struct {
	// TTFT bounds the time to first token from arrival, as the Prometheus
	// histogram and vLLM count it (queue time included).
	TTFT time.Duration
	// ITL bounds the mean inter-token latency (mean_itl_ms): generation
	// time over completion tokens − 1, vllm bench's TPOT. A single stall
	// (max_itl_ms) does not fail it; the max-ITL histogram shows stalls.
	ITL time.Duration
	// E2E bounds the end-to-end latency, arrival to the end of the
	// response: the one objective a non-streaming response can be held
	// to without --upgrade-non-streaming.
	E2E time.Duration
}

// Set tells whether any objective is set.
func (o Objectives) Set() bool { return o.TTFT > 0 || o.ITL > 0 || o.E2E > 0 }

// With returns o with the objectives a request asked for in place of
// the flags' (asked's set ones), and whether any did: a request carrying
// its own objectives (x-llm-d-slo-ttft-ms, x-llm-d-slo-tpot-ms) is judged
// by them, and by the flags for the rest.
func (o Objectives) With(asked Objectives) (Objectives, bool) {
	if asked.TTFT > 0 {
		o.TTFT = asked.TTFT
	}
	if asked.ITL > 0 {
		o.ITL = asked.ITL
	}
	if asked.E2E > 0 {
		o.E2E = asked.E2E
	}
	return o, asked.Set()
}

// Where the objectives a request is judged by came from, as the
// "objectives" label and the access log's slo_objectives name it.
const (
	ObjectivesFlags   = "flags"   // the sidecar's flags alone
	ObjectivesRequest = "request" // at least one from the request's headers
)

// AskedObjective names the objectives a request can ask for, as bits.
type AskedObjective uint8

const (
	ObjectiveTTFT AskedObjective = 1 << iota
	ObjectiveITL
)

// MaxAskedObjective bounds an objective a request asks for: anything
// longer is taken for a mistake (seconds sent as milliseconds ×1000, a
// timestamp) rather than an objective.
const MaxAskedObjective = time.Hour

// ParseAskedObjective reads an objective a request carries in a header,
// in milliseconds as llm-d's headers are: a positive decimal number
// ("250", "37.5") up to MaxAskedObjective. Anything else (empty, signed,
// zero, exponent, hex, NaN, absurd) is not an objective: false, and the
// request falls back to the flags.
func ParseAskedObjective(v []byte) (time.Duration, bool) {
	if len(v) == 0 || len(v) > 16 {
		return 0, false
	}
	dot := false
	for _, c := range v {
		switch {
		case c >= '0' && c <= '9':
		case c == '.' && !dot:
			dot = true
		default:
			return 0, false
		}
	}
	ms, err := strconv.ParseFloat(string(v), 64)
	d := time.Duration(ms * float64(time.Millisecond))
	if err != nil || d <= 0 || d > MaxAskedObjective {
		return 0, false
	}
	return d, true
}

// Verdict is one request's outcome against the objectives.
type Verdict uint8

const (
	// Undecided: no objectives, or a request they cannot judge (refused
	// as the client's error, left by its client before anything missed,
	// or lacking a figure an objective needs). Not counted.
	Undecided Verdict = iota
	Met
	Missed
)

// Objective names, as the access log's slo_missed lists them.
const (
	missedTTFT  = "ttft"
	missedITL   = "itl"
	missedE2E   = "e2e"
	missedError = "error"
)

// Judge gives a finished request's verdict, and the objectives it missed
// ("ttft,itl"; "error" for a request the engine or the sidecar failed).
//
//   - A 5xx or an engine failure misses: an error is not good service.
//   - A client that left without a first token, after waiting longer
//     than the TTFT objective, missed it.
//   - Otherwise a 4xx is the client's (undecided), and a request whose
//     client left is undecided unless a figure measured before it left
//     had already missed.
//   - A served request is decided when every set objective could be
//     measured for it: streams (and upgraded non-streaming requests) for
//     TTFT and ITL, every measured response for E2E. One measured miss
//     decides it as missed whatever else is unknown. A stream of one
//     token has no inter-token latency and cannot miss the ITL objective.
func (o Objectives) Judge(r *Record) (Verdict, string) {
	if !o.Set() {
		return Undecided, ""
	}
	// A leg is held to what it can miss; a failure fails any leg.
	leg := o.forLeg(legOf(r))
	if v, missed, decided := leg.judgeOutright(r); decided {
		return v, missed
	}
	if o = leg; !o.Set() {
		return Undecided, ""
	}
	var t tally
	ttft, ok := r.timeToFirstToken()
	t.check(missedTTFT, o.TTFT, ttft, ok)
	m := &r.Metrics
	if o.ITL > 0 && !m.MeanITL.Set && m.TimeToFirstToken.Set && m.CompletionTokens.Set && m.CompletionTokens.Value <= 1 {
		// One token or none: no gap to judge, nothing missed.
	} else {
		t.check(missedITL, o.ITL, m.MeanITL.Value, m.MeanITL.Set)
	}
	t.check(missedE2E, o.E2E, m.E2ELatency.Value, m.E2ELatency.Set)
	switch {
	case len(t.missed) > 0:
		return Missed, strings.Join(t.missed, ",")
	case t.unknown || r.ClientGone:
		return Undecided, ""
	}
	return Met, ""
}

// forLeg is the objectives a leg of a split request can be judged on: a
// prefill leg's one token and its end are not the client's, a decode
// leg's first token comes after a prefill it did not see; its pace of
// tokens is the client's.
func (o Objectives) forLeg(leg string) Objectives {
	switch leg {
	case LegPrefill:
		return Objectives{}
	case LegDecode:
		return Objectives{ITL: o.ITL}
	}
	return o
}

// judgeOutright decides the requests whose verdict does not rest on
// their figures: failures, clients that gave up waiting for a first
// token, and those the objectives cannot judge. decided is false for the
// others.
func (o Objectives) judgeOutright(r *Record) (v Verdict, missed string, decided bool) {
	if r.UpstreamError != "" || r.Status >= 500 && r.Status != StatusClientGone {
		return Missed, missedError, true
	}
	if _, known := r.timeToFirstToken(); r.ClientGone && !known && o.TTFT > 0 && r.Elapsed > o.TTFT {
		// A client that gave up after waiting longer than the objective
		// for a first token that never came: the worst service of all.
		return Missed, missedTTFT, true
	}
	if r.Status >= 400 && r.Status < 500 || !r.Measured || r.ClientPaced {
		return Undecided, "", true
	}
	return Undecided, "", false
}

// tally is what a request's figures say against the set objectives.
type tally struct {
	missed  []string // the objectives missed, in order
	unknown bool     // a set objective lacked its figure
}

// check holds the figure ms (known when ok) to the objective name's
// limit; an unset objective (limit 0) says nothing.
func (t *tally) check(name string, limit time.Duration, ms float64, ok bool) {
	switch {
	case limit <= 0:
	case !ok:
		t.unknown = true
	case ms > float64(limit)/float64(time.Millisecond):
		t.missed = append(t.missed, name)
	}
}

// String is the verdict as the access log and the "result" label say it.
func (v Verdict) String() string {
	switch v {
	case Met:
		return "met"
	case Missed:
		return "missed"
	}
	return ""
}
