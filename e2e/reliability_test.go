package e2e

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/timing-sidecar/timing-sidecar/e2e/emulator"
)

// adminGauges reads the sidecar's own process figures from /metrics.
type adminGauges struct {
	goroutines, openFDs, rss, heapInuse float64
	panics                              float64
}

func readGauges(t *testing.T, admin string) adminGauges {
	t.Helper()
	resp, err := http.Get(admin + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var g adminGauges
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		name, value, ok := strings.Cut(sc.Text(), " ")
		if !ok {
			continue
		}
		v, err := strconv.ParseFloat(value, 64)
		if err != nil {
			continue
		}
		switch name {
		case "go_goroutines":
			g.goroutines = v
		case "process_open_fds":
			g.openFDs = v
		case "process_resident_memory_bytes":
			g.rss = v
		case "go_memstats_heap_inuse_bytes":
			g.heapInuse = v
		case "timing_sidecar_panics_total":
			g.panics = v
		}
	}
	return g
}

// collectGarbage makes the sidecar run its garbage collector twice (pooled
// buffers survive one collection), through its profiler endpoint.
func collectGarbage(t *testing.T, admin string) {
	t.Helper()
	for i := 0; i < 2; i++ {
		resp, err := http.Get(admin + "/debug/pprof/heap?gc=1")
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
}

// streamsFor says how many streams a leak test can open within the file
// limit: each takes a descriptor in this process, two in the sidecar and
// one in the engine (which is this process too).
func streamsFor(want int) int {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return want
	}
	return min(want, int(lim.Cur-256)/2)
}

func TestKilledClientsLeaveNothingBehind(t *testing.T) {
	t.Parallel() // its own processes: beside the other long tests, not after them
	engine := startEngine(t, emulator.Config{Timing: emulator.Timing{TTFT: 20 * time.Millisecond, ITL: 20 * time.Millisecond, OutputTokens: 1000}})
	sc := startSidecar(t, []string{"--listen", "127.0.0.1:0", "--upstream", engine.URL(), "--admin-pprof", "--access-log=false"})

	// Warm up, so the baseline holds what a running sidecar always holds.
	for i := 0; i < 8; i++ {
		rawStream(t, sc.base, fmt.Sprintf("warm-%d", i), 5, readAll, false)
	}
	collectGarbage(t, sc.admin)
	base := readGauges(t, sc.admin)
	baseConns := engine.OpenConnections()

	n := streamsFor(2000)
	t.Logf("opening %d streams and killing their clients at random moments", n)
	var wg sync.WaitGroup
	var headersSeen, eventsSeen atomic.Int64
	queued := make([]bool, n)
	for i := range queued {
		queued[i] = rand.IntN(5) == 0
	}
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Killed while queued, right after the headers, or mid-stream;
			// half of them with a reset.
			events := rand.IntN(40)
			if queued[i] {
				events = leaveQueued
			}
			got := rawStream(t, sc.base, fmt.Sprintf("kill-%d", i), 1000, events, i%2 == 0)
			if got >= 0 {
				headersSeen.Add(1)
				eventsSeen.Add(int64(got))
			}
		}()
	}
	wg.Wait()
	during := readGauges(t, sc.admin)
	t.Logf("clients left: %d after the headers, %d events read in all; then RSS %.1f MB, %v goroutines",
		headersSeen.Load(), eventsSeen.Load(), during.rss/(1<<20), during.goroutines)

	// Every engine request ends with its client gone, long before its
	// 1,000 tokens (20 s) are out.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for i := 0; i < n; i++ {
		if queued[i] {
			continue // may have left before the sidecar forwarded it: see the connections below
		}
		rec, err := engine.Wait(ctx, fmt.Sprintf("chatcmpl-kill-%d", i))
		if err != nil {
			t.Fatal(err)
		}
		if rec.ClientGone.IsZero() || rec.TokenEvents >= 1000 {
			t.Fatalf("request %d ran to its end (%d events) after its client was killed", i, rec.TokenEvents)
		}
	}

	// The sidecar's goroutines, descriptors and heap, and the engine's
	// connections, return to where they were.
	var now adminGauges
	deadline := time.Now().Add(30 * time.Second) // generous: a leak never comes back
	for {
		collectGarbage(t, sc.admin)
		now = readGauges(t, sc.admin)
		conns := engine.OpenConnections()
		// Memory: the heap in use is what a leak grows; RSS follows as
		// the runtime returns freed pages to the system, more slowly.
		if now.goroutines <= base.goroutines+2 && now.openFDs <= base.openFDs+2 &&
			now.heapInuse <= base.heapInuse+8<<20 && now.rss <= base.rss+32<<20 && conns <= baseConns {
			break
		}
		if time.Now().After(deadline) {
			if resp, err := http.Get(sc.admin + "/debug/pprof/goroutine?debug=1"); err == nil {
				dump, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				t.Logf("the sidecar's goroutines:\n%.6000s", dump)
			}
			t.Fatalf("not back to baseline: goroutines %v (was %v), open fds %v (was %v), heap in use %.1f MB (was %.1f), RSS %.1f MB (was %.1f), engine connections %d (was %d)",
				now.goroutines, base.goroutines, now.openFDs, base.openFDs, now.heapInuse/(1<<20), base.heapInuse/(1<<20), now.rss/(1<<20), base.rss/(1<<20), conns, baseConns)
		}
		time.Sleep(50 * time.Millisecond) // polling gauges: there is no event to await
	}
	t.Logf("after %d killed clients: goroutines %v (baseline %v), open fds %v (%v), heap in use %.1f MB (%.1f), RSS %.1f MB (%.1f)",
		n, now.goroutines, base.goroutines, now.openFDs, base.openFDs, now.heapInuse/(1<<20), base.heapInuse/(1<<20), now.rss/(1<<20), base.rss/(1<<20))
	if now.panics != 0 {
		t.Fatalf("%v panics", now.panics)
	}
}

