package telemetry

import (
	"context"
	"io"
	"log/slog"
	"math"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/timing-sidecar/timing-sidecar/timing"
)

// The access log is one JSON line per request, on every request's path,
// so it is built for that: each line is appended into a pooled buffer by
// hand (no reflection, no allocation), and lines reach the output through
// a buffer that one goroutine writes out flushInterval after the first
// line of a batch, or sooner when flushSize is pending, and at Close; with
// no lines it sleeps, so an idle sidecar's log costs no wake-ups. A
// request never waits on a write to standard output. A reader that stops
// reading stalls only that goroutine: past maxPending bytes, lines are
// dropped, counted in timing_sidecar_access_log_dropped_total, and
// reported at most once a minute on the operational log.
//
// flushSize sets how often a busy sidecar writes: every write to a file or
// a pipe may block, so it hands the goroutine's thread off and wakes
// another, and at 9,000 requests/s (lines of about 1 KB) 64 KiB batches
// take 4-5% more CPU per request than 256 KiB ones.
const (
	flushInterval = 100 * time.Millisecond
	flushSize     = 256 << 10
	maxPending    = 4 << 20
	// maxKeptBuffer: a buffer grown past this by a burst is not kept.
	maxKeptBuffer = 1 << 20
)

// accessLog is the buffered line writer.
type accessLog struct {
	w        io.Writer
	ops      *slog.Logger // where drops are reported
	dropped  prometheus.Counter
	panicked func() // counts a panic of the output

	// flushing is held for a whole flush, so two flushes (the loop's and
	// Flush's) write their lines in order.
	flushing     sync.Mutex
	mu           sync.Mutex
	pending      []byte // lines not yet written
	spare        []byte // the other buffer, while pending is written
	droppedSince int
	lastReport   time.Time

	closed  atomic.Bool
	wake    chan struct{}
	stop    chan struct{}
	stopped chan struct{}
	once    sync.Once
	lines   sync.Pool // *[]byte: one line being encoded
}

func newAccessLog(w io.Writer, ops *slog.Logger, reg prometheus.Registerer, panicked func()) *accessLog {
	l := &accessLog{
		w:        w,
		ops:      ops,
		panicked: panicked,
		dropped: prometheus.NewCounter(prometheus.CounterOpts{Name: "timing_sidecar_access_log_dropped_total",
			Help: "Access-log lines dropped because standard output was not being read fast enough (more than 4 MiB pending), or failed."}),
		wake:    make(chan struct{}, 1),
		stop:    make(chan struct{}),
		stopped: make(chan struct{}),
	}
	l.lines.New = func() any { b := make([]byte, 0, 1024); return &b }
	reg.MustRegister(l.dropped)
	go l.run()
	return l
}

// add queues one request's line.
func (l *accessLog) add(now time.Time, r *Record, j *judgement) {
	if l.closed.Load() {
		// A stream still open when the shutdown grace ran out.
		l.dropped.Inc()
		return
	}
	bp := l.lines.Get().(*[]byte)
	line := appendLine((*bp)[:0], now, r, j)
	l.mu.Lock()
	first := len(l.pending) == 0
	full := len(l.pending)+len(line) > maxPending
	if full {
		l.droppedSince++
	} else {
		l.pending = append(l.pending, line...)
	}
	wake := first || len(l.pending) >= flushSize
	l.mu.Unlock()
	if cap(line) <= 64<<10 {
		*bp = line
		l.lines.Put(bp)
	}
	if full {
		l.dropped.Inc()
	}
	if wake {
		select {
		case l.wake <- struct{}{}:
		default:
		}
	}
}

// run writes the lines out in batches until Close. It is woken by the
// first line of a batch and by a full buffer, never on a schedule of its
// own, but for a report of dropped lines falling due.
func (l *accessLog) run() {
	defer close(l.stopped)
	t := time.NewTimer(time.Hour)
	t.Stop()
	for {
		var due <-chan time.Time
		if wait, ok := l.reportWait(); ok {
			t.Reset(wait)
			due = t.C
		}
		select {
		case <-l.wake:
			// The lines that follow the first have flushInterval to join
			// its batch, unless flushSize is pending sooner.
			t.Reset(flushInterval)
			select {
			case <-t.C:
			case <-l.wake:
			case <-l.stop:
				l.flush()
				return
			}
		case <-due:
		case <-l.stop:
			l.flush()
			return
		}
		t.Stop()
		l.flush()
	}
}

