package telemetry

import (
	"context"
	"errors"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/timing-sidecar/timing-sidecar/timing"
)

// genaiRecorder is a Recorder with the GenAI metrics read by a manual
// reader, and its registry.
func genaiRecorder(t *testing.T, opts Options) (*Recorder, *sdkmetric.ManualReader, *prometheus.Registry) {
	t.Helper()
	reader := sdkmetric.NewManualReader()
	reg := prometheus.NewRegistry()
	o, err := OTLPConfig{MetricReader: reader, Identity: Identity{ServiceVersion: "v9", InstanceID: "pod-7"}}.Resolve(quiet)
	if err != nil {
		t.Fatal(err)
	}
	g, err := NewGenAIMetrics(o, reg, quiet, "10.0.0.5", 8000)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { g.Shutdown(context.Background()) }) //nolint:errcheck
	opts.GenAI = g
	return NewRecorder(reg, opts), reader, reg
}

func collect(t *testing.T, r *sdkmetric.ManualReader) metricdata.ResourceMetrics {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := r.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	return rm
}

func findMetric(rm metricdata.ResourceMetrics, name string) (metricdata.Metrics, bool) {
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name == name {
				return m, true
			}
		}
	}
	return metricdata.Metrics{}, false
}

// promHistogram sums a Prometheus histogram's count and sum over the
// series whose labels include want.
func promHistogram(t *testing.T, reg *prometheus.Registry, name string, want map[string]string) (uint64, float64) {
	t.Helper()
	var count uint64
	var sum float64
	for _, m := range promSeries(t, reg, name, want) {
		count += m.GetHistogram().GetSampleCount()
		sum += m.GetHistogram().GetSampleSum()
	}
	return count, sum
}

func promCounter(t *testing.T, reg *prometheus.Registry, name string, want map[string]string) float64 {
	t.Helper()
	var v float64
	for _, m := range promSeries(t, reg, name, want) {
		v += m.GetCounter().GetValue()
	}
	return v
}

func promSeries(t *testing.T, reg *prometheus.Registry, name string, want map[string]string) []*dto.Metric {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var out []*dto.Metric
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			for k, v := range want {
				if !slices.ContainsFunc(m.GetLabel(), func(l *dto.LabelPair) bool { return l.GetName() == k && l.GetValue() == v }) {
					continue next
				}
			}
			out = append(out, m)
		}
	}
	return out
}

// genaiRequests is the Prometheus fixture and a request whose engine
// reported cached tokens, named a response model, and one that failed.
func genaiRequests() []Record {
	rs := slices.Clone(requests)
	rs = append(rs,
		Record{ID: "r7", Endpoint: EndpointMessages, Model: "claude-ish", ResponseModel: "claude-ish", Stream: true, Status: 200, Measured: true,
			Metrics: timing.Metrics{QueueTime: num(3), TimeToFirstToken: num(40), FirstTokenAfterArrival: num(3 + 40), MeanITL: num(9), E2ELatency: num(120),
				PromptTokens: cnt(500), CompletionTokens: cnt(9), CachedTokens: cnt(480), Cache: timing.CacheFull}},
		Record{ID: "r8", Endpoint: EndpointChat, Model: "llama", Stream: true, Status: 200, Measured: true, UpstreamError: ErrorInterrupted,
			Metrics: timing.Metrics{QueueTime: num(3), TimeToFirstToken: num(40), FirstTokenAfterArrival: num(3 + 40), E2ELatency: num(90), PromptTokens: cnt(5)}},
	)
	return rs
}

