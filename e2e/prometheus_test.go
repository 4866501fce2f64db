package e2e

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/timing-sidecar/timing-sidecar/deploy/grafana"
	"github.com/timing-sidecar/timing-sidecar/e2e/emulator"
	"github.com/timing-sidecar/timing-sidecar/e2e/needs"
)

// The dashboard and the rules are checked against a real Prometheus:
// Debian's package (it brings promtool), installed with apt-get when the
// machine lacks it, scraping the release binary every second.

const (
	rulesFile     = "../deploy/prometheus/timing-sidecar-rules.yaml"
	dashboardFile = "../deploy/grafana/timing-sidecar.json"
)

// needPrometheus installs Debian's prometheus package unless prometheus
// and promtool are on the PATH.
func needPrometheus(t *testing.T) {
	t.Helper()
	needs.Program(t, "prometheus")
	needs.Program(t, "promtool")
}

// promServer is a running Prometheus.
type promServer struct{ base string }

// startPrometheus runs Prometheus scraping target every second and
// evaluating rules every second.
func startPrometheus(t *testing.T, target string) *promServer {
	t.Helper()
	dir := t.TempDir()
	rules, err := filepath.Abs(rulesFile)
	if err != nil {
		t.Fatal(err)
	}
	config := fmt.Sprintf(`global: {scrape_interval: 1s, evaluation_interval: 1s}
rule_files: [%q]
scrape_configs:
  - job_name: timing-sidecar
    static_configs: [{targets: [%q]}]
`, rules, strings.TrimPrefix(target, "http://"))
	if err := os.WriteFile(filepath.Join(dir, "prometheus.yml"), []byte(config), 0o644); err != nil {
		t.Fatal(err)
	}
	listen := freePorts(t, 1)[0]
	cmd := exec.Command("prometheus", "--config.file="+filepath.Join(dir, "prometheus.yml"), "--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--web.listen-address="+listen)
	p := &promServer{base: "http://" + listen}
	startBackend(t, "prometheus", cmd, func() bool { return answers200(p.base + "/-/ready") })
	return p
}

// sample is one element of an instant query's result.
type sample struct {
	Metric map[string]string `json:"metric"`
	Value  [2]any            `json:"value"`
}

func (s sample) value() float64 {
	str, _ := s.Value[1].(string)
	v, _ := strconv.ParseFloat(str, 64)
	return v
}