// reportWait tells, when dropped lines are not yet reported, how long until
// their report is due.
func (l *accessLog) reportWait() (time.Duration, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.droppedSince == 0 {
		return 0, false
	}
	return max(0, time.Minute-time.Since(l.lastReport)), true
}

// flush writes what is pending, outside the lock: requests go on
// appending to the other buffer meanwhile.
func (l *accessLog) flush() {
	l.flushing.Lock()
	defer l.flushing.Unlock()
	l.mu.Lock()
	out := l.pending
	l.pending, l.spare = l.spare[:0], nil
	l.mu.Unlock()
	if len(out) > 0 && !l.write(out) {
		n := lineCount(out)
		l.dropped.Add(float64(n))
		l.mu.Lock()
		l.droppedSince += n
		l.mu.Unlock()
	}
	if cap(out) > maxKeptBuffer {
		out = nil
	}
	l.mu.Lock()
	l.spare = out[:0]
	dropped := l.droppedSince
	report := dropped > 0 && time.Since(l.lastReport) >= time.Minute
	if report {
		l.droppedSince, l.lastReport = 0, time.Now()
	}
	l.mu.Unlock()
	if report && l.ops != nil {
		l.ops.Warn("access-log lines were dropped: standard output is not read fast enough, or failed", "lines", dropped)
	}
}

// write writes out to the output. It is the panic boundary of the log's
// goroutine: an output that panics costs its lines, counted, not the
// process.
func (l *accessLog) write(out []byte) (ok bool) {
	defer func() {
		if r := recover(); r != nil {
			ok = false
			if l.panicked != nil {
				l.panicked()
			}
		}
	}()
	n, err := l.w.Write(out)
	if err != nil && n > 0 && n < len(out) && out[n-1] != '\n' {
		// A line cut short is ended, so the next batch starts a line.
		l.w.Write([]byte{'\n'}) //nolint:errcheck
	}
	return err == nil
}

func lineCount(b []byte) int {
	n := 0
	for _, c := range b {
		if c == '\n' {
			n++
		}
	}
	return n
}

// Flush writes what is pending now. It waits for the output: for tests
// and tools, not the request path.
func (l *accessLog) Flush() {
	l.flush()
}

// Close writes what is pending and stops the writer, waiting for it no
// longer than ctx allows (an output nobody reads would hold it forever).
// Lines added after it are dropped and counted.
func (l *accessLog) Close(ctx context.Context) {
	l.once.Do(func() {
		l.closed.Store(true)
		close(l.stop)
	})
	select {
	case <-l.stopped:
	case <-ctx.Done():
	}
}

// lineTime is the part of a line's time before and after its milliseconds,
// for one second: formatting a date costs a third of encoding a line, and
// thousands of lines a second share it.
type lineTime struct {
	unix       int64
	loc        *time.Location
	head, zone string // "2006-01-02T15:04:05" and "Z07:00"
}

var lastLineTime atomic.Pointer[lineTime]

// appendTime appends t as slog's JSON handler writes it: RFC 3339 with
// milliseconds, truncated.
func appendTime(b []byte, t time.Time) []byte {
	lt := lastLineTime.Load()
	if lt == nil || lt.unix != t.Unix() || lt.loc != t.Location() {
		lt = &lineTime{unix: t.Unix(), loc: t.Location(), head: t.Format("2006-01-02T15:04:05"), zone: t.Format("Z07:00")}
		lastLineTime.Store(lt)
	}
	ms := t.Nanosecond() / 1e6
	b = append(b, lt.head...)
	b = append(b, '.', byte('0'+ms/100), byte('0'+ms/10%10), byte('0'+ms%10))
	return append(b, lt.zone...)
}

