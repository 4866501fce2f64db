// Package usage delivers the usage records: one per request forwarded to
// the engine, written to the spool as the request starts and ends, and
// sent from there to each sink at least once.
package usage

import (
	"context"
	"errors"
	"log/slog"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/timing-sidecar/timing-sidecar/telemetry/spool"
)

// Delivery's pace: a batch is up to maxBatch records or about
// maxBatchBytes; a failed one is sent again after a backoff that doubles
// from minBackoff to maxBackoff, each wait drawn between half and all of
// it (jitter: sidecars that lost one receiver together do not return to
// it together).
const (
	maxBatch      = 500
	maxBatchBytes = 1 << 20
	minBackoff    = 250 * time.Millisecond
	maxBackoff    = 30 * time.Second
	// reportEvery bounds the operational log's reports of failed
	// deliveries and refusals.
	reportEvery = time.Minute
)

// Refusal reasons, as the "reason" label says them.
const (
	RefusedFull     = "spool_full"   // past --usage-spool-max-size
	RefusedWrite    = "write_failed" // the filesystem refused the write (full, or failing)
	RefusedClosed   = "closed"       // the request ended after the spool closed, past the shutdown grace
	RefusedRejected = "rejected"     // the sink refused the record itself (see delivery.deliver), or an OTLP partial success counted it refused
	RefusedBehind   = "sink_behind"  // the sink fell so far behind that the spool gave its oldest records back, for the other sink's sake
)

// Options configures the records.
type Options struct {
	Spool spool.Options
	Sinks []Sink
	Log   *slog.Logger
}

// Records takes the usage records into the spool and delivers them.
type Records struct {
	spool      *spool.Spool
	deliveries []*delivery
	log        *slog.Logger

	produced, refused *prometheus.CounterVec
	sinkNames         []string
	// producedBySink is each sink's produced counter, resolved once.
	producedBySink []prometheus.Counter

	// refusals reports refused records.
	refusals reporter

	// stopped ends the deliveries, and a batch being sent.
	stopped context.Context
	stop    context.CancelFunc
	done    sync.WaitGroup
	closing sync.Once
}

