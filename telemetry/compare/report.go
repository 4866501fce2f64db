package compare

import (
	"encoding/json"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
)

// Report is a comparison of every other arm against the base arm: what
// `timing-sidecar compare --json` prints and `--html` draws.
type Report struct {
	// Base is the arm the others are compared against.
	Base string     `json:"base"`
	Arms []ArmTotal `json:"arms"`
	// Mix is, per arm compared, the chi-square check that it drew its
	// requests from the strata as the base did.
	Mix []MixCheck `json:"mix"`
	// Errors is, per arm compared, its error rate against the base's.
	Errors []ErrorComparison `json:"error_rates"`
	// Results is one entry per metric, stratum and arm compared: first
	// each metric's pooled entry, then its strata.
	Results []Entry `json:"results"`
	Method  Method  `json:"method"`
}

// ArmTotal is an arm's requests and failures, and its pace: requests a
// second over the span of its lines' times (null under a second).
type ArmTotal struct {
	Name              string   `json:"name"`
	Requests          int      `json:"requests"`
	Failed            int      `json:"failed"`
	RequestsPerSecond *float64 `json:"requests_per_second"`
}

// MixCheck is the mix check of one arm against the base.
type MixCheck struct {
	Arm    string  `json:"arm"`
	PValue float64 `json:"p_value"`
	// Differs is a p-value below MixAlpha: the arms' mixes of like
	// requests differ, and only the per-stratum and pooled rows compare
	// like with like.
	Differs bool `json:"differs"`
}

// MixAlpha is the mix check's level: a difference of mix this unlikely
// by chance is flagged. It is strict, as A/B platforms' sample-ratio
// checks are, because it is read once per report, not once per figure.
const MixAlpha = 0.001

// Method says how the figures were made, for the reader of the JSON.
type Method struct {
	Level       float64 `json:"level"`
	Alpha       float64 `json:"alpha"`
	MinN        int     `json:"min_n"`
	Draws       int     `json:"bootstrap_draws"`
	Test        string  `json:"test"`
	Intervals   string  `json:"intervals"`
	Pooled      string  `json:"pooled"`
	Adjustment  string  `json:"adjustment"`
	ErrorRates  string  `json:"error_rates"`
	StrataBasis string  `json:"strata"`
}

// StratumAll is the stratum of a pooled entry.
const StratumAll = "all"

// Entry is one metric in one stratum (or pooled), one arm against the
// base.
type Entry struct {
	Metric string `json:"metric"`
	// Stratum is nil for the pooled entry, which marshals as "all".
	Stratum    *Stratum              `json:"-"`
	Base       string                `json:"base"`
	Arm        string                `json:"arm"`
	Arms       map[string]ArmFigures `json:"arms"`
	Difference Difference            `json:"difference"`
	// PValue is the rank test's; QValue the same adjusted for the false
	// discovery rate over every entry and error rate of the report, the
	// one the verdict is taken at. Both null with too few.
	PValue  *float64 `json:"p_value"`
	QValue  *float64 `json:"q_value"`
	Verdict Verdict  `json:"verdict"`
	// Detectable is, with no difference, the smallest change of the
	// median the data could have shown, as a fraction.
	Detectable *float64 `json:"detectable,omitempty"`
	// Sequential is the anytime-valid test's reading (--follow), on
	// pooled entries only.
	Sequential *Sequential `json:"sequential,omitempty"`
	// Values is the values behind the entry, per arm, for the report's
	// plots; not in the JSON.
	Values map[string][]float64 `json:"-"`
	result Result
}

// MarshalJSON writes the stratum as an object, or "all" when pooled.
func (e Entry) MarshalJSON() ([]byte, error) {
	type plain Entry
	var stratum any = StratumAll
	if e.Stratum != nil {
		stratum = e.Stratum
	}
	return json.Marshal(struct {
		plain
		Stratum any `json:"stratum"`
	}{plain(e), stratum})
}

// ArmFigures is one arm's count and quantiles with their intervals; the
// quantiles are null without values.
type ArmFigures struct {
	N     int       `json:"n"`
	P50   *float64  `json:"p50"`
	P50CI *Interval `json:"p50_ci"`
	P90   *float64  `json:"p90"`
	P90CI *Interval `json:"p90_ci"`
	P99   *float64  `json:"p99"`
	P99CI *Interval `json:"p99_ci"`
}

// Interval is a lower and an upper bound.
type Interval [2]float64

// Difference is the arm's quantiles over the base's, with intervals;
// null where a quantile is zero or there are too few values.
type Difference struct {
	P50Ratio   *float64  `json:"p50_ratio"`
	P50RatioCI *Interval `json:"p50_ratio_ci"`
	P90Ratio   *float64  `json:"p90_ratio"`
	P90RatioCI *Interval `json:"p90_ratio_ci"`
}

// number is v, or nil when v is not a finite number (JSON has none).
func number(v float64) *float64 {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return nil
	}
	return &v
}