// TestGenAIMetricsAgreeWithPrometheus: the conventions' instruments, with
// their names, units, advisory buckets and attributes, hold exactly the
// counts and sums of the Prometheus series they mirror, for the same
// successful answers, and the token counts of all requests.
func TestGenAIMetricsAgreeWithPrometheus(t *testing.T) {
	r, reader, reg := genaiRecorder(t, Options{MaxModels: 8, MaxTenants: 8})
	// The Prometheus series of the successful answers alone: the GenAI
	// latencies without error.type mirror those.
	succeeded := prometheus.NewRegistry()
	s := NewRecorder(succeeded, Options{MaxModels: 8, MaxTenants: 8})
	for _, req := range genaiRequests() {
		r.Begin()
		r.Finish(&req)
		if errorType(&req) == "" {
			s.Begin()
			s.Finish(&req)
		}
	}
	rm := collect(t, reader)
	res := map[string]string{}
	for _, kv := range rm.Resource.Attributes() {
		res[string(kv.Key)] = kv.Value.String()
	}
	if res["service.name"] != DefaultServiceName || res["service.version"] != "v9" || res["service.instance.id"] != "pod-7" {
		t.Errorf("resource %v", res)
	}
	checkGenAIDurationsMirrorPrometheus(t, rm, succeeded)
	checkGenAITokenUsageMirrorsPrometheus(t, rm, reg)
	checkGenAIDurationAttributes(t, rm)
}

// checkGenAIDurationsMirrorPrometheus checks the conventions' duration
// histograms: their units and buckets, and for each endpoint and model of
// genaiRequests the count and sum of the Prometheus histogram they mirror,
// in reg, for the successful answers.
func checkGenAIDurationsMirrorPrometheus(t *testing.T, rm metricdata.ResourceMetrics, reg *prometheus.Registry) {
	t.Helper()
	for _, tc := range []struct {
		name, unit, prom string
		buckets          []float64
	}{
		{"gen_ai.server.time_to_first_token", "s", "timing_sidecar_time_to_first_token_seconds", genaiTTFTBuckets},
		{"gen_ai.server.time_per_output_token", "s", "timing_sidecar_inter_token_latency_seconds", genaiTPOTBuckets},
		{"gen_ai.server.request.duration", "s", "timing_sidecar_e2e_request_latency_seconds", genaiDurationBuckets},
	} {
		m, ok := findMetric(rm, tc.name)
		if !ok {
			t.Errorf("no %s", tc.name)
			continue
		}
		if m.Unit != tc.unit {
			t.Errorf("%s: unit %q, want %q", tc.name, m.Unit, tc.unit)
		}
		h := m.Data.(metricdata.Histogram[float64])
		for endpoint, model := range map[string]string{EndpointChat: "llama", EndpointCompletions: "qwen", EndpointMessages: "claude-ish"} {
			count, sum := genaiHistogramFor(t, tc.name, h, tc.buckets, endpoint, model)
			pc, ps := promHistogram(t, reg, tc.prom, map[string]string{"endpoint": endpoint, "model": model})
			if count != pc || math.Abs(sum-ps) > 1e-9 {
				t.Errorf("%s{%s, %s}: count %d sum %v; Prometheus %d %v", tc.name, endpoint, model, count, sum, pc, ps)
			}
		}
	}
}

// genaiHistogramFor sums the count and sum of h's points without
// error.type for one endpoint and model, and checks that every point has
// the conventions' buckets.
func genaiHistogramFor(t *testing.T, name string, h metricdata.Histogram[float64], buckets []float64, endpoint, model string) (uint64, float64) {
	t.Helper()
	var count uint64
	var sum float64
	for _, p := range h.DataPoints {
		if !slices.Equal(p.Bounds, buckets) {
			t.Errorf("%s: bounds %v, want the conventions' %v", name, p.Bounds, buckets)
		}
		a := p.Attributes
		if _, failed := a.Value("error.type"); failed {
			continue
		}
		if v, _ := a.Value("gen_ai.request.model"); v.AsString() != model {
			continue
		}
		if v, _ := a.Value("gen_ai.operation.name"); v.AsString() != operation(endpoint).Value.AsString() {
			continue
		}
		count += p.Count
		sum += p.Sum
	}
	return count, sum
}

