package compare

import (
	"fmt"
	"io"
	"math"
	"strings"
	"text/tabwriter"
	"time"
)

// WriteText writes the report for people at a terminal: per arm its
// requests, error rate and mix, then per metric a table, the pooled row
// first and each stratum after.
func WriteText(w io.Writer, r *Report) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	p := func(format string, a ...any) { fmt.Fprintf(tw, format, a...) }
	p("timing-sidecar compare: each arm against %s (%.0f%% intervals; verdicts at q < %v, Benjamini-Hochberg)\n\n", r.Base, 100*Level, Alpha)
	for _, a := range r.Arms {
		p("arm %s:\t%d requests,\t%d failed\n", a.Name, a.Requests, a.Failed)
	}
	for _, e := range r.Errors {
		if e.Verdict == TooFew {
			p("error rate of %s: too few requests\n", e.Arm)
			continue
		}
		p("error rate of %s: %s against %s; difference %s %s, q %s: %s\n", e.Arm, percent(e.Rate), percent(e.BaseRate),
			points(e.Difference), ciPoints(e.DifferenceCI), pvalue(e.QValue), e.Verdict)
	}
	for _, m := range r.Mix {
		state := "alike"
		if m.Differs {
			state = "DIFFERENT: the pooled rows weigh strata alike; read the strata"
		}
		p("mix of requests of %s: %s (chi-square p %s)\n", m.Arm, state, pvalue(&m.PValue))
	}
	var metric, arm string
	for _, e := range r.Results {
		if e.Metric != metric || e.Arm != arm {
			metric, arm = e.Metric, e.Arm
			p("\n%s, %s against %s\n", metric, arm, e.Base)
			p("  stratum\tn\tp50 %s\tp50 %s\tp90 %s\tp90 %s\tp50 ratio\tq\tverdict\n", e.Base, arm, e.Base, arm)
		}
		writeRow(tw, e)
	}
	return tw.Flush()
}

func writeRow(w io.Writer, e Entry) {
	a, b := e.Arms[e.Base], e.Arms[e.Arm]
	name := "all (weighted by strata)"
	if e.Stratum != nil {
		s := e.Stratum
		name = strings.Join([]string{s.Endpoint, s.Model, "cache " + s.Cache, "prompt " + s.Prompt, "completion " + s.Completion}, " ")
	}
	verdict := string(e.Verdict)
	if e.Detectable != nil {
		verdict += fmt.Sprintf(" (detectable ±%.1f%%)", 100**e.Detectable)
	}
	if s := e.Sequential; s != nil {
		verdict += fmt.Sprintf("; anytime: %s, p %s, ratio %s", s.Verdict, pvalue(&s.PValue), ci(s.RatioCI))
		switch {
		case s.Decided:
			verdict += ", decided: may stop"
		case s.More > 0 && s.MoreSeconds != nil:
			verdict += fmt.Sprintf(", undecided: about %d more requests an arm, %s at the present pace", s.More,
				(time.Duration(*s.MoreSeconds) * time.Second).Round(time.Minute))
		case s.More > 0:
			verdict += fmt.Sprintf(", undecided: about %d more requests an arm", s.More)
		default:
			verdict += ", undecided: no decision in sight"
		}
	}
	fmt.Fprintf(w, "  %s\t%d/%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", name, a.N, b.N,
		withCI(a.P50, a.P50CI), withCI(b.P50, b.P50CI), withCI(a.P90, a.P90CI), withCI(b.P90, b.P90CI),
		ratio(e.Difference.P50Ratio, e.Difference.P50RatioCI), pvalue(e.QValue), verdict)
}

// figure is v to three significant figures, or "-".
func figure(v *float64) string {
	if v == nil {
		return "-"
	}
	return fmt.Sprintf("%.3g", *v)
}

func withCI(v *float64, c *Interval) string {
	if c == nil {
		return figure(v)
	}
	return figure(v) + " " + ci(c)
}

func ci(c *Interval) string {
	if c == nil {
		return "-"
	}
	return fmt.Sprintf("[%.3g, %.3g]", c[0], c[1])
}

func ratio(v *float64, c *Interval) string {
	if v == nil {
		return "-"
	}
	if c == nil {
		return fmt.Sprintf("%.3f", *v)
	}
	return fmt.Sprintf("%.3f [%.3f, %.3f]", *v, c[0], c[1])
}

// pvalue is p to one significant figure, "<0.001" below it, "-" if none.
func pvalue(p *float64) string {
	switch {
	case p == nil || math.IsNaN(*p):
		return "-"
	case *p < 0.001:
		return "<0.001"
	}
	return fmt.Sprintf("%.2g", *p)
}

func percent(v float64) string { return fmt.Sprintf("%.2f%%", 100*v) }

// points is a difference of rates in percentage points.
func points(v float64) string { return fmt.Sprintf("%+.2f pp", 100*v) }

func ciPoints(c Interval) string { return fmt.Sprintf("[%+.2f, %+.2f]", 100*c[0], 100*c[1]) }
