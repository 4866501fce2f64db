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
			QueueTime: num(queue), TimeToFirstToken: num(ttft), MeanITL: num(itl), E2ELatency: num(e2e), CompletionTokens: cnt(tokens)}}
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
	for _, q := range []float64{10, 20, 200} {
		rec := Record{Endpoint: EndpointChat, Model: "m", Tenant: "acme", Stream: true, Status: 200, Measured: true,
			Metrics: timing.Metrics{QueueTime: num(q), TimeToFirstToken: num(50)}}
		r.Begin()
		r.Finish(&rec)
	}
	if met, missed := testutil.ToFloat64(r.slo.WithLabelValues(EndpointChat, "m", "met", "acme")),
		testutil.ToFloat64(r.slo.WithLabelValues(EndpointChat, "m", "missed", "acme")); met != 2 || missed != 1 {
		t.Errorf("met %v, missed %v; want 2, 1", met, missed)
	}
	var lines []struct{ SLO, SLOMissed string }
	r.Close(context.Background())
	for _, l := range bytes.Split(bytes.TrimSpace([]byte(log.String())), []byte("\n")) {
		var v struct {
			SLO       string `json:"slo"`
			SLOMissed string `json:"slo_missed"`
		}
		if err := json.Unmarshal(l, &v); err != nil {
			t.Fatal(err)
		}
		lines = append(lines, struct{ SLO, SLOMissed string }{v.SLO, v.SLOMissed})
	}
	if len(lines) != 3 || lines[0].SLO != "met" || lines[2].SLO != "missed" || lines[2].SLOMissed != "ttft" {
		t.Errorf("log verdicts %+v", lines)
	}
}
