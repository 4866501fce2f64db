// End-to-end tests: the real timing-sidecar binary, started as a process on
// free ports in front of the emulated engine, driven by the official OpenAI
// Go SDK. Every metric is checked against the engine's record.
package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

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
	// Every sidecar gets a free admin port and no drain delay unless the
	// test says otherwise.
	cmd.Env = append(append(os.Environ(), "TIMING_SIDECAR_ADMIN_LISTEN=127.0.0.1:0", "TIMING_SIDECAR_DRAIN_DELAY=0s"), env...)
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
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		if err := s.wait(t, 10*time.Second); err != nil {
			t.Errorf("sidecar exited with %v after SIGTERM", err)
		}
	})
	type addrs struct {
		Msg         string `json:"msg"`
		Listen      string `json:"listen"`
		AdminListen string `json:"admin_listen"`
	}
	listening := make(chan addrs, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
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

// near checks a figure against the engine's truth within ±max(5 ms, 5%).
func (m metrics) near(t *testing.T, field string, truth float64) {
	t.Helper()
	got := m[field]
	if got == nil {
		t.Errorf("%s = null, want %.3f", field, truth)
		return
	}
	if tol := math.Max(5, 0.05*truth); math.Abs(*got-truth) > tol {
		t.Errorf("%s = %.3f, want %.3f ± %.3f", field, *got, truth, tol)
	}
}

// relNear checks a rate within 5%.
func (m metrics) relNear(t *testing.T, field string, truth float64) {
	t.Helper()
	if got := m[field]; got == nil || math.Abs(*got-truth) > 0.05*truth {
		t.Errorf("%s = %v, want %.3f ± 5%%", field, got, truth)
	}
}

func (m metrics) null(t *testing.T, fields ...string) {
	t.Helper()
	for _, f := range fields {
		if v, ok := m[f]; !ok || v != nil {
			t.Errorf("%s = %v (present %v), want null", f, v, ok)
		}
	}
}

// checkStream compares a stream's metrics with the engine's record.
func checkStream(t *testing.T, m metrics, rec emulator.Record) {
	t.Helper()
	gen := rec.LastToken.Sub(rec.FirstToken)
	m.near(t, "queue_time_ms", msOf(rec.HeadersSent.Sub(rec.Received)))
	m.near(t, "time_to_first_token_ms", msOf(rec.FirstToken.Sub(rec.HeadersSent)))
	m.near(t, "generation_time_ms", msOf(gen))
	m.near(t, "max_itl_ms", msOf(rec.MaxTokenGap))
	m.near(t, "mean_itl_ms", msOf(gen)/float64(rec.CompletionTokens-1))
	m.relNear(t, "tokens_per_second", float64(rec.CompletionTokens)/rec.LastToken.Sub(rec.HeadersSent).Seconds())
	m.near(t, "e2e_latency_ms", msOf(rec.LastToken.Sub(rec.Received)))
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
