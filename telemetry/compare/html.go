package compare

import (
	"fmt"
	"html/template"
	"io"
	"math"
	"slices"
	"sort"
	"strconv"
	"strings"
)

// The HTML report (`timing-sidecar compare --html`): one page that needs
// nothing but itself (no network, no fonts, no scripts from elsewhere),
// for an engineer deciding whether a rollout may go on. It says the
// verdicts first, then whether the arms served like requests and failed
// alike, then per metric an ECDF of both arms and the figures of each
// stratum, and last how the figures were made. Everything from the logs
// (arm, model and endpoint names) goes through html/template's escaping.
//
// A small inline script checks, once the page is laid out, that no two
// labels of an axis or legend overlap and that every label lies inside
// its plot, and writes the finding to the body's data-legible attribute
// ("yes", or "no: " and why), the ECDF curves drawn to data-plots, and
// where each plot lies on the page to data-plot-boxes ("left,top,width,
// height" in CSS pixels): the browser test reads them.

// Colours of the arms in the plots and tables: the base blue, the arm
// compared orange, a pair that readers with any common colour-vision
// deficiency tell apart (ColorBrewer's Paired blue and Dark2 orange).
const (
	htmlBaseColour = "#1b6ca8"
	htmlArmColour  = "#d95f02"
)

// Settings of the plots.
const (
	// htmlMaxPlotPoints is the most values of an arm an ECDF draws: past it
	// the sorted values are taken at even steps, the least and greatest
	// kept.
	htmlMaxPlotPoints = 2000
	// htmlLogSpread: the x axis is logarithmic when its greatest value is
	// more than this many times its least positive one.
	htmlLogSpread = 20
	// htmlLegendRunes and htmlHeaderRunes are the longest arm name a
	// legend and a table's column header print whole; a longer one is
	// cut, whole in its tooltip.
	htmlLegendRunes = 28
	htmlHeaderRunes = 14
)

// The plot's size and margins, in pixels at 1:1.
const (
	htmlPlotW, htmlPlotH                                        = 640, 320
	htmlMarginLeft, htmlMarginRight, htmlMarginTop, htmlMarginB = 64, 24, 56, 50
)

// WriteHTML writes r as one self-contained HTML page.
func WriteHTML(w io.Writer, r *Report) error {
	if err := htmlPageTemplate.Execute(w, htmlNewPage(r)); err != nil {
		return fmt.Errorf("write the HTML report: %w", err)
	}
	return nil
}

// htmlPage is what the template draws, every figure already a string.
type htmlPage struct {
	Title, Base string
	Compared    []string
	Totals      []htmlArmTotalView
	Summary     []htmlSummaryRow
	Mix         []htmlMixView
	Errors      []htmlErrorRow
	Metrics     []htmlMetricView
	Method      []htmlMethodLine
	Level       string
	MixAlpha    string
	// BaseColour and ArmColour are the arms' colours, set in the CSS.
	BaseColour, ArmColour string
}

type htmlArmTotalView struct{ Name, Requests, Failed, Class string }

// htmlVerdictView is a verdict as the page words and colours it.
type htmlVerdictView struct{ Text, Class string }

type htmlSummaryRow struct {
	Anchor, Label, Metric, Arm       string
	Verdict                          htmlVerdictView
	Change, ChangeCI, Ratio, RatioCI string
	Q, Note                          string
}

type htmlMixView struct {
	Arm, PValue string
	Differs     bool
}

type htmlErrorRow struct {
	Arm, BaseRate, BaseRateCI, Rate, RateCI string
	Difference, DifferenceCI, Q             string
	Verdict                                 htmlVerdictView
}

type htmlMetricView struct {
	Anchor, Label, Metric, Unit, Arm, Base string
	// ArmShort and BaseShort are the arms' names cut for the table.
	ArmShort, BaseShort  string
	MultiArm             bool
	Verdict              htmlVerdictView
	Plot                 *htmlPlot
	Pooled               htmlSummaryRow
	P90Ratio, P90RatioCI string
	// Columns are what the strata differ in; Common what they share.
	Columns    []string
	Common     string
	Rows       []htmlStratumRow
	Sequential *htmlSequentialView
}

type htmlStratumRow struct {
	Pooled                           bool
	Cells                            []string
	NBase, NArm                      string
	P50Base, P90Base, P50Arm, P90Arm htmlEstimate
	Ratio                            htmlEstimate
	Q                                string
	Verdict                          htmlVerdictView
}

// htmlEstimate is a figure and its interval, each a string ("" when none).
type htmlEstimate struct{ Value, CI string }

type htmlSequentialView struct {
	PValue, RatioCI, Decided string
	Verdict                  htmlVerdictView
}

type htmlMethodLine struct{ Name, Text string }

func htmlNewPage(r *Report) htmlPage {
	p := htmlPage{Base: r.Base, BaseColour: htmlBaseColour, ArmColour: htmlArmColour, Level: htmlPercent(r.Method.Level),
		MixAlpha: strconv.FormatFloat(MixAlpha, 'f', -1, 64)}
	for _, a := range r.Arms {
		class := "arm"
		if a.Name == r.Base {
			class = "base"
		} else {
			p.Compared = append(p.Compared, a.Name)
		}
		p.Totals = append(p.Totals, htmlArmTotalView{a.Name, htmlCount(a.Requests), htmlCount(a.Failed), class})
	}
	p.Title = htmlTitle(r.Base, p.Compared)
	for _, m := range r.Mix {
		p.Mix = append(p.Mix, htmlMixView{m.Arm, htmlPValue(m.PValue), m.Differs})
	}
	for _, e := range r.Errors {
		p.Errors = append(p.Errors, htmlNewErrorRow(e))
	}
	sequential := false
	for i, e := range r.Results {
		if e.Stratum != nil {
			continue
		}
		m := htmlNewMetricView(r, i, len(p.Compared) > 1)
		p.Metrics = append(p.Metrics, m)
		p.Summary = append(p.Summary, m.Pooled)
		sequential = sequential || e.Sequential != nil
	}
	p.Method = htmlMethodLines(r.Method, sequential)
	return p
}

func htmlTitle(base string, compared []string) string {
	if len(compared) == 0 {
		return "timing-sidecar compare: " + base + " alone"
	}
	return "timing-sidecar compare: " + strings.Join(compared, ", ") + " against " + base
}

