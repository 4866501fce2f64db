package e2e

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// manifestMemoryLimit is the sidecar container's memory limit in
// deploy/inject/sidecar.yaml, and manifestGoMemLimit the GOMEMLIMIT set beside it.
const (
	manifestMemoryLimit = 256 << 20
	manifestGoMemLimit  = "150MiB"
)

// TestLargeUploadsStayWithinTheMemoryLimit: three 60 MB requests at once,
// against the release binary with the manifests' settings, each asking for
// metrics on a stream (so each body is read and edited), all get their
// answer, and the process's peak resident memory stays well under the
// container's limit. Before the body budget, two such requests took the
// container past it.
func TestLargeUploadsStayWithinTheMemoryLimit(t *testing.T) {
	t.Parallel() // its own processes: beside the other long tests, not after them
	engine := startEngineProcess(t)
	sc := startSidecar(t, []string{"--upstream", engine, "--access-log=false", "--admin-pprof"}, "GOMEMLIMIT="+manifestGoMemLimit)
	// 60 MB of prompt, with escapes all through it (a parser that
	// unescapes to skip a value copies it).
	content := strings.Repeat(`line \"quoted\" text\n`, 60<<20/22)
	var wg sync.WaitGroup
	errs := make(chan error, 3)
	for i := range 3 {
		wg.Go(func() {
			body := []byte(fmt.Sprintf(`{"model":"m","messages":[{"role":"user","content":"%s"}],"max_tokens":4,"stream":true,"include_metrics":true,"user":"u%d"}`, content, i))
			resp, err := http.Post(sc.base+"/v1/chat/completions", "application/json", bytes.NewReader(body))
			if err != nil {
				errs <- err
				return
			}
			events, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 || !bytes.Contains(events, []byte("data: [DONE]")) {
				errs <- fmt.Errorf("request %d: status %d, %.200s", i, resp.StatusCode, events)
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	peak := peakRSS(t, sc.cmd.Process.Pid)
	t.Logf("peak RSS with three 60 MB requests: %.1f MiB (limit %d MiB)", float64(peak)/(1<<20), manifestMemoryLimit>>20)
	if peak > manifestMemoryLimit*3/4 {
		t.Fatalf("peak RSS %.1f MiB: not well under the container's %d MiB", float64(peak)/(1<<20), manifestMemoryLimit>>20)
	}
	// The memory goes back to the system once the bodies are sent on,
	// without a collection asked from outside.
	deadline := time.Now().Add(20 * time.Second)
	for {
		g := readGauges(t, sc.admin)
		if g.rss < 64<<20 {
			t.Logf("after the requests: heap in use %.1f MiB, RSS %.1f MiB", g.heapInuse/(1<<20), g.rss/(1<<20))
			break
		}
		if time.Now().After(deadline) {
			if resp, err := http.Get(sc.admin + "/debug/pprof/heap"); err == nil {
				b, _ := io.ReadAll(resp.Body)
				os.WriteFile("/tmp/heap.pprof", b, 0o644)
			}
			t.Fatalf("RSS %.1f MiB 20 s after the requests (heap in use %.1f MiB): the bodies' memory was kept", g.rss/(1<<20), g.heapInuse/(1<<20))
		}
		time.Sleep(100 * time.Millisecond) // polling a gauge: there is no event to await
	}
}

// TestLargeAnswersStayWithinTheMemoryLimit: six non-streaming answers of
// about 15 MB at once, each asking for metrics (so each is held, spliced
// into and held again until its client has it), against the release
// binary with the manifests' settings: every one is answered, those the
// budget has room for with metrics, and the peak resident memory stays
// well under the container's limit.
func TestLargeAnswersStayWithinTheMemoryLimit(t *testing.T) {
	t.Parallel() // its own processes: beside the other long tests, not after them
	engine := startEngineProcess(t)
	sc := startSidecar(t, []string{"--upstream", engine, "--access-log=false"}, "GOMEMLIMIT="+manifestGoMemLimit)
	const answers, tokens = 6, 2_400_000 // about 15 MB of words each
	var wg sync.WaitGroup
	errs := make(chan error, answers)
	var mu sync.Mutex
	withMetrics := 0
	for i := range answers {
		wg.Go(func() {
			body := fmt.Sprintf(`{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":%d,"include_metrics":true,"user":"u%d"}`, tokens, i)
			resp, err := http.Post(sc.base+"/v1/chat/completions", "application/json", strings.NewReader(body))
			if err != nil {
				errs <- err
				return
			}
			answer, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 || len(answer) < 10<<20 {
				errs <- fmt.Errorf("answer %d: status %d, %d bytes", i, resp.StatusCode, len(answer))
				return
			}
			if bytes.Contains(answer[len(answer)-4096:], []byte(`"metrics":{`)) {
				mu.Lock()
				withMetrics++
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	peak := peakRSS(t, sc.cmd.Process.Pid)
	t.Logf("peak RSS with %d answers of 15 MB: %.1f MiB (limit %d MiB), %d with metrics", answers, float64(peak)/(1<<20), manifestMemoryLimit>>20, withMetrics)
	if peak > manifestMemoryLimit*3/4 {
		t.Fatalf("peak RSS %.1f MiB: not well under the container's %d MiB", float64(peak)/(1<<20), manifestMemoryLimit>>20)
	}
	if withMetrics == 0 {
		t.Fatal("no answer had room for its metrics")
	}
}

// startEngineProcess runs the emulated engine as the release binary's
// emulate command, on a port of its own choosing, with a context long
// enough for any body, and returns its URL. The tests that move hundreds
// of megabytes run it out of process: inside the test binary the race
// detector would instrument every byte the engine parses and writes, and
// they would take minutes.
func startEngineProcess(t *testing.T) string {
	t.Helper()
	cmd := exec.Command(binary, "emulate", "--listen", "127.0.0.1:0", "--ttft", "0s", "--itl", "0s", "--max-model-len", strconv.Itoa(1<<30))
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() }) //nolint:errcheck // killed
	addr := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			if a, ok := strings.CutPrefix(sc.Text(), "emulated engine listening on "); ok {
				addr <- a
			}
		}
		close(addr)
	}()
	select {
	case a, ok := <-addr:
		if !ok {
			t.Fatal("the emulated engine exited before it listened")
		}
		return "http://" + a
	case <-time.After(30 * time.Second):
		t.Fatal("the emulated engine did not listen within 30s")
		return ""
	}
}

// peakRSS is the process's peak resident set (VmHWM), in bytes.
func peakRSS(t *testing.T, pid int) int64 {
	t.Helper()
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Skipf("no /proc: %v", err)
	}
	for _, line := range strings.Split(string(status), "\n") {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return kb << 10
		}
	}
	t.Fatal("no VmHWM in /proc status")
	return 0
}

// TestAStreamKeepsAGoroutinesFirstStack: a stream's deepest calls (a
// classification, then the metrics spliced into its held finishing
// event) fit in the 8 KB stack a goroutine starts with, so a connection
// that has carried a stream holds no more than that. 200 streams at once,
// their metrics on the finishing event (the client asked for none of the
// usage), then their connections kept open: each connection's goroutine
// keeps the stack it grew to, as no collection runs to shrink one
// (GOGC=off). The release build, as the race detector's frames are
// larger. A connection holds its goroutine's stack and its read-ahead's
// (4 KB): 12 KB and a share of the sidecar's own goroutines, where a
// goroutine at 16 KB, the next size, would make it 20.
func TestAStreamKeepsAGoroutinesFirstStack(t *testing.T) {
	t.Parallel()
	engine := startEngineProcess(t)
	sc := startSidecar(t, []string{"--upstream", engine, "--access-log=false", "--admin-pprof"}, "GOGC=off")
	const streams = 200
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: streams}}
	defer client.CloseIdleConnections()
	var wg sync.WaitGroup
	errs := make(chan error, streams)
	for range streams {
		wg.Go(func() {
			body := `{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":8,"stream":true,"include_metrics":true}`
			req, _ := http.NewRequest("POST", sc.base+"/v1/chat/completions", strings.NewReader(body))
			req.Header.Set("Content-Type", "application/json")
			// Every stream waits for its first token long enough for all
			// to be open at once, each on a connection of its own.
			req.Header.Set("X-Emulator-TTFT", "500ms")
			resp, err := client.Do(req)
			if err != nil {
				errs <- err
				return
			}
			events, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 || !bytes.Contains(events, []byte(`"metrics":{`)) || !bytes.Contains(events, []byte("data: [DONE]")) {
				errs <- fmt.Errorf("status %d, %.300s", resp.StatusCode, events)
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	resp, err := http.Get(sc.admin + "/debug/pprof/heap?debug=1")
	if err != nil {
		t.Fatal(err)
	}
	profile, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var stack int64
	for line := range strings.Lines(string(profile)) {
		if v, ok := strings.CutPrefix(line, "# Stack = "); ok {
			stack, _ = strconv.ParseInt(strings.Fields(v)[0], 10, 64)
		}
	}
	t.Logf("goroutine stacks after %d streams, their connections open: %d KiB, %.1f KiB a connection", streams, stack>>10, float64(stack)/1024/streams)
	if stack == 0 || stack > streams*16<<10 {
		t.Errorf("goroutine stacks %d KiB, over 16 KiB for each of %d connections", stack>>10, streams)
	}
}