// interval is [lo, hi], or nil when either is not finite.
func interval(lo, hi float64) *Interval {
	if number(lo) == nil || number(hi) == nil {
		return nil
	}
	return &Interval{lo, hi}
}

// BuildOptions are a report's settings.
type BuildOptions struct {
	// Base is the arm the others are compared against; empty, the
	// first arm read.
	Base string
	// Seed fixes the bootstrap: the same input makes the same report.
	Seed uint64
	// Sequential adds the anytime-valid test's reading to each pooled
	// entry, for a comparison looked at again as its log grows.
	Sequential bool
}

// Build compares each arm of s against the base arm, every metric within
// strata and pooled, and the error rates, with the false discovery rate
// held over all of them.
func Build(s *Samples, opts BuildOptions) Report {
	base := opts.Base
	if base == "" && len(s.Order) > 0 {
		base = s.Order[0]
	}
	rng := rand.New(rand.NewPCG(opts.Seed, 0x5eed))
	rep := Report{Base: base, Method: method}
	for _, arm := range s.Order {
		rep.Arms = append(rep.Arms, ArmTotal{arm, s.Requests[arm], s.Failed[arm], s.pace(arm)})
	}
	for _, arm := range s.Order {
		if arm == base {
			continue
		}
		rep.Errors = append(rep.Errors, CompareErrors(s.Requests[base], s.Failed[base], s.Requests[arm], s.Failed[arm]))
		rep.Errors[len(rep.Errors)-1].Arm = arm
		mix := MixPValue(s.Served[base], s.Served[arm])
		rep.Mix = append(rep.Mix, MixCheck{Arm: arm, PValue: mix, Differs: mix < MixAlpha})
		for _, metric := range Metrics {
			st := s.strata(base, arm, metric)
			if len(st.a) == 0 && len(st.b) == 0 {
				continue
			}
			entries := compareMetric(metric, base, arm, st, rng)
			if opts.Sequential {
				entries[0].Sequential = sequential(st, entries[0], s)
			}
			rep.Results = append(rep.Results, entries...)
		}
	}
	rep.adjust()
	return rep
}

// strataValues is one metric's values of two arms by stratum key, and
// the strata the keys name.
type strataValues struct {
	a, b  map[string][]float64
	names map[string]Stratum
}

func (s *Samples) strata(base, arm, metric string) strataValues {
	st := strataValues{a: map[string][]float64{}, b: map[string][]float64{}, names: map[string]Stratum{}}
	for _, side := range []struct {
		arm string
		to  map[string][]float64
	}{{base, st.a}, {arm, st.b}} {
		for stratum, v := range s.Values[side.arm][metric] {
			k := stratum.String()
			side.to[k] = v
			st.names[k] = stratum
		}
	}
	return st
}

// compareMetric is one metric's entries, pooled first.
func compareMetric(metric, base, arm string, st strataValues, rng *rand.Rand) []Entry {
	sr := CompareStrata(st.a, st.b, rng)
	pooled := Entry{Metric: metric, Base: base, Arm: arm, Values: map[string][]float64{}}
	for _, r := range sr.Strata {
		pooled.Values[base] = append(pooled.Values[base], st.a[r.Key]...)
		pooled.Values[arm] = append(pooled.Values[arm], st.b[r.Key]...)
	}
	pooled.Arms = map[string]ArmFigures{base: {N: len(pooled.Values[base])}, arm: {N: len(pooled.Values[arm])}}
	if sr.a != nil {
		pooled.Arms = map[string]ArmFigures{base: sr.a.figures(), arm: sr.b.figures()}
	}
	pooled.setResult(sr.Pooled)
	entries := []Entry{pooled}
	for _, r := range sr.Strata {
		name := st.names[r.Key]
		e := Entry{Metric: metric, Stratum: &name, Base: base, Arm: arm,
			Arms:   map[string]ArmFigures{base: figures(NewArm(st.a[r.Key])), arm: figures(NewArm(st.b[r.Key]))},
			Values: map[string][]float64{base: st.a[r.Key], arm: st.b[r.Key]}}
		e.setResult(r.Result)
		entries = append(entries, e)
	}
	return entries
}

// sequential is the anytime-valid reading of a pooled entry: each
// metric of each arm compared takes an equal share of SequentialAlpha.
// At the arms'
// paces of values (requests a second, times the share of requests that
// have the metric), the requests it still needs take MoreSeconds.
func sequential(st strataValues, pooled Entry, s *Samples) *Sequential {
	if pooled.Difference.P50Ratio == nil {
		return nil
	}
	n := min(len(pooled.Values[pooled.Base]), len(pooled.Values[pooled.Arm]))
	share := SequentialAlpha / float64(len(Metrics)*max(1, len(s.Order)-1))
	r := NewSequentialTest(st.a, st.b).Read(share, n)
	r.Verdict = oriented(pooled.Metric, r.Verdict)
	slowest := math.Inf(1)
	for _, arm := range []string{pooled.Base, pooled.Arm} {
		pace := s.pace(arm)
		if pace == nil {
			return &r
		}
		slowest = min(slowest, *pace*float64(len(pooled.Values[arm]))/float64(s.Requests[arm]))
	}
	if r.More > 0 && slowest > 0 {
		r.MoreSeconds = number(float64(r.More) / slowest)
	}
	return &r
}

