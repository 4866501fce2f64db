package bench

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/http"
	"net/http/httptrace"
	"runtime"
	"slices"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/tidwall/gjson"

	"github.com/timing-sidecar/timing-sidecar/e2e/emulator"
	"github.com/timing-sidecar/timing-sidecar/proxy"
)

// AccuracyOptions is one accuracy run: the emulated engine and a sidecar,
// both in this process on loopback ports, and streaming chat requests
// through the sidecar with include_metrics.
type AccuracyOptions struct {
	Requests    int             // streams to measure
	Concurrency int             // streams in flight at a time
	Timing      emulator.Timing // the engine's pacing (HeaderDelay, TTFT, ITL, OutputTokens)
	// Disconnects is how many clients leave in each phase (queued, before
	// the first token, mid-stream) for the disconnect figures; 0 for none.
	Disconnects int
	Progress    io.Writer // a line per phase; nil for none
}

// DefaultAccuracyOptions is a small model's pacing at modest concurrency.
var DefaultAccuracyOptions = AccuracyOptions{Requests: 200, Concurrency: 8, Disconnects: 50,
	Timing: emulator.Timing{HeaderDelay: 20 * time.Millisecond, TTFT: 50 * time.Millisecond, ITL: 10 * time.Millisecond,
		TokensPerEvent: 1, OutputTokens: 32}}

// ErrorStats is the sidecar's error on one metric: its figure minus the
// engine's record of the same interval, over every request measured.
type ErrorStats struct {
	Metric    string  `json:"metric"`
	Unit      string  `json:"unit"`
	Truth     string  `json:"truth"` // the engine's figure it is compared with
	N         int     `json:"n"`
	SignedP50 float64 `json:"signed_p50"`
	SignedP99 float64 `json:"signed_p99"`
	AbsP50    float64 `json:"abs_p50"`
	AbsP99    float64 `json:"abs_p99"`
}

// DisconnectStats is how long after a client left its engine saw it go.
type DisconnectStats struct {
	Phase  string  `json:"phase"`
	N      int     `json:"n"`
	Missed int     `json:"missed"` // the engine never saw the client go
	P50    float64 `json:"p50_ms"`
	P99    float64 `json:"p99_ms"`
	Max    float64 `json:"max_ms"`
}

// AccuracyResult is what an accuracy run measured.
type AccuracyResult struct {
	Requests    int               `json:"requests"`
	Failed      int               `json:"failed"` // requests without a usable metrics object
	Concurrency int               `json:"concurrency"`
	GOMAXPROCS  int               `json:"gomaxprocs"`
	Timing      string            `json:"timing"`
	Seconds     float64           `json:"seconds"`
	Metrics     []ErrorStats      `json:"metrics"`
	Disconnects []DisconnectStats `json:"disconnects,omitempty"`
}

// truth is one metric's true figure, from the engine's Record and, for
// arrival, the moment the client had written the request (sent).
type truth struct {
	metric, unit, how string
	of                func(r *emulator.Record, sent time.Time) (float64, bool)
}

