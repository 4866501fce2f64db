package requests

import (
	"fmt"
	"math"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// The page is checked here as text, on pages built by hand; e2e's
// TestDebugPageInABrowser draws the real sidecar's page in Chromium and
// looks at its screenshot.

var pageNow = time.Date(2025, 3, 4, 12, 0, 0, 0, time.UTC)

// streamEntry is a finished stream: a role event at ttft, then tokens
// every itl ms, the gap after the stallAfter-th token event stall ms
// longer (none if stallAfter is 0), each event written lag ms after it
// arrived.
func streamEntry(id string, ttft, itl float64, tokens, stallAfter int, stall, lag float64) EntryView {
	arrived := []float64{ttft}
	for i := 1; i <= tokens; i++ {
		at := arrived[i-1] + itl
		if i == stallAfter+1 && stallAfter > 0 {
			at += stall
		}
		arrived = append(arrived, at)
	}
	written := make([]float64, len(arrived))
	longest, before := 0.0, 0
	for i, a := range arrived {
		written[i] = a + lag
		if i > 0 && a-arrived[i-1] > longest {
			longest, before = a-arrived[i-1], i
		}
	}
	f := func(v float64) *float64 { return &v }
	last := arrived[len(arrived)-1]
	return EntryView{ID: id, Endpoint: "chat", Path: "/v1/chat/completions", Model: "meta-llama/Llama-3.1-8B-Instruct",
		Tenant: "team-a", Variant: "stable", Leg: "whole", Stream: true, Status: 200, Cache: "partial",
		Arrival: pageNow.Add(-time.Second).Format(time.RFC3339Nano), ElapsedMS: last + 2, ClientStallMS: 0,
		Marks: Marks{Accepted: f(4), FirstToken: f(arrived[1]), LastToken: f(last), Done: f(last + 1)},
		Metrics: []byte(fmt.Sprintf(`{"time_to_first_token_ms":%.3f,"queue_time_ms":4.000,"mean_itl_ms":%.3f,"max_itl_ms":%.3f,`+
			`"prompt_tokens":812,"completion_tokens":%d,"cached_tokens":512,"prefill_tokens_per_second":9100.7,`+
			`"engine":{"source":"vllm","time_to_first_token_ms":20.5,"queue_time_ms":1.2,"mean_itl_ms":14.1,"total_ms":%.3f}}`,
			arrived[1]-4, (last-arrived[1])/float64(tokens-1), longest, tokens, last)),
		Events:  EventsView{Count: len(arrived), Arrived: arrived, Written: written, LongestGapMS: longest, LongestGapBefore: before},
		TraceID: "4bf92f3577b34da6a3ce929d0e0e4736"}
}

// examplePage has one request running, a stream the engine stalled, one
// whose client stalled, a normal one, and one the engine failed.
func examplePage() *Page {
	stalled := streamEntry("stalled-1", 30, 15, 24, 4, 400, 0.2)
	normal := streamEntry("normal-1", 25, 14, 24, 0, 0, 0.1)
	paced := streamEntry("client-paced-1", 25, 14, 24, 0, 0, 0.1)
	// Events 8 to 15 waited for the client until event 15 arrived.
	for i := 8; i < 16; i++ {
		paced.Events.Written[i] = paced.Events.Arrived[15] + 0.3
	}
	paced.ClientStallMS = paced.Events.Arrived[15] - paced.Events.Arrived[8]
	failed := EntryView{ID: "failed-1", Endpoint: "chat", Model: "m", Leg: "whole", Status: 503, UpstreamError: "connect: connection refused",
		Arrival: pageNow.Format(time.RFC3339Nano), ElapsedMS: 3.2, Metrics: []byte("null")}
	return &Page{Now: pageNow, TraceURL: "https://jaeger.example/trace/{trace_id}",
		Running: []RunningView{{ID: "running-1", Endpoint: "chat", Model: "m", Tenant: "team-b", Variant: "canary",
			ElapsedMS: 812.5, Stage: "tokens", StageMS: 120.25, Events: 9}},
		Recent:  []EntryView{failed, paced, normal, stalled},
		Slowest: []EntryView{stalled, normal, failed}}
}

// waterfall is the SVG of request id's first waterfall on the page.
func waterfall(t *testing.T, page, id string) string {
	t.Helper()
	for _, m := range regexp.MustCompile(`(?s)<svg class="wf".*?</svg>`).FindAllString(page, -1) {
		if attr(t, m, "data-request-id") == id {
			return m
		}
	}
	t.Fatalf("no waterfall of %q on the page", id)
	return ""
}

// attr is the value of the first attribute name in s.
func attr(t *testing.T, s, name string) string {
	t.Helper()
	m := regexp.MustCompile(`\s` + regexp.QuoteMeta(name) + `="([^"]*)"`).FindStringSubmatch(s)
	if m == nil {
		t.Fatalf("no %s in %.300s", name, s)
	}
	return m[1]
}

func num(t *testing.T, s, name string) float64 {
	t.Helper()
	v, err := strconv.ParseFloat(attr(t, s, name), 64)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return v
}

// TestRenderDrawsTheLongestGapWhereItWas: the stalled stream's band runs
// from the event before the stall to the one after it, in ms as the
// events say and in pixels where those ms fall on the waterfall's axis
// (within a pixel), shaded as a stall and labelled with its length; the
// normal stream's longest gap is drawn but not called a stall.
func TestRenderDrawsTheLongestGapWhereItWas(t *testing.T) {
	p := examplePage()
	page := string(Render(p))
	e := p.Slowest[0]
	svg := waterfall(t, page, e.ID)
	band := regexp.MustCompile(`<rect class="gap[^"]*"[^>]*>`).FindString(svg)
	if !strings.Contains(band, `class="gap stall"`) {
		t.Fatalf("the stall's band %q is not shaded as a stall", band)
	}
	start, end := num(t, band, "data-gap-start-ms"), num(t, band, "data-gap-end-ms")
	k := e.Events.LongestGapBefore
	if k != 5 || start != e.Events.Arrived[k-1] || end != e.Events.Arrived[k] || end-start < 400 {
		t.Errorf("band %v → %v ms, want the events around the stall %v → %v (before event %d)", start, end, e.Events.Arrived[k-1], e.Events.Arrived[k], k)
	}
	span, x0, width := num(t, svg, "data-axis-ms"), num(t, svg, "data-axis-x0"), num(t, svg, "data-axis-width")
	if span != e.ElapsedMS {
		t.Errorf("axis spans %v ms, want the request's %v", span, e.ElapsedMS)
	}
	x, w := num(t, band, "x"), num(t, band, "width")
	if wantX, wantW := x0+start/span*width, (end-start)/span*width; math.Abs(x-wantX) > 1 || math.Abs(w-wantW) > 1 {
		t.Errorf("band at x %v width %v, want %v width %v", x, w, wantX, wantW)
	}
	if !strings.Contains(svg, ">longest gap 415 ms</text>") || !strings.Contains(page, "engine paused 415 ms") {
		t.Errorf("the stall is not labelled with its 415 ms:\n%s", svg)
	}
	if normal := waterfall(t, page, "normal-1"); strings.Contains(normal, "gap stall") || strings.Contains(normal, `<text class="gap`) {
		t.Errorf("the normal stream's even gaps are called a stall:\n%s", normal)
	}
}

// TestRenderLeavesThePrefillOutOfStalls: a stream whose longest gap is
// the wait for its first token (after the role event) has that gap drawn,
// not called a stall: the prefill bar says what it was.
func TestRenderLeavesThePrefillOutOfStalls(t *testing.T) {
	p := examplePage()
	e := &p.Recent[2]
	for i := 1; i < len(e.Events.Arrived); i++ {
		e.Events.Arrived[i] += 300
		e.Events.Written[i] += 300
	}
	first := e.Events.Arrived[1]
	e.Marks.FirstToken = &first
	e.Events.LongestGapMS, e.Events.LongestGapBefore = e.Events.Arrived[1]-e.Events.Arrived[0], 1
	svg := waterfall(t, string(Render(p)), e.ID)
	if !strings.Contains(svg, `<rect class="gap" `) || strings.Contains(svg, "gap stall") || strings.Contains(svg, `<text class="gap`) {
		t.Errorf("the wait for the first token is called a stall, or not drawn:\n%s", svg)
	}
}

// TestRenderTellsTheClientsStallFromTheEngines: events that waited for
// the client are shaded in the client's strip, from the first one's
// arrival to the write that let them go, and the engine's strip, its
// events even, shows no stall.
func TestRenderTellsTheClientsStallFromTheEngines(t *testing.T) {
	p := examplePage()
	page := string(Render(p))
	e := p.Recent[1]
	svg := waterfall(t, page, e.ID)
	lags := regexp.MustCompile(`<rect class="lag"[^>]*>`).FindAllString(svg, -1)
	if len(lags) != 1 || strings.Contains(svg, "gap stall") {
		t.Fatalf("client stall drawn as %q, engine stall %v", lags, strings.Contains(svg, "gap stall"))
	}
	span, x0, width := num(t, svg, "data-axis-ms"), num(t, svg, "data-axis-x0"), num(t, svg, "data-axis-width")
	from, to := e.Events.Arrived[8], e.Events.Written[8]
	if x, w := num(t, lags[0], "x"), num(t, lags[0], "width"); math.Abs(x-(x0+from/span*width)) > 1 || math.Abs(x+w-(x0+to/span*width)) > 1 {
		t.Errorf("the client's wait drawn at x %v width %v, want %v ms to %v ms", x, w, from, to)
	}
	if !strings.Contains(page, "<dd class=\"wide\">98.0 ms for room in its socket</dd>") {
		t.Error("the client's wait is not among the facts")
	}
}

// TestRenderShowsWhatTheLogSays: the facts beside a waterfall, the
// engine's own figures among them, the trace linked through the page's
// template, and a failure's status and error.
func TestRenderShowsWhatTheLogSays(t *testing.T) {
	page := string(Render(examplePage()))
	for _, want := range []string{
		"<dt>TTFT</dt><dd>", "<dt>ITL mean / max</dt><dd>32.4 ms / 415 ms</dd>", "<dd class=\"wide\">prompt 812 (512 cached) · completion 24</dd>",
		"<dd>9101 tok/s</dd>", "<dt class=\"wide\">engine&#39;s own (vllm)</dt><dd class=\"wide\">TTFT 20.5 ms · queue 1.20 ms · ITL 14.1 ms · total",
		"<dt>cache</dt><dd>partial</dd>", "<dt>tenant</dt><dd>team-a</dd>", "<dt>variant</dt><dd>stable</dd>", "<dt>leg</dt><dd>whole</dd>",
		`<a href="https://jaeger.example/trace/4bf92f3577b34da6a3ce929d0e0e4736" rel="noreferrer">4bf92f3577b34da6a3ce929d0e0e4736</a>`,
		`<dd class="bad">503</dd>`, `<dd class="bad wide">connect: connection refused</dd>`, `<span class="badge bad">503</span>`,
		"Slowest (last 10 minutes)",
	} {
		if !strings.Contains(page, want) {
			t.Errorf("the page lacks %q", want)
		}
	}
	if svg := waterfall(t, page, "failed-1"); !strings.Contains(svg, "no answer from the engine") {
		t.Errorf("the failed request's waterfall does not say the engine never answered:\n%s", svg)
	}
}

// TestRenderListsRunningRequests: a running request is a row of the
// running table with its time so far, its stage and when, and its events.
func TestRenderListsRunningRequests(t *testing.T) {
	page := string(Render(examplePage()))
	row := regexp.MustCompile(`<tr><td class="mono">running-1</td>.*?</tr>`).FindString(page)
	for _, want := range []string{"<td>chat</td>", "<td>m</td>", "<td>team-b</td>", "<td>canary</td>", ">812 ms</td>", "<td>tokens at 120 ms</td>", ">9</td>"} {
		if !strings.Contains(row, want) {
			t.Errorf("the running row %q lacks %q", row, want)
		}
	}
	if empty := string(Render(&Page{Now: pageNow})); !strings.Contains(empty, "<h2>Running now</h2>\n<p class=\"muted\">None.</p>") {
		t.Error("an empty page does not say nothing is running")
	}
}

// TestRenderEscapesClientStrings: ids, models, tenants and variants come
// from clients; none of them becomes markup.
func TestRenderEscapesClientStrings(t *testing.T) {
	const hostile = `<script>alert(1)</script>`
	p := examplePage()
	e := &p.Recent[1]
	e.ID, e.Model, e.Tenant, e.Variant = hostile, `"><img src=x onerror=alert(2)>`, `</dd><b>t</b>`, `' onmouseover='alert(3)`
	p.Running[0].ID = hostile
	page := string(Render(p))
	if strings.Contains(page, hostile) || strings.Contains(page, "<img") || strings.Contains(page, "<b>t</b>") || strings.Contains(page, "' onmouseover") {
		t.Errorf("a client's string became markup:\n%s", page)
	}
	if n := strings.Count(page, "<script"); n != 1 {
		t.Errorf("%d script elements, want the page's own", n)
	}
	if !strings.Contains(page, `data-request-id="&lt;script&gt;alert(1)&lt;/script&gt;"`) || !strings.Contains(page, "&lt;script&gt;alert(1)&lt;/script&gt;</span>") {
		t.Error("the hostile id is not shown, escaped")
	}
}

// TestRenderLinksTracesOverHTTPOnly: the trace id is linked only when the
// template makes an absolute http or https URL, the id percent-encoded in
// it; otherwise it is shown unlinked.
func TestRenderLinksTracesOverHTTPOnly(t *testing.T) {
	for _, c := range []struct {
		name, tmpl, id, want string
	}{
		{"https", "https://jaeger.example/trace/{trace_id}", "abc", "https://jaeger.example/trace/abc"},
		{"http in a query", "http://tempo:3200/explore?trace={trace_id}&x=1", "abc", "http://tempo:3200/explore?trace=abc&amp;x=1"},
		{"an id that would break out", "https://j.example/trace/{trace_id}", `a"b<c&d=e f/g`, "https://j.example/trace/a%22b%3Cc%26d%3De%20f%2Fg"},
		{"javascript", "javascript:alert(document.domain)//{trace_id}", "abc", ""},
		{"javascript, upper case", "JavaScript:alert(1)//{trace_id}", "abc", ""},
		{"data", "data:text/html,<script>alert(1)</script>{trace_id}", "abc", ""},
		{"no scheme", "//evil.example/{trace_id}", "abc", ""},
		{"no placeholder", "https://jaeger.example/", "abc", ""},
		{"none", "", "abc", ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := examplePage()
			p.TraceURL = c.tmpl
			p.Recent = p.Recent[:1]
			p.Recent[0].TraceID = c.id
			p.Slowest = nil
			page := string(Render(p))
			links := regexp.MustCompile(`<a href="([^"]*)" rel="noreferrer">`).FindAllStringSubmatch(page, -1)
			switch {
			case c.want == "" && len(links) != 0:
				t.Errorf("linked %q, want no link", links[0][1])
			case c.want != "" && (len(links) != 1 || links[0][1] != c.want):
				t.Errorf("links %q, want %q", links, c.want)
			}
			if !strings.Contains(page, ">trace</dt>") {
				t.Error("the trace id is not shown")
			}
		})
	}
}

