package telemetry

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"math"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/timing-sidecar/timing-sidecar/timing"
)

// lockedBuffer is an output the access log's writer and a test can share.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func (l *lockedBuffer) Reset() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.b.Reset()
}

// slogLine is the line slog's JSON handler wrote for a request before the
// access log was written by hand: the reference for its fields.
func slogLine(r *Record) []byte {
	var buf bytes.Buffer
	m := &r.Metrics
	num := func(key string, n timing.Number) slog.Attr {
		if !n.Set {
			return slog.Any(key, nil)
		}
		return slog.Float64(key, float64(int64(n.Value*1000+0.5))/1000)
	}
	cnt := func(key string, c timing.Count) slog.Attr {
		if !c.Set {
			return slog.Any(key, nil)
		}
		return slog.Int64(key, c.Value)
	}
	slog.New(slog.NewJSONHandler(&buf, nil)).LogAttrs(context.Background(), slog.LevelInfo, "request",
		slog.String("request_id", r.ID), slog.String("method", r.Method), slog.String("path", r.Path),
		slog.String("model", r.Model), slog.String("leg", legOf(r)), slog.Bool("stream", r.Stream), slog.Int("status", r.Status),
		num("time_to_first_token_ms", m.TimeToFirstToken), num("generation_time_ms", m.GenerationTime),
		num("queue_time_ms", m.QueueTime), ttftFrom(m), num("mean_itl_ms", m.MeanITL), num("tokens_per_second", m.TokensPerSecond),
		num("e2e_latency_ms", m.E2ELatency), num("max_itl_ms", m.MaxITL), num("time_to_first_byte_ms", m.TimeToFirstByte), cnt("prompt_tokens", m.PromptTokens),
		cnt("completion_tokens", m.CompletionTokens), cnt("token_events", m.TokenEvents),
		num("tokens_per_event", m.TokensPerEvent), cnt("max_tokens_per_event", m.MaxTokensPerEvent),
		cnt("cached_tokens", cachedTokens(m)), cnt("cache_write_tokens", m.CacheWriteTokens), slog.String("cache", m.Cache.String()), num("prefill_tokens_per_second", m.PrefillTokensPerSecond),
		num("prefill_ms", m.PrefillTime), num("engine_prefill_tokens_per_second", m.EnginePrefillTokensPerSecond), num("engine_prefill_ms", enginePrefill(m)),
		num("relay_delay_p50_ms", relayDelay(&r.RelayDelays, (*timing.Delays).Median)),
		num("relay_delay_max_ms", relayDelay(&r.RelayDelays, (*timing.Delays).Max)),
		num("spec_acceptance_length", m.Engine.AcceptanceLength), num("spec_acceptance_rate", m.Engine.AcceptanceRate),
		num("client_stall_ms", timing.Number{Value: float64(r.ClientStall) / float64(time.Millisecond), Set: true}), slog.Int("bytes_in", r.BytesIn), slog.Int("bytes_out", r.BytesOut),
		slog.String("upstream_error", r.UpstreamError), slog.Bool("client_gone", r.ClientGone), slog.Bool("cut_at_shutdown", r.CutAtShutdown), slog.String("tenant", r.Tenant),
		slog.String("variant", r.Variant))
	return buf.Bytes()
}

func TestAccessLogLineIsSlogs(t *testing.T) {
	hostile := "q\"b\\s\n\r\t\x00\x1f<>&\u2028\u2029é€😀"
	for i, r := range append(slicesClone(requests), Record{ID: hostile, Method: "POST", Path: "/" + hostile, Model: hostile,
		Tenant: hostile, Variant: hostile, Status: 200, Measured: true, Metrics: timing.Metrics{E2ELatency: num(1234567.8915), TokensPerSecond: num(0.0004)}}) {
		now := time.Date(2026, 12, 3, 14, 2, 0, 123456789, time.UTC)
		got := appendLine(nil, now, &r, &judgement{})
		if !bytes.HasSuffix(got, []byte("\n")) || bytes.Count(got, []byte("\n")) != 1 {
			t.Fatalf("%d: not one line: %q", i, got)
		}
		var mine, ref map[string]any
		if err := json.Unmarshal(got, &mine); err != nil {
			t.Fatalf("%d: %v: %q", i, err, got)
		}
		if err := json.Unmarshal(slogLine(&r), &ref); err != nil {
			t.Fatal(err)
		}
		if mine["time"] != "2026-12-03T14:02:00.123Z" {
			t.Errorf("time %v, want slog's RFC 3339 in milliseconds", mine["time"])
		}
		delete(mine, "time")
		delete(ref, "time")
		if len(mine) != len(ref) {
			t.Errorf("%d: %d fields, slog had %d", i, len(mine), len(ref))
		}
		for k, v := range ref {
			if mine[k] != v {
				t.Errorf("%d: %s = %#v, slog's %#v", i, k, mine[k], v)
			}
		}
	}
}

