package e2e

import (
	"fmt"
	"io"
	"maps"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/timing-sidecar/timing-sidecar/e2e/emulator"
)

// The GenAI metrics go to a real OpenTelemetry Collector over each OTLP
// protocol, and are read back from the file it writes: the conventions'
// names, units, buckets and attributes, with counts and sums equal to the
// sidecar's own Prometheus series for the same requests.

// scrapeFamilies reads a Prometheus text exposition.
func scrapeFamilies(t *testing.T, url string) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	p := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("%s: %v", url, err)
	}
	return mfs
}

// histogramTotals sums a histogram family's counts and sums.
func histogramTotals(mf *dto.MetricFamily) (uint64, float64) {
	var count uint64
	var sum float64
	for _, m := range mf.GetMetric() {
		count += m.GetHistogram().GetSampleCount()
		sum += m.GetHistogram().GetSampleSum()
	}
	return count, sum
}

func counterTotal(mf *dto.MetricFamily) float64 {
	var v float64
	for _, m := range mf.GetMetric() {
		v += m.GetCounter().GetValue()
	}
	return v
}

func TestGenAIMetricsInACollector(t *testing.T) {
	c := startCollector(t)
	engine := startEngine(t, emulator.Config{Model: "m", PromptTokensDetails: true,
		Timing: emulator.Timing{TTFT: 30 * time.Millisecond, ITL: 5 * time.Millisecond, TokensPerEvent: 1, OutputTokens: 8}})
	for _, tc := range []struct{ protocol, endpoint, instance string }{
		{"grpc", "http://" + c.grpc, "pod-grpc"},
		{"http/protobuf", "http://" + c.http + "/v1/metrics", "pod-http"},
	} {
		t.Run(tc.protocol, func(t *testing.T) {
			s := startSidecar(t, []string{"--upstream", engine.URL(), "--otlp-metrics-endpoint", tc.endpoint,
				"--otlp-metrics-protocol", tc.protocol, "--service-instance-id", tc.instance},
				"OTEL_METRIC_EXPORT_INTERVAL=200")
			sendGenAIRequests(t, s)
			side := scrapeFamilies(t, s.admin+"/metrics")
			// This sidecar's series: the collector has both subtests'.
			ours := func(h histogramSeries) bool { return h.resource["service.instance.id"] == tc.instance }
			col := awaitCollectorHasRequests(t, c, side, ours)
			checkHistogramsMatchSidecar(t, col, side, ours)
			checkUnitsAndBuckets(t, col)
			checkTokenUsage(t, col, side, ours)
			checkRequestDurationAttributes(t, col, ours, engine, tc.instance)
		})
	}
}