// htmlNewMetricView is the section of the pooled entry r.Results[i]: its
// plot, and its row followed by its strata's.
func htmlNewMetricView(r *Report, i int, multiArm bool) htmlMetricView {
	e := r.Results[i]
	var strata []Entry
	for _, s := range r.Results[i+1:] {
		if s.Stratum == nil || s.Metric != e.Metric || s.Arm != e.Arm {
			break
		}
		strata = append(strata, s)
	}
	m := htmlMetricView{
		Anchor: fmt.Sprintf("m%d", i), Label: htmlMetricLabel(e.Metric), Metric: e.Metric, Unit: htmlMetricUnit(e.Metric),
		Arm: e.Arm, Base: e.Base, ArmShort: htmlShorten(e.Arm, htmlHeaderRunes), BaseShort: htmlShorten(e.Base, htmlHeaderRunes), MultiArm: multiArm, Verdict: htmlViewVerdict(e.Verdict),
		Pooled: htmlNewSummaryRow(e, fmt.Sprintf("m%d", i)),
	}
	m.Plot = htmlNewPlot(e, strata)
	if d := e.Difference; d.P90Ratio != nil {
		m.P90Ratio, m.P90RatioCI = htmlRatio(*d.P90Ratio), htmlRatioCI(d.P90RatioCI)
	}
	dims, common := htmlStratumColumns(strata)
	for _, d := range dims {
		m.Columns = append(m.Columns, d.name)
	}
	m.Common = strings.Join(common, ", ")
	m.Rows = append(m.Rows, htmlNewStratumRow(e, nil))
	for _, s := range strata {
		m.Rows = append(m.Rows, htmlNewStratumRow(s, dims))
	}
	if e.Sequential != nil {
		m.Sequential = htmlNewSequentialView(e.Metric, e.Sequential)
	}
	return m
}

// htmlStratumDim is one of the things a stratum is of.
type htmlStratumDim struct {
	name string
	of   func(Stratum) string
}

var htmlStratumDims = []htmlStratumDim{
	{"endpoint", func(s Stratum) string { return s.Endpoint }},
	{"model", func(s Stratum) string { return s.Model }},
	{"cache", func(s Stratum) string { return s.Cache }},
	{"prompt", func(s Stratum) string { return s.Prompt }},
	{"completion", func(s Stratum) string { return s.Completion }},
}

// htmlStratumColumns is what the strata differ in, a column each, and
// what they share, said once ("model m"): a table no wider than it must
// be. The cache class is a column even when all strata share it.
func htmlStratumColumns(strata []Entry) (vary []htmlStratumDim, common []string) {
	for _, d := range htmlStratumDims {
		same := true
		for _, s := range strata[min(1, len(strata)):] {
			same = same && d.of(*s.Stratum) == d.of(*strata[0].Stratum)
		}
		if same && len(strata) > 0 && d.name != "cache" {
			common = append(common, d.name+" "+htmlOrDash(d.of(*strata[0].Stratum)))
		} else {
			vary = append(vary, d)
		}
	}
	return vary, common
}

func htmlNewSummaryRow(e Entry, anchor string) htmlSummaryRow {
	row := htmlSummaryRow{Anchor: anchor, Label: htmlMetricLabel(e.Metric), Metric: e.Metric, Arm: e.Arm,
		Verdict: htmlViewVerdict(e.Verdict), Q: htmlOptionalP(e.QValue)}
	if d := e.Difference; d.P50Ratio != nil {
		row.Ratio, row.RatioCI = htmlRatio(*d.P50Ratio), htmlRatioCI(d.P50RatioCI)
		row.Change = htmlChange(*d.P50Ratio)
		if d.P50RatioCI != nil {
			row.ChangeCI = "[" + htmlChange(d.P50RatioCI[0]) + ", " + htmlChange(d.P50RatioCI[1]) + "]"
		}
	}
	switch {
	case e.Verdict == NoDifference && e.Detectable != nil:
		row.Note = "smallest detectable change ±" + htmlSig3(100**e.Detectable) + "%"
	case e.Verdict == TooFew:
		row.Note = fmt.Sprintf("an arm has fewer than %d values in every stratum", MinN)
	}
	return row
}

func htmlNewStratumRow(e Entry, dims []htmlStratumDim) htmlStratumRow {
	row := htmlStratumRow{Pooled: e.Stratum == nil, Q: htmlOptionalP(e.QValue), Verdict: htmlViewVerdict(e.Verdict)}
	for _, d := range dims {
		row.Cells = append(row.Cells, htmlOrDash(d.of(*e.Stratum)))
	}
	base, arm := e.Arms[e.Base], e.Arms[e.Arm]
	row.NBase, row.NArm = htmlCount(base.N), htmlCount(arm.N)
	row.P50Base, row.P90Base = htmlQuantile(base.P50, base.P50CI), htmlQuantile(base.P90, base.P90CI)
	row.P50Arm, row.P90Arm = htmlQuantile(arm.P50, arm.P50CI), htmlQuantile(arm.P90, arm.P90CI)
	if d := e.Difference; d.P50Ratio != nil {
		row.Ratio = htmlEstimate{htmlRatio(*d.P50Ratio), htmlRatioCI(d.P50RatioCI)}
	} else {
		row.Ratio = htmlEstimate{Value: "–"}
	}
	return row
}

func htmlNewErrorRow(e ErrorComparison) htmlErrorRow {
	row := htmlErrorRow{Arm: e.Arm, Q: htmlOptionalP(e.QValue), Verdict: htmlViewVerdict(e.Verdict)}
	if e.Verdict == TooFew {
		row.BaseRate, row.Rate, row.Difference = "–", "–", "–"
		return row
	}
	rate := func(v float64) string { return htmlSig3(100*htmlNoNoise(v)) + "%" }
	row.BaseRate, row.BaseRateCI = rate(e.BaseRate), "["+rate(e.BaseRateCI[0])+", "+rate(e.BaseRateCI[1])+"]"
	row.Rate, row.RateCI = rate(e.Rate), "["+rate(e.RateCI[0])+", "+rate(e.RateCI[1])+"]"
	pp := func(v float64) string { v = htmlNoNoise(v); return htmlSigned(htmlSig3(100*v), v) }
	row.Difference = pp(e.Difference) + " pp"
	row.DifferenceCI = "[" + pp(e.DifferenceCI[0]) + ", " + pp(e.DifferenceCI[1]) + "] pp"
	return row
}

