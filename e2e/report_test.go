package e2e

import (
	"bytes"
	"context"
	"fmt"
	"html"
	"image"
	"image/png"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/timing-sidecar/timing-sidecar/e2e/needs"
	"github.com/timing-sidecar/timing-sidecar/telemetry/compare"
)

// The comparison's HTML report is looked at in a real browser, Debian's
// Chromium, headless: the page's own script reports whether its plots'
// labels are legible once laid out, and the screenshot must show both
// arms' curves in their colours. The screenshot is left for a human.

const (
	// reportWindow is the browser's window: wide as a laptop's, tall
	// enough to hold the whole report of three metrics.
	reportWindow = "1280,4000"
	// chromiumTimeout bounds each browser run, on a busy machine.
	chromiumTimeout = 60 * time.Second
	// reportScreenshot is where the screenshot is left to be looked at.
	reportScreenshot = "timing-sidecar-compare-report.png"
)

// The arms' colours on the page (compare's html.go), as RGB.
var (
	baseRGB = [3]int{0x1b, 0x6c, 0xa8}
	armRGB  = [3]int{0xd9, 0x5f, 0x02}
)

// realisticLog is an access log of two arms of 3,000 requests each to a
// chat endpoint: prompts under 1k or 4k tokens, served from the prompt
// cache or not, the canary 10% slower to its first token on cache misses
// (two strata) and serving more cache hits than stable; inter-token
// latency alike, and a few failures each.
func realisticLog(rng *rand.Rand) string {
	var b strings.Builder
	hits := map[string]float64{"stable": 0.35, "canary": 0.5}
	medians := map[string]float64{"full ≤1k": 25, "full ≤4k": 45, "none ≤1k": 120, "none ≤4k": 380}
	for _, arm := range []string{"stable", "canary"} {
		for range 3000 {
			cache, prompt, bucket := "none", 600, "≤1k"
			if rng.Float64() < hits[arm] {
				cache = "full"
			}
			if rng.IntN(3) == 0 {
				prompt, bucket = 3000, "≤4k"
			}
			median := medians[cache+" "+bucket]
			if arm == "canary" && cache == "none" {
				median *= 1.1
			}
			ttft := median * math.Exp(0.35*rng.NormFloat64())
			itl := 14 * math.Exp(0.15*rng.NormFloat64())
			completion := 150 + rng.IntN(100)
			fmt.Fprintf(&b, `{"msg":"request","variant":%q,"path":"/v1/chat/completions","model":"meta-llama/Llama-3.1-8B-Instruct","status":200,"cache":%q,"prompt_tokens":%d,"completion_tokens":%d,"time_to_first_token_ms":%.3f,"e2e_latency_ms":%.3f,"tokens_per_second":%.3f}`+"\n",
				arm, cache, prompt, completion, ttft, ttft+float64(completion)*itl, 1000/itl)
		}
		for range map[string]int{"stable": 6, "canary": 14}[arm] {
			fmt.Fprintf(&b, `{"msg":"request","variant":%q,"path":"/v1/chat/completions","model":"meta-llama/Llama-3.1-8B-Instruct","status":503}`+"\n", arm)
		}
	}
	return b.String()
}

// chromium runs Debian's Chromium headless with args and returns what it
// printed, failing the test past chromiumTimeout. It runs in a process
// group of its own, ended with it.
func chromium(t *testing.T, args ...string) []byte {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), chromiumTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "chromium", append([]string{
		"--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
		"--hide-scrollbars", "--force-device-scale-factor=1", "--window-size=" + reportWindow,
		"--user-data-dir=" + t.TempDir(),
	}, args...)...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 10 * time.Second
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	if cmd.Process != nil {
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) // any helper process left behind
	}
	if err != nil {
		t.Fatalf("chromium %s: %v\n%s", strings.Join(args, " "), err, stderr.String())
	}
	return stdout.Bytes()
}

