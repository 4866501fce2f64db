package telemetry

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.41.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/timing-sidecar/timing-sidecar/timing"
)

// OTLP protocols.
const (
	ProtocolGRPC = "grpc"
	ProtocolHTTP = "http/protobuf"
	// DefaultProtocol is vLLM's, for traces and metrics alike: the one
	// endpoint setting in a pod then serves the engine and the sidecar.
	// (The OpenTelemetry specification's SDK default is http/protobuf;
	// set the protocol to use it.)
	DefaultProtocol = ProtocolGRPC
	// DefaultServiceName is service.name unless OTEL_SERVICE_NAME or
	// OTEL_RESOURCE_ATTRIBUTES say otherwise.
	DefaultServiceName = "timing-sidecar"
)

// Tracer makes a span pair for each measured request and sends them to
// an OTLP backend. A nil *Tracer is tracing off: every method is a no-op
// and costs a nil check.
type Tracer struct {
	provider *sdktrace.TracerProvider
	tracer   trace.Tracer
	queue    *spanQueue
	prop     propagation.TraceContext
}

// NewTracer starts a tracer as o says, or returns nil when tracing is
// off. The sampler is the SDK's: OTEL_TRACES_SAMPLER and _ARG, parent-based
// always-on by default, so a sampled client trace is always continued.
// OTEL_EXPORTER_OTLP_HEADERS, _TIMEOUT, _COMPRESSION, _CERTIFICATE and
// their _TRACES_ variants are the exporter's own.
func NewTracer(o OTLP, reg prometheus.Registerer, log *slog.Logger) (*Tracer, error) {
	if !o.Traces.On {
		return nil, nil
	}
	exporter := o.SpanExporter
	if exporter == nil {
		var err error
		if exporter, err = otlpSpanExporter(o.Traces); err != nil {
			return nil, err
		}
	}
	handleOTelErrors(log)
	q := newSpanQueue(exporter, reg, log)
	provider := sdktrace.NewTracerProvider(sdktrace.WithResource(o.Resource), sdktrace.WithSpanProcessor(q))
	return &Tracer{
		provider: provider,
		tracer:   provider.Tracer("github.com/timing-sidecar/timing-sidecar", trace.WithSchemaURL(semconv.SchemaURL)),
		queue:    q,
	}, nil
}

// otlpSpanExporter makes the OTLP exporter for s's protocol. It connects
// lazily: a collector that is down at start costs nothing until spans
// are exported.
func otlpSpanExporter(s Signal) (sdktrace.SpanExporter, error) {
	if s.Protocol == ProtocolHTTP {
		var opts []otlptracehttp.Option
		if s.Endpoint != "" {
			opts = append(opts, otlptracehttp.WithEndpointURL(s.Endpoint))
		}
		return otlptracehttp.New(context.Background(), opts...)
	}
	var opts []otlptracegrpc.Option
	if s.Endpoint != "" {
		opts = append(opts, otlptracegrpc.WithEndpointURL(s.Endpoint))
	}
	return otlptracegrpc.New(context.Background(), opts...)
}

// Shutdown exports the spans still queued, within ctx.
func (t *Tracer) Shutdown(ctx context.Context) error {
	if t == nil {
		return nil
	}
	return t.provider.Shutdown(ctx)
}

// ForceFlush exports the spans queued so far.
func (t *Tracer) ForceFlush(ctx context.Context) error {
	if t == nil {
		return nil
	}
	return t.provider.ForceFlush(ctx)
}

// handleOTelErrors sends the SDK's own errors (a failed export among
// them) to log, rarely. The SDK has one handler per process, for traces
// and metrics alike; the last logger given is the one it writes to.
func handleOTelErrors(log *slog.Logger) {
	otelErrors.mu.Lock()
	otelErrors.log = log
	otelErrors.mu.Unlock()
	otelErrorsOnce.Do(func() { otel.SetErrorHandler(&otelErrors) })
}

var (
	otelErrors     rareErrors
	otelErrorsOnce sync.Once
)

// rareErrors logs the SDK's own errors (a gRPC connection refused, an
// attribute over a limit) at most once a minute.
type rareErrors struct {
	log  *slog.Logger
	mu   sync.Mutex
	last time.Time
	lost int
}

func (h *rareErrors) Handle(err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if time.Since(h.last) < exportReportInterval {
		h.lost++
		return
	}
	h.log.Warn("OpenTelemetry error", "err", err, "not_logged_since_last", h.lost)
	h.last, h.lost = time.Now(), 0
}

// attrSlices holds attribute slices for reuse: the span copies what it is given.
var attrSlices = sync.Pool{New: func() any {
	a := make([]attribute.KeyValue, 0, 64)
	return &a
}}

