package telemetry

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/timing-sidecar/timing-sidecar/timing"
)

var update = flag.Bool("update", false, "rewrite the golden files")

func num(v float64) timing.Number { return timing.Number{Value: v, Set: true} }
func cnt(v int64) timing.Count    { return timing.Count{Value: v, Set: true} }

// requests is a fixed mix: two streams and a non-streaming request for two
// models, a failed request, a client that left and an unmeasured path.
var requests = []Record{
	{ID: "r1", Endpoint: EndpointChat, Model: "llama", Stream: true, Status: 200, Measured: true, Metrics: timing.Metrics{
		QueueTime: num(20), TimeToFirstToken: num(80), FirstTokenAfterArrival: num(20 + 80), GenerationTime: num(150), MeanITL: num(15), MaxITL: num(30),
		E2ELatency: num(260), TokensPerSecond: num(47), PromptTokens: cnt(12), CompletionTokens: cnt(11),
		CachedTokens: cnt(0), Cache: timing.CacheNone, PrefillTokensPerSecond: num(120)}},
	{ID: "r2", Endpoint: EndpointChat, Model: "llama", Stream: true, Status: 200, Measured: true, Metrics: timing.Metrics{
		QueueTime: num(5), TimeToFirstToken: num(1500), FirstTokenAfterArrival: num(5 + 1500), GenerationTime: num(4000), MeanITL: num(40), MaxITL: num(900),
		E2ELatency: num(5510), PromptTokens: cnt(900), CompletionTokens: cnt(101),
		CachedTokens: cnt(880), Cache: timing.CachePartial, PrefillTokensPerSecond: num(20 / 1.505)}},
	{ID: "r3", Endpoint: EndpointCompletions, Model: "qwen", Status: 200, Measured: true, Metrics: timing.Metrics{
		E2ELatency: num(700), TokensPerSecond: num(91), PromptTokens: cnt(5), CompletionTokens: cnt(64)}},
	{ID: "r4", Endpoint: EndpointChat, Model: "qwen", Stream: true, Status: 502, UpstreamError: ErrorConnect},
	{ID: "r5", Endpoint: EndpointChat, Model: "qwen", Status: StatusClientGone, ClientGone: true},
	{ID: "r6", Endpoint: EndpointOther, Status: 200},
}

func TestExpositionGolden(t *testing.T) {
	reg := prometheus.NewRegistry()
	r := NewRecorder(reg, Options{MaxModels: 8, MaxTenants: 8})
	for i := range requests {
		r.Begin()
		r.Finish(&requests[i])
	}
	golden := "testdata/mix.prom"
	if *update {
		var buf bytes.Buffer
		mfs, _ := reg.Gather()
		for _, mf := range mfs {
			writeText(&buf, mf)
		}
		os.WriteFile(golden, buf.Bytes(), 0o644)
	}
	f, err := os.Open(golden)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := testutil.GatherAndCompare(reg, f); err != nil {
		t.Fatal(err)
	}
}

