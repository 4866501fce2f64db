package requests

import (
	"bytes"
	"encoding/json"
	"html/template"
	"math"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"
)

// The HTML page (Render): one page that needs nothing but itself (no
// network, no fonts, no scripts from elsewhere), for an engineer asking
// where a request's time went. Each finished request is a row: a
// waterfall on the request's own time axis (arrival at 0 to its end) with
// its stages, a strip of the engine's events as they arrived and one of
// the same events as they were written to the client, the longest gap
// between arrivals shaded; beside it what the access log says of it.
// Everything from clients (ids, models, tenants, variants) goes through
// html/template's escaping.
//
// The page does not know the query it answers (Render has only the
// Page), so a small inline script fills the filter form from the
// address and points the JSON link at the same view; without it the form
// still filters and the link gives every request as JSON. The script
// also checks, once the page is laid out, that no two labels of a
// waterfall overlap and that every label lies inside its waterfall, and
// writes the finding to the body's data-legible ("yes", or "no: " and
// why), the waterfalls drawn to data-waterfalls, and each waterfall's
// and longest-gap band's place on the page to their data-page-box
// ("left,top,width,height" in CSS pixels): the browser test reads them.

// What the page draws at most: past it, the page says how many it left
// out (the JSON has them all).
const (
	maxPageRows    = 50
	maxRunningRows = 200
)

// The waterfall's geometry, in the SVG's own pixels (drawn 1:1): a column
// of row labels, the axis from wfX0 over wfAxisW, and room on the right
// for the last tick's label.
const (
	wfW, wfH          = 800, 112
	wfX0, wfRight     = 70, 36
	wfAxisW           = wfW - wfX0 - wfRight
	stageY, stageH    = 4, 20
	engineY, engineH  = 32, 26
	clientY, clientH  = 64, 20
	axisY, tickLabelY = 90, 107
	// labelCharW is a 12px label's glyph width, over-estimated, to
	// decide what fits before the browser lays it out.
	labelCharW = 7.0
)

// A longest gap is a stall worth pointing at (shaded strongly and
// labelled) when it is at least stallMinMS and stallFactor times the
// stream's median gap; a write waited on the client when it went out
// lagMinMS or more after its event arrived.
const (
	stallMinMS  = 20
	stallFactor = 3
	lagMinMS    = 5
)

// Render is the page as HTML.
func Render(p *Page) []byte {
	var b bytes.Buffer
	if err := pageTemplate.Execute(&b, pageViewOf(p)); err != nil {
		// Only a template bug gets here; say so on the page.
		return []byte("<!doctype html><title>timing-sidecar: requests</title><p>timing-sidecar: the page failed to render: " +
			template.HTMLEscapeString(err.Error()))
	}
	return b.Bytes()
}

type pageView struct {
	Now                      string
	Running                  []runningRow
	RunningLeft              int
	Sections                 []sectionView
	G                        geometry
	WindowMinutes            int
	NRecent, NSlow, NRunning int
}

// geometry is the waterfalls' layout, the same for all.
type geometry struct {
	W, H, StageY, StageH, StageLabelY, EngineY, EngineH, EngineLabelY int
	ClientY, ClientH, ClientLabelY, AxisY, AxisEnd, TickLabelY        int
}

type runningRow struct {
	ID, Endpoint, Model, Tenant, Variant, Elapsed, Stage, StageAt string
	Events                                                        int
}

type sectionView struct {
	Anchor, Title, Note string
	Rows                []rowView
	Left                int
}

type rowView struct {
	ID, Endpoint, Model, Arrival, Elapsed, Status string
	Failed                                        bool
	// Stall and ClientStall are the engine's pause and the client's
	// worth pointing at, empty if none.
	Stall, ClientStall string
	Facts              []fact
	WF                 waterfallView
}

// fact is a name and value beside a waterfall; Href links the value,
// and a wide one takes a line of its own.
type fact struct {
	Name, Value, Class, Href string
	Wide                     bool
}

// Classes are the value's CSS classes.
func (f fact) Classes() string {
	if f.Wide {
		return strings.TrimSpace(f.Class + " wide")
	}
	return f.Class
}

