package telemetry

import (
	"context"
	"io"
	"log/slog"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/timing-sidecar/timing-sidecar/timing"
)

// Bucket boundaries in seconds, vLLM's (vllm/v1/metrics), so dashboards
// built for the engine's histograms read the sidecar's the same way.
var (
	ttftBuckets = []float64{0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
		1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0}
	// tokensPerEventBuckets: one token an event, stream intervals and
	// speculative decoding's few, and coarse chunking's many.
	tokensPerEventBuckets = []float64{1, 1.25, 1.5, 2, 3, 4, 6, 8, 16, 32}
	itlBuckets            = []float64{0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0,
		2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0}
	latencyBuckets = []float64{0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0,
		40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0}
	// Prefill speed, tokens computed per second: hundreds on a small GPU
	// with a long queue behind, tens of thousands for a large batch.
	prefillBuckets = []float64{100, 250, 500, 1000, 2500, 5000, 10000, 25000, 50000, 100000, 250000}
	// The sidecar's own delay: tens of microseconds when it has its CPU,
	// up to a CFS period (100 ms) and beyond when it is throttled.
	relayDelayBuckets = []float64{0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001,
		0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0}
)

// Options configures a Recorder.
type Options struct {
	// MaxModels bounds the distinct "model" label values. A value takes
	// one of these slots only with a 2xx response (see boundedLabel).
	MaxModels int
	// TenantLabel adds a "tenant" label to the request and token counters;
	// MaxTenants bounds its values, admitted the same way.
	TenantLabel bool
	MaxTenants  int
	// VariantLabel adds a "variant" label, the request's arm of a latency
	// experiment, to the latency histograms and the request, token and
	// goodput counters, and the attribute to the GenAI metrics;
	// MaxVariants bounds its values, admitted as the tenant's are, but
	// for Variant, the deployment's own arm, admitted from the start.
	VariantLabel bool
	MaxVariants  int
	Variant      string
	// AccessLog, when set, gets one JSON line per request, buffered (see
	// accessLog); Log gets the report of lines dropped.
	AccessLog io.Writer
	Log       *slog.Logger
	// Tracer, when set, ends each traced record's spans.
	Tracer *Tracer
	// GenAI, when set, gets each request to a GenAI endpoint as the
	// OpenTelemetry GenAI metrics: a successful answer's figures, the
	// same the Prometheus series get; a failure's duration and tokens.
	GenAI *GenAIMetrics
	// Objectives, when set, judge each request: met or missed, counted
	// per model (and tenant) and said in the access log.
	Objectives Objectives
	// Usage, when set, takes one usage record per request forwarded to
	// the engine, each in UsageEnvelope.
	Usage         UsageRecords
	UsageEnvelope UsageEnvelope
	// KernelTimestamps says the marks are the kernel's receive times;
	// otherwise the clock at each read (the timing_sidecar_kernel_timestamps
	// gauge).
	KernelTimestamps bool
}

// Recorder records finished requests.
type Recorder struct {
	models, tenants, variants *boundedLabel
	tenantLabel, variantLabel bool
	access                    *accessLog
	tracer                    *Tracer
	genai                     *GenAIMetrics
	objectives                Objectives
	usage                     UsageRecords
	envelope                  UsageEnvelope

	queue, ttft, ttfc, itl, maxITL, e2e *prometheus.HistogramVec
	tokensPerEvent                      *prometheus.HistogramVec
	prefill                             *prometheus.HistogramVec
	requests                            *prometheus.CounterVec
	promptTokens, outputTokens          *prometheus.CounterVec
	cachedTokens, cacheWriteTokens      *prometheus.CounterVec
	upstreamErrors                      *prometheus.CounterVec
	clientDisconnects                   prometheus.Counter
	clientPaced                         prometheus.Counter
	ttftOrigin                          *prometheus.CounterVec
	unread                              *prometheus.CounterVec
	panics                              prometheus.Counter
	inFlight                            prometheus.Gauge
	slo                                 *prometheus.CounterVec
	invalidObjectives                   *prometheus.CounterVec
	engineReady                         prometheus.Gauge
	relayDelay                          prometheus.Histogram
	kernelTimestamps                    prometheus.Gauge

	// series caches each (endpoint, model, leg, tenant, variant)'s
	// histograms and token counters, and counters each label set's
	// requests_total counter, so that a request finds its series in a map
	// read instead of hashing and validating its labels once per series (a
	// third of recording). They hold one entry per series, which the
	// labels' bounds already bound.
	series   sync.Map // seriesKey -> *modelSeries
	counters sync.Map // requestKey -> prometheus.Counter
}