// TestCachedSeriesKeepTheirLabels: each label set reaches its own series
// through the caches, the tenant's token counters apart while the
// histograms, which have no tenant label, are shared.
func TestCachedSeriesKeepTheirLabels(t *testing.T) {
	reg := prometheus.NewRegistry()
	r := NewRecorder(reg, Options{MaxModels: 8, TenantLabel: true, MaxTenants: 8})
	for _, rec := range []Record{
		{Endpoint: EndpointChat, Model: "m", Tenant: "a", Status: 200, Stream: true, Measured: true,
			Metrics: timing.Metrics{E2ELatency: num(100), PromptTokens: cnt(3), CompletionTokens: cnt(5)}},
		{Endpoint: EndpointChat, Model: "m", Tenant: "b", Status: 200, Stream: true, Measured: true,
			Metrics: timing.Metrics{E2ELatency: num(300), PromptTokens: cnt(7), CompletionTokens: cnt(11)}},
		{Endpoint: EndpointChat, Model: "m", Tenant: "a", Status: 200, Stream: true, Measured: true,
			Metrics: timing.Metrics{E2ELatency: num(200), PromptTokens: cnt(13), CompletionTokens: cnt(17)}},
		{Endpoint: EndpointChat, Model: "m", Tenant: "a", Status: 502, Stream: true},
		{Endpoint: EndpointChat, Model: "m", Tenant: "a", Status: 200, Stream: false},
	} {
		r.Begin()
		r.Finish(&rec)
	}
	want := `
# HELP timing_sidecar_prompt_tokens_total Prompt tokens, from the engine's usage.
# TYPE timing_sidecar_prompt_tokens_total counter
timing_sidecar_prompt_tokens_total{endpoint="chat_completions",leg="whole",model="m",tenant="a"} 16
timing_sidecar_prompt_tokens_total{endpoint="chat_completions",leg="whole",model="m",tenant="b"} 7
# HELP timing_sidecar_generation_tokens_total Generated tokens, from the engine's usage.
# TYPE timing_sidecar_generation_tokens_total counter
timing_sidecar_generation_tokens_total{endpoint="chat_completions",leg="whole",model="m",tenant="a"} 22
timing_sidecar_generation_tokens_total{endpoint="chat_completions",leg="whole",model="m",tenant="b"} 11
# HELP timing_sidecar_requests_total Requests handled, by endpoint, streaming, status (499: the client left first) and model.
# TYPE timing_sidecar_requests_total counter
timing_sidecar_requests_total{endpoint="chat_completions",leg="whole",model="m",status="200",stream="false",tenant="a"} 1
timing_sidecar_requests_total{endpoint="chat_completions",leg="whole",model="m",status="200",stream="true",tenant="a"} 2
timing_sidecar_requests_total{endpoint="chat_completions",leg="whole",model="m",status="200",stream="true",tenant="b"} 1
timing_sidecar_requests_total{endpoint="chat_completions",leg="whole",model="m",status="502",stream="true",tenant="a"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "timing_sidecar_prompt_tokens_total",
		"timing_sidecar_generation_tokens_total", "timing_sidecar_requests_total"); err != nil {
		t.Fatal(err)
	}
	if n := testutil.CollectAndCount(r.e2e); n != 1 {
		t.Errorf("%d end-to-end histograms, want the one of (chat_completions, m)", n)
	}
}

func TestLabelsAreBounded(t *testing.T) {
	reg := prometheus.NewRegistry()
	r := NewRecorder(reg, Options{MaxModels: 2, TenantLabel: true, MaxTenants: 1})
	for _, m := range []string{"a", "b", "c", "d", "a"} {
		r.Begin()
		r.Finish(&Record{Endpoint: EndpointChat, Model: m, Tenant: "t-" + m, Status: 200})
	}
	want := `
# HELP timing_sidecar_requests_total Requests handled, by endpoint, streaming, status (499: the client left first) and model.
# TYPE timing_sidecar_requests_total counter
timing_sidecar_requests_total{endpoint="chat_completions",leg="whole",model="a",status="200",stream="false",tenant="t-a"} 2
timing_sidecar_requests_total{endpoint="chat_completions",leg="whole",model="b",status="200",stream="false",tenant="other"} 1
timing_sidecar_requests_total{endpoint="chat_completions",leg="whole",model="other",status="200",stream="false",tenant="other"} 2
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "timing_sidecar_requests_total"); err != nil {
		t.Fatal(err)
	}
}

