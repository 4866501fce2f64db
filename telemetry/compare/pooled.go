package compare

import (
	"math"
	"slices"
	"sort"

	"gonum.org/v1/gonum/stat/distuv"
)

// The pooled row compares like with like by direct standardization: each
// arm's distribution with every stratum weighted alike in both arms (by
// its requests in both), so that the arms' quantiles describe the same
// mix of requests, and their ratio is the ratio of those quantiles. The
// intervals are Woodruff's ("Confidence intervals for medians and other
// position measures", JASA 47, 1952), the survey statistician's interval
// for a quantile of a stratified sample: the weighted distribution's
// standard error at the quantile, carried back through the quantile
// function. Its width gives the quantile's standard error (Woodruff's
// variance estimate), and the ratio's interval is the arms' independent
// errors on the logarithm.

// standardDist is one arm's stratum-weighted distribution.
type standardDist struct {
	x, cum []float64 // values sorted, and the weight at or below each
	strata []standardStratum
	n      int
}

type standardStratum struct {
	x      []float64 // sorted
	weight float64
}

// quantileEstimate is a quantile with its interval and standard error.
type quantileEstimate struct{ q, lo, hi, se float64 }

// newStandardDist weighs each stratum's sorted values by its weight,
// the weights summing to 1.
func newStandardDist(strata []standardStratum) *standardDist {
	d := &standardDist{strata: strata}
	type point struct{ x, w float64 }
	var pts []point
	for _, s := range strata {
		d.n += len(s.x)
		for _, x := range s.x {
			pts = append(pts, point{x, s.weight / float64(len(s.x))})
		}
	}
	slices.SortFunc(pts, func(a, b point) int { return cmpFloat(a.x, b.x) })
	acc := 0.0
	for _, p := range pts {
		acc += p.w
		d.x, d.cum = append(d.x, p.x), append(d.cum, acc)
	}
	return d
}

// quantile is the least value at or above a share p of the weight.
func (d *standardDist) quantile(p float64) float64 {
	p = min(max(p, 0), 1)
	i := sort.SearchFloat64s(d.cum, p*d.cum[len(d.cum)-1]-1e-12)
	return d.x[min(i, len(d.x)-1)]
}

// estimate is the p-quantile with Woodruff's interval at Level.
func (d *standardDist) estimate(p float64) quantileEstimate {
	z := distuv.UnitNormal.Quantile(1 - (1-Level)/2)
	q := d.quantile(p)
	var variance float64
	for _, s := range d.strata {
		n := float64(len(s.x))
		below := float64(sort.Search(len(s.x), func(j int) bool { return s.x[j] > q })) / n
		variance += s.weight * s.weight * below * (1 - below) / n
	}
	se := math.Sqrt(variance)
	lo, hi := d.quantile(p-z*se), d.quantile(p+z*se)
	return quantileEstimate{q: q, lo: lo, hi: hi, se: (hi - lo) / (2 * z)}
}

// figures is the arm's pooled row: the standardized quantiles.
func (d *standardDist) figures() ArmFigures {
	f := ArmFigures{N: d.n}
	if d.n == 0 {
		return f
	}
	for _, q := range []struct {
		p  float64
		v  **float64
		ci **Interval
	}{{0.5, &f.P50, &f.P50CI}, {0.9, &f.P90, &f.P90CI}, {0.99, &f.P99, &f.P99CI}} {
		e := d.estimate(q.p)
		*q.v, *q.ci = number(e.q), interval(e.lo, e.hi)
	}
	return f
}

// standardizedRatio is b's standardized p-quantile over a's, and its
// interval at Level from the arms' standard errors on the logarithm.
func standardizedRatio(a, b *standardDist, p float64) (ratio, lo, hi float64) {
	ea, eb := a.estimate(p), b.estimate(p)
	ratio = eb.q / ea.q
	z := distuv.UnitNormal.Quantile(1 - (1-Level)/2)
	spread := z * math.Hypot(ea.se/ea.q, eb.se/eb.q)
	return ratio, ratio * math.Exp(-spread), ratio * math.Exp(spread)
}

func cmpFloat(a, b float64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}
