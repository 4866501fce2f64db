package compare

import (
	"bytes"
	"encoding/json"
	"encoding/xml"
	"fmt"
	"math/rand/v2"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// page is r drawn as HTML.
func page(t *testing.T, r Report) string {
	t.Helper()
	var b bytes.Buffer
	if err := WriteHTML(&b, &r); err != nil {
		t.Fatal(err)
	}
	return b.String()
}

// slowerCanary is a report of a canary 10% slower on TTFT, with failures
// and the TTFT's spread of cache hits (20 ms) and misses (100 ms).
func slowerCanary(t *testing.T, opts BuildOptions) Report {
	t.Helper()
	rng := rand.New(rand.NewPCG(21, 22))
	return Build(read(t, accessLog(rng, 600, map[string]float64{"stable": 0.3, "canary": 0.3}, 1.1, map[string]int{"stable": 3, "canary": 12})), opts)
}

// narrowLog is n requests per arm with TTFT and e2e latency spread
// evenly over [lo, hi): values no axis should draw logarithmically.
func narrowLog(rng *rand.Rand, n int, lo, hi float64) string {
	var b strings.Builder
	for _, arm := range []string{"stable", "canary"} {
		for range n {
			fmt.Fprintf(&b, `{"msg":"request","variant":%q,"path":"/v1/completions","model":"m","status":200,"cache":"none","prompt_tokens":100,"completion_tokens":50,"time_to_first_token_ms":%.3f,"e2e_latency_ms":%.3f}`+"\n",
				arm, lo+rng.Float64()*(hi-lo), 10*(lo+rng.Float64()*(hi-lo)))
		}
	}
	return b.String()
}

var (
	tagRE   = regexp.MustCompile(`<(/?)([a-zA-Z][a-zA-Z0-9]*)\b[^>]*?(/?)>`)
	scripts = regexp.MustCompile(`(?s)<script>.*?</script>`)
	svgs    = regexp.MustCompile(`(?s)<svg\b.*?</svg>`)
	voids   = []string{"meta", "br", "img", "input", "link", "hr", "col", "wbr"}
)

// checkWellFormed fails unless, outside the script, every element the
// page opens is closed in order, and every SVG parses as strict XML.
func checkWellFormed(t *testing.T, html string) {
	t.Helper()
	if !strings.HasPrefix(html, "<!DOCTYPE html>") {
		t.Errorf("the page does not start with its doctype: %.40q", html)
	}
	var open []string
	for _, m := range tagRE.FindAllStringSubmatch(scripts.ReplaceAllString(html, "<script></script>"), -1) {
		closing, name, self := m[1] == "/", strings.ToLower(m[2]), m[3] == "/"
		switch {
		case self || slices.Contains(voids, name):
		case !closing:
			open = append(open, name)
		case len(open) == 0 || open[len(open)-1] != name:
			t.Fatalf("</%s> closes %v", name, open)
		default:
			open = open[:len(open)-1]
		}
	}
	if len(open) > 0 {
		t.Errorf("elements left open: %v", open)
	}
	for i, svg := range svgs.FindAllString(html, -1) {
		d := xml.NewDecoder(strings.NewReader(svg))
		for {
			if _, err := d.Token(); err != nil {
				if err.Error() != "EOF" {
					t.Errorf("SVG %d is not well-formed XML: %v", i, err)
				}
				break
			}
		}
	}
}

// TestHTMLIsSelfContained: one well-formed page that loads nothing: no
// address but the SVG namespace's, no src, link, import or url().
func TestHTMLIsSelfContained(t *testing.T) {
	html := page(t, slowerCanary(t, BuildOptions{Seed: 1}))
	checkWellFormed(t, html)
	const svgNS = `xmlns="http://www.w3.org/2000/svg"`
	if n, ns := strings.Count(html, "http://"), strings.Count(html, svgNS); n != ns || ns == 0 {
		t.Errorf("%d http:// references, of which %d the SVG namespace", n, ns)
	}
	for _, ref := range []string{"https://", "src=", "<link", "@import", "url(", "<iframe", "<img"} {
		if strings.Contains(html, ref) {
			t.Errorf("the page refers out: %q", ref)
		}
	}
	if n := strings.Count(html, "<script"); n != 1 {
		t.Errorf("%d scripts, want the one legibility check", n)
	}
}

// TestHTMLEscapesWhatTheLogSays: an arm, a model and an endpoint from the
// log are text on the page, never markup.
func TestHTMLEscapesWhatTheLogSays(t *testing.T) {
	const arm, model, path = `<script>alert(1)</script>`, `"><img src=x onerror=alert(2)>`, `/v1/<b>chat</b>`
	rng := rand.New(rand.NewPCG(23, 24))
	log := accessLog(rng, 300, map[string]float64{"stable": 0.5, "canary": 0.5}, 1, nil)
	quote := func(s string) string { b, _ := json.Marshal(s); return string(b) }
	log = strings.ReplaceAll(log, `"variant":"canary"`, `"variant":`+quote(arm))
	log = strings.ReplaceAll(log, `"model":"m"`, `"model":`+quote(model))
	log = strings.ReplaceAll(log, `"path":"/v1/chat/completions"`, `"path":`+quote(path))
	html := page(t, Build(read(t, log), BuildOptions{Seed: 1}))
	checkWellFormed(t, html)
	for _, raw := range []string{arm, model, path, "<img", "<b>"} {
		if strings.Contains(html, raw) {
			t.Errorf("the page holds %q unescaped", raw)
		}
	}
	for _, escaped := range []string{"&lt;script&gt;alert(1)&lt;/script&gt;", "&gt;&lt;img src=x onerror=alert(2)&gt;", "/v1/&lt;b&gt;chat&lt;/b&gt;"} {
		if !strings.Contains(html, escaped) {
			t.Errorf("%q is not on the page", escaped)
		}
	}
	if n := strings.Count(html, "<script"); n != 1 {
		t.Errorf("%d scripts, want the one legibility check", n)
	}
}

// TestHTMLSaysItInOrder: the verdicts, then the mix and error rates, then
// each metric's plot and strata (pooled row first, in bold), then the
// method, with the intervals' level.
func TestHTMLSaysItInOrder(t *testing.T) {
	r := slowerCanary(t, BuildOptions{Seed: 1})
	html := page(t, r)
	at := -1
	for _, part := range []string{"<title>timing-sidecar compare: canary against stable</title>", ">Verdicts<", ">Mix of requests and error rates<",
		"more failures", `class="ecdf base"`, ">By stratum<", `<tr class="pooled">`, ">Method<", "Every interval on this page is 95%"} {
		i := strings.Index(html[max(at, 0):], part)
		if i < 0 {
			t.Fatalf("%q missing, or not after the part before it", part)
		}
		at += i + 1
	}
	e, _ := r.Entry("time_to_first_token_ms", "canary")
	if e.Verdict != Slower {
		t.Fatalf("TTFT verdict %q: the fixture no longer shows a slower canary", e.Verdict)
	}
	ratio := fmt.Sprintf("%.3f", *e.Difference.P50Ratio)
	ci := fmt.Sprintf("[%.3f, %.3f]", e.Difference.P50RatioCI[0], e.Difference.P50RatioCI[1])
	if !strings.Contains(html, `<span class="verdict v-bad">slower</span>`) || !strings.Contains(html, ratio+` <span class="muted">`+ci) {
		t.Errorf("no red 'slower' with the ratio %s %s in the summary", ratio, ci)
	}
	for _, table := range strings.Split(html, `<table class="strata wide">`)[1:] {
		body := table[strings.Index(table, "<tbody>"):]
		if !strings.HasPrefix(strings.TrimPrefix(body, "<tbody>\n"), `<tr class="pooled">`) {
			t.Errorf("a strata table does not start with the pooled row: %.120s", body)
		}
	}
}

// TestHTMLDrawsAnECDFPerArmPerMetric: each pooled entry's plot has a
// curve per arm in its arm's colour, with at most maxPlotPoints steps.
func TestHTMLDrawsAnECDFPerArmPerMetric(t *testing.T) {
	rng := rand.New(rand.NewPCG(25, 26))
	r := Build(read(t, narrowLog(rng, 2500, 80, 120)), BuildOptions{Seed: 1})
	html := page(t, r)
	pooled := 0
	for _, e := range r.Results {
		if e.Stratum == nil {
			pooled++
		}
	}
	if pooled != 2 {
		t.Fatalf("%d pooled entries, want TTFT and e2e latency", pooled)
	}
	paths := regexp.MustCompile(`<path class="ecdf (?:base|arm)" stroke="(#[0-9a-f]+)" d="([^"]+)"`).FindAllStringSubmatch(html, -1)
	if len(paths) != 2*pooled {
		t.Fatalf("%d ECDF curves, want %d", len(paths), 2*pooled)
	}
	for i, p := range paths {
		if want := []string{htmlBaseColour, htmlArmColour}[i%2]; p[1] != want {
			t.Errorf("curve %d in %s, want %s", i, p[1], want)
		}
		if steps := strings.Count(p[2], "V"); steps > htmlMaxPlotPoints {
			t.Errorf("curve %d has %d steps for 2,500 values, want at most %d", i, steps, htmlMaxPlotPoints)
		}
	}
	if n := strings.Count(html, `<svg class="plot"`); n != pooled {
		t.Errorf("%d plots, want %d", n, pooled)
	}
}

// TestHTMLAxisIsLogForSpreadOutValues: TTFT of cache hits and misses
// spreads over more than 20 times and is drawn on a log axis with round
// ticks; values within 80 to 120 are drawn linearly.
func TestHTMLAxisIsLogForSpreadOutValues(t *testing.T) {
	html := page(t, slowerCanary(t, BuildOptions{Seed: 1}))
	if !strings.Contains(html, "time to first token (ms), log scale") {
		t.Errorf("spread-out TTFT not on a log axis")
	}
	for _, label := range []string{">10<", ">20<", ">50<", ">100<"} {
		if !strings.Contains(html, `text-anchor="middle"`+label) {
			t.Errorf("no tick %s on the log axis", label)
		}
	}
	rng := rand.New(rand.NewPCG(27, 28))
	narrow := page(t, Build(read(t, narrowLog(rng, 200, 80, 120)), BuildOptions{Seed: 1}))
	if strings.Contains(narrow, "log scale") || !strings.Contains(narrow, "time to first token (ms)") {
		t.Errorf("values within 80 to 120 ms drawn on a log axis")
	}
}

// TestHTMLTicks: round ticks, evenly spaced on a linear axis, at 1, 2 and
// 5 times powers of ten on a short log axis and at powers of ten alone on
// a long one.
func TestHTMLTicks(t *testing.T) {
	for _, c := range []struct {
		name   string
		values []float64
		want   []string
	}{
		{"linear", []float64{81, 95, 119}, []string{"80", "90", "100", "110", "120"}},
		{"short log", []float64{12, 40, 900}, []string{"10", "20", "50", "100", "200", "500", "1,000"}},
		{"long log", []float64{0.5, 40, 90_000}, []string{"1", "10", "100", "1,000", "10k", "100k"}},
		{"one value", []float64{5, 5}, []string{"4", "4.5", "5", "5.5", "6"}},
		// Steps of 0.2 added up are not round in binary: the labels are.
		{"fractional steps", []float64{20.21, 20.55, 20.98}, []string{"20.2", "20.4", "20.6", "20.8", "21"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			x := htmlNewXAxis([]htmlDistribution{{x: c.values}}, 0, 100)
			var got []string
			var pos []float64
			for _, tk := range htmlXTicks(x) {
				got = append(got, tk.Label)
				pos = append(pos, tk.Pos)
			}
			if !slices.Equal(got, c.want) {
				t.Errorf("ticks %v, want %v", got, c.want)
			}
			if pos[0] < -1e-9 || pos[len(pos)-1] > 100+1e-9 {
				t.Errorf("ticks outside the axis: %v", pos)
			}
		})
	}
}

// TestHTMLSubsampleKeepsTheEnds: past maxPlotPoints, values are taken at
// even steps, the least and greatest among them.
func TestHTMLSubsampleKeepsTheEnds(t *testing.T) {
	idx := htmlSubsample(10_000, htmlMaxPlotPoints)
	if len(idx) != htmlMaxPlotPoints || idx[0] != 0 || idx[len(idx)-1] != 9_999 || !slices.IsSorted(idx) {
		t.Errorf("%d indices from %d to %d", len(idx), idx[0], idx[len(idx)-1])
	}
	if got := htmlSubsample(5, htmlMaxPlotPoints); !slices.Equal(got, []int{0, 1, 2, 3, 4}) {
		t.Errorf("few values: %v", got)
	}
}

// TestHTMLFlagsADifferentMix: arms that served different mixes get the
// warning, and alike ones do not.
func TestHTMLFlagsADifferentMix(t *testing.T) {
	const warning = "the arms served different mixes of requests; compare the per-stratum rows"
	rng := rand.New(rand.NewPCG(29, 30))
	mixed := page(t, Build(read(t, accessLog(rng, 1000, map[string]float64{"stable": 0.2, "canary": 0.6}, 1, nil)), BuildOptions{Seed: 1}))
	if !strings.Contains(mixed, warning) || !strings.Contains(mixed, "smallest detectable change ±") {
		t.Errorf("a different mix is not flagged, or no detectable change is said")
	}
	if alike := page(t, slowerCanary(t, BuildOptions{Seed: 1})); strings.Contains(alike, warning) {
		t.Errorf("alike mixes flagged")
	}
}

// TestHTMLShowsTheSequentialReading: with --follow's reading, each
// pooled entry shows its anytime p-value, confidence sequence, verdict
// and whether it is decided; without it, none.
func TestHTMLShowsTheSequentialReading(t *testing.T) {
	with := page(t, slowerCanary(t, BuildOptions{Seed: 1, Sequential: true}))
	for _, part := range []string{"Sequential reading (--follow)", "anytime p-value", "p50 ratio, confidence sequence", "decided"} {
		if !strings.Contains(with, part) {
			t.Errorf("no %q with the sequential reading", part)
		}
	}
	if without := page(t, slowerCanary(t, BuildOptions{Seed: 1})); strings.Contains(without, "anytime p-value") {
		t.Errorf("a sequential reading shown without one")
	}
}

// TestHTMLNumbers: three significant figures, grouped thousands, ratios
// to three decimals, p-values to three or <0.001.
func TestHTMLNumbers(t *testing.T) {
	for _, c := range []struct{ got, want string }{
		{htmlSig3(104.37), "104"}, {htmlSig3(1234.5), "1,230"}, {htmlSig3(0.0123456), "0.0123"},
		{htmlSig3(9.996), "10.0"}, {htmlSig3(-2.5), "-2.50"}, {htmlSig3(1_234_567), "1,230,000"}, {htmlSig3(0), "0"},
		{htmlPValue(0.0004), "<0.001"}, {htmlPValue(0.0031), "0.003"}, {htmlPValue(1), "1.000"},
		{htmlRatio(1.09876), "1.099"}, {htmlChange(1.0987), "+9.87%"}, {htmlChange(0.95), "-5.00%"},
		{htmlTickLabel(20_000), "20k"}, {htmlTickLabel(0.5), "0.5"}, {htmlTickLabel(1500), "1,500"},
	} {
		if c.got != c.want {
			t.Errorf("got %q, want %q", c.got, c.want)
		}
	}
}

// TestRatesThatRiseAreFaster: for a rate (tokens/s), values that rose
// are "faster", in the JSON and on the page, and coloured as good news.
func TestRatesThatRiseAreFaster(t *testing.T) {
	rng := rand.New(rand.NewPCG(41, 42))
	var b strings.Builder
	for _, arm := range []struct {
		name string
		rate float64
	}{{"stable", 50}, {"canary", 60}} {
		for _, v := range ttft(rng, 2000, arm.rate) {
			fmt.Fprintf(&b, `{"msg":"request","variant":%q,"path":"/v1/chat/completions","model":"m","status":200,"tokens_per_second":%.3f}`+"\n", arm.name, v)
		}
	}
	r := Build(read(t, b.String()), BuildOptions{Seed: 1, Sequential: true})
	e, _ := r.Entry("tokens_per_second", "canary")
	if e.Verdict != Faster || e.Sequential == nil || e.Sequential.Verdict != Faster {
		t.Errorf("a 20%% higher decode rate: verdict %q, sequential %+v", e.Verdict, e.Sequential)
	}
	if v := htmlViewVerdict(Faster); v != (htmlVerdictView{"faster", "good"}) {
		t.Errorf("faster: %+v", v)
	}
}

// TestHTMLComparesEachArm: with two arms against the base, the title
// names both, and each has its own plot of itself against the base.
func TestHTMLComparesEachArm(t *testing.T) {
	rng := rand.New(rand.NewPCG(31, 32))
	log := accessLog(rng, 300, map[string]float64{"stable": 0.5, "canary": 0.5}, 1, nil)
	var canary2 strings.Builder
	for line := range strings.Lines(log) {
		if strings.Contains(line, `"variant":"canary"`) {
			canary2.WriteString(strings.Replace(line, `"variant":"canary"`, `"variant":"canary2"`, 1))
		}
	}
	r := Build(read(t, log+canary2.String()), BuildOptions{Seed: 1})
	html := page(t, r)
	if !strings.Contains(html, "<title>timing-sidecar compare: canary, canary2 against stable</title>") {
		t.Errorf("the title does not name both arms")
	}
	if n := strings.Count(html, `<svg class="plot"`); n != 2 {
		t.Errorf("%d plots, want one per arm compared", n)
	}
	if n := strings.Count(html, `<path class="ecdf `); n != 4 {
		t.Errorf("%d curves, want the base and an arm in each of 2 plots", n)
	}
	if !strings.Contains(html, "--base: "+htmlBaseColour+"; --arm: "+htmlArmColour+";") {
		t.Errorf("the CSS does not set the arms' colours")
	}
}
