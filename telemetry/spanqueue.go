package telemetry

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// spanQueue is the span processor between finished requests and the
// exporter: a bounded queue, drained in batches by one goroutine. It does
// what the SDK's BatchSpanProcessor does, and one thing that one cannot:
// count the spans it drops. A request never waits on it: a full queue
// drops the span (timing_sidecar_trace_spans_dropped_total{reason=
// "queue_full"}), and an export that fails loses its batch
// (reason="export_failed"); either is logged at most once a minute.
//
// Its sizes follow the standard OTEL_BSP_* variables, so a user tunes it
// as any OpenTelemetry SDK's batch processor.
type spanQueue struct {
	exporter sdktrace.SpanExporter
	spans    chan sdktrace.ReadOnlySpan
	batch    int
	delay    time.Duration
	timeout  time.Duration

	exported          prometheus.Counter
	queueFull, failed prometheus.Counter
	log               *slog.Logger

	// droppedFull counts queue-full drops since the last report; the
	// loop reports them, so request goroutines only add.
	droppedFull atomic.Int64
	lastReport  time.Time
	failedSince int
	lastErr     error

	// base is the context of every export but the last; Shutdown cancels
	// it when its own context ends, so an export stuck on a collector
	// that does not answer cannot hold the exit past the grace.
	base     context.Context
	cancel   context.CancelFunc
	flushes  chan chan struct{}
	stop     chan context.Context
	done     chan struct{}
	stopped  atomic.Bool
	stopOnce sync.Once
}

// Defaults of the OTEL_BSP_* variables, as the specification gives them,
// except the delay: a second, not five, so a trace shows up while its
// request is still on the user's mind.
const (
	defaultQueueSize     = 2048
	defaultBatchSize     = 512
	defaultBatchDelay    = time.Second
	defaultExportTimeout = 30 * time.Second
	exportReportInterval = time.Minute
)

func newSpanQueue(exporter sdktrace.SpanExporter, reg prometheus.Registerer, log *slog.Logger) *spanQueue {
	size := envInt("OTEL_BSP_MAX_QUEUE_SIZE", defaultQueueSize)
	batch := min(envInt("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", defaultBatchSize), size)
	dropped := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "timing_sidecar_trace_spans_dropped_total",
		Help: "Spans not exported: the queue was full (reason=queue_full) or the export failed (reason=export_failed).",
	}, []string{"reason"})
	exported := prometheus.NewCounter(prometheus.CounterOpts{
		Name: "timing_sidecar_trace_spans_exported_total",
		Help: "Spans the trace backend accepted.",
	})
	dropped.WithLabelValues("queue_full")    // at 0 from the start, as every
	dropped.WithLabelValues("export_failed") // reason the sidecar counts
	reg.MustRegister(dropped, exported)
	q := &spanQueue{
		exporter:  exporter,
		spans:     make(chan sdktrace.ReadOnlySpan, size),
		batch:     batch,
		delay:     time.Duration(envInt("OTEL_BSP_SCHEDULE_DELAY", int(defaultBatchDelay/time.Millisecond))) * time.Millisecond,
		timeout:   time.Duration(envInt("OTEL_BSP_EXPORT_TIMEOUT", int(defaultExportTimeout/time.Millisecond))) * time.Millisecond,
		exported:  exported,
		queueFull: dropped.WithLabelValues("queue_full"),
		failed:    dropped.WithLabelValues("export_failed"),
		log:       log,
		flushes:   make(chan chan struct{}),
		stop:      make(chan context.Context),
		done:      make(chan struct{}),
	}
	q.base, q.cancel = context.WithCancel(context.Background())
	go q.run()
	return q
}

// envInt reads a positive integer variable; anything else is the default.
func envInt(name string, def int) int {
	if n, err := strconv.Atoi(os.Getenv(name)); err == nil && n > 0 {
		return n
	}
	return def
}

func (q *spanQueue) OnStart(context.Context, sdktrace.ReadWriteSpan) {}