// seriesKey names a modelSeries; tenant and variant are empty without
// their labels.
type seriesKey struct{ endpoint, model, leg, tenant, variant string }

// requestKey is the label set of timing_sidecar_requests_total.
type requestKey struct {
	endpoint, model, leg, tenant, variant string
	status                                int
	stream                                bool
}

type modelSeries struct {
	queue, ttfc, itl, maxITL, e2e, prefill   prometheus.Observer
	tokensPerEvent                           prometheus.Observer
	promptTokens, outputTokens, cachedTokens prometheus.Counter
	cacheWriteTokens                         prometheus.Counter
	// ttft is the TTFT histogram of each cache class, made on first use:
	// most deployments see one or two classes.
	ttft [timing.CacheClasses]atomic.Pointer[prometheus.Observer]
	// labels are the histograms' label values but the cache class, for
	// the TTFT histograms made later.
	labels []string
}

// ttftOf returns the TTFT histogram of cache class c.
func (r *Recorder) ttftOf(s *modelSeries, c timing.CacheClass) prometheus.Observer {
	if o := s.ttft[c].Load(); o != nil {
		return *o
	}
	o := r.ttft.WithLabelValues(append(slices.Clip(s.labels), c.String())...)
	s.ttft[c].CompareAndSwap(nil, &o)
	return *s.ttft[c].Load()
}

// seriesFor returns the series of a measured request; tenant and variant
// are ignored without their labels.
func (r *Recorder) seriesFor(endpoint, model, leg, tenant, variant string) *modelSeries {
	tenant, variant = r.onLabels(tenant, variant)
	k := seriesKey{endpoint, model, leg, tenant, variant}
	if s, ok := r.series.Load(k); ok {
		return s.(*modelSeries)
	}
	perModel := r.optional([]string{endpoint, model, leg}, false, "", variant)
	counted := r.optional([]string{endpoint, model, leg}, true, tenant, variant)
	s := &modelSeries{
		labels:           perModel,
		queue:            r.queue.WithLabelValues(perModel...),
		ttfc:             r.ttfc.WithLabelValues(perModel...),
		itl:              r.itl.WithLabelValues(perModel...),
		maxITL:           r.maxITL.WithLabelValues(perModel...),
		e2e:              r.e2e.WithLabelValues(perModel...),
		prefill:          r.prefill.WithLabelValues(perModel...),
		tokensPerEvent:   r.tokensPerEvent.WithLabelValues(perModel...),
		promptTokens:     r.promptTokens.WithLabelValues(counted...),
		outputTokens:     r.outputTokens.WithLabelValues(counted...),
		cachedTokens:     r.cachedTokens.WithLabelValues(counted...),
		cacheWriteTokens: r.cacheWriteTokens.WithLabelValues(counted...),
	}
	actual, _ := r.series.LoadOrStore(k, s)
	return actual.(*modelSeries)
}

// onLabels is tenant and variant, each emptied where its label is off,
// so that such values make no series of their own.
func (r *Recorder) onLabels(tenant, variant string) (string, string) {
	if !r.tenantLabel {
		tenant = ""
	}
	if !r.variantLabel {
		variant = ""
	}
	return tenant, variant
}

