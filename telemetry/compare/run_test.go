package compare

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// armLog is n lines of one arm's requests with no variant field.
func armLog(rng *rand.Rand, n int) string {
	log := accessLog(rng, n, map[string]float64{"stable": 0.3}, 1, nil)
	lines := strings.SplitAfter(log, "\n")
	var b strings.Builder
	for _, l := range lines[:n] {
		b.WriteString(strings.Replace(l, `"variant":"stable",`, "", 1))
	}
	return b.String()
}

// TestRunReadsOneArmPerFile: files named for their arms, globbed, give
// a text report against the base named.
func TestRunReadsOneArmPerFile(t *testing.T) {
	dir := t.TempDir()
	rng := rand.New(rand.NewPCG(7, 7))
	for _, arm := range []string{"stable", "canary"} {
		if err := os.WriteFile(filepath.Join(dir, arm+".log"), []byte(armLog(rng, 200)), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	var out bytes.Buffer
	err := Run(context.Background(), Options{Inputs: []string{filepath.Join(dir, "*.log")}, Base: "stable", Seed: 1}, nil, &out)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"each arm against stable", "arm canary:", "time_to_first_token_ms, canary against stable", "all (weighted by strata)"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("no %q in:\n%s", want, out.String())
		}
	}
}

// TestRunNeedsTwoArms: one arm, a missing base, a glob matching nothing
// and no input at all are each refused with what to do.
func TestRunNeedsTwoArms(t *testing.T) {
	rng := rand.New(rand.NewPCG(8, 8))
	one := armLog(rng, 50)
	two := accessLog(rng, 30, map[string]float64{}, 1, nil)
	for _, c := range []struct {
		name, stdin string
		opts        Options
		want        string
	}{
		{"one arm", one, Options{Inputs: []string{"-"}}, "name arms with the variant field"},
		{"missing base", two, Options{Inputs: []string{"-"}, Base: "nope"}, `no requests of the base arm "nope"; arms read: stable, canary`},
		{"no match", one, Options{Inputs: []string{"/nonexistent/*.log"}}, "no such file"},
		{"no input", one, Options{}, "no access logs"},
	} {
		err := Run(context.Background(), c.opts, strings.NewReader(c.stdin), io.Discard)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: err %v, want %q", c.name, err, c.want)
		}
	}
}

// TestFollowReportsAsStdinGrows: with --follow on standard input, a tick
// before two arms are read says it waits; the end of input gives the
// last report, with the anytime-valid reading, as JSON.
func TestFollowReportsAsStdinGrows(t *testing.T) {
	pr, pw := io.Pipe()
	tick := make(chan time.Time)
	var out syncBuffer
	done := make(chan error, 1)
	go func() {
		done <- Run(context.Background(), Options{Inputs: []string{"-"}, Follow: true, JSON: true, tick: tick}, pr, &out)
	}()
	tick <- time.Now() // taken before any line: waiting
	rng := rand.New(rand.NewPCG(9, 9))
	if _, err := io.WriteString(pw, accessLog(rng, 300, map[string]float64{"stable": 0.3, "canary": 0.3}, 1, nil)); err != nil {
		t.Fatal(err)
	}
	pw.Close()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if !strings.Contains(lines[0], "waiting for two arms") {
		t.Errorf("first report %q", lines[0])
	}
	var last Report
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &last); err != nil {
		t.Fatalf("last line is not a report: %v", err)
	}
	var doc struct {
		Results []struct {
			Stratum    any         `json:"stratum"`
			Sequential *Sequential `json:"sequential"`
		} `json:"results"`
	}
	json.Unmarshal([]byte(lines[len(lines)-1]), &doc)
	if doc.Results[0].Stratum != "all" || doc.Results[0].Sequential == nil || doc.Results[0].Sequential.RatioCI == nil {
		t.Errorf("the pooled entry has no anytime reading: %+v", doc.Results[0])
	}
}

// TestFollowReadsAGrowingFile: lines appended to a followed file reach
// the reports; a file cut shorter (copytruncate) is read from its start.
func TestFollowReadsAGrowingFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "both.log")
	rng := rand.New(rand.NewPCG(10, 10))
	if err := os.WriteFile(path, []byte(accessLog(rng, 30, map[string]float64{"stable": 0.3, "canary": 0.3}, 1, nil)), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	tick := make(chan time.Time)
	var out syncBuffer
	done := make(chan error, 1)
	go func() { done <- Run(ctx, Options{Inputs: []string{path}, Follow: true, tick: tick}, nil, &out) }()
	waitFor := func(want string) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for !strings.Contains(out.String(), want) {
			if time.Now().After(deadline) {
				t.Fatalf("no %q in:\n%s", want, out.String())
			}
			tick <- time.Now()
		}
	}
	waitFor(", 60 requests")
	f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString(accessLog(rng, 20, map[string]float64{"stable": 0.3, "canary": 0.3}, 1, nil))
	f.Close()
	waitFor(", 100 requests")
	if err := os.WriteFile(path, []byte(accessLog(rng, 5, map[string]float64{"stable": 0.3, "canary": 0.3}, 1, nil)), 0o644); err != nil {
		t.Fatal(err)
	}
	waitFor(", 110 requests")
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// syncBuffer is a buffer written by Run and read by the test.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
