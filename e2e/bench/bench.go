// Package bench is timing-sidecar's load tool: concurrent streaming (or
// non-streaming) chat requests against an OpenAI-compatible URL in front
// of the emulated engine, reporting each stream event's delivery delay, from
// the engine's send time stamped into the event to the moment the client
// read it, and throughput. Accuracy is its accuracy report: the sidecar's
// figures against the engine's own record of each request, and how soon
// the engine sees a client leave, measured on the machine it runs on.
package bench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/timing-sidecar/timing-sidecar/e2e/emulator"
)

// Options is one load run.
type Options struct {
	Target         string        // base URL, e.g. http://127.0.0.1:8001
	Concurrency    int           // requests in flight at all times
	Duration       time.Duration // how long new requests start
	Tokens         int           // tokens (events) per response
	ITL            time.Duration // the engine's gap between events
	Unary          bool          // non-streaming requests
	IncludeMetrics bool          // ask for the metrics object
	Progress       io.Writer     // a progress line each second; nil for none
}

// Result is what a run measured. Times are in milliseconds.
type Result struct {
	Target         string  `json:"target"`
	Mode           string  `json:"mode"`
	Concurrency    int     `json:"concurrency"`
	Seconds        float64 `json:"seconds"`
	Requests       int64   `json:"requests"`
	Errors         int64   `json:"errors"`
	Events         int64   `json:"events"`
	RequestsPerSec float64 `json:"requests_per_second"`
	EventsPerSec   float64 `json:"events_per_second"`
	// Per-event delivery delay (streaming).
	DelayP50 float64 `json:"event_delay_p50_ms"`
	DelayP90 float64 `json:"event_delay_p90_ms"`
	DelayP99 float64 `json:"event_delay_p99_ms"`
	// Request latency (non-streaming).
	LatencyP50 float64 `json:"latency_p50_ms"`
	LatencyP90 float64 `json:"latency_p90_ms"`
	LatencyP99 float64 `json:"latency_p99_ms"`
}

// worker state, merged at the end.
type samples struct {
	delays, latencies []int64 // ns
}

// Run runs the load until opts.Duration has passed and every request
// started has ended.
func Run(ctx context.Context, opts Options) (Result, error) {
	if opts.Concurrency < 1 || opts.Tokens < 1 {
		return Result{}, fmt.Errorf("concurrency and tokens must be positive")
	}
	client := &http.Client{Transport: &http.Transport{
		MaxIdleConns: opts.Concurrency, MaxIdleConnsPerHost: opts.Concurrency, DisableCompression: true,
	}}
	body := fmt.Sprintf(`{"model":"emulated","messages":[{"role":"user","content":"bench"}],"max_tokens":%d,"stream":%t,"include_metrics":%t}`,
		opts.Tokens, !opts.Unary, opts.IncludeMetrics)
	var requests, errs, events atomic.Int64
	all := make([]samples, opts.Concurrency)
	start := time.Now()
	deadline := start.Add(opts.Duration)
	var wg sync.WaitGroup
	for w := range opts.Concurrency {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s := &all[w]
			for time.Now().Before(deadline) && ctx.Err() == nil {
				t0 := time.Now()
				n, err := one(ctx, client, opts, body, s)
				requests.Add(1)
				events.Add(int64(n))
				if err != nil {
					errs.Add(1)
					continue
				}
				s.latencies = append(s.latencies, int64(time.Since(t0)))
			}
		}()
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	progress(opts.Progress, done, start, &requests, &events, &errs)
	elapsed := time.Since(start).Seconds()

	var merged samples
	for _, s := range all {
		merged.delays = append(merged.delays, s.delays...)
		merged.latencies = append(merged.latencies, s.latencies...)
	}
	r := Result{Target: opts.Target, Mode: "streaming", Concurrency: opts.Concurrency, Seconds: elapsed,
		Requests: requests.Load(), Errors: errs.Load(), Events: events.Load()}
	if opts.Unary {
		r.Mode = "unary"
	}
	r.RequestsPerSec = float64(r.Requests-r.Errors) / elapsed
	r.EventsPerSec = float64(r.Events) / elapsed
	r.DelayP50, r.DelayP90, r.DelayP99 = percentiles(merged.delays)
	r.LatencyP50, r.LatencyP90, r.LatencyP99 = percentiles(merged.latencies)
	return r, nil
}

