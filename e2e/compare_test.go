package e2e

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/timing-sidecar/timing-sidecar/e2e/emulator"
)

// TestCompareTwoArms runs an experiment end to end: two engines, the
// canary's 50% slower to its first token and alike between tokens, each
// behind a sidecar with its own --variant; requests sent to both arms
// side by side, a few of the canary's failing. The sidecars' access logs,
// given to `timing-sidecar compare`, say the canary is slower on time to
// first token, with the ratio's interval above 1, and count each arm's
// requests and failures.
func TestCompareTwoArms(t *testing.T) {
	const perArm, failures = 40, 3
	arms := map[string]*sidecar{}
	for _, arm := range []struct {
		name string
		ttft time.Duration
	}{{"stable", 40 * time.Millisecond}, {"canary", 60 * time.Millisecond}} {
		e := startEngine(t, emulator.Config{Model: "m", Timing: emulator.Timing{TTFT: arm.ttft, ITL: 10 * time.Millisecond, TokensPerEvent: 1}})
		arms[arm.name] = startSidecar(t, []string{"--upstream", e.URL(), "--variant", arm.name})
	}
	var wg sync.WaitGroup
	for i := range perArm {
		for _, name := range []string{"stable", "canary"} {
			wg.Go(func() {
				h := map[string]string{}
				if name == "canary" && i < failures {
					h[emulator.HeaderStatus] = "503"
				}
				send(t, arms[name].base, true, 8, h)
			})
		}
		if i%2 == 1 {
			wg.Wait() // four at a time: the arms share the machine alike
		}
	}
	wg.Wait()
	dir := t.TempDir()
	var logs []string
	for name, s := range arms {
		path := filepath.Join(dir, name+".log")
		if err := os.WriteFile(path, []byte(strings.Join(requestLines(t, s, perArm), "\n")+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		logs = append(logs, path)
	}
	html := filepath.Join(dir, "report.html")
	out, err := exec.Command(binary, append([]string{"compare", "--json", "--base", "stable", "--html", html}, logs...)...).Output()
	if err != nil {
		t.Fatalf("compare: %v\n%s", err, out)
	}
	var report struct {
		Arms []struct {
			Name             string
			Requests, Failed int
		}
		Results []struct {
			Metric     string
			Stratum    any
			Arm        string
			Verdict    string
			Difference struct {
				Ratio *float64   `json:"p50_ratio"`
				CI    [2]float64 `json:"p50_ratio_ci"`
			}
		}
	}
	if err := json.Unmarshal(out, &report); err != nil {
		t.Fatalf("compare's JSON: %v\n%s", err, out)
	}
	counts := map[string][2]int{}
	for _, a := range report.Arms {
		counts[a.Name] = [2]int{a.Requests, a.Failed}
	}
	if counts["stable"] != [2]int{perArm, 0} || counts["canary"] != [2]int{perArm, failures} {
		t.Errorf("requests and failures by arm: %v", counts)
	}
	found := false
	for _, r := range report.Results {
		if r.Metric == "time_to_first_token_ms" && r.Stratum == "all" && r.Arm == "canary" {
			found = true
			if r.Verdict != "slower" || r.Difference.CI[0] <= 1 {
				t.Errorf("TTFT: %s, ratio %v %v; want slower, interval above 1", r.Verdict, r.Difference.Ratio, r.Difference.CI)
			}
		}
	}
	if !found {
		t.Errorf("no pooled TTFT entry in:\n%s", out)
	}
	if page, err := os.ReadFile(html); err != nil || !strings.Contains(string(page), "<svg") {
		t.Errorf("--html wrote no page with plots: %v", err)
	}
}

// requestLines takes n request lines from s's access log.
func requestLines(t *testing.T, s *sidecar, n int) []string {
	t.Helper()
	var lines []string
	deadline := time.After(30 * time.Second)
	for len(lines) < n {
		select {
		case line := <-s.accessLog:
			if strings.Contains(line, `"msg":"request"`) {
				lines = append(lines, line)
			}
		case <-deadline:
			t.Fatalf("%d of %d request lines logged", len(lines), n)
		}
	}
	return lines
}