func pageViewOf(p *Page) pageView {
	v := pageView{Now: p.Now.UTC().Format("2006-01-02 15:04:05.000 UTC"), WindowMinutes: int(DefaultWindow / time.Minute),
		NRecent: len(p.Recent), NSlow: len(p.Slowest), NRunning: len(p.Running)}
	v.G = geometry{W: wfW, H: wfH, StageY: stageY, StageH: stageH, StageLabelY: stageY + 14,
		EngineY: engineY, EngineH: engineH, EngineLabelY: engineY + engineH/2 + 4,
		ClientY: clientY, ClientH: clientH, ClientLabelY: clientY + clientH/2 + 4,
		AxisY: axisY, AxisEnd: wfX0 + wfAxisW, TickLabelY: tickLabelY}
	for i, r := range p.Running {
		if i == maxRunningRows {
			v.RunningLeft = len(p.Running) - i
			break
		}
		v.Running = append(v.Running, runningRow{ID: r.ID, Endpoint: r.Endpoint, Model: r.Model, Tenant: r.Tenant,
			Variant: r.Variant, Elapsed: fmtMS(r.ElapsedMS), Stage: r.Stage, StageAt: fmtMS(r.StageMS), Events: r.Events})
	}
	v.Sections = []sectionView{
		section("slowest", "Slowest (last "+strconv.Itoa(v.WindowMinutes)+" minutes)",
			"The slowest few of each endpoint, model and latency bucket that arrived in the last "+strconv.Itoa(v.WindowMinutes)+" minutes, slowest first.",
			p.Slowest, p.TraceURL),
		section("recent", "Recent", "The latest finished requests, newest first.", p.Recent, p.TraceURL),
	}
	return v
}

func section(anchor, title, note string, entries []EntryView, traceURL string) sectionView {
	s := sectionView{Anchor: anchor, Title: title, Note: note}
	for i := range entries {
		if i == maxPageRows {
			s.Left = len(entries) - i
			break
		}
		s.Rows = append(s.Rows, rowOf(&entries[i], traceURL))
	}
	return s
}

func rowOf(e *EntryView, traceURL string) rowView {
	r := rowView{ID: e.ID, Endpoint: e.Endpoint, Model: e.Model, Arrival: clockTime(e.Arrival), Elapsed: fmtMS(e.ElapsedMS),
		Status: strconv.Itoa(e.Status), Failed: failed(e)}
	if e.Status == 0 {
		r.Status = "no status"
	}
	r.WF = waterfallOf(e)
	if g := r.WF.Gap; g != nil && g.Notable {
		r.Stall = "engine paused " + fmtMS(g.end-g.start)
	}
	if e.ClientStallMS >= stallMinMS {
		r.ClientStall = "client stalled " + fmtMS(e.ClientStallMS)
	}
	r.Facts = factsOf(e, withCache(metricsOf(e.Metrics), e), traceURL)
	return r
}

// failed says the request failed: an error status, none, or an error
// from the engine.
func failed(e *EntryView) bool { return e.Status >= 400 || e.Status == 0 || e.UpstreamError != "" }

// clockTime is an RFC 3339 arrival as the time of day, to the ms.
func clockTime(s string) string {
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return s
	}
	return t.UTC().Format("15:04:05.000")
}

// metrics is a metrics object's members, read as they come: a member
// absent or null is not shown.
type metrics map[string]json.RawMessage

// withCache adds to m the prompt cache's and prefill's figures the
// entry has beside the metrics object.
func withCache(m metrics, e *EntryView) metrics {
	if m == nil {
		return m
	}
	if e.CachedTokens != nil {
		m["cached_tokens"] = json.RawMessage(strconv.FormatInt(*e.CachedTokens, 10))
	}
	if e.PrefillTokensPerSecond != nil {
		m["prefill_tokens_per_second"] = json.RawMessage(strconv.FormatFloat(*e.PrefillTokensPerSecond, 'f', -1, 64))
	}
	return m
}

func metricsOf(raw json.RawMessage) metrics {
	var m metrics
	if json.Unmarshal(raw, &m) != nil {
		return nil
	}
	return m
}

func (m metrics) num(k string) (float64, bool) {
	var f *float64
	if json.Unmarshal(m[k], &f) != nil || f == nil {
		return 0, false
	}
	return *f, true
}

// ms is member k in ms, or "" if absent.
func (m metrics) ms(k string) string {
	if v, ok := m.num(k); ok {
		return fmtMS(v)
	}
	return ""
}

func (m metrics) count(k string) string {
	if v, ok := m.num(k); ok {
		return strconv.FormatFloat(v, 'f', -1, 64)
	}
	return ""
}

func (m metrics) rate(k string) string {
	if v, ok := m.num(k); ok {
		return strconv.FormatFloat(v, 'f', 0, 64) + " tok/s"
	}
	return ""
}