// optional appends to lvs the values of the optional labels that are on,
// in their order: tenant (where the series has it) and variant.
func (r *Recorder) optional(lvs []string, hasTenant bool, tenant, variant string) []string {
	if hasTenant && r.tenantLabel {
		lvs = append(lvs, tenant)
	}
	if r.variantLabel {
		lvs = append(lvs, variant)
	}
	return lvs
}

// requestCounter returns the requests_total counter of k.
func (r *Recorder) requestCounter(k requestKey) prometheus.Counter {
	k.tenant, k.variant = r.onLabels(k.tenant, k.variant)
	if c, ok := r.counters.Load(k); ok {
		return c.(prometheus.Counter)
	}
	labels := r.optional([]string{k.endpoint, strconv.FormatBool(k.stream), strconv.Itoa(k.status), k.model, k.leg}, true, k.tenant, k.variant)
	actual, _ := r.counters.LoadOrStore(k, r.requests.WithLabelValues(labels...))
	return actual.(prometheus.Counter)
}

// NewRecorder registers the sidecar's series with reg.
func NewRecorder(reg prometheus.Registerer, opts Options) *Recorder {
	r := &Recorder{
		models:       newBoundedLabel(opts.MaxModels),
		tenants:      newBoundedLabel(opts.MaxTenants),
		variants:     newBoundedLabel(opts.MaxVariants, clean(opts.Variant)),
		tenantLabel:  opts.TenantLabel,
		variantLabel: opts.VariantLabel,
		tracer:       opts.Tracer,
		genai:        opts.GenAI,
		objectives:   opts.Objectives,
		usage:        opts.Usage,
		envelope:     opts.UsageEnvelope,
	}
	// leg: whole, or the prefill or decode leg of a request a router
	// split over two engines (see legOf). The histograms have no tenant.
	perModel := r.optional([]string{"endpoint", "model", "leg"}, false, "", "variant")
	counted := r.optional([]string{"endpoint", "model", "leg"}, true, "tenant", "variant")
	requestLabels := r.optional([]string{"endpoint", "stream", "status", "model", "leg"}, true, "tenant", "variant")
	sloLabels := r.optional([]string{"endpoint", "model", "leg", "result", "objectives"}, true, "tenant", "variant")
	histogram := func(name, help string, buckets []float64, labels ...string) *prometheus.HistogramVec {
		return prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: name, Help: help, Buckets: buckets,
			// Native histograms too, for scrapers that ask for them: they
			// cost a few buckets per series and resolve any quantile.
			NativeHistogramBucketFactor:     1.1,
			NativeHistogramMaxBucketNumber:  160,
			NativeHistogramMinResetDuration: time.Hour,
		}, append(slices.Clip(perModel), labels...))
	}
	r.queue = histogram("timing_sidecar_queue_time_seconds",
		"Time from the sidecar holding the whole request to the engine's response headers, for streamed responses.", latencyBuckets)
	r.ttft = histogram("timing_sidecar_time_to_first_token_seconds",
		"Time from the sidecar holding the whole request to the first token event (as vLLM's histogram; the body field counts from the engine's response headers), by how much of the prompt the engine's prefix cache served: cache none, partial, full (all but at most 16 tokens), or unknown (the engine did not say).", ttftBuckets, "cache")
	r.prefill = histogram("timing_sidecar_prefill_tokens_per_second",
		"Each streamed request's prefill speed: prompt tokens the engine computed (prompt - cached) over arrival to first token, less the engine's own queue time when it reports one. Only from engines that report cached tokens, and with 256 tokens computed or more: a full cache hit is not observed.", prefillBuckets)
	r.ttfc = histogram("timing_sidecar_time_to_first_content_token_seconds",
		"Time from the sidecar holding the whole request to the first content (answer) token event, past any reasoning; for streams.", ttftBuckets)
	r.itl = histogram("timing_sidecar_inter_token_latency_seconds",
		"Each streamed request's mean inter-token latency, per token: (last token event - first token event) / (completion tokens - 1).", itlBuckets)
	r.maxITL = histogram("timing_sidecar_max_inter_token_latency_seconds",
		"Each streamed request's largest gap between two token events; an event may carry several tokens.", itlBuckets)
	r.tokensPerEvent = histogram("timing_sidecar_tokens_per_event",
		"Each streamed request's completion tokens over its token events: above 1 where events carry several tokens (a stream interval, speculative decoding, multi-token prediction).", tokensPerEventBuckets)
	r.e2e = histogram("timing_sidecar_e2e_request_latency_seconds",
		"Time from the sidecar holding the whole request to the end of the response.", latencyBuckets)
	r.requests = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "timing_sidecar_requests_total",
		Help: "Requests handled, by endpoint, streaming, status (499: the client left first) and model."}, requestLabels)
	r.promptTokens = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "timing_sidecar_prompt_tokens_total",
		Help: "Prompt tokens, from the engine's usage."}, counted)
	r.outputTokens = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "timing_sidecar_generation_tokens_total",
		Help: "Generated tokens, from the engine's usage."}, counted)
	r.cachedTokens = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "timing_sidecar_cached_prompt_tokens_total",
		Help: "Prompt tokens the engine read from its prefix cache, from requests whose engine reports them (vLLM and SGLang with their cache reports, llama.cpp, the Responses and Messages APIs). Over timing_sidecar_prompt_tokens_total, which counts every request, it is the cache hit ratio where every request's engine reports."}, counted)
	r.cacheWriteTokens = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "timing_sidecar_cache_write_prompt_tokens_total",
		Help: "Prompt tokens the engine computed and wrote to its prefix cache, from engines that report them (vLLM's created_cache_tokens, the Messages API's cache_creation_input_tokens)."}, counted)
	r.upstreamErrors = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "timing_sidecar_upstream_errors_total",
		Help: "Engine failures by kind: connect, timeout, closed (before headers), bad_response (headers too large, or a stream that cannot be reassembled), interrupted or idle_timeout (mid-body), stream_error (an error event of the engine's own in a stream, with a 5xx or no code)."}, []string{"kind"})
	r.clientDisconnects = prometheus.NewCounter(prometheus.CounterOpts{Name: "timing_sidecar_client_disconnects_total",
		Help: "Requests whose client left before the response was complete; the engine's request was aborted."})
	r.clientPaced = prometheus.NewCounter(prometheus.CounterOpts{Name: "timing_sidecar_client_paced_requests_total",
		Help: "Requests whose client held the engine back 10 ms or more in all (a stalled client, past the stream's read-ahead or with none): their tokens count, their latencies stay out of the histograms and goodput."})
	r.ttftOrigin = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "timing_sidecar_time_to_first_token_origin_total",
		Help: "Streams with output by where their time to first token counts from: accepted (the engine's response headers, which came before its output), engine_queue (arrival plus the engine's own queue time) or arrival (neither told when the engine started: queue time unknown)."},
		[]string{"endpoint", "origin"})
	r.unread = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "timing_sidecar_unread_requests_total",
		Help: "Chat and completions requests forwarded without being read or edited, and answered without the metrics object, by reason: repeated_member (a member the sidecar reads or edits came twice), not_understood (not a JSON object, nested too deep, a field of the wrong type), no_memory (no room in --max-body-memory)."}, []string{"reason"})
	r.panics = prometheus.NewCounter(prometheus.CounterOpts{Name: "timing_sidecar_panics_total",
		Help: "Panics caught while serving a request; each answered that request with a 500 or cut its response, and was logged with its stack."})
	r.inFlight = prometheus.NewGauge(prometheus.GaugeOpts{Name: "timing_sidecar_in_flight_requests",
		Help: "Requests being handled now."})
	r.slo = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "timing_sidecar_slo_requests_total",
		Help: "Requests judged against their latency objectives: result met or missed; objectives flags (--slo-ttft, --slo-itl, --slo-e2e) or request (at least one from the request's own headers, --slo-ttft-header, --slo-itl-header). met / (met + missed) is goodput."},
		sloLabels)
	r.invalidObjectives = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "timing_sidecar_invalid_objectives_total",
		Help: "Requests whose objective header (ttft or itl) held no usable objective (not a positive number of milliseconds up to an hour): judged by the flags instead."},
		[]string{"objective"})
	r.engineReady = prometheus.NewGauge(prometheus.GaugeOpts{Name: "timing_sidecar_engine_ready",
		Help: "1 when the last readiness probe of the engine succeeded, 0 otherwise (as /readyz answers)."})
	r.relayDelay = prometheus.NewHistogram(prometheus.HistogramOpts{Name: "timing_sidecar_relay_delay_seconds",
		Help: "The sidecar's own delay on each stream event: from the kernel receiving it from the engine to its hand-over to the client's socket. Under a CPU limit, the figure that shows the sidecar starved.",
		// Classic buckets only: observed per event, where a native
		// histogram's first use of a bucket would allocate.
		Buckets: relayDelayBuckets})
	r.kernelTimestamps = prometheus.NewGauge(prometheus.GaugeOpts{Name: "timing_sidecar_kernel_timestamps",
		Help: "1 when timing marks are the kernel's receive times of the bytes that completed them, 0 when they are the clock at each read (no kernel stamps on this platform, or --kernel-timestamps=false)."})
	if opts.KernelTimestamps {
		r.kernelTimestamps.Set(1)
	}
	// Every kind exists from the start, at 0: a healthy system shows 0
	// failures on the dashboard and in the recording rules, not "no
	// data", and rate() over a first failure sees its increase.
	for _, kind := range []string{ErrorConnect, ErrorTimeout, ErrorClosed, ErrorBadResponse, ErrorInterrupted, ErrorIdleTimeout, ErrorStream} {
		r.upstreamErrors.WithLabelValues(kind)
	}
	for _, reason := range []string{UnreadRepeated, UnreadInvalid, UnreadNoMemory} {
		r.unread.WithLabelValues(reason)
	}
	for _, objective := range []string{missedTTFT, missedITL} {
		r.invalidObjectives.WithLabelValues(objective)
	}
	if opts.AccessLog != nil {
		r.access = newAccessLog(opts.AccessLog, opts.Log, reg, r.Panic)
	}
	reg.MustRegister(r.queue, r.ttft, r.ttfc, r.itl, r.maxITL, r.tokensPerEvent, r.e2e, r.prefill, r.requests, r.promptTokens, r.outputTokens, r.cachedTokens, r.cacheWriteTokens,
		r.upstreamErrors, r.clientDisconnects, r.clientPaced, r.ttftOrigin, r.unread, r.panics, r.inFlight, r.slo, r.invalidObjectives, r.engineReady, r.relayDelay, r.kernelTimestamps)
	return r
}