// checkGenAITokenUsageMirrorsPrometheus checks token usage: its unit and
// buckets, and that its sums are the token counters, by type.
func checkGenAITokenUsageMirrorsPrometheus(t *testing.T, rm metricdata.ResourceMetrics, reg *prometheus.Registry) {
	t.Helper()
	m, ok := findMetric(rm, "gen_ai.client.token.usage")
	if !ok || m.Unit != "{token}" {
		t.Fatalf("token usage %v %q", ok, m.Unit)
	}
	sums := map[string]int64{}
	for _, p := range m.Data.(metricdata.Histogram[int64]).DataPoints {
		v, _ := p.Attributes.Value("gen_ai.token.type")
		sums[v.AsString()] += p.Sum
		if !slices.Equal(p.Bounds, genaiTokenBuckets) {
			t.Errorf("token usage bounds %v", p.Bounds)
		}
	}
	for typ, series := range map[string]string{"input": "timing_sidecar_prompt_tokens_total", "output": "timing_sidecar_generation_tokens_total",
		"cached_input": "timing_sidecar_cached_prompt_tokens_total"} {
		if want := promCounter(t, reg, series, nil); float64(sums[typ]) != want {
			t.Errorf("token usage %s sums to %d; %s is %v", typ, sums[typ], series, want)
		}
	}
}

// checkGenAIDurationAttributes checks the request duration's attributes
// for the Messages request and for the failed one of genaiRequests.
func checkGenAIDurationAttributes(t *testing.T, rm metricdata.ResourceMetrics) {
	t.Helper()
	m, _ := findMetric(rm, "gen_ai.server.request.duration")
	want := map[string]map[string]string{
		"claude-ish": {"gen_ai.operation.name": "chat", "gen_ai.provider.name": "anthropic", "gen_ai.request.model": "claude-ish",
			"gen_ai.response.model": "claude-ish", "server.address": "10.0.0.5", "server.port": "8000"},
		"llama/interrupted": {"gen_ai.provider.name": "openai", "error.type": "interrupted"},
	}
	found := map[string]bool{}
	for _, p := range m.Data.(metricdata.Histogram[float64]).DataPoints {
		model, _ := p.Attributes.Value("gen_ai.request.model")
		key := model.AsString()
		if v, ok := p.Attributes.Value("error.type"); ok {
			key += "/" + v.AsString()
		}
		w, ok := want[key]
		if !ok {
			continue
		}
		found[key] = true
		for k, v := range w {
			if got, ok := p.Attributes.Value(attribute.Key(k)); !ok || got.String() != v {
				t.Errorf("%s: %s = %q, want %q", key, k, got.String(), v)
			}
		}
	}
	if len(found) != len(want) {
		t.Errorf("found %v of %v", found, want)
	}
}