// pace is arm's requests a second over its lines' span, nil under a
// second or without times.
func (s *Samples) pace(arm string) *float64 {
	span := s.Last[arm].Sub(s.First[arm]).Seconds()
	if span < 1 {
		return nil
	}
	return number(float64(s.Requests[arm]) / span)
}

// oriented is a verdict of metric's values in the words of speed: for a
// rate (tokens per second), higher values are faster.
func oriented(metric string, v Verdict) Verdict {
	if !strings.HasSuffix(metric, "_per_second") {
		return v
	}
	switch v {
	case Slower:
		return Faster
	case Faster:
		return Slower
	}
	return v
}

// setResult takes a comparison's figures into the entry.
func (e *Entry) setResult(r Result) {
	e.Verdict = oriented(e.Metric, r.Verdict)
	if r.Verdict == TooFew {
		return
	}
	e.Difference = Difference{
		P50Ratio: number(r.P50Ratio), P50RatioCI: interval(r.P50RatioLo, r.P50RatioHi),
		P90Ratio: number(r.P90Ratio), P90RatioCI: interval(r.P90RatioLo, r.P90RatioHi),
	}
	e.PValue = number(r.PValue)
	e.result = r
}

// figures is an arm's quantiles with their bootstrap intervals.
func figures(a *Arm) ArmFigures {
	f := ArmFigures{N: a.N()}
	if a.N() == 0 {
		return f
	}
	for _, q := range []struct {
		p      float64
		v      **float64
		ci     **Interval
		enough int
	}{{0.5, &f.P50, &f.P50CI, 1}, {0.9, &f.P90, &f.P90CI, 10}, {0.99, &f.P99, &f.P99CI, 100}} {
		est, lo, hi := a.QuantileCI(q.p, Level)
		*q.v = number(est)
		if a.N() >= q.enough {
			// An interval for the 99th percentile of 30 values would
			// only repeat the largest: none is given.
			*q.ci = interval(lo, hi)
		}
	}
	return f
}

// adjust holds the false discovery rate over every comparison of the
// report: each entry's and error rate's q-value, and verdicts retaken at
// it.
func (r *Report) adjust() {
	var p []float64
	for _, e := range r.Results {
		if e.PValue != nil {
			p = append(p, *e.PValue)
		}
	}
	for _, e := range r.Errors {
		if e.PValue != nil {
			p = append(p, *e.PValue)
		}
	}
	q := AdjustBH(p)
	i := 0
	for k := range r.Results {
		e := &r.Results[k]
		if e.PValue == nil {
			continue
		}
		e.QValue = number(q[i])
		res := e.result
		e.Verdict = oriented(e.Metric, decide(&res, q[i]))
		if e.Verdict == NoDifference {
			e.Detectable = number(res.Detectable)
		}
		i++
	}
	for k := range r.Errors {
		e := &r.Errors[k]
		if e.PValue == nil {
			continue
		}
		e.QValue = number(q[i])
		e.Verdict = e.decide(q[i])
		i++
	}
}

// Entry returns the pooled entry of metric for arm, if there is one.
func (r *Report) Entry(metric, arm string) (Entry, bool) {
	i := slices.IndexFunc(r.Results, func(e Entry) bool {
		return e.Metric == metric && e.Arm == arm && e.Stratum == nil
	})
	if i < 0 {
		return Entry{}, false
	}
	return r.Results[i], true
}

var method = Method{
	Level: Level, Alpha: Alpha, MinN: MinN, Draws: Draws,
	Test:        "Brunner-Munzel rank test, two-sided; a verdict needs its q-value below alpha and the median ratio's interval on one side of 1",
	Intervals:   "quantiles: exact percentile bootstrap of the order statistic; ratios: percentile bootstrap of independent draws of each arm; pooled: Woodruff's interval of the stratum-weighted distribution's quantile, and the arms' standard errors from it on the ratio's logarithm",
	Pooled:      "strata weighted by their requests in both arms: the test is the weighted Brunner-Munzel effect's z-test; the quantiles are each arm's stratum-weighted distribution's, and the ratio is theirs",
	Adjustment:  "Benjamini-Hochberg over every entry and error rate",
	ErrorRates:  "5xx or engine failure over requests; two-proportion z-test, Newcombe's hybrid score interval of the difference",
	StrataBasis: "endpoint, model, cache class, prompt and completion tokens (≤256, ≤1k, ≤4k, ≤16k, >16k); strata where an arm has fewer than min_n values are shown, not pooled",
}
