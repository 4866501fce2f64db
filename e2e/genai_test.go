package e2e

import (
	"fmt"
	"io"
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

// The GenAI metrics go to a real OpenTelemetry Collector (Jaeger v2's
// distribution) over each OTLP protocol, and are read back from its
// prometheus exporter: the conventions' names, units, buckets and
// attributes, with counts and sums equal to the sidecar's own Prometheus
// series for the same requests.

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

// label is the value of a metric's label, "" when it has none.
func label(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

// histogramTotals sums a histogram family's counts and sums over the
// series keep accepts.
func histogramTotals(mf *dto.MetricFamily, keep func(*dto.Metric) bool) (uint64, float64) {
	var count uint64
	var sum float64
	for _, m := range mf.GetMetric() {
		if keep(m) {
			count += m.GetHistogram().GetSampleCount()
			sum += m.GetHistogram().GetSampleSum()
		}
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
	j := startJaeger(t)
	engine := startEngine(t, emulator.Config{Model: "m", PromptTokensDetails: true,
		Timing: emulator.Timing{TTFT: 30 * time.Millisecond, ITL: 5 * time.Millisecond, TokensPerEvent: 1, OutputTokens: 8}})
	_, enginePort, _ := strings.Cut(strings.TrimPrefix(engine.URL(), "http://"), ":")
	for _, tc := range []struct{ protocol, endpoint, instance string }{
		{"grpc", "http://" + j.grpc, "pod-grpc"},
		{"http/protobuf", "http://" + j.http + "/v1/metrics", "pod-http"},
	} {
		t.Run(tc.protocol, func(t *testing.T) {
			s := startSidecar(t, []string{"--upstream", engine.URL(), "--otlp-metrics-endpoint", tc.endpoint,
				"--otlp-metrics-protocol", tc.protocol, "--service-instance-id", tc.instance},
				"OTEL_METRIC_EXPORT_INTERVAL=200")
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
			// Every request is recorded before its access-log line is
			// written: the sidecar's series are final once all are in.
			for range 5 {
				select {
				case <-s.accessLog:
				case <-time.After(10 * time.Second):
					t.Fatal("an access-log line did not come")
				}
			}
			side := scrapeFamilies(t, s.admin+"/metrics")
			ours := func(m *dto.Metric) bool { return label(m, "instance") == tc.instance }
			pairs := []struct{ collector, sidecar string }{
				{"gen_ai_server_time_to_first_token_seconds", "timing_sidecar_time_to_first_token_seconds"},
				{"gen_ai_server_time_per_output_token_seconds", "timing_sidecar_inter_token_latency_seconds"},
				{"gen_ai_server_request_duration_seconds", "timing_sidecar_e2e_request_latency_seconds"},
			}
			// The collector has the figures after an export or two: its
			// scrape is polled, as it has no event to await.
			var col map[string]*dto.MetricFamily
			deadline := time.Now().Add(20 * time.Second)
			for {
				col = scrapeFamilies(t, "http://"+j.metrics+"/metrics")
				wantCount, _ := histogramTotals(side["timing_sidecar_e2e_request_latency_seconds"], func(*dto.Metric) bool { return true })
				if mf := col["gen_ai_server_request_duration_seconds"]; mf != nil {
					if n, _ := histogramTotals(mf, ours); n == wantCount && wantCount > 0 {
						break
					}
				}
				if time.Now().After(deadline) {
					t.Fatalf("the collector did not get the sidecar's %d requests within 20s; it has %v", wantCount, keys(col))
				}
				time.Sleep(100 * time.Millisecond)
			}
			for _, p := range pairs {
				mf := col[p.collector]
				if mf == nil || mf.GetType() != dto.MetricType_HISTOGRAM {
					t.Errorf("%s: %v", p.collector, mf)
					continue
				}
				cc, cs := histogramTotals(mf, ours)
				sc, ss := histogramTotals(side[p.sidecar], func(*dto.Metric) bool { return true })
				if cc != sc || cc == 0 || math.Abs(cs-ss) > 1e-9*math.Max(1, ss) {
					t.Errorf("%s: count %d sum %v; the sidecar's %s: %d %v", p.collector, cc, cs, p.sidecar, sc, ss)
				}
			}
			// The conventions' advisory buckets, on every series.
			for _, m := range col["gen_ai_server_time_to_first_token_seconds"].GetMetric() {
				var bounds []float64
				for _, b := range m.GetHistogram().GetBucket() {
					if !math.IsInf(b.GetUpperBound(), 1) {
						bounds = append(bounds, b.GetUpperBound())
					}
				}
				if want := []float64{0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10}; !slices.Equal(bounds, want) {
					t.Errorf("TTFT buckets %v, want %v", bounds, want)
				}
			}
			// Token usage by type: the sidecar's token counters.
			usage := col["gen_ai_client_token_usage"]
			if usage == nil {
				t.Fatalf("no gen_ai_client_token_usage among %v", keys(col))
			}
			for typ, counter := range map[string]string{"input": "timing_sidecar_prompt_tokens_total", "output": "timing_sidecar_generation_tokens_total",
				"cached_input": "timing_sidecar_cached_prompt_tokens_total"} {
				_, sum := histogramTotals(usage, func(m *dto.Metric) bool { return ours(m) && label(m, "gen_ai_token_type") == typ })
				if want := counterTotal(side[counter]); sum != want || want == 0 {
					t.Errorf("token usage %s sums to %v; %s is %v", typ, sum, counter, want)
				}
			}
			// The attributes, and the resource that names this sidecar.
			byProvider := map[string]*dto.Metric{}
			for _, m := range col["gen_ai_server_request_duration_seconds"].GetMetric() {
				if ours(m) {
					byProvider[label(m, "gen_ai_provider_name")] = m
				}
			}
			for provider, op := range map[string]string{"openai": "chat", "anthropic": "chat"} {
				m := byProvider[provider]
				if m == nil {
					t.Errorf("no request.duration series for %s", provider)
					continue
				}
				for name, want := range map[string]string{"gen_ai_operation_name": op, "gen_ai_request_model": "m", "gen_ai_response_model": "m",
					"server_address": "127.0.0.1", "server_port": enginePort, "job": "timing-sidecar", "error_type": ""} {
					if got := label(m, name); got != want {
						t.Errorf("%s: %s = %q, want %q", provider, name, got, want)
					}
				}
			}
			if n, _ := strconv.Atoi(enginePort); n == 0 {
				t.Errorf("engine port %q", enginePort)
			}
		})
	}
}

func keys(m map[string]*dto.MetricFamily) []string {
	var k []string
	for name := range m {
		if strings.HasPrefix(name, "gen_ai") {
			k = append(k, name)
		}
	}
	slices.Sort(k)
	return k
}