// TestGenAIFailuresAreThePrometheusFailures: gen_ai.server.request.duration
// has a point for every failure, measured or not, with the error.type of
// the Prometheus counter that counts it (an engine failure's kind in
// timing_sidecar_upstream_errors_total, a client gone in
// timing_sidecar_client_disconnects_total, any other 4xx or 5xx in
// timing_sidecar_requests_total by status), so an error rate reads the
// same from either; time to first token and time per output token count
// the successful answers alone.
func TestGenAIFailuresAreThePrometheusFailures(t *testing.T) {
	r, reader, reg := genaiRecorder(t, Options{MaxModels: 8, MaxTenants: 8})
	stream := func(id string, ttft, e2e float64) Record {
		return Record{ID: id, Endpoint: EndpointChat, Model: "llama", Stream: true, Status: 200, Measured: true,
			Elapsed: time.Duration(e2e) * time.Millisecond, Metrics: timing.Metrics{QueueTime: num(2), TimeToFirstToken: num(ttft), FirstTokenAfterArrival: num(2 + ttft),
				MeanITL: num(10), E2ELatency: num(e2e), PromptTokens: cnt(20), CompletionTokens: cnt(9)}}
	}
	succeeded := []Record{stream("ok1", 40, 200), stream("ok2", 60, 300), stream("ok3", 80, 400),
		{ID: "ok4", Endpoint: EndpointCompletions, Model: "qwen", Status: 200, Measured: true, Elapsed: 500 * time.Millisecond,
			Metrics: timing.Metrics{E2ELatency: num(500), PromptTokens: cnt(5), CompletionTokens: cnt(64)}}}
	interrupted := stream("interrupted", 50, 120)
	interrupted.UpstreamError = ErrorInterrupted
	left := stream("left mid-stream", 45, 90)
	left.ClientGone = true
	pacedLeft := stream("paced, then left", 45, 2000)
	pacedLeft.ClientGone, pacedLeft.ClientPaced = true, true
	failed := []Record{
		{ID: "engine 500", Endpoint: EndpointChat, Model: "llama", Stream: true, Status: 500, Elapsed: 30 * time.Millisecond},
		{ID: "engine 500 again", Endpoint: EndpointMessages, Model: "llama", Status: 500, Elapsed: 35 * time.Millisecond},
		{ID: "engine 400", Endpoint: EndpointChat, Model: "made-up", Status: 400, Elapsed: 5 * time.Millisecond},
		{ID: "refused by the sidecar", Endpoint: EndpointChat, Status: 413, Elapsed: time.Millisecond},
		{ID: "engine unreachable", Endpoint: EndpointChat, Model: "llama", Stream: true, Status: 502, UpstreamError: ErrorConnect, Elapsed: 3 * time.Millisecond},
		{ID: "left before the answer", Endpoint: EndpointChat, Model: "llama", Status: StatusClientGone, ClientGone: true, Elapsed: 700 * time.Millisecond},
		interrupted, left, pacedLeft,
	}
	// Not a GenAI operation: counted by Prometheus, not in the GenAI metrics.
	other := Record{ID: "other path", Endpoint: EndpointOther, Status: 503, Elapsed: time.Millisecond}
	for _, req := range slices.Concat(succeeded, failed, []Record{other}) {
		r.Begin()
		r.Finish(&req)
	}
	rm := collect(t, reader)

	count, sum := map[string]uint64{}, map[string]float64{}
	m, _ := findMetric(rm, "gen_ai.server.request.duration")
	for _, p := range m.Data.(metricdata.Histogram[float64]).DataPoints {
		kind := ""
		if v, ok := p.Attributes.Value("error.type"); ok {
			kind = v.AsString()
		}
		count[kind] += p.Count
		sum[kind] += p.Sum
	}
	requestsWith := func(status string) float64 {
		var n float64
		for _, e := range []string{EndpointChat, EndpointCompletions, EndpointMessages} {
			n += promCounter(t, reg, "timing_sidecar_requests_total", map[string]string{"endpoint": e, "status": status})
		}
		return n
	}
	want := map[string]float64{
		"client_disconnected": promCounter(t, reg, "timing_sidecar_client_disconnects_total", nil),
		"500":                 requestsWith("500"),
		"400":                 requestsWith("400"),
		"413":                 requestsWith("413"),
	}
	for _, kind := range []string{ErrorConnect, ErrorTimeout, ErrorClosed, ErrorBadResponse, ErrorInterrupted, ErrorIdleTimeout} {
		want[kind] = promCounter(t, reg, "timing_sidecar_upstream_errors_total", map[string]string{"kind": kind})
	}
	var failures uint64
	for kind, n := range count {
		if kind == "" {
			continue
		}
		failures += n
		if _, ok := want[kind]; !ok {
			t.Errorf("error.type %q (%d points) has no Prometheus counter here", kind, n)
		}
	}
	for kind, n := range want {
		if float64(count[kind]) != n {
			t.Errorf("error.type %q: %d request durations; its Prometheus counter %v", kind, count[kind], n)
		}
	}
	if failures != uint64(len(failed)) || count[""] != uint64(len(succeeded)) {
		t.Errorf("%d failed and %d successful request durations, want %d and %d", failures, count[""], len(failed), len(succeeded))
	}
	// A measured failure's duration is its end-to-end latency, paced or
	// not; an unmeasured one's, arrival to the end of its answer.
	for kind, seconds := range map[string]float64{"500": 0.065, "400": 0.005, "413": 0.001, ErrorConnect: 0.003,
		ErrorInterrupted: 0.12, "client_disconnected": 0.7 + 0.09 + 2} {
		if math.Abs(sum[kind]-seconds) > 1e-9 {
			t.Errorf("error.type %q: durations sum to %v s, want %v", kind, sum[kind], seconds)
		}
	}

	// The failed streams' first tokens are in the Prometheus histogram,
	// but for the paced one, and not in the conventions' metrics.
	if n, _ := promHistogram(t, reg, "timing_sidecar_time_to_first_token_seconds", nil); n != 5 {
		t.Errorf("Prometheus TTFT count %d, want the 3 successful streams and the 2 failed unpaced ones", n)
	}
	for _, name := range []string{"gen_ai.server.time_to_first_token", "gen_ai.server.time_per_output_token"} {
		m, _ := findMetric(rm, name)
		var n uint64
		for _, p := range m.Data.(metricdata.Histogram[float64]).DataPoints {
			if v, failed := p.Attributes.Value("error.type"); failed {
				t.Errorf("%s has a point with error.type %q", name, v.AsString())
			}
			n += p.Count
		}
		if n != 3 {
			t.Errorf("%s counts %d, want the 3 successful streams", name, n)
		}
	}
	// Tokens are recorded when known, failed or not.
	checkGenAITokenUsageMirrorsPrometheus(t, rm, reg)
}