// appendLine appends one request's access-log line, with the fields and
// names slog's JSON handler gave it before (TestAccessLogLine holds the
// two equal).
func appendLine(b []byte, now time.Time, r *Record, j *judgement) []byte {
	m := &r.Metrics
	b = append(b, `{"time":"`...)
	b = appendTime(b, now)
	b = append(b, `","level":"INFO","msg":"request","request_id":`...)
	b = appendString(b, r.ID)
	b = append(b, `,"method":`...)
	b = appendString(b, r.Method)
	b = append(b, `,"path":`...)
	b = appendString(b, r.Path)
	b = append(b, `,"model":`...)
	b = appendString(b, r.Model)
	b = append(b, `,"leg":`...)
	b = appendString(b, legOf(r))
	b = append(b, `,"stream":`...)
	b = strconv.AppendBool(b, r.Stream)
	b = append(b, `,"status":`...)
	b = strconv.AppendInt(b, int64(r.Status), 10)
	b = appendNumber(b, `,"time_to_first_token_ms":`, m.TimeToFirstToken)
	b = appendNumber(b, `,"generation_time_ms":`, m.GenerationTime)
	b = appendNumber(b, `,"queue_time_ms":`, m.QueueTime)
	b = append(b, `,"ttft_from":`...)
	if m.FirstTokenAfterArrival.Set {
		b = appendString(b, m.TTFTFrom.String())
	} else {
		b = append(b, "null"...)
	}
	b = appendNumber(b, `,"mean_itl_ms":`, m.MeanITL)
	b = appendNumber(b, `,"tokens_per_second":`, m.TokensPerSecond)
	b = appendNumber(b, `,"e2e_latency_ms":`, m.E2ELatency)
	b = appendNumber(b, `,"max_itl_ms":`, m.MaxITL)
	b = appendNumber(b, `,"time_to_first_byte_ms":`, m.TimeToFirstByte)
	b = appendCount(b, `,"prompt_tokens":`, m.PromptTokens)
	b = appendCount(b, `,"completion_tokens":`, m.CompletionTokens)
	b = appendCount(b, `,"token_events":`, m.TokenEvents)
	b = appendNumber(b, `,"tokens_per_event":`, m.TokensPerEvent)
	b = appendCount(b, `,"max_tokens_per_event":`, m.MaxTokensPerEvent)
	b = appendCount(b, `,"cached_tokens":`, cachedTokens(m))
	b = appendCount(b, `,"cache_write_tokens":`, m.CacheWriteTokens)
	b = append(b, `,"cache":`...)
	b = appendString(b, m.Cache.String())
	b = appendNumber(b, `,"prefill_tokens_per_second":`, m.PrefillTokensPerSecond)
	b = appendNumber(b, `,"prefill_ms":`, m.PrefillTime)
	b = appendNumber(b, `,"engine_prefill_tokens_per_second":`, m.EnginePrefillTokensPerSecond)
	b = appendNumber(b, `,"engine_prefill_ms":`, enginePrefill(m))
	b = appendNumber(b, `,"relay_delay_p50_ms":`, relayDelay(&r.RelayDelays, (*timing.Delays).Median))
	b = appendNumber(b, `,"relay_delay_max_ms":`, relayDelay(&r.RelayDelays, (*timing.Delays).Max))
	b = appendNumber(b, `,"spec_acceptance_length":`, m.Engine.AcceptanceLength)
	b = appendNumber(b, `,"spec_acceptance_rate":`, m.Engine.AcceptanceRate)
	b = append(b, `,"client_stall_ms":`...)
	b = appendMilli(b, float64(r.ClientStall)/float64(time.Millisecond))
	b = append(b, `,"bytes_in":`...)
	b = strconv.AppendInt(b, int64(r.BytesIn), 10)
	b = append(b, `,"bytes_out":`...)
	b = strconv.AppendInt(b, int64(r.BytesOut), 10)
	b = append(b, `,"upstream_error":`...)
	b = appendString(b, r.UpstreamError)
	b = append(b, `,"client_gone":`...)
	b = strconv.AppendBool(b, r.ClientGone)
	b = append(b, `,"cut_at_shutdown":`...)
	b = strconv.AppendBool(b, r.CutAtShutdown)
	b = append(b, `,"tenant":`...)
	b = appendString(b, r.Tenant)
	b = append(b, `,"variant":`...)
	b = appendString(b, r.Variant)
	if j.by.Set() {
		b = append(b, `,"slo":`...)
		b = appendString(b, j.verdict.String())
		b = append(b, `,"slo_missed":`...)
		b = appendString(b, j.missed)
		b = append(b, `,"slo_objectives":`...)
		b = appendString(b, j.source)
		b = appendNumber(b, `,"slo_ttft_ms":`, objectiveMillis(j.by.TTFT))
		b = appendNumber(b, `,"slo_itl_ms":`, objectiveMillis(j.by.ITL))
		b = appendNumber(b, `,"slo_e2e_ms":`, objectiveMillis(j.by.E2E))
	}
	return append(b, "}\n"...)
}