// htmlNoNoise is a share, 0 where it is only rounding error (a Wilson
// bound of no failures comes out as 1e-19, not 0).
func htmlNoNoise(share float64) float64 {
	if math.Abs(share) < 1e-12 {
		return 0
	}
	return share
}

func htmlNewSequentialView(metric string, s *Sequential) *htmlSequentialView {
	v := &htmlSequentialView{PValue: htmlPValue(s.PValue), RatioCI: "–", Verdict: htmlViewVerdict(s.Verdict)}
	if s.RatioCI != nil {
		v.RatioCI = htmlRatioCI(s.RatioCI)
	}
	switch {
	case s.Decided:
		v.Decided = "yes: the experiment may stop"
	case s.More > 0 && s.MoreSeconds != nil:
		v.Decided = "not yet: about " + htmlCount(s.More) + " more requests per arm, " +
			wait(*s.MoreSeconds) + " at the present pace"
	case s.More > 0:
		v.Decided = "not yet: about " + htmlCount(s.More) + " more requests per arm"
	default:
		v.Decided = "not yet, and not in sight at this difference"
	}
	return v
}

// htmlIsRate says the metric is a rate, where a higher value is better.
func htmlIsRate(metric string) bool { return strings.HasSuffix(metric, "_per_second") }

// htmlViewVerdict words and colours a verdict.
func htmlViewVerdict(v Verdict) htmlVerdictView {
	switch v {
	case Slower, MoreFailures:
		return htmlVerdictView{string(v), "bad"}
	case Faster, FewerFailures:
		return htmlVerdictView{string(v), "good"}
	case TooFew:
		return htmlVerdictView{string(v), "few"}
	}
	return htmlVerdictView{string(v), "none"}
}

var htmlMetricLabels = map[string]string{
	"time_to_first_token_ms":    "Time to first token",
	"mean_itl_ms":               "Mean inter-token latency",
	"max_itl_ms":                "Longest inter-token latency",
	"e2e_latency_ms":            "End-to-end latency",
	"queue_time_ms":             "Queue time",
	"tokens_per_second":         "Decode rate",
	"prefill_tokens_per_second": "Prefill rate",
}

func htmlMetricLabel(metric string) string {
	if l, ok := htmlMetricLabels[metric]; ok {
		return l
	}
	return metric
}

// htmlMetricUnit is the unit of an access-log field: ms for *_ms, tokens/s
// for the rates.
func htmlMetricUnit(metric string) string {
	switch {
	case strings.HasSuffix(metric, "_ms"):
		return "ms"
	case htmlIsRate(metric):
		return "tokens/s"
	}
	return ""
}

func htmlMethodLines(m Method, sequential bool) []htmlMethodLine {
	lines := []htmlMethodLine{
		{"Intervals", "Every interval on this page is " + htmlPercent(m.Level) + ", in square brackets after its figure. " + htmlCapital(m.Intervals) + "."},
		{"Test", htmlCapital(m.Test) + fmt.Sprintf(" (alpha %s).", strconv.FormatFloat(m.Alpha, 'f', -1, 64))},
		{"Multiple comparisons", htmlCapital(m.Adjustment) + ": the q-value is the p-value so adjusted, and verdicts are taken at it."},
		{"Pooled", htmlCapital(m.Pooled) + "."},
		{"Strata", htmlCapital(m.StrataBasis) + fmt.Sprintf(" (min_n %d).", m.MinN)},
		{"Bootstrap", htmlCount(m.Draws) + " resamples behind each ratio's interval."},
		{"Error rates", htmlCapital(m.ErrorRates) + "; pp is percentage points."},
		{"Plots", fmt.Sprintf("Each curve is an arm's empirical cumulative distribution (ECDF): the share of its requests at or below each value, the strata compared weighted by their requests in both arms as the pooled quantiles are, so that both curves describe the same mix of requests (with no stratum compared, every request counts alike). At most %d points are drawn per arm (the sorted values at even steps, least and greatest kept); the x axis is logarithmic when the greatest value is over %d times the least. Circles and dashed lines mark the medians.", htmlMaxPlotPoints, htmlLogSpread)},
		{"Rates", "For rates (tokens/s), faster means higher values."},
		{"Figures", "Three significant figures; ratios to three decimals; p- and q-values to three decimals, or <0.001."},
	}
	if sequential {
		lines = append(lines, htmlMethodLine{"Sequential reading", fmt.Sprintf("With --follow, an anytime-valid test of equal medians within strata (Howard and Ramdas, Bernoulli 2022): its p-value and the median ratio's confidence sequence hold at every look however often the report is read. It decides on a difference when the sequence leaves 1, and on none when it lies within ±%s%%; otherwise it estimates the requests per arm still needed.", strconv.FormatFloat(100*Margin, 'f', -1, 64))})
	}
	return lines
}

// htmlCapital is s with its first letter upper-case.
func htmlCapital(s string) string {
	if s == "" {
		return s
	}
	return strings.ToUpper(s[:1]) + s[1:]
}

// Numbers as the page prints them.

// htmlSig3 is v to three significant figures, thousands grouped.
func htmlSig3(v float64) string {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return "–"
	}
	if v == 0 {
		return "0"
	}
	exp := math.Floor(math.Log10(math.Abs(v)))
	scale := math.Pow(10, exp-2)
	v = math.Round(v/scale) * scale
	exp = math.Floor(math.Log10(math.Abs(v)))
	if exp < -4 {
		return strconv.FormatFloat(v, 'g', 3, 64)
	}
	return htmlGroup(strconv.FormatFloat(v, 'f', int(max(0, 2-exp)), 64))
}