func slicesClone(rs []Record) []Record { return append([]Record(nil), rs...) }

func TestAccessLogLineAllocatesNothing(t *testing.T) {
	r := requests[0]
	buf := make([]byte, 0, 1024)
	now := time.Now()
	if n := testing.AllocsPerRun(100, func() {
		buf = appendLine(buf[:0], now, &r, &judgement{verdict: Met, by: Objectives{TTFT: time.Second}, source: ObjectivesFlags})
	}); n != 0 {
		t.Errorf("%v allocations per line", n)
	}
}

// stalledWriter blocks every write until released.
type stalledWriter struct {
	release chan struct{}
	lockedBuffer
}

func (s *stalledWriter) Write(p []byte) (int, error) {
	<-s.release
	return s.lockedBuffer.Write(p)
}

func TestAStalledReaderNeverStallsRequests(t *testing.T) {
	out := &stalledWriter{release: make(chan struct{})}
	var ops lockedBuffer
	r := NewRecorder(prometheus.NewRegistry(), Options{MaxModels: 4, MaxTenants: 4, AccessLog: out, Log: slog.New(slog.NewJSONHandler(&ops, nil))})
	req := requests[0]
	req.Path = strings.Repeat("p", 200) // ~1 KB lines: 4 MiB holds about 4,000
	done := make(chan struct{})
	go func() {
		for range 20000 {
			rec := req
			r.Begin()
			r.Finish(&rec)
		}
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("requests stalled behind a log reader that does not read")
	}
	dropped := testutil.ToFloat64(r.access.dropped)
	if dropped < 10000 {
		t.Errorf("%v lines dropped of 20,000 with 4 MiB pending at most", dropped)
	}
	close(out.release)
	r.Close(context.Background())
	written := strings.Count(out.String(), "\n")
	if float64(written)+dropped != 20000 {
		t.Errorf("written %d + dropped %v, want 20,000", written, dropped)
	}
	if !strings.Contains(ops.String(), "access-log lines were dropped") {
		t.Errorf("the drop was not reported: %q", ops.String())
	}
}

func TestCloseWritesEveryLineInOrder(t *testing.T) {
	var out lockedBuffer
	r := NewRecorder(prometheus.NewRegistry(), Options{MaxModels: 4, MaxTenants: 4, AccessLog: &out})
	for i := range 3000 {
		rec := requests[0]
		rec.ID = "r" + strings.Repeat("x", i%7) + string(rune('a'+i%26))
		rec.BytesIn = i
		r.Begin()
		r.Finish(&rec)
		if i == 1500 {
			r.Flush() // a flush of its own between the loop's
		}
	}
	r.Close(context.Background())
	lines := strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n")
	if len(lines) != 3000 {
		t.Fatalf("%d lines, want 3000", len(lines))
	}
	for i, l := range lines {
		var v struct {
			BytesIn int `json:"bytes_in"`
		}
		if err := json.Unmarshal([]byte(l), &v); err != nil || v.BytesIn != i {
			t.Fatalf("line %d: %v, bytes_in %d", i, err, v.BytesIn)
		}
	}
}

// notifyingWriter tells each write on a channel.
type notifyingWriter struct {
	lockedBuffer
	wrote chan struct{}
}

func (w *notifyingWriter) Write(p []byte) (int, error) {
	n, err := w.lockedBuffer.Write(p)
	w.wrote <- struct{}{}
	return n, err
}