// factsOf is what the page says beside a request's waterfall; facts
// with no value are left out.
func factsOf(e *EntryView, m metrics, traceURL string) []fact {
	status := fact{Name: "status", Value: strconv.Itoa(e.Status), Class: "ok"}
	if failed(e) {
		status.Class = "bad"
	}
	out := []fact{status, {Name: "cache", Value: e.Cache},
		{Name: "upstream error", Value: e.UpstreamError, Class: "bad", Wide: true}}
	if e.ClientGone {
		out = append(out, fact{Name: "client", Value: "gone before the end", Class: "bad", Wide: true})
	}
	out = append(out,
		fact{Name: "tokens", Value: tokens(m), Wide: true},
		fact{Name: "TTFT", Value: m.ms("time_to_first_token_ms")},
		fact{Name: "queue", Value: m.ms("queue_time_ms")},
		fact{Name: "ITL mean / max", Value: joinSet(" / ", m.ms("mean_itl_ms"), m.ms("max_itl_ms"))},
		fact{Name: "prefill speed", Value: m.rate("prefill_tokens_per_second")},
		engineFact(m),
		fact{Name: "events", Value: eventsFact(&e.Events), Wide: true},
		fact{Name: "client waited", Value: clientStall(e.ClientStallMS), Wide: true},
		fact{Name: "leg", Value: e.Leg}, fact{Name: "tenant", Value: e.Tenant}, fact{Name: "variant", Value: e.Variant},
		fact{Name: "trace", Value: e.TraceID, Class: "mono", Href: traceHref(traceURL, e.TraceID), Wide: true},
	)
	return slices.DeleteFunc(out, func(f fact) bool { return f.Value == "" })
}

func tokens(m metrics) string {
	prompt, completion := m.count("prompt_tokens"), m.count("completion_tokens")
	if prompt == "" && completion == "" {
		return ""
	}
	s := "prompt " + orDash(prompt)
	if c := m.count("cached_tokens"); c != "" {
		s += " (" + c + " cached)"
	}
	return s + " · completion " + orDash(completion)
}

// engineFact is the engine's own figures, when it reported them.
func engineFact(m metrics) fact {
	var source string
	eng := metricsOf(m["engine"])
	if eng == nil {
		return fact{}
	}
	json.Unmarshal(eng["source"], &source)
	name := "engine's own"
	if source != "" {
		name += " (" + source + ")"
	}
	return fact{Name: name, Wide: true, Value: joinSet(" · ",
		label("TTFT ", eng.ms("time_to_first_token_ms")), label("queue ", eng.ms("queue_time_ms")),
		label("ITL ", eng.ms("mean_itl_ms")), label("prefill ", eng.rate("prefill_tokens_per_second")),
		label("total ", eng.ms("total_ms")))}
}

func eventsFact(ev *EventsView) string {
	if ev.Count == 0 {
		return ""
	}
	s := strconv.Itoa(ev.Count)
	if len(ev.Arrived) < ev.Count {
		s += " (the first " + strconv.Itoa(len(ev.Arrived)) + " drawn)"
	}
	if ev.Count > 1 {
		s += "; longest gap " + fmtMS(ev.LongestGapMS) + ", before event " + strconv.Itoa(ev.LongestGapBefore+1)
	}
	return s
}

func clientStall(v float64) string {
	if v <= 0 {
		return ""
	}
	return fmtMS(v) + " for room in its socket"
}

func label(name, v string) string {
	if v == "" {
		return ""
	}
	return name + v
}

func joinSet(sep string, vs ...string) string {
	return strings.Join(slices.DeleteFunc(vs, func(v string) bool { return v == "" }), sep)
}

func orDash(s string) string {
	if s == "" {
		return "–"
	}
	return s
}

// traceHref is the link of trace id through the template (its
// {trace_id} replaced by the id, percent-encoded), or "" unless the link
// is an absolute http or https URL.
func traceHref(tmpl, id string) string {
	if tmpl == "" || id == "" || !strings.Contains(tmpl, "{trace_id}") {
		return ""
	}
	s := strings.ReplaceAll(tmpl, "{trace_id}", strings.ReplaceAll(url.QueryEscape(id), "+", "%20"))
	u, err := url.Parse(s)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return ""
	}
	return s
}

// fmtMS is a duration in ms as people read it: ms to three significant
// figures, seconds past one.
func fmtMS(v float64) string {
	switch a := math.Abs(v); {
	case a < 10:
		return strconv.FormatFloat(v, 'f', 2, 64) + " ms"
	case a < 100:
		return strconv.FormatFloat(v, 'f', 1, 64) + " ms"
	case a < 1000:
		return strconv.FormatFloat(v, 'f', 0, 64) + " ms"
	case a < 100_000:
		return strconv.FormatFloat(v/1000, 'f', 2, 64) + " s"
	default:
		return strconv.FormatFloat(v/1000, 'f', 0, 64) + " s"
	}
}

// waterfallView is one request's waterfall, its numbers formatted for
// the SVG.
type waterfallView struct {
	ID                       string
	AxisMS, X0, Width, NoneX string
	Stages                   []stageBar
	EngineTicks, Ticks       string // paths of the event ticks and the axis' ticks
	ClientTicks              string
	Lags                     []band
	Gap                      *gapBand
	Labels                   []axisLabel
}