// htmlGroup puts commas between the thousands of a number's integer part.
func htmlGroup(s string) string {
	sign := ""
	if strings.HasPrefix(s, "-") {
		sign, s = "-", s[1:]
	}
	whole, frac, hasFrac := strings.Cut(s, ".")
	var b strings.Builder
	for i, c := range whole {
		if i > 0 && (len(whole)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	if hasFrac {
		return sign + b.String() + "." + frac
	}
	return sign + b.String()
}

func htmlCount(n int) string { return htmlGroup(strconv.Itoa(n)) }

func htmlRatio(v float64) string { return strconv.FormatFloat(v, 'f', 3, 64) }

func htmlRatioCI(ci *Interval) string {
	if ci == nil {
		return ""
	}
	return "[" + htmlRatio(ci[0]) + ", " + htmlRatio(ci[1]) + "]"
}

// htmlChange is a ratio as a signed percentage change.
func htmlChange(r float64) string { return htmlSigned(htmlSig3(100*(r-1)), r-1) + "%" }

func htmlSigned(s string, v float64) string {
	if v > 0 {
		return "+" + s
	}
	return s
}

func htmlPValue(p float64) string {
	if p < 0.001 {
		return "<0.001"
	}
	return strconv.FormatFloat(p, 'f', 3, 64)
}

func htmlOptionalP(p *float64) string {
	if p == nil {
		return "–"
	}
	return htmlPValue(*p)
}

func htmlQuantile(v *float64, ci *Interval) htmlEstimate {
	if v == nil {
		return htmlEstimate{Value: "–"}
	}
	e := htmlEstimate{Value: htmlSig3(*v)}
	if ci != nil {
		e.CI = "[" + htmlSig3(ci[0]) + ", " + htmlSig3(ci[1]) + "]"
	}
	return e
}

func htmlPercent(level float64) string { return strconv.FormatFloat(100*level, 'f', -1, 64) + "%" }

func htmlOrDash(s string) string {
	if s == "" {
		return "–"
	}
	return s
}

// The ECDF plot.

// htmlPlot is an ECDF plot of a pooled entry's arms, in pixels.
type htmlPlot struct {
	W, H                     int
	Left, Right, Top, Bottom float64
	XTicks, YTicks           []htmlTick
	Curves                   []htmlCurve
	XTitle, YTitle           string
	// Weighted says the curves weight strata as the pooled figures do.
	Weighted bool
}

// CentreX and CentreY are the middle of the plotting area.
func (p *htmlPlot) CentreX() float64 { return (p.Left + p.Right) / 2 }
func (p *htmlPlot) CentreY() float64 { return (p.Top + p.Bottom) / 2 }

type htmlTick struct {
	Pos   float64
	Label string
}

type htmlCurve struct {
	Arm, Legend, Colour, Path string
	// Class is base or arm: the base's curve is drawn wider, beneath,
	// so that where the curves coincide both show.
	Class string
	// MedianX, MedianY mark the median of the values drawn.
	MedianX, MedianY float64
	// LegendY is the baseline of the curve's legend line.
	LegendY float64
}

// htmlXAxis maps values to pixels, linearly or logarithmically.
type htmlXAxis struct {
	log         bool
	lo, hi      float64 // the domain
	left, right float64 // its pixels
}

func (a htmlXAxis) px(v float64) float64 {
	if a.log {
		v = max(v, a.lo)
		return a.left + math.Log(v/a.lo)/math.Log(a.hi/a.lo)*(a.right-a.left)
	}
	return a.left + (v-a.lo)/(a.hi-a.lo)*(a.right-a.left)
}

// htmlDistribution is an arm's values, sorted, with the share of the
// whole at or below each.
type htmlDistribution struct {
	arm    string
	x, cum []float64
}

// quantile is the least value with a share p at or below it.
func (d htmlDistribution) quantile(p float64) float64 {
	i := sort.SearchFloat64s(d.cum, p-1e-12)
	return d.x[min(i, len(d.x)-1)]
}

// htmlDistributions is the base's and the arm's distributions of a
// pooled entry, as its pooled quantiles weigh them: each stratum
// compared (not too few) by its requests in both arms, so that both
// describe the same mix of requests. weighted is false when no stratum
// was compared: then every value of the entry counts alike.
func htmlDistributions(e Entry, strata []Entry) (ds []htmlDistribution, weighted bool) {
	byArm := map[string][]htmlPoint{}
	var total float64
	for _, s := range strata {
		if s.Verdict != TooFew {
			total += float64(len(s.Values[e.Base]) + len(s.Values[e.Arm]))
		}
	}
	for _, s := range strata {
		if s.Verdict == TooFew {
			continue
		}
		w := float64(len(s.Values[e.Base])+len(s.Values[e.Arm])) / total
		for _, arm := range []string{e.Base, e.Arm} {
			for _, x := range s.Values[arm] {
				byArm[arm] = append(byArm[arm], htmlPoint{x, w / float64(len(s.Values[arm]))})
			}
		}
	}
	weighted = total > 0
	if !weighted {
		for _, arm := range []string{e.Base, e.Arm} {
			for _, x := range e.Values[arm] {
				byArm[arm] = append(byArm[arm], htmlPoint{x, 1})
			}
		}
	}
	for _, arm := range []string{e.Base, e.Arm} {
		if len(byArm[arm]) > 0 {
			ds = append(ds, htmlCumulate(arm, byArm[arm]))
		}
	}
	return ds, weighted
}

// htmlPoint is a value and its weight.
type htmlPoint struct{ x, w float64 }

// htmlCumulate is the distribution of weighted values.
func htmlCumulate(arm string, pts []htmlPoint) htmlDistribution {
	slices.SortFunc(pts, func(a, b htmlPoint) int { return cmpFloat(a.x, b.x) })
	d := htmlDistribution{arm: arm, x: make([]float64, len(pts)), cum: make([]float64, len(pts))}
	var acc float64
	for i, p := range pts {
		acc += p.w
		d.x[i], d.cum[i] = p.x, acc
	}
	for i := range d.cum {
		d.cum[i] /= acc
	}
	return d
}

// htmlNewPlot is the ECDF of the pooled entry e's base and arm values,
// from its strata; nil when neither arm has any.
func htmlNewPlot(e Entry, strata []Entry) *htmlPlot {
	ds, weighted := htmlDistributions(e, strata)
	if len(ds) == 0 {
		return nil
	}
	p := &htmlPlot{W: htmlPlotW, H: htmlPlotH, Left: htmlMarginLeft, Right: htmlPlotW - htmlMarginRight, Top: htmlMarginTop, Bottom: htmlPlotH - htmlMarginB,
		YTitle: "share of requests ≤ x", Weighted: weighted}
	x := htmlNewXAxis(ds, p.Left, p.Right)
	unit := htmlMetricUnit(e.Metric)
	p.XTitle = strings.ToLower(htmlMetricLabel(e.Metric)[:1]) + htmlMetricLabel(e.Metric)[1:]
	if unit != "" {
		p.XTitle += " (" + unit + ")"
	}
	if x.log {
		p.XTitle += ", log scale"
	}
	p.XTicks = htmlXTicks(x)
	y := func(share float64) float64 { return p.Bottom - share*(p.Bottom-p.Top) }
	for _, share := range []float64{0, 0.25, 0.5, 0.75, 1} {
		p.YTicks = append(p.YTicks, htmlTick{y(share), strconv.Itoa(int(100*share)) + "%"})
	}
	for i, d := range ds {
		colour, role, class := htmlArmColour, "", "arm"
		if d.arm == e.Base {
			colour, role, class = htmlBaseColour, " (base)", "base"
		}
		median := d.quantile(0.5)
		legend := fmt.Sprintf("%s%s · n = %s · median %s %s", htmlShorten(d.arm, htmlLegendRunes), role, htmlCount(len(d.x)), htmlSig3(median), unit)
		p.Curves = append(p.Curves, htmlCurve{Arm: d.arm, Legend: strings.TrimSpace(legend), Colour: colour, Class: class,
			Path: htmlEcdfPath(d, x, y), MedianX: x.px(median), MedianY: y(0.5), LegendY: float64(20 + 20*i)})
	}
	return p
}

// htmlNewXAxis is the axis over every value: logarithmic when they spread
// over more than htmlLogSpread times (values at or below 0 then drawn at its
// left edge), from and to round numbers.
func htmlNewXAxis(ds []htmlDistribution, left, right float64) htmlXAxis {
	lo, hi, least := math.Inf(1), math.Inf(-1), math.Inf(1)
	for _, d := range ds {
		lo, hi = min(lo, d.x[0]), max(hi, d.x[len(d.x)-1])
		if i, _ := slices.BinarySearch(d.x, math.SmallestNonzeroFloat64); i < len(d.x) {
			least = min(least, d.x[i])
		}
	}
	if !math.IsInf(least, 1) && hi/least > htmlLogSpread {
		return htmlXAxis{log: true, lo: htmlRoundLog(least, math.Floor), hi: htmlRoundLog(hi, math.Ceil), left: left, right: right}
	}
	if hi == lo {
		lo, hi = lo-max(1, math.Abs(lo)/10), hi+max(1, math.Abs(hi)/10)
	}
	step := htmlNiceStep((hi - lo) / 5)
	return htmlXAxis{lo: math.Floor(lo/step) * step, hi: math.Ceil(hi/step) * step, left: left, right: right}
}

// htmlRoundLog rounds v, down or up, to 1, 2 or 5 times a power of ten.
func htmlRoundLog(v float64, round func(float64) float64) float64 {
	decade := math.Pow(10, math.Floor(math.Log10(v)))
	steps := []float64{1, 2, 5, 10}
	if round(1.5) == 1 { // down
		for i := len(steps) - 1; i >= 0; i-- {
			if steps[i]*decade <= v*(1+1e-9) {
				return steps[i] * decade
			}
		}
	}
	for _, s := range steps {
		if s*decade >= v*(1-1e-9) {
			return s * decade
		}
	}
	return 10 * decade
}

// htmlNiceStep is the 1, 2 or 5 times a power of ten nearest above raw.
func htmlNiceStep(raw float64) float64 {
	decade := math.Pow(10, math.Floor(math.Log10(raw)))
	for _, s := range []float64{1, 2, 5} {
		if s*decade >= raw {
			return s * decade
		}
	}
	return 10 * decade
}

// htmlXTicks are round values across the axis: on a log axis each power of
// ten, and 2 and 5 times it when the axis spans under three decades.
func htmlXTicks(a htmlXAxis) []htmlTick {
	var values []float64
	if a.log {
		mult := []float64{1}
		if a.hi/a.lo < 1000 {
			mult = []float64{1, 2, 5}
		}
		for e := math.Floor(math.Log10(a.lo)); e <= math.Ceil(math.Log10(a.hi)); e++ {
			for _, m := range mult {
				if v := m * math.Pow(10, e); v >= a.lo*(1-1e-9) && v <= a.hi*(1+1e-9) {
					values = append(values, v)
				}
			}
		}
	} else {
		step := htmlNiceStep((a.hi - a.lo) / 5)
		// Each tick rounded to the step's decimals: 20.4, not the
		// 20.400000000000002 that adding steps makes.
		scale := math.Pow(10, max(0, -math.Floor(math.Log10(step))))
		first := math.Ceil(a.lo/step-1e-9) * step
		for i := 0; first+float64(i)*step <= a.hi+step/1e6; i++ {
			values = append(values, math.Round((first+float64(i)*step)*scale)/scale)
		}
	}
	ticks := make([]htmlTick, len(values))
	for i, v := range values {
		ticks[i] = htmlTick{a.px(v), htmlTickLabel(v)}
	}
	return ticks
}

// htmlTickLabel is a round value short: 20, 0.5, 1,500, 20k, 3M.
func htmlTickLabel(v float64) string {
	switch a := math.Abs(v); {
	case a >= 1e7:
		return htmlGroup(strconv.FormatFloat(v/1e6, 'f', -1, 64)) + "M"
	case a >= 1e4:
		return strconv.FormatFloat(v/1e3, 'f', -1, 64) + "k"
	case a < 1e-9:
		return "0"
	}
	return htmlGroup(strconv.FormatFloat(v, 'f', -1, 64))
}

// htmlEcdfPath is the SVG path of a distribution's ECDF: a step up to
// the share at or below each value drawn, from 0 at the least to 1 at the
// axis's right edge.
func htmlEcdfPath(d htmlDistribution, x htmlXAxis, y func(float64) float64) string {
	var b strings.Builder
	fmt.Fprintf(&b, "M%.1f,%.1f", x.px(d.x[0]), y(0))
	for _, i := range htmlSubsample(len(d.x), htmlMaxPlotPoints) {
		fmt.Fprintf(&b, "H%.1fV%.1f", x.px(d.x[i]), y(d.cum[i]))
	}
	fmt.Fprintf(&b, "H%.1f", x.right)
	return b.String()
}

// htmlSubsample is m indices of n at even steps, the first and last among
// them; every index when n is at most m.
func htmlSubsample(n, m int) []int {
	idx := make([]int, 0, min(n, m))
	if n <= m {
		for i := range n {
			idx = append(idx, i)
		}
		return idx
	}
	for k := range m {
		idx = append(idx, int(math.Round(float64(k)*float64(n-1)/float64(m-1))))
	}
	return idx
}

// htmlShorten cuts an arm's name to at most n runes.
func htmlShorten(name string, n int) string {
	r := []rune(name)
	if len(r) <= n {
		return name
	}
	return string(r[:n-1]) + "…"
}

var htmlPageTemplate = template.Must(template.New("report").Funcs(template.FuncMap{
	"px": func(v float64) string { return strconv.FormatFloat(v, 'f', 1, 64) },
}).Parse(htmlPageHTML))

const htmlPageHTML = `<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{{.Title}}</title>
<style>
:root { --base: {{.BaseColour}}; --arm: {{.ArmColour}}; --muted: #57606a; --rule: #d0d7de; }
* { box-sizing: border-box; }
body { margin: 0; background: #fff; color: #1f2328; font: 15px/1.45 system-ui, "DejaVu Sans", "Liberation Sans", Arial, sans-serif; }
main { max-width: 1200px; margin: 0 auto; padding: 28px 36px 56px; }
h1 { font-size: 26px; margin: 0 0 6px; font-weight: 700; }
h2 { font-size: 20px; margin: 40px 0 10px; padding-top: 14px; border-top: 2px solid #eaeef2; }
h2 code { margin-left: 8px; }
h3 { font-size: 16px; margin: 22px 0 8px; }
p { margin: 6px 0; }
.muted, .sub { color: var(--muted); }
.sub { margin: 0 0 18px; }
.base { color: var(--base); font-weight: 700; }
.arm { color: var(--arm); font-weight: 700; }
code { font: 13px ui-monospace, "DejaVu Sans Mono", monospace; color: var(--muted); }
table { border-collapse: collapse; font-variant-numeric: tabular-nums; }
th, td { padding: 5px 10px; text-align: left; vertical-align: top; border-bottom: 1px solid #eaeef2; }
thead th { font-size: 13px; font-weight: 600; color: var(--muted); border-bottom: 1px solid var(--rule); vertical-align: bottom; }
thead tr.group th { border-bottom: none; text-align: center; padding-bottom: 0; }
th.num, td.num { text-align: right; white-space: nowrap; }
td.stratum { white-space: nowrap; }
.ci { display: block; color: #6e7781; font-size: 12px; font-weight: 400; }
tr.pooled td { font-weight: 700; background: #f6f8fa; }
table.wide { width: 100%; }
.verdict { display: inline-block; padding: 1px 9px; border-radius: 11px; font-size: 13px; font-weight: 700; white-space: nowrap; }
.v-bad { background: #c62828; color: #fff; }
.v-good { background: #2e7d32; color: #fff; }
.v-none { background: #6b7280; color: #fff; }
.v-few { background: #f1f3f5; color: #8c959f; }
.summary td { vertical-align: middle; }
.summary td.metric { font-weight: 700; }
.summary td.metric a { color: inherit; text-decoration: none; }
.summary td.note { color: var(--muted); }
.alert { border-left: 6px solid #b35c00; background: #fff4e5; padding: 12px 16px; margin: 10px 0; font-size: 16px; }
.alert strong { color: #8a4500; }
.fine { border-left: 6px solid #d0d7de; background: #f6f8fa; padding: 8px 16px; margin: 10px 0; color: var(--muted); }
.figure-row { display: flex; gap: 32px; align-items: flex-start; flex-wrap: wrap; }
figure { margin: 6px 0 10px; flex: none; }
figcaption { color: var(--muted); font-size: 13px; width: 640px; }
.facts { flex: 1; min-width: 300px; }
.facts dl { display: grid; grid-template-columns: max-content 1fr; gap: 4px 14px; margin: 6px 0 14px; }
.facts dt { color: var(--muted); }
.facts dd { margin: 0; font-variant-numeric: tabular-nums; }
.box { border: 1px solid var(--rule); border-radius: 6px; padding: 8px 14px; }
.box h3 { margin: 4px 0; }
svg.plot { display: block; background: #fff; }
svg.plot text { font-size: 12px; fill: #3d444d; font-family: system-ui, "DejaVu Sans", "Liberation Sans", Arial, sans-serif; }
svg.plot g.legend text { font-size: 13px; fill: #1f2328; }
svg.plot .grid { stroke: #e6e9ed; stroke-width: 1; }
svg.plot .axis { stroke: #8c959f; stroke-width: 1; }
svg.plot path.ecdf { fill: none; stroke-width: 2; stroke-linejoin: round; }
svg.plot path.ecdf.base { stroke-width: 4; }
svg.plot .median { stroke-width: 1.5; stroke-dasharray: 4 3; }
dl.method { display: grid; grid-template-columns: max-content 1fr; gap: 6px 18px; max-width: 1100px; }
dl.method dt { font-weight: 700; }
dl.method dd { margin: 0; }
</style>
</head>
<body>
<main>
<header>
<h1>timing-sidecar compare: {{range $i, $a := .Compared}}{{if $i}}, {{end}}<span class="arm">{{$a}}</span>{{end}}{{if not .Compared}}<span class="base">{{.Base}}</span> alone{{else}} against <span class="base">{{.Base}}</span>{{end}}</h1>
<p class="sub">{{range $i, $t := .Totals}}{{if $i}} · {{end}}<span class="{{$t.Class}}">{{$t.Name}}</span>: {{$t.Requests}} requests, {{$t.Failed}} failed{{end}}. Intervals are {{.Level}}; figures to three significant figures.</p>
</header>

<section>
<h2>Verdicts</h2>
{{if .Summary}}<table class="summary wide">
<thead><tr><th>metric</th>{{if gt (len .Compared) 1}}<th>arm</th>{{end}}<th>verdict</th><th class="num">median change [{{.Level}}]</th><th class="num">p50 ratio [{{.Level}}]</th><th class="num">q-value</th><th></th></tr></thead>
<tbody>
{{range .Summary}}<tr><td class="metric"><a href="#{{.Anchor}}">{{.Label}}</a></td>{{if gt (len $.Compared) 1}}<td class="arm">{{.Arm}}</td>{{end}}<td><span class="verdict v-{{.Verdict.Class}}">{{.Verdict.Text}}</span></td><td class="num">{{if .Change}}{{.Change}} <span class="muted">{{.ChangeCI}}</span>{{else}}–{{end}}</td><td class="num">{{if .Ratio}}{{.Ratio}} <span class="muted">{{.RatioCI}}</span>{{else}}–{{end}}</td><td class="num">{{.Q}}</td><td class="note">{{.Note}}</td></tr>
{{end}}</tbody>
</table>{{else}}<p class="muted">No metric has values in both arms.</p>{{end}}
</section>

<section>
<h2>Mix of requests and error rates</h2>
{{range .Mix}}{{if .Differs}}<div class="alert"><strong>Mix differs:</strong> the arms served different mixes of requests; compare the per-stratum rows. <span class="muted">(<span class="arm">{{.Arm}}</span> against <span class="base">{{$.Base}}</span>: chi-square p {{.PValue}}, flagged below {{$.MixAlpha}}.)</span></div>
{{else}}<div class="fine">The arms served alike mixes of requests (<span class="arm">{{.Arm}}</span> against <span class="base">{{$.Base}}</span>: chi-square p {{.PValue}}; flagged below {{$.MixAlpha}}).</div>
{{end}}{{end}}
{{if .Errors}}<table class="errors">
<thead><tr><th>arm</th><th class="num">error rate of <span class="base">{{.Base}}</span> [{{.Level}}]</th><th class="num">error rate of the arm [{{.Level}}]</th><th class="num">difference [{{.Level}}]</th><th class="num">q-value</th><th>verdict</th></tr></thead>
<tbody>
{{range .Errors}}<tr><td class="arm">{{.Arm}}</td><td class="num">{{.BaseRate}} <span class="muted">{{.BaseRateCI}}</span></td><td class="num">{{.Rate}} <span class="muted">{{.RateCI}}</span></td><td class="num">{{.Difference}} <span class="muted">{{.DifferenceCI}}</span></td><td class="num">{{.Q}}</td><td><span class="verdict v-{{.Verdict.Class}}">{{.Verdict.Text}}</span></td></tr>
{{end}}</tbody>
</table>{{end}}
</section>

{{range .Metrics}}{{$m := .}}<section class="metric" id="{{.Anchor}}">
<h2>{{.Label}}{{if .MultiArm}}: <span class="arm">{{.Arm}}</span>{{end}} <code>{{.Metric}}</code> <span class="verdict v-{{.Verdict.Class}}">{{.Verdict.Text}}</span></h2>
<div class="figure-row">
{{with .Plot}}{{$p := .}}<figure>
<svg class="plot" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {{.W}} {{.H}}" width="{{.W}}" height="{{.H}}" role="img" aria-label="ECDF of {{.XTitle}}">
<g class="gridlines">{{range .XTicks}}<line class="grid" x1="{{px .Pos}}" x2="{{px .Pos}}" y1="{{px $p.Top}}" y2="{{px $p.Bottom}}"/>{{end}}{{range .YTicks}}<line class="grid" x1="{{px $p.Left}}" x2="{{px $p.Right}}" y1="{{px .Pos}}" y2="{{px .Pos}}"/>{{end}}</g>
<line class="axis" x1="{{px .Left}}" x2="{{px .Right}}" y1="{{px .Bottom}}" y2="{{px .Bottom}}"/>
<line class="axis" x1="{{px .Left}}" x2="{{px .Left}}" y1="{{px .Top}}" y2="{{px .Bottom}}"/>
<g class="ticks x">{{range .XTicks}}<text x="{{px .Pos}}" y="{{px $p.Bottom}}" dy="17" text-anchor="middle">{{.Label}}</text>{{end}}</g>
<g class="ticks y">{{range .YTicks}}<text x="{{px $p.Left}}" dx="-7" y="{{px .Pos}}" dy="4" text-anchor="end">{{.Label}}</text>{{end}}</g>
<text class="title" x="{{px .CentreX}}" y="{{.H}}" dy="-9" text-anchor="middle">{{.XTitle}}</text>
<text class="title" transform="translate(18 {{px .CentreY}}) rotate(-90)" text-anchor="middle">{{.YTitle}}</text>
{{range .Curves}}<path class="ecdf {{.Class}}" stroke="{{.Colour}}" d="{{.Path}}"><title>{{.Arm}}</title></path>
<line class="median" stroke="{{.Colour}}" x1="{{px .MedianX}}" x2="{{px .MedianX}}" y1="{{px $p.Bottom}}" y2="{{px .MedianY}}"/><circle cx="{{px .MedianX}}" cy="{{px .MedianY}}" r="4" fill="#fff" stroke="{{.Colour}}" stroke-width="2"/>
{{end}}<g class="legend">{{range .Curves}}<rect x="{{px $p.Left}}" y="{{px .LegendY}}" width="18" height="3" transform="translate(0 -6)" fill="{{.Colour}}"/><text x="{{px $p.Left}}" dx="26" y="{{px .LegendY}}"><title>{{.Arm}}</title>{{.Legend}}</text>{{end}}</g>
</svg>
<figcaption>{{if .Weighted}}Share of each arm's requests at or below each value (ECDF), strata weighted alike in both arms as in the pooled row, so both curves describe the same mix of requests; circles and dashed lines mark the medians, the pooled p50.{{else}}Share of each arm's requests at or below each value (ECDF), every request counted alike: no stratum had enough values to weight; circles and dashed lines mark the medians.{{end}}</figcaption>
</figure>{{end}}
<div class="facts">
<h3>Pooled over strata</h3>
<dl>
<dt>verdict</dt><dd><span class="verdict v-{{.Verdict.Class}}">{{.Verdict.Text}}</span> <span class="muted">q-value {{.Pooled.Q}}</span></dd>
<dt>median change</dt><dd>{{if .Pooled.Change}}{{.Pooled.Change}} <span class="muted">{{.Pooled.ChangeCI}}</span>{{else}}–{{end}}</dd>
<dt>p50 ratio</dt><dd>{{if .Pooled.Ratio}}{{.Pooled.Ratio}} <span class="muted">{{.Pooled.RatioCI}}</span>{{else}}–{{end}}</dd>
<dt>p90 ratio</dt><dd>{{if .P90Ratio}}{{.P90Ratio}} <span class="muted">{{.P90RatioCI}}</span>{{else}}–{{end}}</dd>
{{if .Pooled.Note}}<dt>note</dt><dd>{{.Pooled.Note}}</dd>{{end}}
</dl>
{{with .Sequential}}<div class="box sequential">
<h3>Sequential reading (--follow)</h3>
<dl>
<dt>verdict</dt><dd><span class="verdict v-{{.Verdict.Class}}">{{.Verdict.Text}}</span></dd>
<dt>anytime p-value</dt><dd>{{.PValue}}</dd>
<dt>p50 ratio, confidence sequence</dt><dd>{{.RatioCI}}</dd>
<dt>decided</dt><dd>{{.Decided}}</dd>
</dl>
</div>{{end}}
</div>
</div>
<h3>By stratum</h3>
{{if .Common}}<p class="muted">Every stratum: {{.Common}}.</p>{{end}}
<table class="strata wide">
<thead>
<tr class="group"><th colspan="{{len .Columns}}"></th><th colspan="2" class="num">n</th><th colspan="2" class="num">p50{{if .Unit}} ({{.Unit}}){{end}} [{{$.Level}}]</th><th colspan="2" class="num">p90{{if .Unit}} ({{.Unit}}){{end}} [{{$.Level}}]</th><th colspan="3"></th></tr>
<tr>{{range .Columns}}<th>{{.}}</th>{{end}}{{range 3}}<th class="num base" title="{{$m.Base}}">{{$m.BaseShort}}</th><th class="num arm" title="{{$m.Arm}}">{{$m.ArmShort}}</th>{{end}}<th class="num">p50 ratio [{{$.Level}}]</th><th class="num">q-value</th><th>verdict</th></tr>
</thead>
<tbody>
{{range .Rows}}<tr{{if .Pooled}} class="pooled"{{end}}>{{if .Pooled}}<td colspan="{{len $m.Columns}}">all strata, pooled</td>{{else}}{{range .Cells}}<td class="stratum">{{.}}</td>{{end}}{{end}}<td class="num">{{.NBase}}</td><td class="num">{{.NArm}}</td><td class="num">{{.P50Base.Value}}<span class="ci">{{.P50Base.CI}}</span></td><td class="num">{{.P50Arm.Value}}<span class="ci">{{.P50Arm.CI}}</span></td><td class="num">{{.P90Base.Value}}<span class="ci">{{.P90Base.CI}}</span></td><td class="num">{{.P90Arm.Value}}<span class="ci">{{.P90Arm.CI}}</span></td><td class="num">{{.Ratio.Value}}<span class="ci">{{.Ratio.CI}}</span></td><td class="num">{{.Q}}</td><td><span class="verdict v-{{.Verdict.Class}}">{{.Verdict.Text}}</span></td></tr>
{{end}}</tbody>
</table>
</section>
{{end}}
<section>
<h2>Method</h2>
<dl class="method">
{{range .Method}}<dt>{{.Name}}</dt><dd>{{.Text}}</dd>
{{end}}</dl>
</section>
</main>
<script>
(function () {
  "use strict";
  // Legibility, checked once laid out: the labels of each axis and of
  // the legend do not overlap, and every label lies inside its plot.
  function overlap(a, b) {
    return a.x < b.x + b.width - 0.5 && b.x < a.x + a.width - 0.5 &&
      a.y < b.y + b.height - 0.5 && b.y < a.y + a.height - 0.5;
  }
  function inside(svg, index, problems) {
    var vb = svg.viewBox.baseVal, box = svg.getBoundingClientRect();
    var sx = box.width / vb.width, sy = box.height / vb.height;
    var texts = svg.querySelectorAll("text");
    for (var j = 0; j < texts.length; j++) {
      var r = texts[j].getBoundingClientRect();
      var x0 = vb.x + (r.left - box.left) / sx, x1 = vb.x + (r.right - box.left) / sx;
      var y0 = vb.y + (r.top - box.top) / sy, y1 = vb.y + (r.bottom - box.top) / sy;
      if (r.width === 0 || x0 < vb.x - 0.5 || y0 < vb.y - 0.5 || x1 > vb.x + vb.width + 0.5 || y1 > vb.y + vb.height + 0.5) {
        problems.push("plot " + index + ": label '" + texts[j].textContent + "' outside its viewBox");
      }
      if (parseFloat(window.getComputedStyle(texts[j]).fontSize) < 12) {
        problems.push("plot " + index + ": label '" + texts[j].textContent + "' under 12px");
      }
    }
  }
  function apart(svg, index, problems) {
    var groups = svg.querySelectorAll("g.ticks, g.legend");
    for (var g = 0; g < groups.length; g++) {
      var labels = groups[g].querySelectorAll("text"), boxes = [];
      for (var i = 0; i < labels.length; i++) {
        boxes.push(labels[i].getBBox());
      }
      for (var a = 0; a < boxes.length; a++) {
        for (var b = a + 1; b < boxes.length; b++) {
          if (overlap(boxes[a], boxes[b])) {
            problems.push("plot " + index + ": labels '" + labels[a].textContent + "' and '" + labels[b].textContent + "' overlap");
          }
        }
      }
    }
  }
  function check() {
    var problems = [], svgs = document.querySelectorAll("svg.plot");
    for (var i = 0; i < svgs.length; i++) {
      inside(svgs[i], i + 1, problems);
      apart(svgs[i], i + 1, problems);
    }
    var boxes = [];
    for (var k = 0; k < svgs.length; k++) {
      var b = svgs[k].getBoundingClientRect();
      boxes.push([b.left + window.scrollX, b.top + window.scrollY, b.width, b.height].map(Math.round).join(","));
    }
    document.body.dataset.plotBoxes = boxes.join(" ");
    document.body.dataset.plots = String(document.querySelectorAll("svg.plot path.ecdf").length);
    document.body.dataset.legible = problems.length === 0 ? "yes" : "no: " + problems.slice(0, 5).join("; ");
  }
  if (document.readyState === "complete") {
    check();
  } else {
    window.addEventListener("load", check);
  }
})();
</script>
</body>
</html>
`