// bodyAttribute is the value of the data- attribute name on the body of
// a DOM chromium dumped.
func bodyAttribute(t *testing.T, dom []byte, name string) string {
	t.Helper()
	body := regexp.MustCompile(`<body[^>]*>`).Find(dom)
	m := regexp.MustCompile(`\s` + name + `="([^"]*)"`).FindSubmatch(body)
	if m == nil {
		t.Fatalf("the page's body has no %s: %s (did its script run?)", name, body)
	}
	return html.UnescapeString(string(m[1]))
}

// plotBoxes are the plots' places on the page, from data-plot-boxes
// ("left,top,width,height" each).
func plotBoxes(t *testing.T, attr string) []image.Rectangle {
	t.Helper()
	var boxes []image.Rectangle
	for _, box := range strings.Fields(attr) {
		var v [4]int
		for i, s := range strings.SplitN(box, ",", 4) {
			n, err := strconv.Atoi(s)
			if err != nil {
				t.Fatalf("plot box %q: %v", box, err)
			}
			v[i] = n
		}
		boxes = append(boxes, image.Rect(v[0], v[1], v[0]+v[2], v[1]+v[3]))
	}
	return boxes
}

// colourPixels counts the pixels of r in img within 30 of rgb in every
// channel (antialiased edges of a 2-pixel line still count).
func colourPixels(img image.Image, r image.Rectangle, rgb [3]int) int {
	n := 0
	for y := r.Min.Y; y < r.Max.Y; y++ {
		for x := r.Min.X; x < r.Max.X; x++ {
			cr, cg, cb, _ := img.At(x, y).RGBA()
			if shadeOf(cr, rgb[0]) && shadeOf(cg, rgb[1]) && shadeOf(cb, rgb[2]) {
				n++
			}
		}
	}
	return n
}

// shadeOf says a 16-bit channel is within 30 of an 8-bit one.
func shadeOf(channel uint32, want int) bool {
	d := int(channel>>8) - want
	return d >= -30 && d <= 30
}

// TestReportIsLegibleInABrowser: the report of a canary slower on cache
// misses, serving more cache hits, drawn by Chromium: its script finds
// every label of every plot legible and counts two ECDF curves per
// metric, and the screenshot shows each plot with both arms' colours in
// quantity: a legend and median marks alone (about 200 pixels a colour)
// would not reach minCurvePixels, a 2-pixel curve across a plot does.
func TestReportIsLegibleInABrowser(t *testing.T) {
	const minCurvePixels = 500
	needs.Program(t, "chromium")
	var s compare.Samples
	if err := s.Read(strings.NewReader(realisticLog(rand.New(rand.NewPCG(7, 8)))), ""); err != nil {
		t.Fatal(err)
	}
	r := compare.Build(&s, compare.BuildOptions{Base: "stable", Seed: 1, Sequential: true})
	if e, _ := r.Entry("time_to_first_token_ms", "canary"); e.Verdict != compare.Slower || !r.Mix[0].Differs {
		t.Fatalf("the fixture no longer shows a slower canary with a different mix: TTFT %q, mix %+v", e.Verdict, r.Mix)
	}
	metrics := 0
	for _, e := range r.Results {
		if e.Stratum == nil {
			metrics++
		}
	}
	dir := t.TempDir()
	page := filepath.Join(dir, "report.html")
	var b bytes.Buffer
	if err := compare.WriteHTML(&b, &r); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(page, b.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}

	dom := chromium(t, "--virtual-time-budget=2000", "--dump-dom", "file://"+page)
	if legible := bodyAttribute(t, dom, "data-legible"); legible != "yes" {
		t.Errorf("the page finds itself illegible: %s", legible)
	}
	if plots := bodyAttribute(t, dom, "data-plots"); plots != strconv.Itoa(2*metrics) || metrics != 3 {
		t.Errorf("%s ECDF curves drawn for %d metrics, want two for each of TTFT, e2e latency and tokens/s", plots, metrics)
	}
	boxes := plotBoxes(t, bodyAttribute(t, dom, "data-plot-boxes"))

	raw := screenshot(t, dir, reportScreenshot, "file://"+page)
	if len(boxes) != metrics {
		t.Errorf("%d plots on the page, want %d", len(boxes), metrics)
	}
	checkPlotsDrew(t, raw, boxes, minCurvePixels)
	checkIllegibleIsCaught(t, dir, b.String())
}