// Flush writes the access-log lines pending now.
func (r *Recorder) Flush() {
	if r.access != nil {
		r.access.Flush()
	}
}

// Close writes the access-log lines pending and stops its writer, within
// ctx: at shutdown, after the last request.
func (r *Recorder) Close(ctx context.Context) {
	if r.access != nil {
		r.access.Close(ctx)
	}
}

// EngineReady records the last readiness probe's result.
func (r *Recorder) EngineReady(ready bool) {
	if ready {
		r.engineReady.Set(1)
	} else {
		r.engineReady.Set(0)
	}
}

// RelayDelay records the sidecar's own delay on one stream event. It runs
// per event: one unlabelled histogram, no allocation.
func (r *Recorder) RelayDelay(d time.Duration) { r.relayDelay.Observe(d.Seconds()) }

// Panic counts a panic caught at a request's boundary.
func (r *Recorder) Panic() { r.panics.Inc() }

// Begin counts a request in flight; every Begin is followed by one Finish.
func (r *Recorder) Begin() { r.inFlight.Inc() }

// Finish records a finished request. It first cleans, in place, the
// strings req holds from the client (see clean), so that neither the
// series nor the access log ever gets them raw.
func (r *Recorder) Finish(req *Record) {
	if r.tracer != nil {
		// Deferred: a panic below still ends (and exports) the spans.
		// Only when tracing is on: off, it costs nothing here.
		defer r.tracer.End(req, time.Now())
	}
	r.inFlight.Dec()
	req.ID, req.Method, req.Path = clean(req.ID), clean(req.Method), clean(req.Path)
	req.Model, req.Tenant, req.Variant = clean(req.Model), clean(req.Tenant), clean(req.Variant)
	served := req.Status >= 200 && req.Status < 300
	model := r.models.value(req.Model, served)
	tenant := r.tenants.value(req.Tenant, served)
	variant := r.variants.value(req.Variant, served)
	leg := legOf(req)
	r.requestCounter(requestKey{req.Endpoint, model, leg, tenant, variant, req.Status, req.Stream}).Inc()
	if req.UpstreamError != "" {
		r.upstreamErrors.WithLabelValues(req.UpstreamError).Inc()
	}
	if req.ClientGone {
		r.clientDisconnects.Inc()
	}
	if req.ClientPaced {
		r.clientPaced.Inc()
	}
	if req.Unread != "" {
		r.unread.WithLabelValues(req.Unread).Inc()
	}
	var figures genaiObservation
	if req.Measured {
		r.observe(req, model, tenant, variant, &figures)
	}
	if r.genai != nil {
		r.observeGenAI(req, model, tenant, variant, &figures)
	}
	if req.AskedInvalid&ObjectiveTTFT != 0 {
		r.invalidObjectives.WithLabelValues(missedTTFT).Inc()
	}
	if req.AskedInvalid&ObjectiveITL != 0 {
		r.invalidObjectives.WithLabelValues(missedITL).Inc()
	}
	j := r.judge(req)
	if j.verdict != Undecided {
		r.countJudgement(&j, r.optional([]string{req.Endpoint, model, leg, j.verdict.String(), j.source}, true, tenant, variant))
	}
	now := time.Now()
	if r.usage != nil && req.UsageID != "" {
		r.endUsage(req, now)
	}
	if r.access != nil {
		r.access.add(now, req, &j)
	}
}

