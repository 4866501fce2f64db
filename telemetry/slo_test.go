package telemetry

import (
	"bytes"
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/timing-sidecar/timing-sidecar/timing"
)

func TestJudge(t *testing.T) {
	ms := time.Millisecond
	stream := func(queue, ttft, itl, e2e float64, tokens int64) Record {
		return Record{Endpoint: EndpointChat, Stream: true, Status: 200, Measured: true, Metrics: timing.Metrics{
			QueueTime: num(queue), TimeToFirstToken: num(ttft), FirstTokenAfterArrival: num(queue + ttft), MeanITL: num(itl), E2ELatency: num(e2e), CompletionTokens: cnt(tokens)}}
	}
	oneToken := stream(10, 50, 0, 70, 1)
	oneToken.Metrics.MeanITL = timing.Number{}
	unary := Record{Endpoint: EndpointChat, Status: 200, Measured: true, Metrics: timing.Metrics{E2ELatency: num(900), CompletionTokens: cnt(40)}}
	goneEarly := stream(10, 500, 20, 600, 8)
	goneEarly.ClientGone = true
	goneFine := stream(10, 50, 20, 600, 8)
	goneFine.ClientGone = true
	for _, tc := range []struct {
		name    string
		o       Objectives
		r       Record
		verdict Verdict
		missed  string
	}{
		{"no objectives", Objectives{}, stream(10, 50, 20, 500, 20), Undecided, ""},
		{"all met", Objectives{TTFT: 100 * ms, ITL: 30 * ms}, stream(10, 50, 20, 500, 20), Met, ""},
		// TTFT counts from arrival: 60 + 50 is over 100.
		{"queue counts toward TTFT", Objectives{TTFT: 100 * ms}, stream(60, 50, 20, 500, 20), Missed, "ttft"},
		{"exactly at the objective", Objectives{TTFT: 110 * ms}, stream(60, 50, 20, 500, 20), Met, ""},
		{"two missed", Objectives{TTFT: 100 * ms, ITL: 10 * ms, E2E: time.Second}, stream(60, 50, 20, 500, 20), Missed, "ttft,itl"},
		{"e2e", Objectives{E2E: 400 * ms}, stream(10, 50, 20, 500, 20), Missed, "e2e"},
		{"one token cannot miss ITL", Objectives{ITL: 10 * ms}, oneToken, Met, ""},
		{"non-streaming: TTFT unknown", Objectives{TTFT: 100 * ms}, unary, Undecided, ""},
		{"non-streaming: E2E judged", Objectives{E2E: time.Second}, unary, Met, ""},
		{"non-streaming: a known miss decides", Objectives{TTFT: 100 * ms, E2E: 500 * ms}, unary, Missed, "e2e"},
		{"engine error", Objectives{TTFT: 100 * ms}, Record{Status: 503}, Missed, "error"},
		{"engine unreachable", Objectives{TTFT: 100 * ms}, Record{Status: 502, UpstreamError: ErrorConnect}, Missed, "error"},
		{"stream cut by the engine", Objectives{TTFT: 100 * ms}, func() Record { r := stream(10, 50, 20, 500, 20); r.UpstreamError = ErrorInterrupted; return r }(), Missed, "error"},
		{"the client's 4xx", Objectives{TTFT: 100 * ms}, Record{Status: 400}, Undecided, ""},
		{"client left while queued", Objectives{TTFT: 100 * ms}, Record{Status: StatusClientGone, ClientGone: true}, Undecided, ""},
		{"client left after a miss", Objectives{TTFT: 100 * ms}, goneEarly, Missed, "ttft"},
		{"client left with nothing missed", Objectives{TTFT: 100 * ms}, goneFine, Undecided, ""},
		{"client gave up waiting past the TTFT objective", Objectives{TTFT: 100 * ms}, Record{Status: StatusClientGone, ClientGone: true, Elapsed: 300 * ms}, Missed, "ttft"},
		{"client left before the TTFT objective was due", Objectives{TTFT: 100 * ms}, Record{Status: StatusClientGone, ClientGone: true, Elapsed: 50 * ms}, Undecided, ""},
		{"client gave up after headers, before a token", Objectives{TTFT: 100 * ms}, Record{Status: 200, ClientGone: true, Measured: true, Elapsed: 300 * ms}, Missed, "ttft"},
	} {
		verdict, missed := tc.o.Judge(&tc.r)
		if verdict != tc.verdict || missed != tc.missed {
			t.Errorf("%s: %v %q, want %v %q", tc.name, verdict, missed, tc.verdict, tc.missed)
		}
	}
}

