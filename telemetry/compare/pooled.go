package compare

import (
	"math"
	"slices"
	"sort"

	"gonum.org/v1/gonum/stat/distuv"
)

// weighted is one stratum's values of both arms and its weight in the
// pooled result.
type weighted struct {
	a, b   []float64
	weight float64
}

// standardized is an arm's pooled figures: the quantiles of its
// distribution with each stratum weighted as in the pooled comparison,
// so that both arms' figures describe the same mix of requests. The
// intervals are Woodruff's ("Confidence intervals for medians and other
// position measures", JASA 47, 1952), the survey statistician's interval
// for a quantile of a stratified sample: the weighted distribution's
// standard error at the quantile, carried back through the quantile
// function.
func standardized(strata []weighted, side func(weighted) []float64) ArmFigures {
	type point struct{ x, w float64 }
	var pts []point
	var sorted [][]float64
	f := ArmFigures{}
	for _, s := range strata {
		v := slices.Clone(side(s))
		slices.Sort(v)
		sorted = append(sorted, v)
		f.N += len(v)
		for _, x := range v {
			pts = append(pts, point{x, s.weight / float64(len(v))})
		}
	}
	if len(pts) == 0 {
		return f
	}
	slices.SortFunc(pts, func(a, b point) int { return cmpFloat(a.x, b.x) })
	cum := make([]float64, len(pts))
	acc := 0.0
	for i, p := range pts {
		acc += p.w
		cum[i] = acc
	}
	quantile := func(p float64) float64 {
		p = min(max(p, 0), 1)
		i := sort.SearchFloat64s(cum, p*acc-1e-12)
		return pts[min(i, len(pts)-1)].x
	}
	z := distuv.UnitNormal.Quantile(1 - (1-Level)/2)
	for _, q := range []struct {
		p  float64
		v  **float64
		ci **Interval
	}{{0.5, &f.P50, &f.P50CI}, {0.9, &f.P90, &f.P90CI}, {0.99, &f.P99, &f.P99CI}} {
		x := quantile(q.p)
		*q.v = number(x)
		var variance float64
		for i, s := range strata {
			n := float64(len(sorted[i]))
			below := float64(sort.Search(len(sorted[i]), func(j int) bool { return sorted[i][j] > x })) / n
			w := s.weight / acc
			variance += w * w * below * (1 - below) / n
		}
		se := math.Sqrt(variance)
		*q.ci = interval(quantile(q.p-z*se), quantile(q.p+z*se))
	}
	return f
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
