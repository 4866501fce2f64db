package e2e

import (
	"bytes"
	"encoding/json"
	"image"
	"image/png"
	"io"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/timing-sidecar/timing-sidecar/e2e/emulator"
	"github.com/timing-sidecar/timing-sidecar/e2e/needs"
	"github.com/timing-sidecar/timing-sidecar/telemetry/requests"
)

// The sidecar's /debug/requests page is looked at in a real browser,
// Debian's Chromium, headless, as report_test.go looks at the comparison
// report: a stream the engine stalled must be drawn with its stall where
// the sidecar's own record of its events puts it, in the page's geometry
// and in the screenshot's pixels. The screenshot is left for a human.

const (
	// debugWindow is the browser's window: a laptop's width, tall enough
	// for the running table and the first few slowest requests.
	debugWindow = "--window-size=1400,1600"
	// debugScreenshot is where the screenshot is left to be looked at.
	debugScreenshot = "timing-sidecar-debug-requests.png"
	// debugStalled is the request whose engine pauses debugStall more
	// after debugStallAfter token events.
	debugStalled    = "debug-page-stalled"
	debugStall      = 400 * time.Millisecond
	debugStallAfter = 4
)

// debugRequests are the requests the test sends: the stalled stream
// among ordinary ones, one served from the prefix cache, and one not
// streamed (its engine's own figures in its headers).
var debugRequests = []struct {
	id      string
	stream  bool
	headers map[string]string
}{
	{"debug-page-plain-1", true, nil},
	{debugStalled, true, map[string]string{emulator.HeaderStall: strconv.Itoa(debugStallAfter) + ":" + debugStall.String()}},
	{"debug-page-cached", true, map[string]string{emulator.HeaderCachedTokens: "24"}},
	{"debug-page-unary", false, nil},
	{"debug-page-plain-2", true, nil},
}

// TestDebugPageInABrowser: the real sidecar before the emulated engine
// serves a few streams, one stalled 400 ms after its fourth token event.
// Its page's JSON lists that request with its marks in order and its
// events, the longest gap the stall, between the fifth and sixth events
// (a chat stream opens with a role event). Drawn by Chromium, the page
// finds itself legible and draws every request; the stalled request's
// longest-gap band runs between those two events' arrivals in ms, at the
// x where those ms fall on its axis; and in the screenshot, at the place
// the page's script measured, the band is there in its colour. Opened
// with a query, the page's filter form and JSON link follow it; spoilt,
// it finds itself illegible.
func TestDebugPageInABrowser(t *testing.T) {
	needs.Program(t, "chromium")
	e := startEngine(t, emulator.Config{Timing: emulator.Timing{HeaderDelay: 5 * time.Millisecond, TTFT: 40 * time.Millisecond,
		ITL: 12 * time.Millisecond, OutputTokens: 40}, PromptTokensDetails: true, RequestStatsHeaders: true})
	s := startSidecar(t, []string{"--upstream", e.URL()})
	for _, r := range debugRequests {
		chat(t, s.base, r.id, r.stream, r.headers)
	}
	page := debugPageJSON(t, s.admin)
	stalled := checkStalledInJSON(t, &page)

	dir := t.TempDir()
	path := filepath.Join(dir, "debug-requests.html")
	html := httpGet(t, s.admin+"/debug/requests")
	if err := os.WriteFile(path, html, 0o644); err != nil {
		t.Fatal(err)
	}
	// Opened with a query, as a filtered view: the form and the JSON link
	// follow it.
	dom := chromium(t, debugWindow, "--virtual-time-budget=2000", "--dump-dom", "file://"+path+"?model=m&status=200")
	for _, want := range []string{`<input name="model" value="m">`, `<a id="json-link" href="?model=m&amp;status=200&amp;format=json">`} {
		if !bytes.Contains(dom, []byte(want)) {
			t.Errorf("the page opened with ?model=m&status=200 lacks %s", want)
		}
	}
	if legible := bodyAttribute(t, dom, "data-legible"); legible != "yes" {
		t.Errorf("the page finds itself illegible: %s", legible)
	}
	if drawn, want := bodyAttribute(t, dom, "data-waterfalls"), len(page.Recent)+len(page.Slowest); drawn != strconv.Itoa(want) {
		t.Errorf("%s waterfalls drawn, want %d (every recent and slowest request)", drawn, want)
	}
	checkDebugIllegibleIsCaught(t, dir, string(html))
	band := stalledBand(t, string(dom))
	checkBandAtTheStall(t, band, stalled)

	raw := screenshot(t, dir, debugScreenshot, "file://"+path, debugWindow)
	checkBandPixels(t, raw, band, gapColour(t, html))
}