// sendGenAIRequests sends five requests, chat and messages, streamed and
// not, each with some prompt tokens cached, and waits for their access-log
// lines: every request is recorded before its line is written, so the
// sidecar's series are final once all are in.
func sendGenAIRequests(t *testing.T, s *sidecar) {
	t.Helper()
	prompt := strings.TrimSpace(strings.Repeat("word ", 40))
	chat := `{"model":"m","stream":%v,"messages":[{"role":"user","content":"` + prompt + `"}]}`
	for i, r := range []struct {
		path, body, cached string
	}{
		{"/v1/chat/completions", fmt.Sprintf(chat, true), "0"},
		{"/v1/chat/completions", fmt.Sprintf(chat, true), "20"},
		{"/v1/chat/completions", fmt.Sprintf(chat, true), "39"},
		{"/v1/chat/completions", fmt.Sprintf(chat, false), "16"},
		{"/v1/messages", `{"model":"m","max_tokens":8,"stream":true,"messages":[{"role":"user","content":"` + prompt + `"}]}`, "30"},
	} {
		req, _ := http.NewRequest("POST", s.base+r.path, strings.NewReader(r.body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set(emulator.HeaderCachedTokens, r.cached)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("request %d: %d", i, resp.StatusCode)
		}
	}
	for range 5 {
		select {
		case <-s.accessLog:
		case <-time.After(10 * time.Second):
			t.Fatal("an access-log line did not come")
		}
	}
}

// awaitCollectorHasRequests returns the collector's histograms once its
// request durations of ours count every request the sidecar has. The
// collector has the figures after an export or two: its file is polled,
// as it has no event to await.
func awaitCollectorHasRequests(t *testing.T, c *collector, side map[string]*dto.MetricFamily, ours func(histogramSeries) bool) map[string][]histogramSeries {
	t.Helper()
	var col map[string][]histogramSeries
	wantCount, _ := histogramTotals(side["timing_sidecar_e2e_request_latency_seconds"])
	if !await(func() bool {
		col = c.histograms(t)
		n, _ := histogramTotal(col["gen_ai.server.request.duration"], ours)
		return n == wantCount && wantCount > 0
	}) {
		t.Fatalf("the collector did not get the sidecar's %d requests within 20s; it has %v", wantCount, names(col))
	}
	return col
}

// checkHistogramsMatchSidecar: each GenAI histogram's count and sum equal
// those of the sidecar's Prometheus histogram of the same figure.
func checkHistogramsMatchSidecar(t *testing.T, col map[string][]histogramSeries, side map[string]*dto.MetricFamily, ours func(histogramSeries) bool) {
	t.Helper()
	for _, p := range []struct{ collector, sidecar string }{
		{"gen_ai.server.time_to_first_token", "timing_sidecar_time_to_first_token_seconds"},
		{"gen_ai.server.time_per_output_token", "timing_sidecar_inter_token_latency_seconds"},
		{"gen_ai.server.request.duration", "timing_sidecar_e2e_request_latency_seconds"},
	} {
		cc, cs := histogramTotal(col[p.collector], ours)
		sc, ss := histogramTotals(side[p.sidecar])
		if cc != sc || cc == 0 || math.Abs(cs-ss) > 1e-9*math.Max(1, ss) {
			t.Errorf("%s: count %d sum %v; the sidecar's %s: %d %v", p.collector, cc, cs, p.sidecar, sc, ss)
		}
	}
}

// checkUnitsAndBuckets checks the units and cumulative temporality (which
// makes the newest point the total) on every series, and the conventions'
// advisory buckets on every TTFT series.
func checkUnitsAndBuckets(t *testing.T, col map[string][]histogramSeries) {
	t.Helper()
	for name, unit := range map[string]string{"gen_ai.server.time_to_first_token": "s", "gen_ai.server.time_per_output_token": "s",
		"gen_ai.server.request.duration": "s", "gen_ai.client.token.usage": "{token}"} {
		for _, h := range col[name] {
			if h.unit != unit || h.temporality != temporalityCumulative {
				t.Errorf("%s: unit %q, temporality %d; want %q, cumulative", name, h.unit, h.temporality, unit)
			}
		}
	}
	for _, h := range col["gen_ai.server.time_to_first_token"] {
		if want := []float64{0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10}; !slices.Equal(h.point.Bounds, want) {
			t.Errorf("TTFT buckets %v, want %v", h.point.Bounds, want)
		}
	}
}

// checkTokenUsage: token usage by type sums to the sidecar's token
// counters.
func checkTokenUsage(t *testing.T, col map[string][]histogramSeries, side map[string]*dto.MetricFamily, ours func(histogramSeries) bool) {
	t.Helper()
	usage := col["gen_ai.client.token.usage"]
	if usage == nil {
		t.Fatalf("no gen_ai.client.token.usage among %v", names(col))
	}
	for typ, counter := range map[string]string{"input": "timing_sidecar_prompt_tokens_total", "output": "timing_sidecar_generation_tokens_total",
		"cached_input": "timing_sidecar_cached_prompt_tokens_total"} {
		_, sum := histogramTotal(usage, func(h histogramSeries) bool { return ours(h) && h.point.Attributes["gen_ai.token.type"] == typ })
		if want := counterTotal(side[counter]); sum != want || want == 0 {
			t.Errorf("token usage %s sums to %v; %s is %v", typ, sum, counter, want)
		}
	}
}

// checkRequestDurationAttributes checks the attributes of each provider's
// request.duration series, and the resource that names this sidecar.
func checkRequestDurationAttributes(t *testing.T, col map[string][]histogramSeries, ours func(histogramSeries) bool, engine *emulator.Server, instance string) {
	t.Helper()
	byProvider := map[string]histogramSeries{}
	for _, h := range col["gen_ai.server.request.duration"] {
		if ours(h) {
			provider, _ := h.point.Attributes["gen_ai.provider.name"].(string)
			byProvider[provider] = h
		}
	}
	_, enginePort, _ := strings.Cut(strings.TrimPrefix(engine.URL(), "http://"), ":")
	port, err := strconv.ParseInt(enginePort, 10, 64)
	if err != nil || port == 0 {
		t.Fatalf("engine port %q", enginePort)
	}
	for provider, op := range map[string]string{"openai": "chat", "anthropic": "chat"} {
		h, ok := byProvider[provider]
		if !ok {
			t.Errorf("no request.duration series for %s", provider)
			continue
		}
		for name, want := range map[string]any{"gen_ai.operation.name": op, "gen_ai.request.model": "m", "gen_ai.response.model": "m",
			"server.address": "127.0.0.1", "server.port": port} {
			if got := h.point.Attributes[name]; got != want {
				t.Errorf("%s: %s = %v (%T), want %v (%T)", provider, name, got, got, want, want)
			}
		}
		if et, ok := h.point.Attributes["error.type"]; ok {
			t.Errorf("%s: error.type %#v on a series of successes", provider, et)
		}
		if r := h.resource; r["service.name"] != "timing-sidecar" || r["service.instance.id"] != instance {
			t.Errorf("%s: resource %v", provider, r)
		}
	}
}

// names lists the histograms the collector has, for a failure's message.
func names(col map[string][]histogramSeries) []string {
	return slices.Sorted(maps.Keys(col))
}