// checkPlotsDrew fails unless each plot of the screenshot shows at
// least minPixels pixels of each arm's colour.
func checkPlotsDrew(t *testing.T, screenshot []byte, boxes []image.Rectangle, minPixels int) {
	t.Helper()
	img, err := png.Decode(bytes.NewReader(screenshot))
	if err != nil {
		t.Fatalf("the screenshot: %v", err)
	}
	for i, box := range boxes {
		if !box.In(img.Bounds()) {
			t.Errorf("plot %d at %v is outside the %v screenshot", i+1, box, img.Bounds())
			continue
		}
		base, arm := colourPixels(img, box, baseRGB), colourPixels(img, box, armRGB)
		t.Logf("plot %d at %v: %d pixels of the base's colour, %d of the arm's", i+1, box, base, arm)
		if base < minPixels || arm < minPixels {
			t.Errorf("plot %d shows %d pixels of the base's colour and %d of the arm's, want %d of each", i+1, base, arm, minPixels)
		}
	}
}

// checkIllegibleIsCaught spoils the page's plots as a bad layout would,
// and the page's own check must say so: the check is not taken on trust.
func checkIllegibleIsCaught(t *testing.T, dir, page string) {
	t.Helper()
	xTicks := regexp.MustCompile(`<g class="ticks x">.*?</g>`)
	checkSpoilsAreCaught(t, dir, page, nil, []spoil{
		{"tick labels on top of each other", "overlap", func(p string) string {
			return xTicks.ReplaceAllStringFunc(p, func(g string) string {
				return regexp.MustCompile(`<text x="[0-9.]+"`).ReplaceAllString(g, `<text x="300"`)
			})
		}},
		{"an axis title below the plot", "outside its viewBox", func(p string) string {
			return strings.ReplaceAll(p, `dy="-9" text-anchor="middle"`, `dy="30" text-anchor="middle"`)
		}},
	})
}

// screenshot takes Chromium's screenshot of url (args before it, e.g. a
// window size) and leaves a copy named keep in the temporary directory,
// for a human to look at before anything is judged of it.
func screenshot(t *testing.T, dir, keep, url string, args ...string) []byte {
	t.Helper()
	shot := filepath.Join(dir, "screenshot.png")
	chromium(t, append(args, "--screenshot="+shot, url)...)
	raw, err := os.ReadFile(shot)
	if err != nil {
		t.Fatal(err)
	}
	kept := filepath.Join(os.TempDir(), keep)
	if err := os.WriteFile(kept, raw, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("the screenshot, to look at: %s", kept)
	return raw
}

// spoil is a bad layout made of a good page, and the words the page's
// legibility check must answer it with.
type spoil struct {
	name, want string
	spoil      func(string) string
}

// checkSpoilsAreCaught renders each spoilt copy of page in Chromium
// (with args before the page, e.g. a window size) and requires the
// page's own check to answer "no", naming what is wrong.
func checkSpoilsAreCaught(t *testing.T, dir, page string, args []string, spoils []spoil) {
	t.Helper()
	for _, c := range spoils {
		spoilt := c.spoil(page)
		if spoilt == page {
			t.Fatalf("%s: the page has nothing to spoil", c.name)
		}
		path := filepath.Join(dir, "spoilt.html")
		if err := os.WriteFile(path, []byte(spoilt), 0o644); err != nil {
			t.Fatal(err)
		}
		dom := chromium(t, append(args, "--virtual-time-budget=2000", "--dump-dom", "file://"+path)...)
		if legible := bodyAttribute(t, dom, "data-legible"); !strings.HasPrefix(legible, "no: ") || !strings.Contains(legible, c.want) {
			t.Errorf("%s: the page says legible %q, want no, with %q", c.name, legible, c.want)
		}
	}
}