// OnEnd queues a finished span, or drops it when the queue is full.
func (q *spanQueue) OnEnd(s sdktrace.ReadOnlySpan) {
	if !s.SpanContext().IsSampled() {
		return
	}
	if q.stopped.Load() {
		q.queueFull.Inc()
		return
	}
	select {
	case q.spans <- s:
	default:
		q.queueFull.Inc()
		q.droppedFull.Add(1)
	}
}

func (q *spanQueue) run() {
	defer close(q.done)
	batch := make([]sdktrace.ReadOnlySpan, 0, q.batch)
	tick := time.NewTicker(q.delay)
	defer tick.Stop()
	export := func(ctx context.Context) {
		if len(batch) > 0 {
			q.export(ctx, batch)
			clear(batch) // the spans go to the collector, not stay here
			batch = batch[:0]
		}
		q.report()
	}
	for {
		select {
		case s := <-q.spans:
			batch = append(batch, s)
			if len(batch) == q.batch {
				export(q.base)
			}
		case <-tick.C:
			export(q.base)
		case flushed := <-q.flushes:
			q.drain(q.base, &batch)
			export(q.base)
			close(flushed)
		case ctx := <-q.stop:
			q.drain(ctx, &batch)
			export(ctx)
			return
		}
	}
}

// drain exports everything queued, in batches.
func (q *spanQueue) drain(ctx context.Context, batch *[]sdktrace.ReadOnlySpan) {
	for {
		select {
		case s := <-q.spans:
			*batch = append(*batch, s)
			if len(*batch) == q.batch {
				q.export(ctx, *batch)
				clear(*batch)
				*batch = (*batch)[:0]
			}
		default:
			return
		}
	}
}

func (q *spanQueue) export(ctx context.Context, batch []sdktrace.ReadOnlySpan) {
	ctx, cancel := context.WithTimeout(ctx, q.timeout)
	defer cancel()
	if err := q.exporter.ExportSpans(ctx, batch); err != nil {
		q.failed.Add(float64(len(batch)))
		q.failedSince += len(batch)
		q.lastErr = err
		return
	}
	q.exported.Add(float64(len(batch)))
}

// report logs what was lost since the last report, at most once a minute:
// a collector that is down for an hour costs sixty lines, not one per
// batch.
func (q *spanQueue) report() {
	if q.failedSince == 0 && q.droppedFull.Load() == 0 || time.Since(q.lastReport) < exportReportInterval {
		return
	}
	full := q.droppedFull.Swap(0)
	q.log.Warn("trace spans were dropped", "export_failed", q.failedSince, "queue_full", full, "last_error", errString(q.lastErr))
	q.failedSince, q.lastErr, q.lastReport = 0, nil, time.Now()
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// ForceFlush exports everything queued so far.
func (q *spanQueue) ForceFlush(ctx context.Context) error {
	if q.stopped.Load() {
		return nil
	}
	flushed := make(chan struct{})
	select {
	case q.flushes <- flushed:
	case <-ctx.Done():
		return ctx.Err()
	case <-q.done:
		return nil
	}
	select {
	case <-flushed:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Shutdown exports what is queued, within ctx, and shuts the exporter
// down. Spans that end later are dropped.
func (q *spanQueue) Shutdown(ctx context.Context) error {
	var err error
	q.stopOnce.Do(func() {
		q.stopped.Store(true)
		// When ctx ends, so does the export in flight, and the loop
		// takes the stop; exports after that fail at once.
		stop := context.AfterFunc(ctx, q.cancel)
		defer stop()
		// Bounded by ctx even against an exporter that ignores its own.
		select {
		case q.stop <- ctx:
			select {
			case <-q.done:
			case <-ctx.Done():
			}
		case <-ctx.Done():
		}
		q.cancel()
		err = errors.Join(ctx.Err(), q.exporter.Shutdown(ctx))
	})
	return err
}