func msOf(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// truths are the true figures for the sidecar's metrics. The engine stamps
// each piece just before writing it, and the client's request counts as
// arrived when its write to the sidecar returned (on loopback the bytes
// are in the sidecar's socket then); the sidecar marks each when it
// arrived, so the error is how far its marks are from the moments they
// stand for.
var truths = []truth{
	{"queue_time_ms", "ms", "headers sent − request written", func(r *emulator.Record, sent time.Time) (float64, bool) {
		return msOf(r.HeadersSent.Sub(sent)), !sent.IsZero()
	}},
	{"time_to_first_token_ms", "ms", "first token − headers sent", func(r *emulator.Record, _ time.Time) (float64, bool) {
		return msOf(r.FirstToken.Sub(r.HeadersSent)), true
	}},
	{"generation_time_ms", "ms", "last token − first token", func(r *emulator.Record, _ time.Time) (float64, bool) {
		return msOf(r.LastToken.Sub(r.FirstToken)), true
	}},
	{"mean_itl_ms", "ms", "generation / (tokens − 1)", func(r *emulator.Record, _ time.Time) (float64, bool) {
		return msOf(r.LastToken.Sub(r.FirstToken)) / float64(r.CompletionTokens-1), r.CompletionTokens > 1
	}},
	{"max_itl_ms", "ms", "largest gap between token events", func(r *emulator.Record, _ time.Time) (float64, bool) {
		return msOf(r.MaxTokenGap), r.TokenEvents > 1
	}},
	{"e2e_latency_ms", "ms", "last token − request written", func(r *emulator.Record, sent time.Time) (float64, bool) {
		return msOf(r.LastToken.Sub(sent)), !sent.IsZero()
	}},
	{"tokens_per_second", "tok/s", "tokens / (last token − headers sent)", func(r *emulator.Record, _ time.Time) (float64, bool) {
		d := r.LastToken.Sub(r.HeadersSent).Seconds()
		return float64(r.CompletionTokens) / d, d > 0
	}},
}

// Accuracy measures, on this machine, how far each of the sidecar's
// figures lies from the engine's own record of the same interval, and how
// soon the engine sees a client that leaves.
func Accuracy(ctx context.Context, opts AccuracyOptions) (AccuracyResult, error) {
	if opts.Requests < 1 || opts.Concurrency < 1 || opts.Timing.OutputTokens < 2 {
		return AccuracyResult{}, errors.New("accuracy: requests and concurrency must be positive, tokens at least 2")
	}
	opts.Timing.TokensPerEvent = max(opts.Timing.TokensPerEvent, 1)
	engine := emulator.New(emulator.Config{Timing: opts.Timing})
	if err := engine.Start("127.0.0.1:0"); err != nil {
		return AccuracyResult{}, err
	}
	defer engine.Close()
	cfg := proxy.DefaultConfig()
	cfg.Upstream, cfg.AccessLog = engine.URL(), false
	sidecar, err := proxy.New(cfg, slog.New(slog.NewTextHandler(io.Discard, nil)), nil)
	if err != nil {
		return AccuracyResult{}, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return AccuracyResult{}, err
	}
	go sidecar.Serve(ln) //nolint:errcheck // ends with Shutdown
	defer sidecar.Shutdown(context.Background())
	base := "http://" + ln.Addr().String()

	t := opts.Timing
	r := AccuracyResult{Requests: opts.Requests, Concurrency: opts.Concurrency, GOMAXPROCS: runtime.GOMAXPROCS(0),
		Timing: fmt.Sprintf("queue %v, ttft %v, itl %v, %d tokens, %d per event", t.HeaderDelay, t.TTFT, t.ITL, t.OutputTokens, t.TokensPerEvent)}
	start := time.Now()
	errs, failed, err := measureStreams(ctx, base, engine, opts)
	if err != nil {
		return r, err
	}
	r.Failed = failed
	for i, tr := range truths {
		r.Metrics = append(r.Metrics, errorStats(tr, errs[i]))
	}
	if opts.Disconnects > 0 {
		for _, ph := range phases {
			if opts.Progress != nil {
				fmt.Fprintf(opts.Progress, "disconnects: %s\n", ph.name)
			}
			d, err := measureDisconnects(ctx, base, engine, ph, opts.Disconnects)
			if err != nil {
				return r, err
			}
			r.Disconnects = append(r.Disconnects, d)
		}
	}
	r.Seconds = time.Since(start).Seconds()
	return r, nil
}

// measureStreams sends the streams and returns, per truth, the sidecar's
// signed errors, and how many requests failed.
func measureStreams(ctx context.Context, base string, engine *emulator.Server, opts AccuracyOptions) ([][]float64, int, error) {
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: opts.Concurrency, DisableCompression: true}}
	body := fmt.Sprintf(`{"model":"emulated","stream":true,"include_metrics":true,"max_tokens":%d,"messages":[{"role":"user","content":"accuracy"}]}`,
		opts.Timing.OutputTokens)
	if opts.Progress != nil {
		fmt.Fprintf(opts.Progress, "streams: %d, %d at a time\n", opts.Requests, opts.Concurrency)
	}
	var (
		mu     sync.Mutex
		errs   = make([][]float64, len(truths))
		failed int
		fatal  error
	)
	next := make(chan int)
	var wg sync.WaitGroup
	for range opts.Concurrency {
		wg.Go(func() {
			for range next {
				var sent time.Time
				traced := httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{
					WroteRequest: func(httptrace.WroteRequestInfo) { sent = time.Now() }})
				metrics, id, err := PostForMetrics(traced, client, base, body, true)
				var rec emulator.Record
				if err == nil {
					waitCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
					rec, err = engine.Wait(waitCtx, id)
					cancel()
				}
				mu.Lock()
				if err != nil {
					failed++
					if ctx.Err() != nil {
						fatal = ctx.Err()
					}
				} else {
					for i, tr := range truths {
						want, ok := tr.of(&rec, sent)
						got := gjson.Get(metrics, tr.metric)
						if !ok || got.Type != gjson.Number {
							continue
						}
						errs[i] = append(errs[i], got.Float()-want)
					}
				}
				mu.Unlock()
			}
		})
	}
	for i := 0; i < opts.Requests && ctx.Err() == nil; i++ {
		next <- i
	}
	close(next)
	wg.Wait()
	return errs, failed, fatal
}