// chat sends a chat request with id and headers, streamed or not, to
// the sidecar at base and reads its answer to the end.
func chat(t *testing.T, base, id string, stream bool, headers map[string]string) {
	t.Helper()
	body := `{"model":"m","stream":` + strconv.FormatBool(stream) + `,"messages":[{"role":"user","content":"Where did the time go in this request?"}]}`
	req, err := http.NewRequest("POST", base+"/v1/chat/completions", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Request-Id", id)
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s: %v", id, err)
	}
	defer resp.Body.Close()
	if _, err := io.Copy(io.Discard, resp.Body); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("%s: status %d, read %v", id, resp.StatusCode, err)
	}
}

func httpGet(t *testing.T, url string) []byte {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: status %d, %v\n%s", url, resp.StatusCode, err, b)
	}
	return b
}

// debugPageJSON is the page as JSON once every request sent is among
// the recent ones: the sidecar files a request once it has ended, which
// its client may see a moment before.
func debugPageJSON(t *testing.T, admin string) requests.Page {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		var page requests.Page
		if err := json.Unmarshal(httpGet(t, admin+"/debug/requests?format=json"), &page); err != nil {
			t.Fatalf("the page's JSON: %v", err)
		}
		if len(page.Recent) == len(debugRequests) && len(page.Running) == 0 {
			return page
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 10s the page shows %d recent and %d running requests, want %d recent", len(page.Recent), len(page.Running), len(debugRequests))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// checkStalledInJSON checks the stalled request as the JSON lists it, and
// returns it: the slowest, its marks in order, every event kept with its
// write no earlier than its arrival, and its longest gap the stall,
// before the sixth event.
func checkStalledInJSON(t *testing.T, page *requests.Page) requests.EntryView {
	t.Helper()
	if len(page.Slowest) == 0 || page.Slowest[0].ID != debugStalled {
		t.Fatalf("the slowest requests %+v do not start with the stalled one", page.Slowest)
	}
	e := page.Slowest[0]
	checkMarksInOrder(t, &e)
	ev := e.Events
	if ev.Count < 1+40 || len(ev.Arrived) != ev.Count || len(ev.Written) != ev.Count {
		t.Fatalf("events %+v, want a role event and 40 token events, all kept", ev)
	}
	for i := range ev.Arrived {
		if ev.Written[i] < ev.Arrived[i] || i > 0 && ev.Arrived[i] < ev.Arrived[i-1] {
			t.Errorf("event %d arrived at %v ms, written at %v, the one before it arrived at %v", i, ev.Arrived[i], ev.Written[i], ev.Arrived[max(i-1, 0)])
		}
	}
	k := debugStallAfter + 1
	gap := ev.Arrived[k] - ev.Arrived[k-1]
	if ev.LongestGapBefore != k || gap < float64(debugStall.Milliseconds()) || math.Abs(gap-ev.LongestGapMS) > 0.002 {
		t.Fatalf("longest gap %v ms before event %d, the arrivals %v apart; want at least %v before event %d (arrivals %v)",
			ev.LongestGapMS, ev.LongestGapBefore, gap, debugStall, k, ev.Arrived)
	}
	return e
}

// checkMarksInOrder: every mark passed, each no earlier than the one
// before it, the last no later than the request's end.
func checkMarksInOrder(t *testing.T, e *requests.EntryView) {
	t.Helper()
	m := e.Marks
	if m.Accepted == nil || m.FirstToken == nil || m.LastToken == nil || m.Done == nil {
		t.Fatalf("marks %+v, want all four", m)
	}
	if !(0 <= *m.Accepted && *m.Accepted <= *m.FirstToken && *m.FirstToken <= *m.LastToken && *m.LastToken <= *m.Done && *m.Done <= e.ElapsedMS) {
		t.Errorf("marks out of order: accepted %v, first token %v, last token %v, done %v, elapsed %v ms",
			*m.Accepted, *m.FirstToken, *m.LastToken, *m.Done, e.ElapsedMS)
	}
}

// gapBand is the stalled request's longest-gap band as the browser laid
// it out: its ms, its x range in the SVG, the SVG's axis, and the band's
// and the SVG's places on the page (from the page's script).
type gapBand struct {
	startMS, endMS, x, width     float64
	axisMS, axisX0, axisWidth    float64
	notable                      bool
	onPage, svgOnPage            image.Rectangle
	bandTag, svgTag, svgContents string
}

// stalledBand reads the stalled request's first waterfall (the slowest
// section's) from the DOM the browser dumped.
func stalledBand(t *testing.T, dom string) gapBand {
	t.Helper()
	var b gapBand
	for _, svg := range regexp.MustCompile(`(?s)<svg class="wf".*?</svg>`).FindAllString(dom, -1) {
		if tagAttr(svg, "data-request-id") == debugStalled {
			b.svgContents = svg
			break
		}
	}
	if b.svgContents == "" {
		t.Fatalf("no waterfall of %s on the page", debugStalled)
	}
	b.svgTag = regexp.MustCompile(`<svg[^>]*>`).FindString(b.svgContents)
	b.bandTag = regexp.MustCompile(`<rect class="gap[^"]*"[^>]*>`).FindString(b.svgContents)
	if b.bandTag == "" {
		t.Fatalf("the stalled request's waterfall has no longest-gap band:\n%s", b.svgContents)
	}
	b.notable = strings.Contains(b.bandTag, `class="gap stall"`)
	for _, f := range []struct {
		tag, name string
		to        *float64
	}{
		{b.bandTag, "data-gap-start-ms", &b.startMS}, {b.bandTag, "data-gap-end-ms", &b.endMS},
		{b.bandTag, "x", &b.x}, {b.bandTag, "width", &b.width},
		{b.svgTag, "data-axis-ms", &b.axisMS}, {b.svgTag, "data-axis-x0", &b.axisX0}, {b.svgTag, "data-axis-width", &b.axisWidth},
	} {
		v, err := strconv.ParseFloat(tagAttr(f.tag, f.name), 64)
		if err != nil {
			t.Fatalf("%s of %s: %v", f.name, f.tag, err)
		}
		*f.to = v
	}
	b.onPage = plotBoxes(t, tagAttr(b.bandTag, "data-page-box"))[0]
	b.svgOnPage = plotBoxes(t, tagAttr(b.svgTag, "data-page-box"))[0]
	return b
}

// tagAttr is the value of attribute name in an element's tag, "" if none.
func tagAttr(tag, name string) string {
	m := regexp.MustCompile(`\s` + regexp.QuoteMeta(name) + `="([^"]*)"`).FindStringSubmatch(tag)
	if m == nil {
		return ""
	}
	return m[1]
}

// checkBandAtTheStall: the band runs between the arrivals of the events
// around the stall (the JSON's ms, printed to the µs), its x range is
// where those ms fall on the waterfall's axis, within a pixel, and the
// page measured it there: its box is the SVG's, offset by its x.
func checkBandAtTheStall(t *testing.T, b gapBand, e requests.EntryView) {
	t.Helper()
	k := e.Events.LongestGapBefore
	if math.Abs(b.startMS-e.Events.Arrived[k-1]) > 0.0005 || math.Abs(b.endMS-e.Events.Arrived[k]) > 0.0005 {
		t.Errorf("band from %v to %v ms, want the stall's events %v to %v", b.startMS, b.endMS, e.Events.Arrived[k-1], e.Events.Arrived[k])
	}
	if !b.notable || !strings.Contains(b.svgContents, ">longest gap ") {
		t.Errorf("the stall's band is not shaded and labelled as a stall: %s", b.bandTag)
	}
	if b.axisMS < e.ElapsedMS || b.axisMS <= 0 {
		t.Errorf("the axis spans %v ms, less than the request's %v", b.axisMS, e.ElapsedMS)
	}
	wantX := b.axisX0 + b.startMS/b.axisMS*b.axisWidth
	wantW := (b.endMS - b.startMS) / b.axisMS * b.axisWidth
	if math.Abs(b.x-wantX) > 1 || math.Abs(b.width-wantW) > 1 {
		t.Errorf("band at x %v, width %v; the stall's ms fall at x %v, width %v", b.x, b.width, wantX, wantW)
	}
	// The SVG is drawn 1:1 (its width is its viewBox's).
	if got := b.onPage.Min.X - b.svgOnPage.Min.X; math.Abs(float64(got)-b.x) > 1 || math.Abs(float64(b.onPage.Dx())-b.width) > 1 {
		t.Errorf("the page laid the band out at %v, %d px into its waterfall at %v; want %v px in, %v wide", b.onPage, got, b.svgOnPage, b.x, b.width)
	}
}

// gapColour is the stall band's colour, as the page's style declares it.
func gapColour(t *testing.T, page []byte) [3]int {
	t.Helper()
	m := regexp.MustCompile(`--gap: #([0-9a-f]{2})([0-9a-f]{2})([0-9a-f]{2})`).FindSubmatch(page)
	if m == nil {
		t.Fatal("the page declares no --gap colour")
	}
	var rgb [3]int
	for i := range rgb {
		v, _ := strconv.ParseUint(string(m[i+1]), 16, 8)
		rgb[i] = int(v)
	}
	return rgb
}

// checkBandPixels: in the screenshot, the band's top row (above its
// label) is the band's colour across its width, most of the band is, and
// the engine strip just before and after it (the events either side of
// the stall) is not.
func checkBandPixels(t *testing.T, screenshot []byte, b gapBand, rgb [3]int) {
	t.Helper()
	img, err := png.Decode(bytes.NewReader(screenshot))
	if err != nil {
		t.Fatalf("the screenshot: %v", err)
	}
	if img.Bounds() != image.Rect(0, 0, 1400, 1600) {
		t.Errorf("the screenshot is %v, want the 1400×1600 window", img.Bounds())
	}
	r := b.onPage
	if !r.In(img.Bounds()) || r.Dx() < 20 {
		t.Fatalf("the band at %v is not within the %v screenshot, or too narrow to look at", r, img.Bounds())
	}
	inner := r.Inset(2)
	top := image.Rect(inner.Min.X, r.Min.Y+3, inner.Max.X, r.Min.Y+4)
	share := func(area image.Rectangle) float64 {
		return float64(colourPixels(img, area, rgb)) / float64(area.Dx()*area.Dy())
	}
	before := image.Rect(r.Min.X-40, inner.Min.Y, r.Min.X-4, inner.Max.Y)
	after := image.Rect(r.Max.X+4, inner.Min.Y, r.Max.X+40, inner.Max.Y)
	t.Logf("band at %v: %.0f%% of its top row and %.0f%% of it in its colour; %.0f%% just before it, %.0f%% just after",
		r, 100*share(top), 100*share(inner), 100*share(before), 100*share(after))
	if share(top) < 0.95 || share(inner) < 0.6 {
		t.Errorf("the band at %v is not in its colour %v: %.2f of its top row, %.2f of it", r, rgb, share(top), share(inner))
	}
	if share(before) > 0.1 || share(after) > 0.1 {
		t.Errorf("the band's colour spills beyond it: %.2f just before, %.2f just after", share(before), share(after))
	}
}

// checkDebugIllegibleIsCaught spoils the page's waterfalls as a bad
// layout would, and the page's own check must say so: the check is not
// taken on trust.
func checkDebugIllegibleIsCaught(t *testing.T, dir, page string) {
	t.Helper()
	ticks := regexp.MustCompile(`<g class="ticks">.*?</g>`)
	checkSpoilsAreCaught(t, dir, page, []string{debugWindow}, []spoil{
		{"an axis' tick labels on top of each other", "overlap", func(p string) string {
			return ticks.ReplaceAllStringFunc(p, func(g string) string {
				return regexp.MustCompile(`<text x="[0-9.]+"`).ReplaceAllString(g, `<text x="300"`)
			})
		}},
		{"a row's label past the waterfall's right edge", "outside its viewBox", func(p string) string {
			return strings.ReplaceAll(p, `<text class="row" x="4"`, `<text class="row" x="790"`)
		}},
	})
}