// TestGenAIMetricsKeepTheLabelBounds: a model past --max-model-labels is
// "other" in the OTLP attributes as in the Prometheus labels, and the
// tenant is an attribute only with the tenant label on.
func TestGenAIMetricsKeepTheLabelBounds(t *testing.T) {
	r, reader, _ := genaiRecorder(t, Options{MaxModels: 1, MaxTenants: 1, TenantLabel: true})
	for _, model := range []string{"a", "b", "c"} {
		rec := Record{Endpoint: EndpointChat, Model: model, ResponseModel: model + "-resp", Tenant: "t-" + model, Stream: true, Status: 200, Measured: true,
			Metrics: timing.Metrics{E2ELatency: num(10)}}
		r.Begin()
		r.Finish(&rec)
	}
	m, _ := findMetric(collect(t, reader), "gen_ai.server.request.duration")
	seen := map[string]bool{}
	for _, p := range m.Data.(metricdata.Histogram[float64]).DataPoints {
		for _, k := range []attribute.Key{"gen_ai.request.model", "gen_ai.response.model", attrTenant} {
			v, _ := p.Attributes.Value(k)
			seen[string(k)+"="+v.AsString()] = true
		}
	}
	// A response model takes no slot of its own: one the request models
	// did not admit is "other", so the Prometheus labels are the same
	// with the GenAI metrics on or off.
	for _, want := range []string{"gen_ai.request.model=a", "gen_ai.request.model=other", "gen_ai.response.model=other", "timing_sidecar.tenant=t-a", "timing_sidecar.tenant=other"} {
		if !seen[want] {
			t.Errorf("no %s among %v", want, seen)
		}
	}
	for k := range seen {
		if k == "gen_ai.request.model=b" || k == "gen_ai.request.model=c" || k == "gen_ai.response.model=b-resp" {
			t.Errorf("%s past the bound", k)
		}
	}
}

// failingExporter fails every export, after waiting for release: a
// collector that is down, or hangs.
type failingExporter struct {
	sdkmetric.Exporter
	release chan struct{}
	calls   chan struct{}
}

func (e *failingExporter) Export(ctx context.Context, _ *metricdata.ResourceMetrics) error {
	e.calls <- struct{}{}
	select {
	case <-e.release:
	case <-ctx.Done():
	}
	return errors.New("collector down")
}

func (e *failingExporter) Shutdown(context.Context) error { return nil }