func errorStats(tr truth, signed []float64) ErrorStats {
	s := ErrorStats{Metric: tr.metric, Unit: tr.unit, Truth: tr.how, N: len(signed)}
	if len(signed) == 0 {
		return s
	}
	abs := make([]float64, len(signed))
	for i, e := range signed {
		abs[i] = math.Abs(e)
	}
	s.SignedP50, s.SignedP99 = quantile(signed, 0.50), quantile(signed, 0.99)
	s.AbsP50, s.AbsP99 = quantile(abs, 0.50), quantile(abs, 0.99)
	return s
}

// quantile is the nearest-rank quantile q of xs (sorted in place).
func quantile(xs []float64, q float64) float64 {
	slices.Sort(xs)
	i := int(math.Ceil(q*float64(len(xs)))) - 1
	return xs[min(max(i, 0), len(xs)-1)]
}

// phase is a moment at which a client leaves.
type phase struct {
	name string
	// headers are the emulator's pacing headers for the request.
	headers map[string]string
	// events is how many "data:" lines the client reads before it
	// leaves; -1 leaves before the response headers, once the engine has
	// the request.
	events int
}

// phases: while the engine holds the request before its headers (its
// queue), between the headers and the first token (its prefill), and
// between two token events. Each request would run for 10 s if its client
// were not seen to leave.
var phases = []phase{
	{"queued", map[string]string{emulator.HeaderHeaderDelay: "10s"}, -1},
	{"before the first token", map[string]string{emulator.HeaderTTFT: "10s"}, 0},
	{"mid-stream", map[string]string{emulator.HeaderTTFT: "0s", emulator.HeaderITL: "10ms"}, 4}, // the role event and 3 tokens
}

// measureDisconnects has n clients leave, one after another, in phase ph
// and returns how long after each left its engine saw it go.
func measureDisconnects(ctx context.Context, base string, engine *emulator.Server, ph phase, n int) (DisconnectStats, error) {
	s := DisconnectStats{Phase: ph.name, N: n}
	var lags []float64
	for i := range n {
		id := fmt.Sprintf("leave-%s-%d", strings.ReplaceAll(ph.name, " ", "-"), i)
		lag, seen, err := leave(ctx, strings.TrimPrefix(base, "http://"), engine, ph, id)
		if err != nil {
			return s, fmt.Errorf("%s: %w", id, err)
		}
		if !seen {
			s.Missed++
			continue
		}
		lags = append(lags, msOf(lag))
	}
	if len(lags) > 0 {
		s.P50, s.P99, s.Max = quantile(lags, 0.50), quantile(lags, 0.99), quantile(lags, 1)
	}
	return s, nil
}