// Open opens the spool, recovers what an earlier process left in it, and
// starts one delivery per sink.
func Open(opts Options, reg prometheus.Registerer) (*Records, error) {
	for _, s := range opts.Sinks {
		opts.Spool.Readers = append(opts.Spool.Readers, s.Name())
	}
	failures := &reporter{log: opts.Log}
	opts.Spool.Failed = func(err error) { failures.report("usage spool: a segment could not be begun or synced", "err", err) }
	sp, rec, err := spool.Open(opts.Spool)
	if err != nil {
		return nil, err
	}
	r := &Records{spool: sp, log: opts.Log, refusals: reporter{log: opts.Log},
		produced: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "timing_sidecar_usage_records_produced_total",
			Help: "Usage records taken for each sink: one per request forwarded to the engine, and those found in the spool at start (recovered). produced = delivered + spooled + refused."}, []string{"sink"}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "timing_sidecar_usage_records_refused_total",
			Help: "Usage records not delivered, by reason: spool_full (past --usage-spool-max-size), write_failed (the filesystem refused the write, or a failed sync could not be recovered), closed (the request ended past the shutdown grace), rejected (the sink refused the record itself), sink_behind (the sink fell so far behind that the spool gave its oldest records back for the other sink)."}, []string{"sink", "reason"}),
	}
	recovered := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "timing_sidecar_usage_records_recovered_total",
		Help: "Usage records found in the spool at start, not yet delivered (counted in produced too); lost ones among them."}, []string{"sink"})
	lost := prometheus.NewCounter(prometheus.CounterOpts{Name: "timing_sidecar_usage_records_lost_total",
		Help: "Requests found started and never ended in the spool at start (the process ended first): each delivered with end sidecar_lost and unknown counts."})
	corrupt := prometheus.NewCounter(prometheus.CounterOpts{Name: "timing_sidecar_usage_spool_corrupt_bytes_total",
		Help: "Bytes cut from the spool at start where a frame did not check: a write a kill cut short."})
	delivered := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "timing_sidecar_usage_records_delivered_total",
		Help: "Usage records the sink acknowledged."}, []string{"sink"})
	retried := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "timing_sidecar_usage_records_retried_total",
		Help: "Usage records sent again after a failed delivery (an error, a non-2xx answer, a timeout)."}, []string{"sink"})
	bytes := prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "timing_sidecar_usage_spool_bytes",
		Help: "Bytes the usage spool holds on disk."}, func() float64 { return float64(sp.Size()) })
	reg.MustRegister(r.produced, r.refused, recovered, lost, corrupt, delivered, retried, bytes)
	r.stopped, r.stop = context.WithCancel(context.Background())
	lost.Add(float64(rec.Lost))
	corrupt.Add(float64(rec.Corrupt))
	for _, s := range opts.Sinks {
		name := s.Name()
		reader := sp.Reader(name)
		reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "timing_sidecar_usage_records_spooled",
			Help: "Usage records in the spool that the sink has not acknowledged.", ConstLabels: prometheus.Labels{"sink": name}},
			func() float64 { return float64(reader.Pending()) }))
		r.produced.WithLabelValues(name).Add(float64(rec.Pending[name]))
		recovered.WithLabelValues(name).Add(float64(rec.Pending[name]))
		for _, reason := range []string{RefusedFull, RefusedWrite, RefusedClosed, RefusedRejected, RefusedBehind} {
			r.refused.WithLabelValues(name, reason)
		}
		r.sinkNames = append(r.sinkNames, name)
		r.producedBySink = append(r.producedBySink, r.produced.WithLabelValues(name))
		d := &delivery{sink: s, reader: reader, stopped: r.stopped, kick: make(chan struct{}, 1),
			retrying: reporter{log: opts.Log}, rejects: reporter{log: opts.Log}, saves: reporter{log: opts.Log},
			partials: reporter{log: opts.Log}, behind: reporter{log: opts.Log},
			delivered: delivered.WithLabelValues(name), retried: retried.WithLabelValues(name),
			rejected: r.refused.WithLabelValues(name, RefusedRejected), skipped: r.refused.WithLabelValues(name, RefusedBehind)}
		r.deliveries = append(r.deliveries, d)
		r.done.Go(d.run)
	}
	if rec.Lost > 0 || rec.Corrupt > 0 {
		opts.Log.Warn("usage spool: the last process ended with requests in flight; each is delivered with end sidecar_lost",
			"lost", rec.Lost, "corrupt_bytes", rec.Corrupt)
	}
	return r, nil
}

// Sinks names the sinks the records go to.
func (r *Records) Sinks() []string { return r.sinkNames }

// Start spools the record a request gets if the process ends before it
// does. A refusal is not counted: the request's end still is.
func (r *Records) Start(id string, record []byte) {
	r.spool.Append(spool.Start, id, record) //nolint:errcheck // see above
}

// End spools a request's record. It never blocks on a sink; a record the
// spool refuses is counted, and reported on the operational log at most
// once a minute.
func (r *Records) End(id string, record []byte) {
	err := r.spool.Append(spool.End, id, record)
	for _, c := range r.producedBySink {
		c.Inc()
	}
	if err == nil {
		return
	}
	r.spool.Cancel(id)
	reason := RefusedWrite
	switch {
	case errors.Is(err, spool.ErrFull):
		reason = RefusedFull
	case errors.Is(err, spool.ErrClosed):
		reason = RefusedClosed
	}
	for _, name := range r.sinkNames {
		r.refused.WithLabelValues(name, reason).Inc()
	}
	r.refusals.report("usage records refused: the spool cannot take them; they are not delivered", "reason", reason, "err", err)
}

// reporter logs a kind of failure at most once a minute, with how many
// there were since the last report.
type reporter struct {
	log   *slog.Logger
	mu    sync.Mutex
	since int
	last  time.Time
}

func (p *reporter) report(msg string, args ...any) {
	p.mu.Lock()
	p.since++
	due := time.Since(p.last) >= reportEvery
	count := p.since
	if due {
		p.since, p.last = 0, time.Now()
	}
	p.mu.Unlock()
	if due {
		p.log.Error(msg, append(args, "count", count)...)
	}
}