// TestRenderNeedsNoNetwork: nothing on the page is fetched from
// elsewhere: the only absolute URLs are SVG's namespace and the trace
// link, and nothing is loaded by src, @import or url().
func TestRenderNeedsNoNetwork(t *testing.T) {
	page := string(Render(examplePage()))
	for _, u := range regexp.MustCompile(`(?i)(https?:)?//[^\s"'<>)]+`).FindAllString(page, -1) {
		if u != "http://www.w3.org/2000/svg" && u != "https://jaeger.example/trace/4bf92f3577b34da6a3ce929d0e0e4736" {
			t.Errorf("the page refers to %s", u)
		}
	}
	for _, bad := range []string{"src=", "@import", "url(", "<link", "<iframe", "fetch(", "XMLHttpRequest"} {
		if strings.Contains(page, bad) {
			t.Errorf("the page has %q", bad)
		}
	}
}

// TestRenderCapsWhatItDraws: at most maxPageRows requests a section and
// maxRunningRows running ones, saying how many it left out.
func TestRenderCapsWhatItDraws(t *testing.T) {
	p := examplePage()
	p.Recent, p.Slowest, p.Running = nil, nil, nil
	for i := range 120 {
		p.Recent = append(p.Recent, streamEntry(fmt.Sprintf("r-%d", i), 20, 10, 30, 0, 0, 0))
	}
	p.Slowest = p.Recent[:maxPageRows]
	for i := range 250 {
		p.Running = append(p.Running, RunningView{ID: fmt.Sprintf("run-%d", i), Stage: "arrived"})
	}
	page := string(Render(p))
	if n := strings.Count(page, `<svg class="wf"`); n != 2*maxPageRows {
		t.Errorf("%d waterfalls drawn, want %d", n, 2*maxPageRows)
	}
	if !strings.Contains(page, "r-49\"") || strings.Contains(page, "r-50\"") {
		t.Error("not the first 50 of the recent requests drawn")
	}
	if !strings.Contains(page, "<p class=\"left\">70 more not drawn") || strings.Count(page, "more not drawn") != 1 {
		t.Error("the page does not say 70 recent requests were left out, and only those")
	}
	if n := strings.Count(page, `<tr><td class="mono">run-`); n != maxRunningRows || !strings.Contains(page, "50 more running, not listed") {
		t.Errorf("%d running rows, want %d and the 50 left out said", n, maxRunningRows)
	}
}