type stageBar struct {
	Class, X, W, Title, Label, LabelX string
}

type band struct{ X, W, Label, LabelX string }

type gapBand struct {
	StartMS, EndMS, X, W, Label, LabelX, LabelY, Anchor string
	Notable                                             bool
	start, end                                          float64
}

type axisLabel struct{ X, Label string }

// axis maps a request's ms after arrival to the SVG's x.
type axis struct{ span float64 }

func (a axis) x(ms float64) float64 {
	return wfX0 + math.Min(math.Max(ms, 0), a.span)/a.span*wfAxisW
}

func px(v float64) string { return strconv.FormatFloat(v, 'f', 2, 64) }

func waterfallOf(e *EntryView) waterfallView {
	a := axis{span: axisSpan(e)}
	w := waterfallView{ID: e.ID, AxisMS: strconv.FormatFloat(a.span, 'f', 3, 64), X0: px(wfX0), Width: px(wfAxisW),
		NoneX: px(wfX0 + 8)}
	w.Stages = stagesOf(e, a)
	w.EngineTicks = tickPath(e.Events.Arrived, a, engineY, engineH)
	w.ClientTicks = tickPath(e.Events.Written, a, clientY, clientH)
	w.Lags = lagsOf(&e.Events, a)
	w.Gap = gapOf(e, a)
	w.Ticks, w.Labels = axisTicks(a)
	return w
}

// axisSpan is the request's whole time: its end, or its last mark or
// event if one came later; never zero.
func axisSpan(e *EntryView) float64 {
	span := e.ElapsedMS
	for _, m := range []*float64{e.Marks.Accepted, e.Marks.FirstToken, e.Marks.LastToken, e.Marks.Done} {
		if m != nil {
			span = math.Max(span, *m)
		}
	}
	for _, at := range [][]float64{e.Events.Arrived, e.Events.Written} {
		if len(at) > 0 {
			span = math.Max(span, slices.Max(at))
		}
	}
	if span <= 0 {
		return 1
	}
	return span
}

// stagesOf are the request's stages: queue (arrival to the engine's
// headers), prefill (to the first token), decode (to the last token) and
// finish (to the end), those of no length left out. A request the engine
// never answered is all queue; one not streamed waits for its whole
// answer, its headers coming with it.
func stagesOf(e *EntryView, a axis) []stageBar {
	end := e.ElapsedMS
	if e.Marks.Accepted == nil {
		return []stageBar{stage("queue", "no answer", "arrival → end, no answer from the engine", 0, end, a)}
	}
	first, what := "queue", "arrival → engine's headers"
	if !e.Stream {
		first, what = "whole answer", "arrival → engine's headers, which came with the answer: its queue and generation in one"
	}
	var out []stageBar
	from := 0.0
	for _, s := range []struct {
		class, name, what string
		to                *float64
	}{
		{"queue", first, what, e.Marks.Accepted},
		{"prefill", "prefill", "headers → first token", e.Marks.FirstToken},
		{"decode", "decode", "first → last token", e.Marks.LastToken},
		{"finish", "finish", "last token → end", &end},
	} {
		if s.to == nil || *s.to <= from {
			continue
		}
		out = append(out, stage(s.class, s.name, s.what, from, *s.to, a))
		from = *s.to
	}
	return out
}

func stage(class, name, what string, from, to float64, a axis) stageBar {
	x0, x1 := a.x(from), a.x(to)
	b := stageBar{Class: class, X: px(x0), W: px(math.Max(x1-x0, 0.5)), Title: name + " " + fmtMS(to-from) + ": " + what}
	for _, l := range []string{name + " " + fmtMS(to-from), name} {
		if textWidth(l)+8 <= x1-x0 {
			b.Label, b.LabelX = l, px((x0+x1)/2)
			break
		}
	}
	return b
}

func textWidth(s string) float64 { return float64(len([]rune(s))) * labelCharW }

// tickPath is a path of one vertical line per event at its time, at most
// one a pixel.
func tickPath(at []float64, a axis, y, h int) string {
	var b strings.Builder
	last := -1
	for _, ms := range at {
		p := int(a.x(ms))
		if p == last {
			continue
		}
		last = p
		b.WriteString("M" + strconv.Itoa(p) + ".5 " + strconv.Itoa(y) + "v" + strconv.Itoa(h))
	}
	return b.String()
}