// leaveQueued and readAll are rawStream's special event counts.
const (
	leaveQueued = -2 // leave while the engine holds the request before its headers
	readAll     = -1 // read the stream to its end
)

// rawStream opens a connection to the sidecar, asks for a stream of tokens,
// reads events of it (all, a number, or none: leaveQueued) and closes the
// connection, with a reset if rst. It returns the events read, or -1 if it
// left before the response headers.
func rawStream(t *testing.T, base, id string, tokens, events int, rst bool) int {
	c, err := net.Dial("tcp", strings.TrimPrefix(base, "http://"))
	if err != nil {
		t.Error(err)
		return -1
	}
	defer func() {
		if tc, ok := c.(*net.TCPConn); ok && rst {
			tc.SetLinger(0) //nolint:errcheck
		}
		c.Close()
	}()
	c.SetDeadline(time.Now().Add(30 * time.Second)) //nolint:errcheck
	body := fmt.Sprintf(`{"model":"m","stream":true,"include_metrics":true,"max_tokens":%d,"messages":[{"role":"user","content":"hi"}]}`, tokens)
	delay := "0s"
	if events == leaveQueued {
		delay = "1s"
	}
	fmt.Fprintf(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nX-Request-Id: %s\r\n%s: %s\r\nContent-Length: %d\r\n\r\n%s",
		id, emulator.HeaderHeaderDelay, delay, len(body), body)
	if events == leaveQueued {
		time.Sleep(time.Duration(rand.IntN(50)) * time.Millisecond) // a random moment in the queue
		return -1
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Errorf("%s: %v", id, err)
		return -1
	}
	br := bufio.NewReader(resp.Body)
	read := 0
	for events == readAll || read < events {
		line, err := br.ReadString('\n')
		if err != nil {
			if events == readAll && err != io.EOF {
				t.Errorf("%s: %v", id, err)
			}
			break
		}
		if strings.HasPrefix(line, "data:") {
			read++
		}
	}
	return read
}

// soakDuration is 20 s unless TIMING_SIDECAR_SOAK says otherwise (a
// longer soak before a release, a shorter one while developing). Twenty
// seconds send each kind of request hundreds of times, interleaved with
// every other kind, through every pool's reuse; the leaks a longer run
// would show are measured directly by TestKilledClientsLeaveNothingBehind.
func soakDuration() time.Duration {
	if d, err := time.ParseDuration(os.Getenv("TIMING_SIDECAR_SOAK")); err == nil {
		return d
	}
	return 20 * time.Second
}