// TestACollectorOutageCostsNoRequestAnything: while an export hangs on a
// collector, requests are recorded as fast as ever (recording never
// waits on the export); its failure is counted.
func TestACollectorOutageCostsNoRequestAnything(t *testing.T) {
	exp := &failingExporter{Exporter: nopExporter{}, release: make(chan struct{}), calls: make(chan struct{}, 8)}
	reg := prometheus.NewRegistry()
	g, err := NewGenAIMetrics(OTLP{Metrics: Signal{On: true}, MetricExporter: exp}, reg, quiet, "", 0)
	if err != nil {
		t.Fatal(err)
	}
	r := NewRecorder(reg, Options{MaxModels: 4, GenAI: g})
	flushed := make(chan error, 1)
	go func() { flushed <- g.ForceFlush(context.Background()) }()
	<-exp.calls // the export is in the collector's hands, and stays there
	for range 1000 {
		rec := requests[0]
		r.Begin()
		r.Finish(&rec) // would hang here if recording waited on the export
	}
	close(exp.release)
	if err := <-flushed; err == nil {
		t.Error("the failed export was not reported to ForceFlush")
	}
	if got := promCounter(t, reg, "timing_sidecar_otlp_metric_exports_total", map[string]string{"result": "failed"}); got != 1 {
		t.Errorf("failed exports %v, want 1", got)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	g.Shutdown(ctx) //nolint:errcheck
}

// nopExporter is an exporter's defaults: cumulative temporality, the
// default aggregations.
type nopExporter struct{}

func (nopExporter) Temporality(k sdkmetric.InstrumentKind) metricdata.Temporality {
	return sdkmetric.DefaultTemporalitySelector(k)
}
func (nopExporter) Aggregation(k sdkmetric.InstrumentKind) sdkmetric.Aggregation {
	return sdkmetric.DefaultAggregationSelector(k)
}
func (nopExporter) Export(context.Context, *metricdata.ResourceMetrics) error { return nil }
func (nopExporter) ForceFlush(context.Context) error                          { return nil }
func (nopExporter) Shutdown(context.Context) error                            { return nil }

// TestRecordingWithGenAIAllocatesNothing: with the GenAI metrics on, a
// request of a label set seen before is recorded without allocating,
// succeeded or failed.
func TestRecordingWithGenAIAllocatesNothing(t *testing.T) {
	r, _, _ := genaiRecorder(t, Options{MaxModels: 4})
	failed := Record{Endpoint: EndpointChat, Model: requests[0].Model, Stream: true, Status: 503, Elapsed: time.Second}
	for _, want := range []Record{requests[0], failed} {
		rec := want
		finish := func() {
			rec.Model = want.Model
			r.Begin()
			r.Finish(&rec)
		}
		finish()
		if n := testing.AllocsPerRun(200, finish); n > 0 {
			t.Errorf("status %d: %v allocations per request", want.Status, n)
		}
	}
}

// TestGenAIMetricsCarryTheVariant: with variants configured, each point
// carries the request's arm, bounded as the label is; without, none does.
func TestGenAIMetricsCarryTheVariant(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts Options
		want []string // the variant attribute's values; nil: none
	}{
		{"off", Options{MaxModels: 8}, nil},
		{"on", Options{MaxModels: 8, VariantLabel: true, MaxVariants: 2, Variant: "stable"}, []string{"canary", "other", "stable"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, reader, _ := genaiRecorder(t, tc.opts)
			for _, variant := range []string{"stable", "canary", "third"} {
				rec := Record{Endpoint: EndpointChat, Model: "m", Variant: variant, Stream: true, Status: 200, Measured: true,
					Metrics: timing.Metrics{E2ELatency: num(10)}}
				r.Begin()
				r.Finish(&rec)
			}
			m, _ := findMetric(collect(t, reader), "gen_ai.server.request.duration")
			var got []string
			for _, p := range m.Data.(metricdata.Histogram[float64]).DataPoints {
				if v, ok := p.Attributes.Value(attrVariant); ok {
					got = append(got, v.AsString())
				}
			}
			slices.Sort(got)
			if !slices.Equal(got, tc.want) {
				t.Errorf("variant attributes %v, want %v", got, tc.want)
			}
		})
	}
}