// lagsOf are the spans in which an event had arrived and was not yet
// written (waiting lagMinMS or more), merged where they touch; each is
// labelled with its length where the label fits.
func lagsOf(ev *EventsView, a axis) []band {
	var out []band
	var from, to float64
	open := false
	flush := func() {
		if open {
			out = append(out, lagBand(from, to, a))
		}
	}
	for i := range min(len(ev.Arrived), len(ev.Written)) {
		if ev.Written[i]-ev.Arrived[i] < lagMinMS {
			continue
		}
		if open && a.x(ev.Arrived[i]) <= a.x(to)+1 {
			to = math.Max(to, ev.Written[i])
			continue
		}
		flush()
		from, to, open = ev.Arrived[i], ev.Written[i], true
	}
	flush()
	return out
}

func lagBand(from, to float64, a axis) band {
	x0, x1 := a.x(from), a.x(to)
	b := band{X: px(x0), W: px(math.Max(x1-x0, 1))}
	if l := "writes held " + fmtMS(to-from); textWidth(l)+8 <= x1-x0 {
		b.Label, b.LabelX = l, px((x0+x1)/2)
	}
	return b
}

// gapOf is the band of the longest gap between two arrivals, when both
// events around it were kept. It is a stall worth pointing at when it is
// long against the stream's median gap and lies in the decode: a wait
// for the first token is the prefill's, drawn above it.
func gapOf(e *EntryView, a axis) *gapBand {
	ev := &e.Events
	k := ev.LongestGapBefore
	if ev.Count < 2 || ev.LongestGapMS <= 0 || k < 1 || k >= len(ev.Arrived) {
		return nil
	}
	start, end := ev.Arrived[k-1], ev.Arrived[k]
	x0, x1 := a.x(start), a.x(end)
	g := &gapBand{StartMS: strconv.FormatFloat(start, 'f', 3, 64), EndMS: strconv.FormatFloat(end, 'f', 3, 64),
		X: px(x0), W: px(math.Max(x1-x0, 1)), start: start, end: end}
	decoding := e.Marks.FirstToken != nil && start >= *e.Marks.FirstToken
	g.Notable = decoding && end-start >= stallMinMS && end-start >= stallFactor*medianGap(ev.Arrived)
	if !g.Notable {
		return g
	}
	g.Label = "longest gap " + fmtMS(end-start)
	g.LabelY = strconv.Itoa(engineY + engineH/2 + 5)
	wl := textWidth(g.Label)
	switch {
	case x1-x0 >= wl+8:
		g.LabelX, g.Anchor = px((x0+x1)/2), "middle"
	case x1+4+wl <= wfW-2:
		g.LabelX, g.Anchor = px(x1+4), "start"
	default:
		g.LabelX, g.Anchor = px(math.Max(x0-4, wl+2)), "end"
	}
	return g
}

func medianGap(arrived []float64) float64 {
	if len(arrived) < 2 {
		return 0
	}
	gaps := make([]float64, len(arrived)-1)
	for i := range gaps {
		gaps[i] = arrived[i+1] - arrived[i]
	}
	slices.Sort(gaps)
	return gaps[len(gaps)/2]
}

// axisTicks are the axis' tick marks (a path) and labels: at a round
// step (1, 2 or 5 times a power of ten ms), the finest whose labels stand
// apart.
func axisTicks(a axis) (string, []axisLabel) {
	unit, div := " ms", 1.0
	if a.span >= 2000 {
		unit, div = " s", 1000
	}
	step := math.Pow(10, math.Floor(math.Log10(a.span/20)))
	for m := 0; ; m = (m + 1) % 3 {
		s := step * []float64{1, 2, 5}[m]
		if labels, ok := tickLabels(a, s, unit, div); ok {
			var path strings.Builder
			for _, l := range labels {
				path.WriteString("M" + l.X + " " + strconv.Itoa(axisY) + "v4")
			}
			return path.String(), labels
		}
		if m == 2 {
			step *= 10
		}
	}
}

// tickLabels are the labels every step ms, unless two would stand
// closer than their width and a margin.
func tickLabels(a axis, step float64, unit string, div float64) ([]axisLabel, bool) {
	var out []axisLabel
	widest := 0.0
	for v := 0.0; v <= a.span*(1+1e-9); v += step {
		n := math.Round(v/step) * step
		l := axisLabel{X: px(a.x(n)), Label: strconv.FormatFloat(math.Round(n/div*1e6)/1e6, 'f', -1, 64)}
		if n > 0 {
			l.Label += unit
		}
		widest = math.Max(widest, textWidth(l.Label))
		out = append(out, l)
	}
	return out, step/a.span*wfAxisW >= widest+12 || len(out) == 1
}

var pageTemplate = template.Must(template.New("requests").Parse(pageHTML))