func TestGoodputIsCountedAndLogged(t *testing.T) {
	reg := prometheus.NewRegistry()
	var log lockedBuffer
	r := NewRecorder(reg, Options{MaxModels: 4, MaxTenants: 4, TenantLabel: true, AccessLog: &log,
		Objectives: Objectives{TTFT: 100 * time.Millisecond}})
	ms := time.Millisecond
	for _, tc := range []struct {
		queue   float64
		asked   Objectives
		invalid AskedObjective
	}{
		{queue: 10}, {queue: 20}, {queue: 200},
		// Its own objective, looser than the flag's: met.
		{queue: 200, asked: Objectives{TTFT: 300 * ms}},
		// Its own, tighter: missed, though the flag's is met.
		{queue: 10, asked: Objectives{TTFT: 40 * ms}},
		// A header that held no objective: the flag's, counted.
		{queue: 200, invalid: ObjectiveTTFT | ObjectiveITL},
	} {
		rec := Record{Endpoint: EndpointChat, Model: "m", Tenant: "acme", Stream: true, Status: 200, Measured: true,
			Metrics: timing.Metrics{QueueTime: num(tc.queue), TimeToFirstToken: num(50), FirstTokenAfterArrival: num(tc.queue + 50)}, Asked: tc.asked, AskedInvalid: tc.invalid}
		r.Begin()
		r.Finish(&rec)
	}
	count := func(result, source string) float64 {
		return testutil.ToFloat64(r.slo.WithLabelValues(EndpointChat, "m", LegWhole, result, source, "acme"))
	}
	if met, missed := count("met", ObjectivesFlags), count("missed", ObjectivesFlags); met != 2 || missed != 2 {
		t.Errorf("by the flags: met %v, missed %v; want 2, 2", met, missed)
	}
	if met, missed := count("met", ObjectivesRequest), count("missed", ObjectivesRequest); met != 1 || missed != 1 {
		t.Errorf("by the request's own: met %v, missed %v; want 1, 1", met, missed)
	}
	for _, o := range []string{"ttft", "itl"} {
		if n := testutil.ToFloat64(r.invalidObjectives.WithLabelValues(o)); n != 1 {
			t.Errorf("invalid %s objectives %v, want 1", o, n)
		}
	}
	type line struct {
		SLO        string   `json:"slo"`
		SLOMissed  string   `json:"slo_missed"`
		Objectives string   `json:"slo_objectives"`
		TTFT       *float64 `json:"slo_ttft_ms"`
		ITL        *float64 `json:"slo_itl_ms"`
	}
	var lines []line
	r.Close(context.Background())
	for _, l := range bytes.Split(bytes.TrimSpace([]byte(log.String())), []byte("\n")) {
		var v line
		if err := json.Unmarshal(l, &v); err != nil {
			t.Fatal(err)
		}
		lines = append(lines, v)
	}
	if len(lines) != 6 {
		t.Fatalf("%d lines", len(lines))
	}
	for i, want := range []struct {
		slo, missed, objectives string
		ttft                    float64
	}{
		{"met", "", "flags", 100}, {"met", "", "flags", 100}, {"missed", "ttft", "flags", 100},
		{"met", "", "request", 300}, {"missed", "ttft", "request", 40}, {"missed", "ttft", "flags", 100},
	} {
		l := lines[i]
		if l.SLO != want.slo || l.SLOMissed != want.missed || l.Objectives != want.objectives || l.TTFT == nil || *l.TTFT != want.ttft || l.ITL != nil {
			t.Errorf("line %d: %+v, want %+v", i, l, want)
		}
	}
}

func TestParseAskedObjective(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want time.Duration
		ok   bool
	}{
		{"250", 250 * time.Millisecond, true},
		{"37.5", 37500 * time.Microsecond, true},
		{"3600000", time.Hour, true},
		{"3600001", 0, false}, // over an hour: a mistake, not an objective
		{"0", 0, false},
		{"0.0000001", 0, false}, // under a nanosecond
		{"", 0, false},
		{"-5", 0, false},
		{"+5", 0, false},
		{"1e3", 0, false},
		{"0x10", 0, false},
		{"NaN", 0, false},
		{"Inf", 0, false},
		{"1.2.3", 0, false},
		{" 5", 0, false},
		{"5ms", 0, false},
		{"99999999999999999999", 0, false},
	} {
		got, ok := ParseAskedObjective([]byte(tc.in))
		if got != tc.want || ok != tc.ok {
			t.Errorf("%q: %v %v, want %v %v", tc.in, got, ok, tc.want, tc.ok)
		}
	}
}

// TestJudgeByLeg: a leg of a split request is judged only on what it can
// be: a decode leg on its pace of tokens (its first token follows a
// prefill it did not see, its end is not the client's), a prefill leg on
// nothing but failure.
func TestJudgeByLeg(t *testing.T) {
	o := Objectives{TTFT: 100 * time.Millisecond, ITL: 20 * time.Millisecond, E2E: time.Second}
	leg := func(leg string, ttft, itl, e2e float64, status int) *Record {
		return &Record{Endpoint: EndpointChat, Leg: leg, Stream: true, Status: status, Measured: true, Metrics: timing.Metrics{
			TimeToFirstToken: num(ttft), FirstTokenAfterArrival: num(ttft), MeanITL: num(itl), E2ELatency: num(e2e), CompletionTokens: cnt(8)}}
	}
	for _, tc := range []struct {
		name string
		r    *Record
		want Verdict
	}{
		{"a decode leg slow to its first token, on pace", leg(LegDecode, 900, 10, 2000, 200), Met},
		{"a decode leg off pace", leg(LegDecode, 50, 40, 500, 200), Missed},
		{"a prefill leg, however long", leg(LegPrefill, 900, 0, 2000, 200), Undecided},
		{"a prefill leg that failed", leg(LegPrefill, 0, 0, 10, 503), Missed},
		{"a whole request slow to its first token", leg(LegWhole, 900, 10, 2000, 200), Missed},
		{"a decode leg its router gave up on before a first token", func() *Record {
			r := leg(LegDecode, 0, 0, 0, StatusClientGone)
			r.Metrics, r.ClientGone, r.Elapsed = timing.Metrics{}, true, 5*time.Second
			return r
		}(), Undecided},
	} {
		if got, _ := o.Judge(tc.r); got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}