// one sends one request and reads its response; streaming events'
// delivery delays go into s.
func one(ctx context.Context, client *http.Client, opts Options, body string, s *samples) (int, error) {
	req, err := http.NewRequestWithContext(ctx, "POST", opts.Target+"/v1/chat/completions", strings.NewReader(body))
	if err != nil {
		return 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(emulator.HeaderITL, opts.ITL.String())
	req.Header.Set(emulator.HeaderTTFT, "0s")
	req.Header.Set(emulator.HeaderStamp, "1")
	resp, err := client.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		io.Copy(io.Discard, resp.Body) //nolint:errcheck
		return 0, fmt.Errorf("status %d", resp.StatusCode)
	}
	if opts.Unary {
		_, err := io.Copy(io.Discard, resp.Body)
		return 0, err
	}
	br := bufio.NewReaderSize(resp.Body, 16<<10)
	n, done := 0, false
	for {
		line, err := br.ReadSlice('\n')
		if stamp, ok := stampOf(line); ok {
			s.delays = append(s.delays, time.Now().UnixNano()-stamp)
			n++
		}
		done = done || bytes.HasPrefix(line, []byte("data: [DONE]"))
		if err == io.EOF {
			if !done {
				return n, fmt.Errorf("stream ended without [DONE]")
			}
			return n, nil
		}
		if err != nil {
			return n, err
		}
	}
}

var stampMark = []byte(`" @`)

// stampOf finds the emulator's send-time stamp in an event line.
func stampOf(line []byte) (int64, bool) {
	i := bytes.Index(line, stampMark)
	if i < 0 {
		return 0, false
	}
	digits := line[i+len(stampMark):]
	end := bytes.IndexByte(digits, '"')
	if end < 0 {
		return 0, false
	}
	v, err := strconv.ParseInt(string(digits[:end]), 10, 64)
	return v, err == nil
}

func percentiles(ns []int64) (p50, p90, p99 float64) {
	if len(ns) == 0 {
		return 0, 0, 0
	}
	slices.Sort(ns)
	at := func(q float64) float64 { return float64(ns[int(q*float64(len(ns)-1))]) / 1e6 }
	return at(0.50), at(0.90), at(0.99)
}

func progress(w io.Writer, done chan struct{}, start time.Time, requests, events, errs *atomic.Int64) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-done:
			if w != nil {
				fmt.Fprintln(w)
			}
			return
		case <-t.C:
			if w != nil {
				fmt.Fprintf(w, "\r%5.0fs  requests %d  events %d  errors %d", time.Since(start).Seconds(), requests.Load(), events.Load(), errs.Load())
			}
		}
	}
}

// WriteTable writes r as a plain-text table.
func (r Result) WriteTable(w io.Writer) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "target\t%s\n", r.Target)
	fmt.Fprintf(tw, "mode\t%s, %d concurrent, %.1fs\n", r.Mode, r.Concurrency, r.Seconds)
	fmt.Fprintf(tw, "requests\t%d (%d errors), %.1f/s\n", r.Requests, r.Errors, r.RequestsPerSec)
	if r.Mode == "streaming" {
		fmt.Fprintf(tw, "events\t%d, %.0f/s\n", r.Events, r.EventsPerSec)
		fmt.Fprintf(tw, "event delivery delay\tp50 %.3f ms  p90 %.3f ms  p99 %.3f ms\n", r.DelayP50, r.DelayP90, r.DelayP99)
	}
	fmt.Fprintf(tw, "request latency\tp50 %.3f ms  p90 %.3f ms  p99 %.3f ms\n", r.LatencyP50, r.LatencyP90, r.LatencyP99)
	tw.Flush()
}

// WriteJSON writes r as one JSON object.
func (r Result) WriteJSON(w io.Writer) error {
	return json.NewEncoder(w).Encode(r)
}
