package telemetry

import (
	"context"
	"log/slog"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlpmetric/otlpmetricgrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlpmetric/otlpmetrichttp"
	"go.opentelemetry.io/otel/metric"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/exemplar"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	semconv "go.opentelemetry.io/otel/semconv/v1.41.0"
	"go.opentelemetry.io/otel/semconv/v1.41.0/genaiconv"
)

// The OpenTelemetry GenAI metrics (semantic conventions v1.41.0, marked
// development), sent over OTLP: what Envoy AI Gateway, Kong and LiteLLM
// export, so that dashboards built on them read every engine behind a
// sidecar. A successful answer's figures are those of the Prometheus
// series each mirrors, from one reading (observe feeds both), so the two
// never drift:
//
//	gen_ai.server.time_to_first_token   timing_sidecar_time_to_first_token_seconds
//	gen_ai.server.time_per_output_token timing_sidecar_inter_token_latency_seconds
//	gen_ai.server.request.duration      timing_sidecar_e2e_request_latency_seconds
//	gen_ai.client.token.usage           timing_sidecar_prompt_tokens_total (input),
//	                                    timing_sidecar_generation_tokens_total (output),
//	                                    timing_sidecar_cached_prompt_tokens_total (cached_input)
//
// A failed request (error.type: an engine failure, a client gone, a 4xx or
// 5xx) records its duration, measured or not, and its tokens when known,
// but no time to first token or per output token, which the conventions
// define for successful responses: gen_ai.server.request.duration counts
// each failure the Prometheus failure counters count (observeGenAI).

// Advisory bucket boundaries of the conventions, in seconds and tokens.
var (
	genaiTTFTBuckets     = []float64{0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10}
	genaiTPOTBuckets     = []float64{0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1, 2.5}
	genaiDurationBuckets = []float64{0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92}
	genaiTokenBuckets    = []float64{1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216, 67108864}
)

// Token types of gen_ai.client.token.usage: the conventions' input and
// output, and Envoy AI Gateway's cached_input (a custom value, as the
// conventions allow, proposed for them): the part of input the engine read
// from its prefix cache. input counts every prompt token, cached ones
// included, so a sum over all types counts those twice.
const (
	tokenTypeInput       = "input"
	tokenTypeOutput      = "output"
	tokenTypeCachedInput = "cached_input"
)

// GenAIMetrics records the GenAI metrics of finished requests. A nil
// *GenAIMetrics is the metrics off: every method is a no-op.
type GenAIMetrics struct {
	provider             *sdkmetric.MeterProvider
	ttft, tpot, duration metric.Float64Histogram
	tokens               metric.Int64Histogram
	// engine is server.address and server.port: the engine that answered.
	engine []attribute.KeyValue
	// series caches each label set's attribute sets, made once: recording
	// then allocates nothing.
	series sync.Map // genaiKey -> *genaiSeries
}

// genaiKey is a series' labels, bounded as the Prometheus labels are.
type genaiKey struct {
	endpoint, model, responseModel, errorType, tenant, variant, leg string
}

// genaiAttributes says which of the optional attributes the series carry:
// those whose Prometheus labels are on.
type genaiAttributes struct{ tenant, variant bool }

// genaiSeries is the options that record to one label set, by token type
// for the token usage.
type genaiSeries struct {
	latency                    []metric.RecordOption
	input, output, cachedInput []metric.RecordOption
}

// NewGenAIMetrics starts the GenAI metrics as cfg says, reporting to the
// engine at address:port, or returns nil when they are off. The export
// interval and timeout are OTEL_METRIC_EXPORT_INTERVAL (60 s) and
// OTEL_METRIC_EXPORT_TIMEOUT (30 s); the exporter reads its own
// OTEL_EXPORTER_OTLP_METRICS_* variables (headers, compression,
// certificates, temporality). Exports run beside requests, never in their
// way: a collector that is down or slow costs a failed export, counted.
func NewGenAIMetrics(o OTLP, reg prometheus.Registerer, log *slog.Logger, address string, port int) (*GenAIMetrics, error) {
	if !o.Metrics.On {
		return nil, nil
	}
	handleOTelErrors(log)
	reader := o.MetricReader
	if reader == nil {
		exporter := o.MetricExporter
		if exporter == nil {
			var err error
			if exporter, err = otlpMetricExporter(o.Metrics); err != nil {
				return nil, err
			}
		}
		reader = sdkmetric.NewPeriodicReader(newCountingExporter(exporter, reg))
	}
	provider := sdkmetric.NewMeterProvider(sdkmetric.WithResource(o.Resource), sdkmetric.WithReader(reader),
		// Recorded after the request, outside its span: no exemplar
		// would be sampled, and looking for one costs.
		sdkmetric.WithExemplarFilter(exemplar.AlwaysOffFilter))
	meter := provider.Meter("github.com/timing-sidecar/timing-sidecar", metric.WithSchemaURL(semconv.SchemaURL))
	g := &GenAIMetrics{provider: provider}
	ttft, err1 := genaiconv.NewServerTimeToFirstToken(meter, metric.WithExplicitBucketBoundaries(genaiTTFTBuckets...))
	tpot, err2 := genaiconv.NewServerTimePerOutputToken(meter, metric.WithExplicitBucketBoundaries(genaiTPOTBuckets...))
	duration, err3 := genaiconv.NewServerRequestDuration(meter, metric.WithExplicitBucketBoundaries(genaiDurationBuckets...))
	tokens, err4 := genaiconv.NewClientTokenUsage(meter, metric.WithExplicitBucketBoundaries(genaiTokenBuckets...))
	for _, err := range []error{err1, err2, err3, err4} {
		if err != nil {
			return nil, err
		}
	}
	g.ttft, g.tpot, g.duration, g.tokens = ttft.Inst(), tpot.Inst(), duration.Inst(), tokens.Inst()
	if address != "" {
		g.engine = append(g.engine, semconv.ServerAddress(address))
		if port > 0 {
			g.engine = append(g.engine, semconv.ServerPort(port))
		}
	}
	return g, nil
}

