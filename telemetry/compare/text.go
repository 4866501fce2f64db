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
	for start := 0; start < len(r.Results); {
		end := start + 1
		for end < len(r.Results) && r.Results[end].Metric == r.Results[start].Metric && r.Results[end].Arm == r.Results[start].Arm {
			end++
		}
		writeMetric(tw, r.Results[start:end])
		start = end
	}
	return tw.Flush()
}

// writeMetric writes one metric's entries of one arm: what every stratum
// shares said once, above a row per stratum naming what differs.
func writeMetric(w io.Writer, entries []Entry) {
	e := entries[0]
	fmt.Fprintf(w, "\n%s, %s against %s\n", e.Metric, e.Arm, e.Base)
	varies, shared := strataFields(entries)
	if len(shared) > 0 {
		fmt.Fprintf(w, "  every stratum: %s\n", strings.Join(shared, ", "))
	}
	fmt.Fprintf(w, "  stratum\tn\tp50 %s\tp50 %s\tp90 %s\tp90 %s\tp50 ratio\tq\tverdict\n", e.Base, e.Arm, e.Base, e.Arm)
	for _, e := range entries {
		name := "all (weighted by strata)"
		if e.Stratum != nil {
			var parts []string
			for _, f := range varies {
				parts = append(parts, f.name+" "+f.of(e.Stratum))
			}
			name = strings.Join(parts, " ")
		}
		writeRow(w, name, e)
	}
}

// stratumField is one field of a stratum, named.
type stratumField struct {
	name string
	of   func(*Stratum) string
}

var stratumFields = []stratumField{
	{"endpoint", func(s *Stratum) string { return s.Endpoint }},
	{"model", func(s *Stratum) string { return s.Model }},
	{"cache", func(s *Stratum) string { return s.Cache }},
	{"prompt", func(s *Stratum) string { return s.Prompt }},
	{"completion", func(s *Stratum) string { return s.Completion }},
}

// strataFields splits the strata's fields into those that vary among the
// entries and those all share ("model m").
func strataFields(entries []Entry) (varies []stratumField, shared []string) {
	for _, f := range stratumFields {
		values := map[string]bool{}
		var one string
		for _, e := range entries {
			if e.Stratum != nil {
				one = f.of(e.Stratum)
				values[one] = true
			}
		}
		if len(values) == 1 {
			shared = append(shared, f.name+" "+one)
		} else {
			varies = append(varies, f)
		}
	}
	return varies, shared
}

func writeRow(w io.Writer, name string, e Entry) {
	a, b := e.Arms[e.Base], e.Arms[e.Arm]
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
			verdict += fmt.Sprintf(", undecided: about %d more requests an arm, %s at the present pace", s.More, wait(*s.MoreSeconds))
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

// figure is v to three significant figures, whole from 1,000 up (never
// in exponent form), or "-".
func figure(v *float64) string {
	if v == nil {
		return "-"
	}
	return short(*v)
}

func short(v float64) string {
	if math.Abs(v) >= 1000 {
		return fmt.Sprintf("%.0f", v)
	}
	return fmt.Sprintf("%.3g", v)
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
	return "[" + short(c[0]) + ", " + short(c[1]) + "]"
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

// wait is a span of seconds for people: to the second under a minute,
// to the minute under a day, else in hours.
func wait(seconds float64) string {
	d := time.Duration(seconds * float64(time.Second))
	switch {
	case d < time.Minute:
		return d.Round(time.Second).String()
	case d < 24*time.Hour:
		return d.Round(time.Minute).String()
	}
	return fmt.Sprintf("%.0fh", d.Hours())
}