func TestSoakMixedTraffic(t *testing.T) {
	t.Parallel() // its own processes: beside the other long tests, not after them
	engine := startEngine(t, emulator.Config{Timing: emulator.Timing{TTFT: 10 * time.Millisecond, ITL: 5 * time.Millisecond, OutputTokens: 32}})
	sc := startSidecar(t, []string{"--listen", "127.0.0.1:0", "--upstream", engine.URL(), "--access-log=false"})
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64, DisableCompression: true}}

	type outcome struct{ kind, got string }
	var (
		mu          sync.Mutex
		counts      = map[string]int{}
		unexplained []outcome
	)
	note := func(kind string, ok bool, got string) {
		mu.Lock()
		defer mu.Unlock()
		counts[kind]++
		if !ok && len(unexplained) < 20 {
			unexplained = append(unexplained, outcome{kind, got})
		}
	}
	kinds := soakKinds()
	d := soakDuration()
	stop := time.Now().Add(d)
	var wg sync.WaitGroup
	for w := 0; w < 16; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; time.Now().Before(stop); i++ {
				k := kinds[i%len(kinds)]
				status, body, err := soakRequest(client, sc.base, k)
				note(k.name, k.check(status, body, err), fmt.Sprintf("%d %v %.200s", status, err, body))
			}
		}()
	}
	wg.Wait()
	total := 0
	for _, n := range counts {
		total += n
	}
	t.Logf("soak %v: %d requests %v", d, total, counts)
	if len(unexplained) > 0 {
		t.Fatalf("unexplained outcomes: %+v", unexplained)
	}
	if g := readGauges(t, sc.admin); g.panics != 0 {
		t.Fatalf("%v panics", g.panics)
	}
}

// soakKind is a kind of request the soak sends, and the only outcome it
// may have.
type soakKind struct {
	name    string
	body    string // empty for a GET
	headers map[string]string
	path    string
	check   func(status int, body string, err error) bool
	cancel  bool // the client leaves after the first bytes
}

// soakKinds lists each kind of request the soak sends.
func soakKinds() []soakKind {
	const msgs = `[{"role":"user","content":"hi"}]`
	return []soakKind{
		{name: "stream", path: "/v1/chat/completions", body: `{"model":"m","stream":true,"include_metrics":true,"messages":` + msgs + `}`,
			check: func(s int, b string, err error) bool {
				return err == nil && s == 200 && strings.Contains(b, `"metrics":{`) && strings.HasSuffix(b, "data: [DONE]\n\n")
			}},
		{name: "unary", path: "/v1/chat/completions", body: `{"model":"m","include_metrics":true,"messages":` + msgs + `}`,
			check: func(s int, b string, err error) bool {
				return err == nil && s == 200 && strings.Contains(b, `"metrics":{`)
			}},
		{name: "completions", path: "/v1/completions", body: `{"model":"m","prompt":"a","stream":true,"stream_options":{"include_usage":true}}`,
			check: func(s int, b string, err error) bool {
				return err == nil && s == 200 && strings.Contains(b, `"usage":{`)
			}},
		{name: "models", path: "/v1/models",
			check: func(s int, b string, err error) bool {
				return err == nil && s == 200 && strings.Contains(b, `"object":"list"`)
			}},
		{name: "engine error", path: "/v1/chat/completions", body: `{"model":"m","include_metrics":true,"messages":` + msgs + `}`,
			headers: map[string]string{emulator.HeaderStatus: "503"},
			check:   func(s int, b string, err error) bool { return err == nil && s == 503 && strings.Contains(b, `"error"`) }},
		{name: "engine drops", path: "/v1/chat/completions", body: `{"model":"m","stream":true,"include_metrics":true,"messages":` + msgs + `}`,
			headers: map[string]string{emulator.HeaderCutAfter: "3"},
			check:   func(s int, b string, err error) bool { return err != nil && s == 200 && !strings.Contains(b, "[DONE]") }},
		// A stream of a minute: it cannot end before its client leaves,
		// however late the client runs.
		{name: "client cancels", path: "/v1/chat/completions", body: `{"model":"m","stream":true,"max_tokens":1200,"messages":` + msgs + `}`,
			headers: map[string]string{emulator.HeaderITL: "50ms"}, cancel: true,
			check: func(s int, b string, err error) bool { return err != nil }},
		{name: "bad include_metrics", path: "/v1/chat/completions", body: `{"model":"m","include_metrics":"maybe"}`,
			check: func(s int, b string, err error) bool {
				return err == nil && s == 400 && strings.Contains(b, "invalid_include_metrics")
			}},
	}
}

// soakRequest sends one request of kind k and returns what its client saw:
// the status, the body, and the error of the request or of its body.
func soakRequest(client *http.Client, base string, k soakKind) (int, string, error) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	method := http.MethodPost
	if k.body == "" {
		method = http.MethodGet
	}
	req, _ := http.NewRequestWithContext(ctx, method, base+k.path, strings.NewReader(k.body))
	req.Header.Set("Content-Type", "application/json")
	for h, v := range k.headers {
		req.Header.Set(h, v)
	}
	resp, err := client.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	if k.cancel {
		// Leave after the first bytes of the stream.
		io.ReadAtLeast(resp.Body, make([]byte, 64), 1) //nolint:errcheck
		cancel()
		_, err = io.ReadAll(resp.Body)
		return resp.StatusCode, "", err
	}
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}
