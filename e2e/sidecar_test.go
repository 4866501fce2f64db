// End-to-end tests: the real timing-sidecar binary, started as a process on
// free ports in front of the emulated engine, driven by the official OpenAI
// Go SDK. Every metric is checked against causal bounds from the engine's
// record and the client's own reads (see span).
package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/timing-sidecar/timing-sidecar/e2e/needs"

	"github.com/openai/openai-go/v3/option"

	"github.com/timing-sidecar/timing-sidecar/e2e/emulator"
)

// binary is the timing-sidecar built once for all tests.
var binary string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "timing-sidecar-e2e")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binary = filepath.Join(dir, "timing-sidecar")
	// The collector, for the tracing and GenAI metrics tests, and Helm,
	// for the post-renderer test, build while the others run.
	go needs.Collector.Path() //nolint:errcheck // the collector's tests report it
	go needs.Helm.Path()      //nolint:errcheck // the post-renderer test reports it
	// The release build, as the Dockerfile runs it.
	build := exec.Command("../.ci/build", binary)
	build.Env = append(os.Environ(), "VERSION=e2e", "COMMIT=e2e-commit")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "build timing-sidecar:", err)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// sidecar is a running timing-sidecar process.
type sidecar struct {
	cmd   *exec.Cmd
	base  string // http://host:port
	admin string // http://host:port of the admin endpoints
	// accessLog receives the access-log lines (stdout) as they come.
	accessLog chan string

	waitOnce sync.Once
	exitErr  error

	mu sync.Mutex
	// logs are the operational log's lines (stderr), and logged is closed
	// once the last has come (the process has exited).
	logs   []string
	logged chan struct{}
}

// logLines returns the operational log's lines once the process has
// exited and its log has been read to the end. Call it before wait, which
// closes the pipe the log is read from (os/exec: reads must be done
// before Wait).
func (s *sidecar) logLines(t *testing.T) []string {
	t.Helper()
	select {
	case <-s.logged:
	case <-time.After(20 * time.Second):
		t.Fatal("the sidecar's log did not end")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.logs...)
}

// wait waits for the process to exit, once, and returns how it exited.
func (s *sidecar) wait(t *testing.T, within time.Duration) error {
	t.Helper()
	done := make(chan struct{})
	go func() {
		s.waitOnce.Do(func() { s.exitErr = s.cmd.Wait() })
		close(done)
	}()
	select {
	case <-done:
		return s.exitErr
	case <-time.After(within):
		s.cmd.Process.Kill()
		t.Fatalf("sidecar did not exit within %v", within)
		return nil
	}
}

// startSidecar runs the binary with args and extra environment, listening
// on a free loopback port, and waits until it says where it listens.
func startSidecar(t *testing.T, args []string, env ...string) *sidecar {
	t.Helper()
	cmd := exec.Command(binary, args...)
	// Every sidecar gets free loopback ports (never the default :8001,
	// which anything else on the machine may hold) and no drain delay
	// unless the test says otherwise.
	cmd.Env = append(append(os.Environ(), "TIMING_SIDECAR_LISTEN=127.0.0.1:0", "TIMING_SIDECAR_ADMIN_LISTEN=127.0.0.1:0",
		"TIMING_SIDECAR_DRAIN_DELAY=0s"), env...)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	s := &sidecar{cmd: cmd, accessLog: make(chan string, 1000)}
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			s.accessLog <- sc.Text()
		}
	}()
	// logged is closed when the sidecar's last log line has been logged:
	// the test must not end before, or the logging races with its end.
	logged := make(chan struct{})
	s.logged = logged
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		if err := s.wait(t, 10*time.Second); err != nil {
			t.Errorf("sidecar exited with %v after SIGTERM", err)
		}
		<-logged // the pipe is closed once the process has exited
	})
	type addrs struct {
		Msg         string `json:"msg"`
		Listen      string `json:"listen"`
		AdminListen string `json:"admin_listen"`
	}
	listening := make(chan addrs, 1)
	go func() {
		defer close(logged)
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			// Kept before it is announced: a test that has the address
			// has the line in logs.
			s.mu.Lock()
			s.logs = append(s.logs, sc.Text())
			s.mu.Unlock()
			var line addrs
			if json.Unmarshal(sc.Bytes(), &line) == nil && line.Msg == "timing-sidecar listening" {
				listening <- line
			}
			t.Logf("sidecar: %s", sc.Text())
		}
	}()
	select {
	case a := <-listening:
		s.base, s.admin = "http://"+a.Listen, "http://"+a.AdminListen
	case <-time.After(10 * time.Second):
		t.Fatal("the sidecar did not start listening within 10s")
	}
	return s
}