func TestAccessLogLine(t *testing.T) {
	var buf lockedBuffer
	r := NewRecorder(prometheus.NewRegistry(), Options{MaxModels: 8, MaxTenants: 8, AccessLog: &buf})
	req := requests[0]
	req.Method, req.Path, req.Tenant, req.BytesIn, req.BytesOut = "POST", "/v1/chat/completions", "acme", 120, 3400
	r.Begin()
	r.Finish(&req)
	r.Flush()
	var line map[string]any
	if err := json.Unmarshal([]byte(buf.String()), &line); err != nil {
		t.Fatalf("not one JSON line: %q", buf.String())
	}
	want := map[string]any{
		"msg": "request", "request_id": "r1", "method": "POST", "path": "/v1/chat/completions", "model": "llama",
		"stream": true, "status": 200.0, "time_to_first_token_ms": 80.0, "generation_time_ms": 150.0,
		"queue_time_ms": 20.0, "mean_itl_ms": 15.0, "tokens_per_second": 47.0, "e2e_latency_ms": 260.0,
		"max_itl_ms": 30.0, "prompt_tokens": 12.0, "completion_tokens": 11.0, "bytes_in": 120.0, "bytes_out": 3400.0,
		"upstream_error": "", "client_gone": false, "tenant": "acme",
	}
	for k, v := range want {
		if line[k] != v {
			t.Errorf("%s = %v, want %v", k, line[k], v)
		}
	}
	buf.Reset()
	r.Begin()
	r.Finish(&requests[4])
	r.Close(context.Background())
	json.Unmarshal([]byte(buf.String()), &line)
	if line["time_to_first_token_ms"] != nil || line["status"] != 499.0 || line["client_gone"] != true {
		t.Errorf("unmeasured request logged as %v", line)
	}
}

// TestClientPacedRequestsAreCountedApart: a request whose client held the
// engine back has its tokens counted, its stall in the access log, and
// its latencies kept out of the histograms and goodput; a stall that held
// nothing back (a read-ahead took it) changes nothing.
func TestClientPacedRequestsAreCountedApart(t *testing.T) {
	reg := prometheus.NewRegistry()
	var log bytes.Buffer
	r := NewRecorder(reg, Options{MaxModels: 8, AccessLog: &log, Objectives: Objectives{E2E: time.Second}})
	for _, stall := range []time.Duration{9 * time.Millisecond, 8 * time.Second} {
		rec := Record{Endpoint: EndpointChat, Model: "m", Status: 200, Stream: true, Measured: true, ClientStall: stall, ClientPaced: stall > time.Second,
			Metrics: timing.Metrics{E2ELatency: num(100), PromptTokens: cnt(3), CompletionTokens: cnt(5)}}
		r.Begin()
		r.Finish(&rec)
	}
	r.Close(context.Background())
	if got := testutil.ToFloat64(r.clientPaced); got != 1 {
		t.Errorf("client-paced requests %v, want 1", got)
	}
	if got := testutil.ToFloat64(r.seriesFor(EndpointChat, "m", LegWhole, "", "").outputTokens); got != 10 {
		t.Errorf("generated tokens %v, want both requests' 10", got)
	}
	if got := histogramCount(t, reg, "timing_sidecar_e2e_request_latency_seconds"); got != 1 {
		t.Errorf("%d end-to-end latencies observed, want the unpaced request's 1", got)
	}
	if n := testutil.CollectAndCount(r.slo); n != 2 {
		t.Errorf("%d goodput series, want met and missed (at 0)", n)
	}
	if got := testutil.ToFloat64(r.slo.WithLabelValues(EndpointChat, "m", LegWhole, "met", ObjectivesFlags)); got != 1 {
		t.Errorf("goodput counted %v met, want 1 (the paced request undecided)", got)
	}
	if !strings.Contains(log.String(), `"client_stall_ms":9,`) || !strings.Contains(log.String(), `"client_stall_ms":8000,`) {
		t.Errorf("access log without the stalls: %s", log.String())
	}
}

func histogramCount(t *testing.T, reg *prometheus.Registry, name string) uint64 {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var n uint64
	for _, f := range families {
		if f.GetName() == name {
			for _, m := range f.GetMetric() {
				n += m.GetHistogram().GetSampleCount()
			}
		}
	}
	return n
}
