package proxy

import (
	"bufio"
	"context"
	"crypto/x509"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/timing-sidecar/timing-sidecar/proxy/netclock"
)

// window is when one write of the engine's (or the client's) ran: a mark
// taken from the kernel's receive time of those bytes lies within it.
type window struct{ before, after time.Time }

// between bounds, in ms, the time from a mark within a to one within b.
func (a window) to(b window) (lo, hi float64) {
	return ms(b.before.Sub(a.after)), ms(b.after.Sub(a.before))
}

// stampedEngine is an engine that records, for each write it flushes, the
// window in which the write ran: headers after 60 ms, the first token 30 ms
// later, two more 80 ms apart, and 80 ms later the finishing event with
// the usage event. Against a reader held 50 ms before each read, the gaps
// keep each write in a read of its own: bytes that wait in the socket
// together share the stamp of the last of them (netclock.Conn), which
// TestKernelStampOfAMergedReadIsItsLastSegment covers.
type stampedEngine struct {
	srv *httptest.Server

	mu             sync.Mutex
	headers, usage window
	tokens         []window
	done           chan struct{}
}

const (
	engineQueue      = 60 * time.Millisecond
	engineFirstToken = 30 * time.Millisecond
	engineGap        = 80 * time.Millisecond
)

// newStampedEngine starts the engine, speaking HTTPS with withTLS.
func newStampedEngine(t *testing.T, withTLS bool) *stampedEngine {
	e := &stampedEngine{done: make(chan struct{}, 1)}
	if withTLS {
		e.srv = httptest.NewTLSServer(http.HandlerFunc(e.serve))
	} else {
		e.srv = httptest.NewServer(http.HandlerFunc(e.serve))
	}
	t.Cleanup(e.srv.Close)
	return e
}

func (e *stampedEngine) serve(w http.ResponseWriter, r *http.Request) {
	io.Copy(io.Discard, r.Body) //nolint:errcheck
	flush := func(write func()) window {
		var win window
		win.before = time.Now()
		write()
		w.(http.Flusher).Flush()
		win.after = time.Now()
		return win
	}
	time.Sleep(engineQueue)
	w.Header().Set("Content-Type", "text/event-stream")
	headers := flush(func() { w.WriteHeader(200) })
	var tokens []window
	for i := range 3 {
		if i == 0 {
			time.Sleep(engineFirstToken)
		} else {
			time.Sleep(engineGap)
		}
		tokens = append(tokens, flush(func() {
			fmt.Fprintf(w, "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\" t%d\"},\"finish_reason\":null}]}\n\n", i)
		}))
	}
	time.Sleep(engineGap)
	io.WriteString(w, `data: {"id":"c","object":"chat.completion.chunk","model":"m","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}`+"\n\n")
	usage := flush(func() {
		io.WriteString(w, `data: {"id":"c","object":"chat.completion.chunk","model":"m","choices":[],"usage":{"prompt_tokens":3,"total_tokens":6,"completion_tokens":3}}`+"\n\ndata: [DONE]\n\n")
	})
	e.mu.Lock()
	e.headers, e.tokens, e.usage = headers, tokens, usage
	e.mu.Unlock()
	e.done <- struct{}{}
}

// heldExchange sends one streaming request through a sidecar whose every
// read, of the client and of the engine, is held back 50 ms, as a CPU limit
// would hold it; it returns the metrics, the window of the client's write
// of the request, and the engine.
func heldExchange(t *testing.T, kernel, withTLS bool) (map[string]*float64, window, *stampedEngine, *Proxy) {
	t.Helper()
	engine := newStampedEngine(t, withTLS)
	cfg := DefaultConfig()
	cfg.Upstream, cfg.KernelTimestamps = engine.srv.URL, kernel
	p, err := New(cfg, slog.New(slog.DiscardHandler), nil)
	if err != nil {
		t.Fatal(err)
	}
	if withTLS {
		// The test engine's own certificate authority.
		p.up.TLS.RootCAs = x509.NewCertPool()
		p.up.TLS.RootCAs.AddCert(engine.srv.Certificate())
	}
	hold := func() { time.Sleep(readHold) }
	p.clientHold, p.up.Hold = hold, hold
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go p.Serve(ln) //nolint:errcheck
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		p.Shutdown(ctx) //nolint:errcheck
	})

	// The request in one write, so its arrival is that write's.
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	body := `{"model":"m","stream":true,"include_metrics":true,"stream_options":{"include_usage":true},"messages":[]}`
	request := window{before: time.Now()}
	fmt.Fprintf(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
	request.after = time.Now()
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	out, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	<-engine.done
	for ev := range strings.SplitSeq(string(out), "\n\n") {
		if strings.Contains(ev, `"choices":[]`) {
			return metricsOf(t, strings.TrimPrefix(ev, "data: ")), request, engine, p
		}
	}
	t.Fatalf("no usage event in %q", out)
	return nil, window{}, nil, nil
}