// judgement is a request's verdict and what it was judged by.
type judgement struct {
	verdict Verdict
	missed  string     // the objectives missed, as Judge says them
	by      Objectives // the objectives that applied
	source  string     // ObjectivesFlags or ObjectivesRequest
}

// countJudgement counts a judged request in the goodput counter, lvs
// being its labels' values. The other result exists too, at 0: goodput's
// "missed" side reads 0 on a healthy system, not "no data".
func (r *Recorder) countJudgement(j *judgement, lvs []string) {
	r.slo.WithLabelValues(lvs...).Inc()
	other := Missed
	if j.verdict == Missed {
		other = Met
	}
	lvs[3] = other.String() // the result's place in sloLabels
	r.slo.WithLabelValues(lvs...)
}

// judge judges req by the flags' objectives, or the ones it asked for.
func (r *Recorder) judge(req *Record) judgement {
	by, asked := r.objectives.With(req.Asked)
	j := judgement{by: by, source: ObjectivesFlags}
	if asked {
		j.source = ObjectivesRequest
	}
	j.verdict, j.missed = by.Judge(req)
	return j
}

// observe records a measured request's figures into the Prometheus series
// and gives o the same figures, in the same units, for the GenAI metrics:
// one reading, so the two agree.
func (r *Recorder) observe(req *Record, model, tenant, variant string, o *genaiObservation) {
	m := &req.Metrics
	s := r.seriesFor(req.Endpoint, model, legOf(req), tenant, variant)
	if c := m.PromptTokens; c.Set {
		s.promptTokens.Add(float64(c.Value))
		o.input, o.hasInput = c.Value, true
	}
	if c := m.CompletionTokens; c.Set {
		s.outputTokens.Add(float64(c.Value))
		o.output, o.hasOutput = c.Value, true
	}
	if m.Cache != timing.CacheUnknown {
		s.cachedTokens.Add(float64(m.CachedTokens.Value))
		o.cached, o.hasCached = m.CachedTokens.Value, true
	}
	if c := m.CacheWriteTokens; c.Set {
		s.cacheWriteTokens.Add(float64(c.Value))
	}
	if m.FirstTokenAfterArrival.Set {
		r.ttftOrigin.WithLabelValues(req.Endpoint, m.TTFTFrom.String()).Inc()
	}
	if p := m.TokensPerEvent; p.Set {
		s.tokensPerEvent.Observe(p.Value) // the engine's events, however the client reads
	}
	if !req.ClientPaced {
		// A paced request's latencies are the client's pace as much as
		// the engine's: its tokens count, its latencies do not.
		if ttft, ok := req.timeToFirstToken(); ok {
			o.ttft, o.hasTTFT = ttft/1000, true
			r.ttftOf(s, m.Cache).Observe(o.ttft)
		}
		if ttfc, ok := req.timeToFirstContent(); ok {
			s.ttfc.Observe(ttfc / 1000)
		}
		if p := m.PrefillTokensPerSecond; p.Set {
			s.prefill.Observe(p.Value)
		}
		observeMillis(s.queue, m.QueueTime)
		o.tpot, o.hasTPOT = observeMillis(s.itl, m.MeanITL)
		observeMillis(s.maxITL, m.MaxITL)
		o.duration, o.hasDuration = observeMillis(s.e2e, m.E2ELatency)
	}
}