// TestAxisTicksStandApart: over spans from under a millisecond to hours,
// the axis' labels are round, in order, at least their width apart, and
// the first and last inside the waterfall.
func TestAxisTicksStandApart(t *testing.T) {
	for _, span := range []float64{0.37, 1, 7.3, 49, 100, 999, 1000, 1999, 2000, 4321, 60_000, 3_600_000, 9_999_999} {
		_, labels := axisTicks(axis{span: span})
		if len(labels) < 2 && span >= 1 {
			t.Errorf("span %v: labels %v, want at least two", span, labels)
		}
		prev := math.Inf(-1)
		for i, l := range labels {
			x, _ := strconv.ParseFloat(l.X, 64)
			half := textWidth(l.Label) / 2
			if x-half < wfX0-half || x+half > wfW-2 {
				t.Errorf("span %v: label %q at %v leaves the waterfall", span, l.Label, x)
			}
			if i > 0 && x-prev < textWidth(l.Label)+12 {
				t.Errorf("span %v: labels %q at %v and %v too close", span, l.Label, prev, x)
			}
			prev = x
		}
	}
}

// TestStagesFollowTheMarks: a request's bars run between the marks it
// passed, and one the engine never answered is all queue.
func TestStagesFollowTheMarks(t *testing.T) {
	e := streamEntry("s", 30, 10, 10, 0, 0, 0)
	a := axis{span: axisSpan(&e)}
	var names []string
	for _, s := range stagesOf(&e, a) {
		names = append(names, s.Class)
	}
	if strings.Join(names, " ") != "queue prefill decode finish" {
		t.Errorf("stages %v", names)
	}
	e.Stream = false
	if s := stagesOf(&e, a); !strings.HasPrefix(s[0].Title, "whole answer ") {
		t.Errorf("an answer not streamed waits for its whole answer, not a queue: %+v", s[0])
	}
	e.Marks = Marks{}
	if s := stagesOf(&e, a); len(s) != 1 || s[0].Class != "queue" || s[0].X != px(wfX0) {
		t.Errorf("an unanswered request's stages: %+v", s)
	}
}
