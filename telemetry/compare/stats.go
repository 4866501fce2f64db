// Package compare judges whether one arm of live traffic is slower than
// another on a latency figure: each arm's quantiles with their intervals,
// the ratio of the arms' quantiles with its interval, a rank test, and a
// verdict. It is the statistics of `timing-sidecar compare`; what reads
// the access log and stratifies requests like with like builds on it.
//
// The distributions come from gonum (stat, distuv); what gonum does not
// have (the Brunner-Munzel test, the bootstrap of an order statistic) is
// written here from its source, cited where it is.
package compare

import (
	"math"
	"math/rand/v2"
	"slices"
	"sort"

	"gonum.org/v1/gonum/stat"
	"gonum.org/v1/gonum/stat/distuv"
)

// Arm is one arm's values of a figure, sorted.
type Arm struct {
	x []float64
	// tails[p] is, for the p-quantile, the bootstrap probability that
	// the resampled quantile is at most x[j] (orderTail).
	tails map[float64][]float64
}

// NewArm sorts a copy of values.
func NewArm(values []float64) *Arm {
	x := slices.Clone(values)
	slices.Sort(x)
	return &Arm{x: x, tails: map[float64][]float64{}}
}

// N is the arm's count.
func (a *Arm) N() int { return len(a.x) }

// Quantile is the arm's p-quantile: the least value at or above a
// fraction p of the values (gonum's Empirical).
func (a *Arm) Quantile(p float64) float64 { return stat.Quantile(p, stat.Empirical, a.x, nil) }

// rank is the 1-based order statistic the Empirical p-quantile of n
// values is.
func rank(p float64, n int) int { return max(1, int(math.Ceil(p*float64(n)-1e-9))) }

// orderTail is the bootstrap distribution of the arm's p-quantile,
// exactly rather than by resampling: a resample's m-th smallest value is
// at most x[j] when at least m of its n draws are, and the number of draws
// at most x[j] is Binomial(n, (j+1)/n). tail[j] is that probability
// (Efron 1979, §3; it is the basis of the distribution-free interval for
// a quantile).
func (a *Arm) orderTail(p float64) []float64 {
	if t, ok := a.tails[p]; ok {
		return t
	}
	n := len(a.x)
	m := float64(rank(p, n))
	t := make([]float64, n)
	for j := range t {
		t[j] = distuv.Binomial{N: float64(n), P: float64(j+1) / float64(n)}.Survival(m - 1)
	}
	t[n-1] = 1
	a.tails[p] = t
	return t
}

// draw is a bootstrap draw of the arm's p-quantile, from u in [0, 1).
func (a *Arm) draw(p, u float64) float64 {
	t := a.orderTail(p)
	return a.x[min(sort.SearchFloat64s(t, u), len(t)-1)]
}

// QuantileCI is the arm's p-quantile and its percentile-bootstrap
// interval at level (0.95: 95%), computed exactly from orderTail.
func (a *Arm) QuantileCI(p, level float64) (est, lo, hi float64) {
	alpha := (1 - level) / 2
	return a.Quantile(p), a.draw(p, alpha), a.draw(p, 1-alpha)
}

// RatioCI is b's p-quantile over a's and its percentile-bootstrap
// interval at level, from draws resamples of each arm, independent.
func RatioCI(a, b *Arm, p, level float64, draws int, rng *rand.Rand) (ratio, lo, hi float64) {
	r := make([]float64, draws)
	for i := range r {
		r[i] = b.draw(p, rng.Float64()) / a.draw(p, rng.Float64())
	}
	slices.Sort(r)
	alpha := (1 - level) / 2
	return b.Quantile(p) / a.Quantile(p), stat.Quantile(alpha, stat.Empirical, r, nil), stat.Quantile(1-alpha, stat.Empirical, r, nil)
}

// BrunnerMunzel tests whether values of b tend to exceed values of a, or
// the reverse, without assuming equal shapes or variances (Brunner and
// Munzel, "The nonparametric Behrens-Fisher problem", Biometrical
// Journal 42(1), 2000; the form of SciPy's stats.brunnermunzel). It
// returns the estimated P(a < b) + P(a = b)/2, the statistic, and the
// two-sided p-value from Student's t with the Satterthwaite degrees of
// freedom. Ties take midranks. Arms of identical values give p 1; arms
// whose values do not overlap, p 0.
func BrunnerMunzel(a, b *Arm) (effect, w, pValue float64) {
	nx, ny := float64(a.N()), float64(b.N())
	all := append(slices.Clone(a.x), b.x...)
	rc := midranks(all)
	rx, ry := midranks(a.x), midranks(b.x)
	rcx, rcy := rc[:a.N()], rc[a.N():]
	mx, my := stat.Mean(rcx, nil), stat.Mean(rcy, nil)
	var sx, sy float64
	for i := range rcx {
		d := rcx[i] - rx[i] - mx + (nx+1)/2
		sx += d * d
	}
	for i := range rcy {
		d := rcy[i] - ry[i] - my + (ny+1)/2
		sy += d * d
	}
	sx /= nx - 1
	sy /= ny - 1
	effect = (my - (ny+1)/2) / nx
	v := nx*sx + ny*sy
	if v == 0 {
		// No spread within either arm's ranks: every value of one arm
		// is on one side of every value of the other (complete
		// separation, the statistic infinite and p 0, as SciPy gives),
		// or all are one value (p 1).
		if effect == 0.5 {
			return effect, 0, 1
		}
		return effect, math.Copysign(math.Inf(1), effect-0.5), 0
	}
	w = nx * ny * (my - mx) / ((nx + ny) * math.Sqrt(v))
	df := v * v / ((nx*sx)*(nx*sx)/(nx-1) + (ny*sy)*(ny*sy)/(ny-1))
	t := distuv.StudentsT{Mu: 0, Sigma: 1, Nu: df}
	return effect, w, 2 * math.Min(t.CDF(w), t.Survival(w))
}

// midranks is the 1-based ranks of sorted values, ties given their mean
// rank.
func midranks(x []float64) []float64 {
	idx := make([]int, len(x))
	for i := range idx {
		idx[i] = i
	}
	sort.SliceStable(idx, func(i, j int) bool { return x[idx[i]] < x[idx[j]] })
	r := make([]float64, len(x))
	for i := 0; i < len(idx); {
		j := i
		for j+1 < len(idx) && x[idx[j+1]] == x[idx[i]] {
			j++
		}
		for k := i; k <= j; k++ {
			r[idx[k]] = float64(i+j)/2 + 1
		}
		i = j + 1
	}
	return r
}