// cachedTokens is the cached prompt tokens the record can use: unset where
// the class is unknown (not reported, or more than the prompt).
func cachedTokens(m *timing.Metrics) timing.Count {
	if m.Cache == timing.CacheUnknown {
		return timing.Count{}
	}
	return m.CachedTokens
}

// enginePrefill is the interval the engine's prefill speed divides by:
// its own prefill time, where the speed is known.
func enginePrefill(m *timing.Metrics) timing.Number {
	if !m.EnginePrefillTokensPerSecond.Set {
		return timing.Number{}
	}
	return m.Engine.TimeToFirstToken
}

// objectiveMillis is an objective in ms, unset when it is not set.
func objectiveMillis(d time.Duration) timing.Number {
	return timing.Number{Value: float64(d) / float64(time.Millisecond), Set: d > 0}
}

// relayDelay is one figure of a request's relay delays in ms, unset when
// no stream event was relayed.
func relayDelay(d *timing.Delays, figure func(*timing.Delays) time.Duration) timing.Number {
	if d.Count() == 0 {
		return timing.Number{}
	}
	return timing.Number{Value: float64(figure(d)) / float64(time.Millisecond), Set: true}
}

// appendNumber appends key and a figure to three decimals, or null.
func appendNumber(b []byte, key string, n timing.Number) []byte {
	b = append(b, key...)
	if !n.Set {
		return append(b, "null"...)
	}
	return appendMilli(b, n.Value)
}

// appendMilli appends v rounded to three decimals, trailing zeros dropped,
// exactly as strconv.AppendFloat(b, float64(int64(v*1000+0.5))/1000, 'f',
// -1, 64) writes it (TestAppendMilliIsStrconvs), in integer arithmetic:
// shortest-float formatting, seven times a line, was more than half of a
// line's cost. Below 1e9 the floats a thousandth apart are distinct and their
// shortest forms are those thousandths; larger figures take the float path.
// A figure with no JSON form (NaN, ±Inf) is null.
func appendMilli(b []byte, v float64) []byte {
	if !(v > -1e9 && v < 1e9) {
		if math.IsNaN(v) || math.IsInf(v, 0) {
			return append(b, "null"...)
		}
		return strconv.AppendFloat(b, float64(int64(v*1000+0.5))/1000, 'f', -1, 64)
	}
	k := int64(v*1000 + 0.5)
	if k < 0 {
		b, k = append(b, '-'), -k
	}
	b = strconv.AppendInt(b, k/1000, 10)
	frac := k % 1000
	if frac == 0 {
		return b
	}
	b = append(b, '.', byte('0'+frac/100))
	if frac%100 != 0 {
		b = append(b, byte('0'+frac/10%10))
		if frac%10 != 0 {
			b = append(b, byte('0'+frac%10))
		}
	}
	return b
}

func appendCount(b []byte, key string, c timing.Count) []byte {
	b = append(b, key...)
	if !c.Set {
		return append(b, "null"...)
	}
	return strconv.AppendInt(b, c.Value, 10)
}

const hex = "0123456789abcdef"

// appendString appends s as a JSON string. Control characters, quotes and
// backslashes are escaped, and U+2028/U+2029 (JavaScript's line
// terminators); invalid UTF-8 becomes U+FFFD, though clean has already made
// client strings valid.
func appendString(b []byte, s string) []byte {
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' {
				i++
				continue
			}
			b = append(b, s[start:i]...)
			switch c {
			case '"', '\\':
				b = append(b, '\\', c)
			case '\n':
				b = append(b, '\\', 'n')
			case '\r':
				b = append(b, '\\', 'r')
			case '\t':
				b = append(b, '\\', 't')
			default:
				b = append(b, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 || r == '\u2028' || r == '\u2029' {
			b = append(b, s[start:i]...)
			switch r {
			case '\u2028':
				b = append(b, `\u2028`...)
			case '\u2029':
				b = append(b, `\u2029`...)
			default:
				b = append(b, `\ufffd`...)
			}
			i += size
			start = i
			continue
		}
		i += size
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}