// readHold is how late the held sidecar reads.
const readHold = 50 * time.Millisecond

// TestMarksAreReceiveTimesNotReadTimes checks each figure of a held
// sidecar against the causal bounds of the writes that set its marks: the
// client's write of the request (arrival), the engine's writes of the
// headers (accepted), the tokens and the usage event (done). The bounds,
// with the stamps' conversion slack, are a few milliseconds wide and the
// hold 50 ms: a mark taken when the sidecar got round to the bytes falls
// outside them.
//
// With TLS to the engine, the stamps are those of the TCP reads under it:
// the arrival of the record that completed what a mark marks.
func TestMarksAreReceiveTimesNotReadTimes(t *testing.T) {
	if !netclock.KernelTimestamps() {
		t.Skip("this platform gives no kernel receive timestamps; the fallback is tested on its own")
	}
	if err := netclock.WaitForKernelStamps(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	t.Run("plain", func(t *testing.T) { receiveTimeMarks(t, false) })
	t.Run("TLS to the engine", func(t *testing.T) { receiveTimeMarks(t, true) })
}

// conversionSlack is what converting a kernel stamp to the monotonic
// clock may be off by (netclock's tests use the same).
const conversionSlack = 2 * time.Millisecond

func receiveTimeMarks(t *testing.T, withTLS bool) {
	m, request, engine, p := heldExchange(t, true, withTLS)
	engine.mu.Lock()
	defer engine.mu.Unlock()
	first, last := engine.tokens[0], engine.tokens[len(engine.tokens)-1]
	slack := ms(2 * conversionSlack) // two converted stamps in each figure
	check := func(field string, from, to window) {
		t.Helper()
		lo, hi := from.to(to)
		within(t, m, field, lo-slack, hi+slack)
	}
	check("queue_time_ms", request, engine.headers)
	check("time_to_first_token_ms", engine.headers, first)
	check("generation_time_ms", first, last)
	check("e2e_latency_ms", request, engine.usage)
	lo, hi := engine.tokens[0].to(engine.tokens[1])
	lo2, hi2 := engine.tokens[1].to(engine.tokens[2])
	within(t, m, "max_itl_ms", max(lo, lo2)-slack, max(hi, hi2)+slack)
	if got := gaugeValue(t, p.registry, "timing_sidecar_kernel_timestamps"); got != 1 {
		t.Errorf("timing_sidecar_kernel_timestamps = %v, want 1", got)
	}
}

// TestFallbackMarksAreTheClockAtTheRead: without kernel stamps a mark is
// taken when the held sidecar reads. The first token arrives 30 ms after
// the headers, during the hold before the read that takes it, so it is
// marked no sooner than the hold after the headers' read.
func TestFallbackMarksAreTheClockAtTheRead(t *testing.T) {
	m, _, _, p := heldExchange(t, false, false)
	within(t, m, "time_to_first_token_ms", ms(readHold), 1e9)
	if got := gaugeValue(t, p.registry, "timing_sidecar_kernel_timestamps"); got != 0 {
		t.Errorf("timing_sidecar_kernel_timestamps = %v, want 0", got)
	}
}

// TestRelayDelayRunsFromTheReceiveStamp: an event that arrived a second
// before the relay hands it to the client is booked a second of the
// sidecar's own delay, in the request's record and in Prometheus.
func TestRelayDelayRunsFromTheReceiveStamp(t *testing.T) {
	r := newBenchRelay(event300)
	r.x.Recv.Received = time.Now().Add(-time.Second)
	var w eventWriter
	writeEvents(t, r, &w, 4) // the fourth write fails: that event never reached the client
	d := &r.f.rec.RelayDelays
	if d.Count() != 3 || d.Max() < time.Second || d.Median() < time.Second*88/100 {
		t.Errorf("relay delays: %d events, median %v, max %v; want 3 events of at least 1s (the median within its bucket's 12%%)", d.Count(), d.Median(), d.Max())
	}
	families, err := r.p.registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range families {
		if mf.GetName() == "timing_sidecar_relay_delay_seconds" {
			h := mf.GetMetric()[0].GetHistogram()
			if h.GetSampleCount() != 3 || h.GetSampleSum() < 3 {
				t.Errorf("histogram: %d events summing to %.3fs, want 3 of at least 1s", h.GetSampleCount(), h.GetSampleSum())
			}
			return
		}
	}
	t.Error("no timing_sidecar_relay_delay_seconds series")
}