// Close delivers what the spool holds until every sink has it or ctx is
// done, then stops the deliveries and closes the spool: what is left
// stays there for the next start on the same directory, and is returned
// per sink.
func (r *Records) Close(ctx context.Context) map[string]int {
	r.closing.Do(func() {
		// Readers are handed what is synced: what is spooled now goes
		// out in the drain, not at the next tick.
		r.spool.Sync() //nolint:errcheck // Failed hears of it; what is not synced stays for the next start
		for _, d := range r.deliveries {
			d.drain(ctx)
		}
		r.stop()
		r.done.Wait()
		for _, d := range r.deliveries {
			d.sink.Close(ctx) //nolint:errcheck // nothing left to send
		}
		if err := r.spool.Close(); err != nil {
			r.log.Warn("usage spool: the last sync failed", "err", err)
		}
	})
	left := map[string]int{}
	for _, d := range r.deliveries {
		if n := d.reader.Pending(); n > 0 {
			left[d.sink.Name()] = n
		}
	}
	return left
}

// delivery sends one sink's records, in order, from the spool.
type delivery struct {
	sink   Sink
	reader *spool.Reader
	// stopped ends the delivery, and the batch being sent.
	stopped context.Context
	// kick ends a backoff early: at shutdown, the last tries go at once.
	kick chan struct{}
	// Each kind of failure is reported apart, at most once a minute.
	retrying, rejects, saves, partials, behind reporter

	delivered, retried, rejected, skipped prometheus.Counter
}

func (d *delivery) run() {
	backoff := time.Duration(0)
	// probe says the endpoint seemed to refuse everything: the next
	// batch is a small one, split down (delivery.probe).
	probe := false
	for {
		batch := maxBatch
		if probe {
			batch = probeBatch
		}
		b, err := d.reader.Next(batch, maxBatchBytes)
		if err == nil && b.Skipped > 0 {
			d.skipped.Add(float64(b.Skipped))
			d.behind.report("usage records dropped: the sink fell so far behind that the spool gave its oldest records back, so that the other sink's are still taken",
				"sink", d.sink.Name(), "records", b.Skipped)
		}
		if err == nil && len(b.Records) == 0 {
			if !d.wait(d.reader.Wake()) {
				return
			}
			continue
		}
		if err == nil {
			var rejected int
			if rejected, err = d.deliver(b.Records, probe); err == nil {
				probe = false
				d.delivered.Add(float64(len(b.Records) - rejected))
				d.rejected.Add(float64(rejected))
				if err := d.reader.Ack(b); err != nil {
					// Delivered all the same: only a restart sends them again.
					d.saves.report("usage spool: a sink's position was not saved", "sink", d.sink.Name(), "err", err)
				}
				backoff = 0
				continue
			}
			d.retried.Add(float64(len(b.Records)))
		}
		var refuses *EndpointRefuses
		if probe = errors.As(err, &refuses); probe {
			d.retrying.report("usage records not delivered: the sink refuses every one, which is a configuration error (a wrong URL or path, a token, a receiver that takes another format); retrying",
				"sink", d.sink.Name(), "err", err, "pending", d.reader.Pending())
		} else {
			d.retrying.report("usage records not delivered; retrying", "sink", d.sink.Name(), "err", err, "pending", d.reader.Pending())
		}
		backoff = min(max(2*backoff, minBackoff), maxBackoff)
		t := time.NewTimer(backoff/2 + rand.N(backoff/2+1))
		select {
		case <-t.C:
		case <-d.kick:
			t.Stop()
		case <-d.reader.Behind():
			t.Stop()
		case <-d.stopped.Done():
			t.Stop()
			return
		}
	}
}

// wait waits for a record, or the stop; false at the stop.
func (d *delivery) wait(wake <-chan struct{}) bool {
	select {
	case <-wake:
		return true
	case <-d.stopped.Done():
		return false
	}
}

// drain waits until the sink has every record spooled, or ctx is done. A
// delivery waiting out a backoff tries again at once.
func (d *delivery) drain(ctx context.Context) {
	select {
	case d.kick <- struct{}{}:
	default:
	}
	t := time.NewTicker(10 * time.Millisecond)
	defer t.Stop()
	for d.reader.Pending() > 0 {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