// otlpMetricExporter makes the OTLP exporter for s's protocol. It
// connects lazily: a collector that is down at start costs nothing until
// the first export.
func otlpMetricExporter(s Signal) (sdkmetric.Exporter, error) {
	if s.Protocol == ProtocolHTTP {
		var opts []otlpmetrichttp.Option
		if s.Endpoint != "" {
			opts = append(opts, otlpmetrichttp.WithEndpointURL(s.Endpoint))
		}
		return otlpmetrichttp.New(context.Background(), opts...)
	}
	var opts []otlpmetricgrpc.Option
	if s.Endpoint != "" {
		opts = append(opts, otlpmetricgrpc.WithEndpointURL(s.Endpoint))
	}
	return otlpmetricgrpc.New(context.Background(), opts...)
}

// seriesFor returns the recording options of a label set.
func (g *GenAIMetrics) seriesFor(k genaiKey, on genaiAttributes) *genaiSeries {
	if s, ok := g.series.Load(k); ok {
		return s.(*genaiSeries)
	}
	a := []attribute.KeyValue{operation(k.endpoint), provider(k.endpoint)}
	a = append(a, g.engine...)
	if k.model != "" {
		a = append(a, semconv.GenAIRequestModel(k.model))
	}
	if k.responseModel != "" {
		a = append(a, semconv.GenAIResponseModel(k.responseModel))
	}
	if k.errorType != "" {
		a = append(a, semconv.ErrorTypeKey.String(k.errorType))
	}
	if on.tenant {
		a = append(a, attrTenant.String(k.tenant))
	}
	if on.variant {
		a = append(a, attrVariant.String(k.variant))
	}
	a = append(a, attrLeg.String(k.leg))
	with := func(extra ...attribute.KeyValue) []metric.RecordOption {
		return []metric.RecordOption{metric.WithAttributeSet(attribute.NewSet(append(append([]attribute.KeyValue(nil), a...), extra...)...))}
	}
	s := &genaiSeries{
		latency:     with(),
		input:       with(semconv.GenAITokenTypeInput),
		output:      with(semconv.GenAITokenTypeOutput),
		cachedInput: with(semconv.GenAITokenTypeKey.String(tokenTypeCachedInput)),
	}
	actual, _ := g.series.LoadOrStore(k, s)
	return actual.(*genaiSeries)
}

// Shutdown exports what is recorded and stops, within ctx.
func (g *GenAIMetrics) Shutdown(ctx context.Context) error {
	if g == nil {
		return nil
	}
	return g.provider.Shutdown(ctx)
}

// ForceFlush exports what is recorded now.
func (g *GenAIMetrics) ForceFlush(ctx context.Context) error {
	if g == nil {
		return nil
	}
	return g.provider.ForceFlush(ctx)
}

// countingExporter counts the exports and their failures on /metrics: a
// collector that is down shows there, not in a request's latency.
type countingExporter struct {
	sdkmetric.Exporter
	exported, failed prometheus.Counter
}

func newCountingExporter(e sdkmetric.Exporter, reg prometheus.Registerer) *countingExporter {
	exports := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "timing_sidecar_otlp_metric_exports_total",
		Help: "Exports of the GenAI metrics to the OTLP collector, by result: exported or failed. With cumulative temporality (the default) a failed export loses nothing but its moment: the next carries the totals; with delta, its interval's measurements are lost.",
	}, []string{"result"})
	reg.MustRegister(exports)
	return &countingExporter{Exporter: e, exported: exports.WithLabelValues("exported"), failed: exports.WithLabelValues("failed")}
}

func (c *countingExporter) Export(ctx context.Context, rm *metricdata.ResourceMetrics) error {
	err := c.Exporter.Export(ctx, rm)
	if err != nil {
		c.failed.Inc()
	} else {
		c.exported.Inc()
	}
	return err
}

// genaiObservation is what one finished request gives the GenAI metrics:
// the figures the Prometheus series got, in their units.
type genaiObservation struct {
	ttft, tpot, duration           float64 // seconds
	hasTTFT, hasTPOT, hasDuration  bool
	input, output, cached          int64
	hasInput, hasOutput, hasCached bool
	endpoint, model, responseModel string
	errorType, tenant, variant     string
	leg                            string
}

// record records one request's observation.
func (g *GenAIMetrics) record(o *genaiObservation, on genaiAttributes) {
	if g == nil {
		return
	}
	s := g.seriesFor(genaiKey{o.endpoint, o.model, o.responseModel, o.errorType, o.tenant, o.variant, o.leg}, on)
	ctx := context.Background()
	if o.hasTTFT {
		g.ttft.Record(ctx, o.ttft, s.latency...)
	}
	if o.hasTPOT {
		g.tpot.Record(ctx, o.tpot, s.latency...)
	}
	if o.hasDuration {
		g.duration.Record(ctx, o.duration, s.latency...)
	}
	if o.hasInput {
		g.tokens.Record(ctx, o.input, s.input...)
	}
	if o.hasOutput {
		g.tokens.Record(ctx, o.output, s.output...)
	}
	if o.hasCached {
		g.tokens.Record(ctx, o.cached, s.cachedInput...)
	}
}