// observeGenAI records a request to a GenAI endpoint in the conventions'
// metrics, measured or not. A successful answer gets the figures its
// Prometheus series got (o). A failed one gets its duration with
// error.type, and its tokens when known, but neither time to first token
// nor time per output token: the conventions define those for successful
// responses only, and a failure's duration is what lets an error rate be
// read from gen_ai.server.request.duration.
func (r *Recorder) observeGenAI(req *Record, model, tenant, variant string, o *genaiObservation) {
	if req.Endpoint == EndpointOther {
		return // not a GenAI operation
	}
	o.endpoint, o.model, o.errorType, o.leg = req.Endpoint, model, errorType(req), legOf(req)
	if r.tenantLabel {
		o.tenant = tenant
	}
	if r.variantLabel {
		o.variant = variant
	}
	if req.ResponseModel != "" {
		// Only a value the request models admitted: a response model
		// never takes a slot, so the Prometheus labels are the same
		// with the GenAI metrics on or off.
		o.responseModel = r.models.value(clean(req.ResponseModel), false)
	}
	if o.errorType != "" {
		o.hasTTFT, o.hasTPOT = false, false
		// Every failure, paced or not: the failures counted here are
		// those the Prometheus counters count.
		o.duration, o.hasDuration = failedDuration(req)
	}
	r.genai.record(o, genaiAttributes{tenant: r.tenantLabel, variant: r.variantLabel})
}

// failedDuration is a failed request's duration in seconds: its measured
// end-to-end latency, the figure its Prometheus histogram got, or else
// arrival to the end of its answer (Elapsed), which an unmeasured request
// has too. A record with neither has no duration: none is made up.
func failedDuration(req *Record) (float64, bool) {
	if e := req.Metrics.E2ELatency; req.Measured && e.Set {
		return e.Value / 1000, true
	}
	if req.Elapsed > 0 {
		return req.Elapsed.Seconds(), true
	}
	return 0, false
}

// observeMillis observes a figure in milliseconds, if known, in seconds,
// and returns what it observed.
func observeMillis(o prometheus.Observer, n timing.Number) (float64, bool) {
	if !n.Set {
		return 0, false
	}
	o.Observe(n.Value / 1000)
	return n.Value / 1000, true
}

// log writes the access-log line: what was asked, what came back and the
// timing, never the prompt, the output or credentials.