// query runs an instant query; a query Prometheus refuses fails the test.
func (p *promServer) query(t *testing.T, expr string) []sample {
	t.Helper()
	resp, err := http.Get(p.base + "/api/v1/query?" + url.Values{"query": {expr}}.Encode())
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out struct {
		Status string `json:"status"`
		Error  string `json:"error"`
		Data   struct {
			ResultType string   `json:"resultType"`
			Result     []sample `json:"result"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		t.Fatal(err)
	}
	if out.Status != "success" {
		t.Errorf("Prometheus refused %s: %s", expr, out.Error)
	}
	return out.Data.Result
}

// await polls expr until its first sample satisfies ok.
func (p *promServer) await(t *testing.T, expr string, ok func(float64) bool, what string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		if r := p.query(t, expr); len(r) > 0 && ok(r[0].value()) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %s did not hold within 30s", what, expr)
		}
		time.Sleep(200 * time.Millisecond) // polling Prometheus, which has no event to await
	}
}

// fillVariables puts what Grafana would into a dashboard expression: every
// value of a variable, and a rate window of a few scrapes.
func fillVariables(expr string) string {
	return strings.NewReplacer(`"$namespace"`, `".*"`, `"$pod"`, `".*"`, `"$model"`, `".*"`, "$__rate_interval", "1m").Replace(expr)
}

func TestDashboardAndRulesInPrometheus(t *testing.T) {
	needPrometheus(t)
	if out, err := exec.Command("promtool", "check", "rules", rulesFile).CombinedOutput(); err != nil {
		t.Fatalf("promtool check rules: %v\n%s", err, out)
	}
	const ttft, slo = 150 * time.Millisecond, 400 * time.Millisecond
	engine := startEngine(t, emulator.Config{Model: "m", PromptTokensDetails: true,
		Timing: emulator.Timing{TTFT: ttft, ITL: 5 * time.Millisecond, TokensPerEvent: 1, OutputTokens: 16}})
	// Two arms: the deployment's (--variant) and the one half the known
	// streams name in their header, as a gateway splitting traffic would.
	s := startSidecar(t, []string{"--upstream", engine.URL(), "--slo-ttft", slo.String(), "--slo-itl", "50ms",
		"--tenant-header", "X-Tenant", "--tenant-label", "--variant", "stable", "--variant-header", "X-Variant", "--readiness-interval", "200ms"})
	prom := startPrometheus(t, s.admin)

	// Known timings: every stream's first token 150 ms after the engine
	// takes it, well inside the 400 ms objective.
	const streams = 24
	bodyTTFT := sendKnownStreams(t, s, streams)
	misses := sendPrefillMix(t, s, prefillMisses/2)
	sendUnaryAndEmbeddings(t, s)
	prom.await(t, `sum(timing_sidecar_time_to_first_token_seconds_count)`, func(v float64) bool { return v >= streams }, "the streams scraped")

	// Every dashboard expression, variables filled in, returns data (a
	// counter's rate needs two scrapes after its first value: each is
	// awaited), and every recording rule has been recorded.
	mustReturn := dashboardAndRuleExpressions(t, prom)
	awaitAllReturnData(t, prom, mustReturn)
	t.Logf("%d dashboard and rule expressions return data before any failure", len(mustReturn))
	// The Arms row compares rates: a second round of each arm's streams,
	// once the first is scraped, gives every arm one.
	for _, arm := range []string{"stable", "canary"} {
		for i := range 4 {
			h := map[string]string{"X-Request-Id": fmt.Sprintf("%s-%d", arm, i)}
			if arm != "stable" {
				h["X-Variant"] = arm
			}
			if r := send(t, s.base, true, 8, h); r.status != 200 {
				t.Fatalf("%s stream %d: %d", arm, i, r.status)
			}
		}
	}
	awaitEveryArm(t, prom, s, []string{"stable", "canary"})
	checkPrefillPanel(t, prom, s, misses)

	// Failures now: a stream the engine cuts (an upstream error), a
	// client that leaves.
	sendCutAndLeftStreams(t, s)
	prom.await(t, `sum(timing_sidecar_upstream_errors_total)`, func(v float64) bool { return v >= 1 }, "the cut stream scraped")

	checkMedianWithinItsBucket(t, prom, bodyTTFT)
	if met := prom.query(t, `sum(timing_sidecar_slo_requests_total{result="met", tenant="acme"})`); len(met) == 0 || met[0].value() < streams {
		t.Errorf("goodput counter: %v met for tenant acme, want %d", met, streams)
	}

	// The engine slows past the objective: the counter and the alert
	// follow.
	sendSlowStreams(t, s, 12)
	prom.await(t, `sum(timing_sidecar_slo_requests_total{result="missed"})`, func(v float64) bool { return v >= 12 }, "missed requests counted")
	prom.await(t, `count(ALERTS{alertname="TimingSidecarGoodputLow", alertstate=~"pending|firing"})`, func(v float64) bool { return v >= 1 }, "the goodput alert")
	checkMissedTTFTLogged(t, s)
}

// sendKnownStreams sends n streams for tenant acme, four at a time, and
// returns each body's queue + ttft (the histogram's definition) in ms; a
// stream that fails ends the test.
func sendKnownStreams(t *testing.T, s *sidecar, n int) []float64 {
	t.Helper()
	var mu sync.Mutex
	var bodyTTFT []float64
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			h := map[string]string{"X-Request-Id": fmt.Sprintf("known-%d", i), "X-Tenant": "acme"}
			if i%2 == 1 {
				h["X-Variant"] = "canary" // the others are the deployment's, stable
			}
			if i%4 == 3 {
				// A few prompt tokens from the prefix cache: the TTFT
				// panels by cache class get a second class, and the
				// first token stays in the same bucket.
				h[emulator.HeaderCachedTokens] = "3"
			}
			r := send(t, s.base, true, 8, h)
			if r.status != 200 || r.metrics == nil || r.metrics["queue_time_ms"] == nil || r.metrics["time_to_first_token_ms"] == nil {
				t.Errorf("stream %d: %+v", i, r)
				return
			}
			mu.Lock()
			bodyTTFT = append(bodyTTFT, *r.metrics["queue_time_ms"]+*r.metrics["time_to_first_token_ms"])
			mu.Unlock()
		})
		if i%4 == 3 {
			wg.Wait() // four at a time: no queueing in front of the emulator
		}
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	return bodyTTFT
}

// Prefill mix: 600-token prompts, each first token 150 ms after the
// engine takes it (the emulator's TTFT shrinks to the share computed), as
// the known streams' are, so the TTFT median stays theirs: prefillMisses
// computed whole, 4,000 tokens a second; twice as many full hits, one
// token computed, which would read 6.7 tokens a second and pull the
// panel's median below every miss.
const (
	prefillPrompt = 600
	prefillMisses = 4
)

// sendPrefillMix sends misses of the prefill mix and twice as many full
// hits, and returns the misses' speed, in tokens a second, as the engine
// paced it.
func sendPrefillMix(t *testing.T, s *sidecar, misses int) float64 {
	t.Helper()
	prompt := strings.TrimSpace(strings.Repeat("word ", prefillPrompt))
	body := `{"model":"m","stream":true,"max_tokens":2,"messages":[{"role":"user","content":"` + prompt + `"}]}`
	for i := range 3 * misses {
		cached, ttft := "0", 150*time.Millisecond
		if i%3 != 0 {
			cached, ttft = strconv.Itoa(prefillPrompt-1), 150*time.Millisecond*prefillPrompt
		}
		req, err := http.NewRequest("POST", s.base+"/v1/chat/completions", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set(emulator.HeaderCachedTokens, cached)
		req.Header.Set(emulator.HeaderTTFT, ttft.String())
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("prefill mix %d: %d", i, resp.StatusCode)
		}
	}
	return prefillPrompt / 0.150
}

// checkPrefillPanel checks the dashboard's prefill speed panel against the
// mix: the first half of it scraped, the second is sent, so that the
// panel's rate() sees it; only the misses are observed, and the panel's
// median lies in their bucket.
func checkPrefillPanel(t *testing.T, prom *promServer, s *sidecar, misses float64) {
	t.Helper()
	count := `sum(timing_sidecar_prefill_tokens_per_second_count)`
	prom.await(t, count, func(v float64) bool { return v >= prefillMisses/2 }, "the first prefill speeds scraped")
	sendPrefillMix(t, s, prefillMisses/2)
	prom.await(t, count, func(v float64) bool { return v >= prefillMisses }, "the prefill speeds scraped")
	if n := prom.query(t, count); len(n) != 1 || n[0].value() != prefillMisses {
		t.Errorf("prefill speeds observed: %v, want the %d misses alone", n, prefillMisses)
	}
	raw, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	var dashboard any
	if err := json.Unmarshal(raw, &dashboard); err != nil {
		t.Fatal(err)
	}
	var median string
	var walk func(v any)
	walk = func(v any) {
		switch v := v.(type) {
		case map[string]any:
			if e, ok := v["expr"].(string); ok && strings.HasPrefix(e, "histogram_quantile(0.5,") && strings.Contains(e, "timing_sidecar_prefill_tokens_per_second_bucket") {
				median = e
			}
			for _, x := range v {
				walk(x)
			}
		case []any:
			for _, x := range v {
				walk(x)
			}
		}
	}
	walk(dashboard)
	if median == "" {
		t.Fatal("no median prefill speed panel in the dashboard")
	}
	// The misses' speed is about 4,000 (the sidecar's interval holds a
	// little more than the engine's 150 ms): the 2,500–5,000 bucket.
	// Observed full hits would have put it under 100.
	inBucket := func(v float64) bool { return v > 2500 && v <= 5000 }
	prom.await(t, fillVariables(median), func(v float64) bool { return !math.IsNaN(v) }, "the panel's median after the second half")
	if r := prom.query(t, fillVariables(median)); len(r) != 1 || !inBucket(r[0].value()) {
		t.Errorf("the panel's median prefill speed %v, want the misses' bucket, 2,500 to 5,000 (%.0f tokens/s)", r, misses)
	} else {
		t.Logf("the panel's median prefill speed %.0f tokens/s, the misses' %.0f", r[0].value(), misses)
	}
}

// sendUnaryAndEmbeddings sends a non-streaming request (the other panels'
// source) and an embeddings request (the pooling panel's). No failure yet:
// a healthy system's panels and rules must show data (0 failures), not
// "no data".
func sendUnaryAndEmbeddings(t *testing.T, s *sidecar) {
	t.Helper()
	if r := send(t, s.base, false, 8, map[string]string{"X-Tenant": "beta"}); r.status != 200 {
		t.Fatalf("unary: %d", r.status)
	}
	emb, err := http.Post(s.base+"/v1/embeddings", "application/json", strings.NewReader(`{"model":"m","input":"a b c"}`))
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, emb.Body)
	emb.Body.Close()
	if emb.StatusCode != 200 {
		t.Fatalf("embeddings: %d", emb.StatusCode)
	}
}

// dashboardAndRuleExpressions returns what must return data: every
// dashboard expression with its variables filled in, and every recording
// rule's expression and its recorded series. Each alert's expression is
// run here, since it returns data only when it fires.
func dashboardAndRuleExpressions(t *testing.T, prom *promServer) []string {
	t.Helper()
	raw, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	exprs, err := grafana.Expressions(raw)
	if err != nil {
		t.Fatal(err)
	}
	rraw, err := os.ReadFile(rulesFile)
	if err != nil {
		t.Fatal(err)
	}
	var rules struct {
		Groups []struct {
			Rules []struct{ Record, Alert, Expr string } `json:"rules"`
		} `json:"groups"`
	}
	if err := yaml.Unmarshal(rraw, &rules); err != nil {
		t.Fatal(err)
	}
	var mustReturn []string
	for _, e := range exprs {
		mustReturn = append(mustReturn, fillVariables(e))
	}
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			if r.Record != "" {
				mustReturn = append(mustReturn, r.Expr, r.Record)
			} else {
				prom.query(t, r.Expr) // an alert's expression runs; it returns data only when it fires
			}
		}
	}
	return mustReturn
}

// awaitAllReturnData polls until every expression returns data, for 30 s.
func awaitAllReturnData(t *testing.T, prom *promServer, mustReturn []string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		var empty []string
		for _, e := range mustReturn {
			if len(prom.query(t, e)) == 0 {
				empty = append(empty, e)
			}
		}
		if len(empty) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d dashboard and rule expressions return nothing after 30s:\n%s", len(empty), len(mustReturn), strings.Join(empty, "\n"))
		}
		time.Sleep(250 * time.Millisecond) // polling Prometheus, which has no event to await
	}
}

// awaitEveryArm polls until each expression of the dashboard's Arms row
// returns a number for every arm, for 30 s. Each round sends a stream
// of each arm: the row's rates need each arm's counters to rise between
// two scrapes, and a counter first scraped at its final value never does.
func awaitEveryArm(t *testing.T, prom *promServer, s *sidecar, arms []string) {
	t.Helper()
	exprs := rowExpressions(t, "Arms")
	if len(exprs) < 6 {
		t.Fatalf("the Arms row has %d expressions: %v", len(exprs), exprs)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		for _, arm := range arms {
			if r := send(t, s.base, true, 8, map[string]string{"X-Variant": arm}); r.status != 200 {
				t.Fatalf("a stream of %s: %+v", arm, r)
			}
		}
		var missing []string
		for _, e := range exprs {
			got := map[string]bool{}
			for _, r := range prom.query(t, fillVariables(e)) {
				got[r.Metric["variant"]] = !math.IsNaN(r.value())
			}
			for _, arm := range arms {
				if !got[arm] {
					missing = append(missing, arm+": "+e)
				}
			}
		}
		if len(missing) == 0 {
			t.Logf("each of the Arms row's %d expressions has a number for each arm, %v", len(exprs), arms)
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 30s, the Arms row has no number for these arms:\n%s", strings.Join(missing, "\n"))
		}
		time.Sleep(250 * time.Millisecond) // polling Prometheus, which has no event to await
	}
}

// rowExpressions is the expressions of the dashboard's panels under the
// row titled title, up to the next row.
func rowExpressions(t *testing.T, title string) []string {
	t.Helper()
	raw, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Panels []struct {
			Type, Title string
			Targets     []struct{ Expr string }
		}
	}
	if err := json.Unmarshal(raw, &d); err != nil {
		t.Fatal(err)
	}
	var out []string
	in := false
	for _, p := range d.Panels {
		if p.Type == "row" {
			in = p.Title == title
			continue
		}
		for _, tg := range p.Targets {
			if in && tg.Expr != "" {
				out = append(out, tg.Expr)
			}
		}
	}
	return out
}

// sendCutAndLeftStreams sends a stream the engine cuts (an upstream error)
// and one whose client leaves.
func sendCutAndLeftStreams(t *testing.T, s *sidecar) {
	t.Helper()
	cut, err := http.NewRequest("POST", s.base+"/v1/chat/completions", strings.NewReader(`{"model":"m","stream":true,"messages":[{"role":"user","content":"x"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	cut.Header.Set(emulator.HeaderCutAfter, "2")
	if resp, err := http.DefaultClient.Do(cut); err == nil {
		io.Copy(io.Discard, resp.Body) //nolint:errcheck // the engine cuts it: the error is the point
		resp.Body.Close()
	}
	if n := rawStream(t, s.base, "leaves", 2000, 2, false); n != 2 {
		t.Fatalf("the leaving client read %d events", n)
	}
}

// checkMedianWithinItsBucket: the histogram's median agrees with the
// bodies' (in ms) within its bucket.
func checkMedianWithinItsBucket(t *testing.T, prom *promServer, bodyTTFT []float64) {
	t.Helper()
	slices.Sort(bodyTTFT)
	median := (bodyTTFT[len(bodyTTFT)/2-1] + bodyTTFT[len(bodyTTFT)/2]) / 2 / 1000
	r := prom.query(t, `histogram_quantile(0.5, sum by (le) (timing_sidecar_time_to_first_token_seconds_bucket))`)
	if len(r) != 1 {
		t.Fatalf("median query: %v", r)
	}
	var bounds []float64
	for _, b := range prom.query(t, `sum by (le) (timing_sidecar_time_to_first_token_seconds_bucket)`) {
		if v, err := strconv.ParseFloat(b.Metric["le"], 64); err == nil && !math.IsInf(v, 1) {
			bounds = append(bounds, v)
		}
	}
	slices.Sort(bounds)
	i, _ := slices.BinarySearch(bounds, median)
	if i == 0 || i == len(bounds) {
		t.Fatalf("median %v s outside the buckets %v", median, bounds)
	}
	width := bounds[i] - bounds[i-1]
	if q := r[0].value(); math.Abs(q-median) > width {
		t.Errorf("histogram_quantile(0.5) = %.4f s, the bodies' median %.4f s: more than the bucket's width %.3f s apart", q, median, width)
	} else {
		t.Logf("median time to first token: histogram %.4f s, bodies %.4f s (bucket %g–%g s)", q, median, bounds[i-1], bounds[i])
	}
}

// sendSlowStreams sends n streams whose first token comes after 600 ms,
// past the objective.
func sendSlowStreams(t *testing.T, s *sidecar, n int) {
	t.Helper()
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			r := send(t, s.base, true, 4, map[string]string{"X-Request-Id": fmt.Sprintf("slow-%d", i), emulator.HeaderTTFT: "600ms"})
			if r.status != 200 {
				t.Errorf("slow stream %d: %d", i, r.status)
			}
		})
	}
	wg.Wait()
}

// checkMissedTTFTLogged: some access-log line says a slow request missed
// its ttft objective.
func checkMissedTTFTLogged(t *testing.T, s *sidecar) {
	t.Helper()
	missedLine := false
	for len(s.accessLog) > 0 {
		line := <-s.accessLog
		missedLine = missedLine || strings.Contains(line, `"slo":"missed","slo_missed":"ttft"`) && strings.Contains(line, `"request_id":"slow-`)
	}
	if !missedLine {
		t.Error("no access-log line says a slow request missed its ttft objective")
	}
}
