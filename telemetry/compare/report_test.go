package compare

import (
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"time"
)

// accessLog writes n request lines per arm: cache hits (20 ms TTFT) and
// misses (100 ms, times slower for canary), hits a share of each arm's
// requests, and failed requests of each arm.
func accessLog(rng *rand.Rand, n int, hits map[string]float64, slower float64, failed map[string]int) string {
	var b strings.Builder
	for _, arm := range []string{"stable", "canary"} {
		for i := range n {
			cache, median := "none", 100.0
			if float64(i) < hits[arm]*float64(n) {
				cache, median = "full", 20
			}
			if arm == "canary" {
				median *= slower
			}
			fmt.Fprintf(&b, `{"msg":"request","variant":%q,"path":"/v1/chat/completions","model":"m","status":200,"cache":%q,"prompt_tokens":500,"completion_tokens":100,"time_to_first_token_ms":%.3f,"upstream_error":""}`+"\n",
				arm, cache, ttft(rng, 1, median)[0])
		}
		for range failed[arm] {
			fmt.Fprintf(&b, `{"msg":"request","variant":%q,"path":"/v1/chat/completions","model":"m","status":502,"upstream_error":"connect"}`+"\n", arm)
		}
	}
	return b.String()
}

func read(t *testing.T, log string) *Samples {
	t.Helper()
	var s Samples
	if err := s.Read(strings.NewReader(log), ""); err != nil {
		t.Fatal(err)
	}
	return &s
}

// TestReportComparesLikeWithLike: the canary served more cache hits and
// is no slower on like requests: its pooled TTFT says no difference and
// the mix check flags the mix; each stratum is there too.
func TestReportComparesLikeWithLike(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	s := read(t, accessLog(rng, 1000, map[string]float64{"stable": 0.2, "canary": 0.6}, 1, nil))
	r := Build(s, BuildOptions{Seed: 1})
	if r.Base != "stable" {
		t.Errorf("base %q, want the first arm read", r.Base)
	}
	e, ok := r.Entry("time_to_first_token_ms", "canary")
	if !ok {
		t.Fatalf("no pooled TTFT entry in %+v", r.Results)
	}
	if e.Verdict != NoDifference || e.Detectable == nil {
		t.Errorf("pooled verdict %q, detectable %v", e.Verdict, e.Detectable)
	}
	if len(r.Mix) != 1 || !r.Mix[0].Differs {
		t.Errorf("mix %+v", r.Mix)
	}
	strata := 0
	for _, e := range r.Results {
		if e.Stratum != nil && e.Metric == "time_to_first_token_ms" {
			strata++
		}
	}
	if strata != 2 {
		t.Errorf("%d TTFT strata, want 2", strata)
	}
	// Each arm's pooled median is of the same mix: both near the
	// strata's weighted median, far from the canary's naive one.
	base, canary := *e.Arms["stable"].P50, *e.Arms["canary"].P50
	if canary/base < 0.8 || canary/base > 1.25 {
		t.Errorf("standardized medians %v and %v differ as the naive ones would", base, canary)
	}
}

// TestReportFindsASlowerCanary: 10% slower on like requests, and more
// failures: slower, with its ratio's interval above 1, and more failures.
func TestReportFindsASlowerCanary(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	s := read(t, accessLog(rng, 2000, map[string]float64{"stable": 0.3, "canary": 0.3}, 1.1, map[string]int{"stable": 5, "canary": 60}))
	r := Build(s, BuildOptions{Base: "stable", Seed: 1})
	e, _ := r.Entry("time_to_first_token_ms", "canary")
	if e.Verdict != Slower || e.Difference.P50RatioCI[0] <= 1 {
		t.Errorf("verdict %q, ratio %v %v", e.Verdict, *e.Difference.P50Ratio, e.Difference.P50RatioCI)
	}
	if len(r.Errors) != 1 || r.Errors[0].Verdict != MoreFailures {
		t.Errorf("errors %+v", r.Errors)
	}
	if r.Mix[0].Differs {
		t.Errorf("mix flagged for alike mixes: %+v", r.Mix)
	}
}