// TestALineIsWrittenWithoutAFlush: the writer, asleep while nothing is
// pending, wakes for the first line of each batch and writes it out.
func TestALineIsWrittenWithoutAFlush(t *testing.T) {
	out := &notifyingWriter{wrote: make(chan struct{}, 16)}
	r := NewRecorder(prometheus.NewRegistry(), Options{MaxModels: 4, MaxTenants: 4, AccessLog: out})
	defer r.Close(context.Background())
	for batch := 1; batch <= 3; batch++ {
		rec := requests[0]
		r.Begin()
		r.Finish(&rec)
		select {
		case <-out.wrote:
		case <-time.After(10 * time.Second):
			t.Fatalf("batch %d: not written within 10 s", batch)
		}
		if n := strings.Count(out.String(), "\n"); n != batch {
			t.Fatalf("batch %d: %d lines written", batch, n)
		}
	}
}

func TestCloseIsBoundedByItsContext(t *testing.T) {
	out := &stalledWriter{release: make(chan struct{})}
	defer close(out.release)
	r := NewRecorder(prometheus.NewRegistry(), Options{MaxModels: 4, MaxTenants: 4, AccessLog: out})
	rec := requests[0]
	r.Begin()
	r.Finish(&rec)
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	closed := make(chan struct{})
	go func() { r.Close(ctx); close(closed) }()
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Fatal("Close waited 10 s on an output nobody reads")
	}
	late := requests[0]
	r.Begin()
	r.Finish(&late) // a stream that outlived the grace
	if got := testutil.ToFloat64(r.access.dropped); got != 1 {
		t.Errorf("a line after Close: dropped = %v, want 1", got)
	}
}

// appendTime, which formats a date once a second, writes what slog's
// format writes for every time.
func TestAppendTimeIsSlogsFormat(t *testing.T) {
	east := time.FixedZone("east", 5*3600+30*60)
	base := time.Date(2026, 12, 3, 14, 2, 0, 0, time.UTC)
	var times []time.Time
	for _, ns := range []int{0, 999_999, 1_000_000, 123_456_789, 999_999_999} {
		at := base.Add(time.Duration(ns))
		times = append(times, at, at.In(east), at.Local(), at.Add(time.Second), at.AddDate(-2030, 0, 0))
	}
	for i := 0; i < 1000; i++ {
		times = append(times, base.Add(time.Duration(i)*7_777_777*time.Nanosecond))
	}
	for _, at := range times {
		if got, want := string(appendTime(nil, at)), at.Format("2006-01-02T15:04:05.000Z07:00"); got != want {
			t.Errorf("appendTime(%v) = %s, want %s", at, got, want)
		}
	}
}

// TestAppendMilliIsStrconvs holds the integer formatting of the log's
// figures to the float formatting it replaced, byte for byte: on the
// thousandths and their neighbours, halves that round either way,
// negative figures, the range's edges and random figures at every scale.
func TestAppendMilliIsStrconvs(t *testing.T) {
	want := func(v float64) string {
		return string(strconv.AppendFloat(nil, float64(int64(v*1000+0.5))/1000, 'f', -1, 64))
	}
	check := func(v float64) {
		t.Helper()
		if got := string(appendMilli(nil, v)); got != want(v) {
			t.Fatalf("%v: %q, strconv's %q", v, got, want(v))
		}
	}
	for k := int64(-3000); k <= 3000; k++ {
		v := float64(k) / 1000
		check(v)
		check(math.Nextafter(v, math.Inf(1)))
		check(math.Nextafter(v, math.Inf(-1)))
		check(v + 0.0005)
		check(v - 0.0005)
	}
	for _, v := range []float64{0, -0.0004, -0.0005, -0.0006, 0.0004999, 0.0005, 999999999.9994, 999999999.9996,
		-999999999.9996, 1e9, -1e9, 1e9 + 0.25, 123456789.123456, 1e15, -1e15, math.MaxInt32, 1e-300} {
		check(v)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for i := 0; i < 200000; i++ {
		v := math.Pow(10, rng.Float64()*12-3) // 0.001 to 1e9
		if i%2 == 1 {
			v = -v
		}
		check(v)
	}
	for _, v := range []float64{math.NaN(), math.Inf(1), math.Inf(-1)} {
		if got := string(appendMilli(nil, v)); got != "null" {
			t.Errorf("%v: %q, want null", v, got)
		}
	}
}

// ttftFrom is the log's ttft_from as slog writes it: the origin of a
// stream with output, null otherwise.
func ttftFrom(m *timing.Metrics) slog.Attr {
	if !m.FirstTokenAfterArrival.Set {
		return slog.Any("ttft_from", nil)
	}
	return slog.String("ttft_from", m.TTFTFrom.String())
}