// startEngine runs an emulated engine for one test.
func startEngine(t *testing.T, cfg emulator.Config) *emulator.Server {
	t.Helper()
	e := emulator.New(cfg)
	if err := e.Start("127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	return e
}

// record waits for the engine's record of request id.
func record(t *testing.T, e *emulator.Server, id string) emulator.Record {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	rec, err := e.Wait(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	return rec
}

// metrics is a decoded metrics object; null fields are nil.
type metrics map[string]*float64

func parseMetrics(t *testing.T, raw string) metrics {
	t.Helper()
	var fields map[string]json.RawMessage
	if err := json.Unmarshal([]byte(raw), &fields); err != nil || fields == nil {
		t.Fatalf("metrics %q: %v", raw, err)
	}
	m := metrics{}
	for k, v := range fields {
		var f *float64
		if json.Unmarshal(v, &f) == nil {
			m[k] = f // numbers and nulls; the engine's report is an object
		}
	}
	return m
}

func msOf(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// The timing checks are causal bounds, never two clocks agreeing within a
// tolerance: a mark the sidecar takes on a piece of the exchange lies after
// the engine began writing that piece (the engine's Record stamps it just
// before its first byte) and before the test's client had read it (the
// client stamps it just after). Its arrival mark lies after the client
// began sending and before the engine had read the request. A figure from
// mark a to mark b then lies between b.from − a.to and b.to − a.from,
// however long the scheduler pauses either side: the suite passes with the
// CPU saturated. On an idle machine the bounds are a few milliseconds
// apart, so a mark taken on the wrong event still fails. The arithmetic is
// tested exactly in timing/; the tight accuracy figures come from the
// accuracy report (bench.Accuracy).

// span is when the sidecar must have taken one mark: not before from, not
// after to.
type span struct{ from, to time.Time }

// between bounds, in ms, the time from mark a to mark b.
func between(a, b span) (lo, hi float64) { return msOf(b.from.Sub(a.to)), msOf(b.to.Sub(a.from)) }

// rounding is what the metrics' three decimals may add or take.
const rounding = 0.001

// within checks that a figure lies in [lo, hi].
func (m metrics) within(t *testing.T, field string, lo, hi float64) {
	t.Helper()
	got := m[field]
	switch {
	case got == nil:
		t.Errorf("%s = null, want between %.3f and %.3f", field, lo, hi)
	case *got < lo-rounding || *got > hi+rounding:
		t.Errorf("%s = %.3f, want between %.3f and %.3f (causal bounds)", field, *got, lo, hi)
	}
}

// during checks a figure that is the time from mark a to mark b, divided
// among gaps (1 for a plain duration, tokens − 1 for a mean gap).
func (m metrics) during(t *testing.T, field string, a, b span, gaps float64) {
	t.Helper()
	lo, hi := between(a, b)
	m.within(t, field, lo/gaps, hi/gaps)
}

// rate checks tokens per second over the time from mark a to mark b: the
// duration's bounds, inverted.
func (m metrics) rate(t *testing.T, field string, a, b span, tokens float64) {
	t.Helper()
	lo, hi := between(a, b)
	fastest := math.Inf(1)
	if lo > 0 {
		fastest = tokens / (lo / 1000)
	}
	m.within(t, field, tokens/(hi/1000), fastest)
}

func (m metrics) null(t *testing.T, fields ...string) {
	t.Helper()
	for _, f := range fields {
		if v, ok := m[f]; !ok || v != nil {
			t.Errorf("%s = %v (present %v), want null", f, v, ok)
		}
	}
}

// seen is what the test's client saw of one exchange, each stamp taken on
// the client's side of the event it names.
type seen struct {
	sent    time.Time // just before the request was sent
	headers time.Time // the response headers had arrived
	// first and last: the first and last events carrying generated
	// output had been read; events counts those events.
	first, last time.Time
	events      int
	metrics     time.Time // the event or body carrying the metrics had been read
}

// stamp is an SDK option that notes when the request left and when its
// response headers arrived.
func (c *seen) stamp() option.RequestOption {
	return option.WithMiddleware(func(req *http.Request, next option.MiddlewareNext) (*http.Response, error) {
		c.sent = time.Now()
		resp, err := next(req)
		c.headers = time.Now()
		return resp, err
	})
}

// read notes an event the client has just read: one carrying generated
// output if token, the metrics if metrics.
func (c *seen) read(token, metrics bool) {
	now := time.Now()
	if token {
		if c.events == 0 {
			c.first = now
		}
		c.last = now
		c.events++
	}
	if metrics {
		c.metrics = now
	}
}

// whole is what a client of a non-streaming response saw: everything at
// once, when the call returned, after events token events upstream.
func (c seen) whole(end time.Time, events int) seen {
	c.headers, c.first, c.last, c.metrics, c.events = end, end, end, end, events
	return c
}

// checkStream checks a stream's metrics against the engine's record and
// what the client saw.
func checkStream(t *testing.T, m metrics, rec emulator.Record, c seen) {
	t.Helper()
	if c.events != rec.TokenEvents || c.events < 2 {
		t.Fatalf("the client read %d token events, the engine sent %d; want the same, at least 2", c.events, rec.TokenEvents)
	}
	arrival := span{c.sent, rec.Received}
	accepted := span{rec.HeadersSent, c.headers}
	first := span{rec.FirstToken, c.first}
	last := span{rec.LastToken, c.last}
	// The metrics go out on the usage event, which the engine sends after
	// its last token.
	done := span{rec.LastToken, c.metrics}
	tokens := float64(rec.CompletionTokens)
	m.during(t, "queue_time_ms", arrival, accepted, 1)
	m.during(t, "time_to_first_token_ms", accepted, first, 1)
	m.during(t, "generation_time_ms", first, last, 1)
	m.during(t, "mean_itl_ms", first, last, tokens-1)
	m.rate(t, "tokens_per_second", accepted, last, tokens)
	m.during(t, "e2e_latency_ms", arrival, done, 1)
	// The engine stamps only its first and last token events; what holds
	// whatever the marks: the mean gap between events ≤ the largest ≤ all.
	if gen := m["generation_time_ms"]; gen != nil {
		m.within(t, "max_itl_ms", *gen/float64(c.events-1)-rounding, *gen)
	}
	// The parts add up to the whole they lie in.
	if q, f, g, e := m["queue_time_ms"], m["time_to_first_token_ms"], m["generation_time_ms"], m["e2e_latency_ms"]; q != nil && f != nil && g != nil && e != nil {
		if sum := *q + *f + *g; sum > *e+3*rounding {
			t.Errorf("queue + ttft + generation = %.3f ms, more than e2e_latency_ms %.3f", sum, *e)
		}
	}
	if *m["prompt_tokens"] != float64(rec.PromptTokens) || *m["completion_tokens"] != float64(rec.CompletionTokens) {
		t.Errorf("token counts %v/%v, engine reported %d/%d", *m["prompt_tokens"], *m["completion_tokens"], rec.PromptTokens, rec.CompletionTokens)
	}
}

func contains(s string, subs ...string) bool {
	for _, sub := range subs {
		if !strings.Contains(s, sub) {
			return false
		}
	}
	return true
}