const pageHTML = `<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>timing-sidecar: requests</title>
<style>
:root { --muted: #57606a; --rule: #d0d7de; --queue: #afb8c1; --prefill: #8250df; --decode: #1b6ca8; --finish: #2f9e6e; --gap: #f2766b; --lag: #f2c14e; --tick: #24292f; }
* { box-sizing: border-box; }
body { margin: 0; background: #fff; color: #1f2328; font: 14px/1.4 system-ui, "DejaVu Sans", "Liberation Sans", Arial, sans-serif; }
main { max-width: 1380px; margin: 0 auto; padding: 18px 24px 48px; }
h1 { font-size: 22px; margin: 0 0 2px; }
h2 { font-size: 18px; margin: 26px 0 4px; padding-top: 10px; border-top: 2px solid #eaeef2; }
p { margin: 4px 0; }
.muted { color: var(--muted); }
code, .mono { font: 12.5px ui-monospace, "DejaVu Sans Mono", monospace; }
form.filter { display: flex; flex-wrap: wrap; gap: 6px 12px; align-items: end; margin: 10px 0 4px; }
form.filter label { display: flex; flex-direction: column; font-size: 12px; color: var(--muted); }
form.filter input { font: 13px system-ui, "DejaVu Sans", sans-serif; width: 140px; padding: 3px 5px; border: 1px solid var(--rule); border-radius: 4px; }
form.filter input.short { width: 70px; }
form.filter button { font: 13px system-ui, "DejaVu Sans", sans-serif; padding: 4px 12px; }
table { border-collapse: collapse; font-variant-numeric: tabular-nums; }
th, td { padding: 4px 10px; text-align: left; border-bottom: 1px solid #eaeef2; }
th { font-size: 12px; font-weight: 600; color: var(--muted); }
td.num, th.num { text-align: right; }
.legend { display: flex; flex-wrap: wrap; gap: 4px 16px; margin: 8px 0; color: var(--muted); font-size: 13px; }
.sw { display: inline-block; width: 14px; height: 11px; margin-right: 5px; vertical-align: -1px; }
.sw.tick { width: 2px; background: var(--tick); margin: 0 6px; }
article.req { display: flex; gap: 18px; align-items: flex-start; padding: 8px 0 6px; border-bottom: 1px solid #eaeef2; }
article.req .head { margin: 0 0 2px; font-size: 13px; }
article.req .head .id { font-weight: 700; word-break: break-all; }
.badge { display: inline-block; padding: 0 7px; border-radius: 9px; font-size: 12px; font-weight: 700; }
.badge.bad { background: #cf222e; color: #fff; }
.badge.stall { background: #fbe0dd; color: #9a1c12; }
.badge.client { background: #fcefc7; color: #5c3c00; }
dl.facts { display: grid; grid-template-columns: max-content 1fr max-content 1fr; grid-auto-flow: row dense; gap: 1px 10px; margin: 0; font-size: 13px; min-width: 300px; flex: 1; font-variant-numeric: tabular-nums; }
dl.facts dt { color: var(--muted); }
dl.facts dd { margin: 0; word-break: break-word; }
dl.facts dt.wide { grid-column: 1; }
dl.facts dd.wide { grid-column: span 3; }
dd.bad { color: #cf222e; font-weight: 700; }
dd.ok { color: #1a7f37; font-weight: 700; }
svg.wf { display: block; flex: none; }
svg.wf text { font-size: 12px; font-family: system-ui, "DejaVu Sans", "Liberation Sans", Arial, sans-serif; fill: #3d444d; }
svg.wf text.row, svg.wf text.none { fill: var(--muted); }
svg.wf text.none { font-style: italic; }
svg.wf text.in { fill: #fff; font-weight: 600; }
svg.wf text.in.queue { fill: #1f2328; }
svg.wf rect.queue { fill: var(--queue); } svg.wf rect.prefill { fill: var(--prefill); }
svg.wf rect.decode { fill: var(--decode); } svg.wf rect.finish { fill: var(--finish); }
svg.wf rect.strip { fill: #f6f8fa; }
svg.wf rect.gap { fill: #fbe0dd; }
svg.wf rect.gap.stall { fill: var(--gap); }
svg.wf text.gap { fill: #6e0b06; font-weight: 700; paint-order: stroke; stroke: #fff; stroke-width: 3px; }
svg.wf text.gap.middle { stroke: none; }
svg.wf rect.lag { fill: var(--lag); }
svg.wf text.lag { fill: #5c3c00; font-weight: 700; }
svg.wf path.events { stroke: var(--tick); stroke-width: 1; fill: none; }
svg.wf path.axis { stroke: #8c959f; stroke-width: 1; fill: none; }
.left { color: var(--muted); font-style: italic; margin: 6px 0; }
</style>
</head>
<body>
<main>
<header>
<h1>timing-sidecar: requests</h1>
<p class="muted">At {{.Now}}: {{.NRunning}} running, {{.NRecent}} recent, {{.NSlow}} among the slowest. <a id="json-link" href="?format=json">This view as JSON</a></p>
<form class="filter" method="get" action="">
<label>id<input name="id"></label>
<label>tenant<input name="tenant"></label>
<label>model<input name="model"></label>
<label>variant<input name="variant"></label>
<label>status<input name="status" class="short" inputmode="numeric"></label>
<label>cache<input name="cache" class="short" placeholder="none…"></label>
<label>leg<input name="leg" class="short" placeholder="whole…"></label>
<button type="submit">Filter</button> <a href="?">clear</a>
</form>
</header>

<section id="running">
<h2>Running now</h2>
{{if .Running}}<table>
<thead><tr><th>id</th><th>endpoint</th><th>model</th><th>tenant</th><th>variant</th><th class="num">time so far</th><th>last stage passed</th><th class="num">events so far</th></tr></thead>
<tbody>
{{range .Running}}<tr><td class="mono">{{.ID}}</td><td>{{.Endpoint}}</td><td>{{.Model}}</td><td>{{.Tenant}}</td><td>{{.Variant}}</td><td class="num">{{.Elapsed}}</td><td>{{.Stage}} at {{.StageAt}}</td><td class="num">{{.Events}}</td></tr>
{{end}}</tbody>
</table>{{if .RunningLeft}}<p class="left">{{.RunningLeft}} more running, not listed: narrow with the filter, or read the JSON.</p>{{end}}{{else}}<p class="muted">None.</p>{{end}}
</section>

<div class="legend"><span>Each waterfall runs from the request's arrival (0) to its end:</span>
<span><span class="sw" style="background: var(--queue)"></span>queue (arrival → engine's headers)</span>
<span><span class="sw" style="background: var(--prefill)"></span>prefill (→ first token)</span>
<span><span class="sw" style="background: var(--decode)"></span>decode (→ last token)</span>
<span><span class="sw" style="background: var(--finish)"></span>finish (→ end)</span>
<span><span class="sw tick"></span>an event, as it arrived (engine) and was written (client)</span>
<span><span class="sw" style="background: var(--gap)"></span>the engine's longest pause</span>
<span><span class="sw" style="background: var(--lag)"></span>events waiting on the client</span>
</div>

{{range .Sections}}<section id="{{.Anchor}}">
<h2>{{.Title}}</h2>
<p class="muted">{{.Note}}</p>
{{range .Rows}}<article class="req">
<div>
<p class="head"><span class="id mono">{{.ID}}</span> · {{.Endpoint}} · {{.Model}} · arrived {{.Arrival}} · <strong>{{.Elapsed}}</strong>{{if .Failed}} <span class="badge bad">{{.Status}}</span>{{end}}{{if .Stall}} <span class="badge stall">{{.Stall}}</span>{{end}}{{if .ClientStall}} <span class="badge client">{{.ClientStall}}</span>{{end}}</p>
{{with .WF}}<svg class="wf" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {{$.G.W}} {{$.G.H}}" width="{{$.G.W}}" height="{{$.G.H}}" role="img" aria-label="waterfall of request {{.ID}}" data-request-id="{{.ID}}" data-axis-ms="{{.AxisMS}}" data-axis-x0="{{.X0}}" data-axis-width="{{.Width}}">
<text class="row" x="4" y="{{$.G.StageLabelY}}">stages</text>
{{range .Stages}}<rect class="{{.Class}}" x="{{.X}}" y="{{$.G.StageY}}" width="{{.W}}" height="{{$.G.StageH}}"><title>{{.Title}}</title></rect>{{if .Label}}<text class="in {{.Class}}" x="{{.LabelX}}" y="{{$.G.StageLabelY}}" text-anchor="middle">{{.Label}}</text>{{end}}
{{end}}<text class="row" x="4" y="{{$.G.EngineLabelY}}">engine</text>
<rect class="strip" x="{{.X0}}" y="{{$.G.EngineY}}" width="{{.Width}}" height="{{$.G.EngineH}}"/>
{{with .Gap}}<rect class="gap{{if .Notable}} stall{{end}}" x="{{.X}}" y="{{$.G.EngineY}}" width="{{.W}}" height="{{$.G.EngineH}}" data-gap-start-ms="{{.StartMS}}" data-gap-end-ms="{{.EndMS}}"><title>longest gap between two events: {{.StartMS}} → {{.EndMS}} ms</title></rect>{{end}}
<path class="events" d="{{.EngineTicks}}"/>{{if not .EngineTicks}}<text class="none" x="{{.NoneX}}" y="{{$.G.EngineLabelY}}">no stream events</text>{{end}}
<text class="row" x="4" y="{{$.G.ClientLabelY}}">client</text>
<rect class="strip" x="{{.X0}}" y="{{$.G.ClientY}}" width="{{.Width}}" height="{{$.G.ClientH}}"/>
{{range .Lags}}<rect class="lag" x="{{.X}}" y="{{$.G.ClientY}}" width="{{.W}}" height="{{$.G.ClientH}}"/>{{end}}
<path class="events" d="{{.ClientTicks}}"/>
{{range .Lags}}{{if .Label}}<text class="lag" x="{{.LabelX}}" y="{{$.G.ClientLabelY}}" text-anchor="middle">{{.Label}}</text>{{end}}{{end}}
{{with .Gap}}{{if .Label}}<text class="gap {{.Anchor}}" x="{{.LabelX}}" y="{{.LabelY}}" text-anchor="{{.Anchor}}">{{.Label}}</text>{{end}}{{end}}
<path class="axis" d="M{{.X0}} {{$.G.AxisY}}H{{$.G.AxisEnd}}{{.Ticks}}"/>
<g class="ticks">{{range .Labels}}<text x="{{.X}}" y="{{$.G.TickLabelY}}" text-anchor="middle">{{.Label}}</text>{{end}}</g>
</svg>{{end}}
</div>
<dl class="facts">
{{range .Facts}}<dt{{if .Wide}} class="wide"{{end}}>{{.Name}}</dt><dd{{with .Classes}} class="{{.}}"{{end}}>{{if .Href}}<a href="{{.Href}}" rel="noreferrer">{{.Value}}</a>{{else}}{{.Value}}{{end}}</dd>
{{end}}</dl>
</article>
{{else}}<p class="muted">None.</p>
{{end}}{{if .Left}}<p class="left">{{.Left}} more not drawn: narrow with the filter, or read the JSON.</p>{{end}}
</section>
{{end}}
</main>
<script>
(function () {
  "use strict";
  // The filter form and the JSON link follow the address: the page is
  // rendered without its query.
  function follow() {
    var q = new URLSearchParams(window.location.search), form = document.querySelector("form.filter");
    for (var i = 0; i < form.elements.length; i++) {
      var el = form.elements[i];
      if (el.name && q.has(el.name)) {
        el.setAttribute("value", q.get(el.name));
      }
    }
    q.set("format", "json");
    document.getElementById("json-link").setAttribute("href", "?" + q.toString());
  }
  function overlap(a, b) {
    return a.left < b.right - 0.5 && b.left < a.right - 0.5 && a.top < b.bottom - 0.5 && b.top < a.bottom - 0.5;
  }
  function pageBox(el) {
    var r = el.getBoundingClientRect();
    return [r.left + window.scrollX, r.top + window.scrollY, r.width, r.height].map(Math.round).join(",");
  }
  // Legibility of one waterfall: every label inside its viewBox, no two
  // labels (the axis' ticks among them) on top of each other.
  function check(svg, index, problems) {
    var vb = svg.viewBox.baseVal, box = svg.getBoundingClientRect();
    var sx = box.width / vb.width, sy = box.height / vb.height;
    var texts = svg.querySelectorAll("text"), rects = [];
    for (var j = 0; j < texts.length; j++) {
      var r = texts[j].getBoundingClientRect();
      rects.push(r);
      var x0 = vb.x + (r.left - box.left) / sx, x1 = vb.x + (r.right - box.left) / sx;
      var y0 = vb.y + (r.top - box.top) / sy, y1 = vb.y + (r.bottom - box.top) / sy;
      if (r.width === 0 || x0 < vb.x - 0.5 || y0 < vb.y - 0.5 || x1 > vb.x + vb.width + 0.5 || y1 > vb.y + vb.height + 0.5) {
        problems.push("waterfall " + index + ": label '" + texts[j].textContent + "' outside its viewBox");
      }
    }
    for (var a = 0; a < rects.length; a++) {
      for (var b = a + 1; b < rects.length; b++) {
        if (overlap(rects[a], rects[b])) {
          problems.push("waterfall " + index + ": labels '" + texts[a].textContent + "' and '" + texts[b].textContent + "' overlap");
        }
      }
    }
  }
  function run() {
    follow();
    var problems = [], svgs = document.querySelectorAll("svg.wf");
    for (var i = 0; i < svgs.length; i++) {
      check(svgs[i], i + 1, problems);
      svgs[i].dataset.pageBox = pageBox(svgs[i]);
    }
    var gaps = document.querySelectorAll("svg.wf rect.gap");
    for (var k = 0; k < gaps.length; k++) {
      gaps[k].dataset.pageBox = pageBox(gaps[k]);
    }
    document.body.dataset.waterfalls = String(svgs.length);
    document.body.dataset.legible = problems.length === 0 ? "yes" : "no: " + problems.slice(0, 5).join("; ");
  }
  if (document.readyState === "complete") {
    run();
  } else {
    window.addEventListener("load", run);
  }
})();
</script>
</body>
</html>
`