// leave sends one request on its own connection, closes the connection
// at the phase's moment, and returns how long after that the engine saw
// the client go (false if it never did).
func leave(ctx context.Context, addr string, engine *emulator.Server, ph phase, id string) (time.Duration, bool, error) {
	c, err := net.Dial("tcp", addr)
	if err != nil {
		return 0, false, err
	}
	defer c.Close()
	body := `{"model":"emulated","stream":true,"include_metrics":true,"max_tokens":1000,"messages":[{"role":"user","content":"leave"}]}`
	var head strings.Builder
	for k, v := range ph.headers {
		fmt.Fprintf(&head, "%s: %s\r\n", k, v)
	}
	if _, err := fmt.Fprintf(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: sidecar\r\nContent-Type: application/json\r\nX-Request-Id: %s\r\n%sContent-Length: %d\r\n\r\n%s",
		id, head.String(), len(body), body); err != nil {
		return 0, false, err
	}
	waitCtx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	engineID := "chatcmpl-" + id
	if ph.events < 0 {
		if err := engine.Started(waitCtx, engineID); err != nil {
			return 0, false, err
		}
	} else {
		c.SetReadDeadline(time.Now().Add(20 * time.Second)) //nolint:errcheck
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			return 0, false, err
		}
		br := bufio.NewReader(resp.Body)
		for read := 0; read < ph.events; {
			line, err := br.ReadString('\n')
			if err != nil {
				return 0, false, err
			}
			if strings.HasPrefix(line, "data:") {
				read++
			}
		}
	}
	left := time.Now()
	c.Close()
	rec, err := engine.Wait(waitCtx, engineID)
	if err != nil {
		return 0, false, err
	}
	if rec.ClientGone.IsZero() {
		return 0, false, nil
	}
	return rec.ClientGone.Sub(left), true, nil
}

// WriteTable writes r as plain-text tables.
func (r AccuracyResult) WriteTable(w io.Writer) {
	fmt.Fprintf(w, "sidecar accuracy against the engine's record: %d streams (%d failed), %d at a time, GOMAXPROCS %d, %.1fs\n",
		r.Requests, r.Failed, r.Concurrency, r.GOMAXPROCS, r.Seconds)
	fmt.Fprintf(w, "engine pacing: %s\n\n", r.Timing)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "metric\tunit\t   n\tsigned p50\tsigned p99\t|error| p50\t|error| p99\tthe engine's figure")
	for _, m := range r.Metrics {
		fmt.Fprintf(tw, "%s\t%s\t%4d\t%+10.3f\t%+10.3f\t%11.3f\t%11.3f\t%s\n", m.Metric, m.Unit, m.N, m.SignedP50, m.SignedP99, m.AbsP50, m.AbsP99, m.Truth)
	}
	tw.Flush()
	if len(r.Disconnects) == 0 {
		return
	}
	fmt.Fprintln(w, "\nclient disconnect: the engine sees its client leave, ms after the client closed its connection")
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "phase\t   n\tmissed\t     p50\t     p99\t     max")
	for _, d := range r.Disconnects {
		fmt.Fprintf(tw, "%s\t%4d\t%6d\t%8.3f\t%8.3f\t%8.3f\n", d.Phase, d.N, d.Missed, d.P50, d.P99, d.Max)
	}
	tw.Flush()
}

// WriteJSON writes r as one JSON object.
func (r AccuracyResult) WriteJSON(w io.Writer) error {
	return json.NewEncoder(w).Encode(r)
}