// TestReportJSON: the JSON has the documented fields: per entry metric,
// stratum (an object, or "all" pooled), arms with n, p50, p50_ci, p90,
// p90_ci, difference with p50_ratio and p50_ratio_ci, p_value, verdict.
func TestReportJSON(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	r := Build(read(t, accessLog(rng, 300, map[string]float64{"stable": 0.5, "canary": 0.5}, 1, nil)), BuildOptions{Seed: 1})
	out, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Results []map[string]any `json:"results"`
	}
	if err := json.Unmarshal(out, &doc); err != nil {
		t.Fatal(err)
	}
	first := doc.Results[0]
	if first["metric"] != "time_to_first_token_ms" || first["stratum"] != "all" {
		t.Errorf("first entry %v", first)
	}
	stratum, _ := doc.Results[1]["stratum"].(map[string]any)
	if stratum["cache"] == nil || stratum["endpoint"] != "/v1/chat/completions" {
		t.Errorf("a stratum's entry: %v", doc.Results[1])
	}
	for _, key := range []string{"arms", "difference", "p_value", "q_value", "verdict"} {
		if _, ok := first[key]; !ok {
			t.Errorf("no %q in %v", key, first)
		}
	}
	arm, _ := first["arms"].(map[string]any)["canary"].(map[string]any)
	for _, key := range []string{"n", "p50", "p50_ci", "p90", "p90_ci"} {
		if _, ok := arm[key]; !ok {
			t.Errorf("no %q in an arm: %v", key, arm)
		}
	}
	diff, _ := first["difference"].(map[string]any)
	if _, ok := diff["p50_ratio_ci"].([]any); !ok {
		t.Errorf("difference %v", diff)
	}
}

// TestReportSaysNoDifferenceForAA: through the whole path (access-log
// lines, strata, pooling, the false discovery rate), two arms alike with
// alike mixes say "no difference" for the pooled TTFT in at least 95% of
// 200 seeds.
func TestReportSaysNoDifferenceForAA(t *testing.T) {
	const seeds = 200
	same := 0
	for seed := range seeds {
		rng := rand.New(rand.NewPCG(uint64(seed), 21))
		r := Build(read(t, accessLog(rng, 500, map[string]float64{"stable": 0.3, "canary": 0.3}, 1, nil)), BuildOptions{Seed: uint64(seed)})
		if e, _ := r.Entry("time_to_first_token_ms", "canary"); e.Verdict == NoDifference {
			same++
		}
	}
	t.Logf("A/A through the report: no difference in %d of %d seeds (%.1f%%)", same, seeds, 100*float64(same)/seeds)
	if same < seeds*95/100 {
		t.Errorf("no difference in %d of %d", same, seeds)
	}
}

// BenchmarkBuild: a report of 100,000 requests an arm in 8 strata.
func BenchmarkBuild(b *testing.B) {
	rng := rand.New(rand.NewPCG(1, 1))
	var log strings.Builder
	for _, arm := range []string{"stable", "canary"} {
		for i := range 100_000 {
			fmt.Fprintf(&log, `{"msg":"request","variant":%q,"path":"/v1/chat/completions","model":"m%d","status":200,"cache":"none","prompt_tokens":%d,"completion_tokens":100,"time_to_first_token_ms":%.3f,"mean_itl_ms":%.3f,"e2e_latency_ms":%.3f}`+"\n",
				arm, i%2, 100<<(i%4*2), ttft(rng, 1, 100)[0], ttft(rng, 1, 10)[0], ttft(rng, 1, 1000)[0])
		}
	}
	var s Samples
	if err := s.Read(strings.NewReader(log.String()), ""); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for range b.N {
		Build(&s, BuildOptions{Seed: 1, Sequential: true})
	}
}

// TestTheSequentialReadingSaysHowLong: with the log's times, an undecided
// reading says how long the requests it still needs take at the arms'
// pace: here two requests a second an arm.
func TestTheSequentialReadingSaysHowLong(t *testing.T) {
	rng := rand.New(rand.NewPCG(51, 52))
	var timed strings.Builder
	start := time.Date(2026, 12, 7, 10, 0, 0, 0, time.UTC)
	i := 0
	for line := range strings.Lines(accessLog(rng, 200, map[string]float64{"stable": 0.3, "canary": 0.3}, 1.15, nil)) {
		at := start.Add(time.Duration(i%200) * 500 * time.Millisecond).Format(time.RFC3339Nano)
		timed.WriteString(strings.Replace(line, `{"msg"`, `{"time":"`+at+`","msg"`, 1))
		i++
	}
	r := Build(read(t, timed.String()), BuildOptions{Seed: 1, Sequential: true})
	if pace := r.Arms[0].RequestsPerSecond; pace == nil || math.Abs(*pace-200/99.5) > 0.01 {
		t.Errorf("pace %v, want 200 requests over 99.5 s", pace)
	}
	e, _ := r.Entry("time_to_first_token_ms", "canary")
	s := e.Sequential
	if s == nil || s.Decided || s.More == 0 || s.MoreSeconds == nil {
		t.Fatalf("reading %+v", s)
	}
	if want := float64(s.More) / (200 / 99.5); math.Abs(*s.MoreSeconds-want) > 1 {
		t.Errorf("%d more requests take %v s, want %v", s.More, *s.MoreSeconds, want)
	}
}