// Trace is one measured request's spans and what they will say. The zero
// Trace is off. The proxy fills it as the request goes; the Recorder ends
// it with the record.
type Trace struct {
	server, client trace.Span
	ctx            context.Context
	// Sent is when the request went to the engine; EngineStatus is the
	// status the engine answered with (0 if it did not).
	Sent         time.Time
	EngineStatus int
	// EngineAddress and EnginePort are the engine's (server.* of the
	// CLIENT span); Address and Port are what the client called (the
	// SERVER span's).
	EngineAddress, Address string
	EnginePort, Port       int
	Sampling               Sampling
	Answer                 Answer
	// Clock is the request's marks, for the span times and events.
	Clock timing.Clock
}

// Sampling is the generation settings a request asked for, as GenAI
// spans name them (gen_ai.request.*). A false Has* means the field was
// not sent.
type Sampling struct {
	MaxTokens                             int64
	Temperature, TopP                     float64
	HasMaxTokens, HasTemperature, HasTopP bool
}

// Answer is what a response said of itself: its id, the model that
// answered, and why each choice ended.
type Answer struct {
	ID, Model     string
	FinishReasons []string
}

// On tells whether the request is traced.
func (tr *Trace) On() bool { return tr.server != nil }

// ID is the request's trace id in hex, or empty when it is not traced.
func (tr *Trace) ID() string {
	if tr.server == nil {
		return ""
	}
	return tr.server.SpanContext().TraceID().String()
}

// Begin starts a measured request's SERVER span at its arrival, as a
// child of the trace context incoming carries (traceparent, tracestate)
// when there is one.
func (t *Tracer) Begin(tr *Trace, incoming propagation.TextMapCarrier, arrival time.Time, endpoint, model string) {
	if t == nil {
		return
	}
	op := operation(endpoint)
	name := op.Value.AsString()
	if model != "" {
		name += " " + clean(model)
	}
	ctx := t.prop.Extract(context.Background(), incoming)
	tr.ctx, tr.server = t.tracer.Start(ctx, name, trace.WithSpanKind(trace.SpanKindServer), trace.WithTimestamp(arrival),
		trace.WithAttributes(op, provider(endpoint)))
}

// Send starts the CLIENT span of the exchange with the engine at sent, and
// writes its context into outgoing, the request to the engine: the
// engine's own span (vLLM's llm_request) then nests beneath it.
func (t *Tracer) Send(tr *Trace, outgoing propagation.TextMapCarrier, sent time.Time, method, path string) {
	if t == nil || tr.server == nil {
		return
	}
	var ctx context.Context
	ctx, tr.client = t.tracer.Start(tr.ctx, clientSpanName(method, path), trace.WithSpanKind(trace.SpanKindClient), trace.WithTimestamp(sent))
	tr.Sent = sent
	t.prop.Inject(ctx, outgoing)
}

// End ends a record's spans: the CLIENT span when the engine's body ended
// (the clock's done mark, or now if it never was), the SERVER span now,
// as the response is handed to the client's connection.
func (t *Tracer) End(r *Record, now time.Time) {
	tr := &r.Trace
	if t == nil || tr.server == nil {
		return
	}
	defer func() { *tr = Trace{} }()
	if !tr.server.IsRecording() {
		// Sampled out: nothing is recorded, nothing to build.
		if tr.client != nil {
			tr.client.End()
		}
		tr.server.End()
		return
	}
	if tr.client != nil {
		end := tr.Clock.Done
		if end.IsZero() || end.Before(tr.Sent) {
			end = now
		}
		buf := attrSlices.Get().(*[]attribute.KeyValue)
		*buf = clientAttributes((*buf)[:0], r)
		tr.client.SetAttributes(*buf...)
		clear(*buf)
		attrSlices.Put(buf)
		if kind := clientError(r); kind != "" {
			tr.client.SetStatus(codes.Error, kind)
		}
		tr.client.End(trace.WithTimestamp(end))
	}
	for _, e := range spanEvents(&tr.Clock) {
		tr.server.AddEvent(e.name, trace.WithTimestamp(e.at))
	}
	buf := attrSlices.Get().(*[]attribute.KeyValue)
	*buf = serverAttributes((*buf)[:0], r)
	tr.server.SetAttributes(*buf...) // copied: the slice is reused
	clear(*buf)
	attrSlices.Put(buf)
	if kind := serverError(r); kind != "" {
		tr.server.SetStatus(codes.Error, kind)
	}
	tr.server.End(trace.WithTimestamp(now))
}
