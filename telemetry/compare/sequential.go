package compare

import (
	"math"
	"slices"
	"sort"
)

// An anytime-valid test of equal medians, for a comparison read again as
// its log grows (--follow): its p-value may be looked at after every
// request and the experiment stopped at the first that decides, and the
// chance of ever deciding wrongly stays below its level. A fixed-sample
// test looked at that way decides wrongly far more often than it says.
//
// The method is Howard and Ramdas', "Sequential estimation of quantiles
// with applications to A/B-testing and best-arm identification",
// Bernoulli 28(3), 2022 (arXiv:1906.09712), section 4.2, as their
// confseq library computes it (QuantileABTest): for a value x, the count
// of an arm's values at most x, less p per value, is a sum of
// sub-Bernoulli increments when x is the arm's p-quantile, and the
// beta-binomial mixture of its exponential supermartingales (their
// Proposition 7 with g = p, h = 1 - p) is a nonnegative supermartingale.
// Under the null, both arms share a p-quantile x*, the two arms'
// supermartingales at x* multiply into one, and so does their minimum
// over every x; Ville's inequality makes the reciprocal of that minimum
// an anytime-valid p-value. Within strata, the strata's minima multiply
// again: the null is that no stratum's medians differ.

// Sequential is the anytime-valid reading of a pooled entry.
type Sequential struct {
	// PValue is anytime-valid: below Level's alpha at any look, at
	// most that often under the null, however many looks.
	PValue float64 `json:"p_value"`
	// RatioCI is the arm's median over the base's, as a confidence
	// sequence: it covers the true ratio at every look at once.
	RatioCI *Interval `json:"p50_ratio_ci"`
	Verdict Verdict   `json:"verdict"`
	// Decided says the experiment may stop: a difference found, or the
	// interval inside ±Margin (no difference that large).
	Decided bool `json:"decided"`
	// More is, undecided, the requests each arm would need at the
	// present difference and pace of narrowing, roughly; 0 when no
	// decision is in sight.
	More int `json:"more_requests"`
	// MoreSeconds is how long those requests take at the arms' paces in
	// the log; null without times in it.
	MoreSeconds *float64 `json:"more_seconds"`
}

// Settings of the sequential test.
const (
	// SequentialAlpha is the chance, over a whole experiment however
	// often it is looked at, that any metric's verdict is wrong: each
	// metric of each arm compared takes an equal share of it
	// (Bonferroni), so the guarantee holds over all of them together.
	SequentialAlpha = Alpha
	// TuneN is the requests per stratum and arm where the test's
	// boundary is tightest (the mixture's v_opt): latency experiments
	// are usually decided between some hundreds and some thousands.
	TuneN = 1000
	// Margin is the difference of medians too small to matter: an
	// interval inside [1/(1+Margin), 1+Margin] decides "no difference".
	Margin = 0.05
)

// mixture is the two-sided beta-binomial mixture supermartingale of
// Howard and Ramdas for increments in {-g, h}: here 1{value <= x} - p,
// g = p and h = 1 - p.
type mixture struct{ g, h, r, norm float64 }

func newMixture(p float64) mixture {
	g, h := p, 1-p
	vOpt := TuneN * g * h
	// rho: the two-sided normal mixture's best precision at vOpt
	// (confseq's TwoSidedNormalMixture::best_rho, with their default
	// alpha_opt of 0.05), less g h for the beta-binomial's r.
	l := math.Log(1 / 0.05)
	rho := vOpt / (2*l + math.Log(1+2*l))
	r := max(rho-g*h, 1e-3*g*h)
	return mixture{g: g, h: h, r: r, norm: lbeta(r/(g*(g+h)), r/(h*(g+h)))}
}

// logM is the log of the mixture at sum s and intrinsic time v.
func (m mixture) logM(s, v float64) float64 {
	g, h := m.g, m.h
	return -((v+h*s)/(h*(g+h)))*math.Log(g) - ((v-g*s)/(g*(g+h)))*math.Log(h) +
		lbeta((m.r+v-g*s)/(g*(g+h)), (m.r+v+h*s)/(h*(g+h))) - m.norm
}

func lbeta(a, b float64) float64 {
	la, _ := math.Lgamma(a)
	lb, _ := math.Lgamma(b)
	lab, _ := math.Lgamma(a + b)
	return la + lb - lab
}

// sequentialArm is one arm's sorted values and where, as a share of
// them at or below x, its supermartingale is least.
type sequentialArm struct {
	x     []float64
	m     mixture
	p     float64
	least float64 // the share minimising logM
}

func newSequentialArm(sorted []float64, m mixture, p float64) sequentialArm {
	a := sequentialArm{x: sorted, m: m, p: p}
	// logM is convex in s (a mixture of exponentials): a ternary search
	// finds its least value's share.
	lo, hi := 0.0, 1.0
	for range 60 {
		m1, m2 := lo+(hi-lo)/3, hi-(hi-lo)/3
		if a.at(m1) > a.at(m2) {
			lo = m1
		} else {
			hi = m2
		}
	}
	a.least = (lo + hi) / 2
	return a
}

// at is logM with a share q of the arm's values at or below x.
func (a sequentialArm) at(q float64) float64 {
	n := float64(len(a.x))
	return a.m.logM((q-a.p)*n, a.p*(1-a.p)*n)
}

// g is the arm's least logM at x, over the shares a true distribution
// with these values could have at or below x (ties make it a range).
func (a sequentialArm) g(x float64) float64 {
	n := float64(len(a.x))
	below := float64(sort.SearchFloat64s(a.x, x)) / n
	atOrBelow := float64(sort.Search(len(a.x), func(i int) bool { return a.x[i] > x })) / n
	switch {
	case a.least < below:
		return a.at(below)
	case a.least > atOrBelow:
		return a.at(atOrBelow)
	}
	return a.at(a.least)
}

// middle is the value where the arm's logM is least.
func (a sequentialArm) middle() float64 {
	i := int(math.Floor(a.least * float64(len(a.x))))
	return a.x[min(max(i, 0), len(a.x)-1)]
}

// logEvidence is the log of the least product, over x, of two arms'
// supermartingales: the evidence against their sharing the p-quantile.
// Each arm's logM falls to its least value and rises after, in x, so
// their sum is least between the two arms' least points: only the values
// there are tried.
func logEvidence(a, b sequentialArm, scale float64) float64 {
	if len(a.x) == 0 || len(b.x) == 0 {
		return 0
	}
	lo, hi := a.middle()*scale, b.middle()
	if lo > hi {
		lo, hi = hi, lo
	}
	best := math.Inf(1)
	try := func(x float64) { best = min(best, a.g(x/scale)+b.g(x)) }
	try(lo)
	try(hi)
	for _, side := range []struct {
		x     []float64
		scale float64
	}{{a.x, scale}, {b.x, 1}} {
		for i := sort.SearchFloat64s(side.x, lo/side.scale); i < len(side.x) && side.x[i]*side.scale <= hi; i++ {
			if i == 0 || side.x[i] != side.x[i-1] {
				try(side.x[i] * side.scale)
			}
		}
	}
	return best
}

// SequentialTest is the anytime-valid test of the medians of two arms'
// values in strata (by key). It keeps each stratum's values sorted.
type SequentialTest struct {
	m      mixture
	strata []sequentialStratum
}

type sequentialStratum struct{ a, b sequentialArm }

// NewSequentialTest is the test of a's medians against b's, stratum by
// stratum.
func NewSequentialTest(a, b map[string][]float64) *SequentialTest {
	t := &SequentialTest{m: newMixture(0.5)}
	for k, va := range a {
		vb := b[k]
		if len(va) == 0 || len(vb) == 0 {
			continue // a stratum one arm has not served says nothing
		}
		sa, sb := slices.Clone(va), slices.Clone(vb)
		slices.Sort(sa)
		slices.Sort(sb)
		t.strata = append(t.strata, sequentialStratum{newSequentialArm(sa, t.m, 0.5), newSequentialArm(sb, t.m, 0.5)})
	}
	return t
}

// logEvidence is the strata's evidence multiplied, with a's values
// scaled: against b's medians being scale times a's.
func (t *SequentialTest) logEvidence(scale float64) float64 {
	var sum float64
	for _, s := range t.strata {
		sum += logEvidence(s.a, s.b, scale)
	}
	return sum
}

// commonRatio is the strata's medians' ratios, b's over a's, as one:
// their geometric mean weighted by the strata's values. Where one ratio
// fits every stratum, it is near it; the confidence sequence is sought
// either side of it.
func (t *SequentialTest) commonRatio() float64 {
	var sum, weight float64
	for _, s := range t.strata {
		w := float64(len(s.a.x) + len(s.b.x))
		sum += w * math.Log(s.b.x[len(s.b.x)/2]/s.a.x[len(s.a.x)/2])
		weight += w
	}
	if weight == 0 || math.IsNaN(sum) || math.IsInf(sum, 0) {
		return 1
	}
	return math.Exp(sum / weight)
}

// PValue is the anytime-valid p-value of equal medians in every stratum.
func (t *SequentialTest) PValue() float64 { return min(1, math.Exp(-t.logEvidence(1))) }

// searchSpan is how far either side of the estimate the confidence
// sequence is sought: a ratio past a hundredfold says nothing yet.
const searchSpan = 100

// RatioCI is the confidence sequence of b's medians over a's at level
// 1 - alpha: the ratios the test at alpha does not reject, found by
// bisection either side of estimate (the ratio it is least against).
func (t *SequentialTest) RatioCI(estimate, alpha float64) (lo, hi float64, ok bool) {
	limit := math.Log(1 / alpha)
	if t.logEvidence(estimate) >= limit {
		return 0, 0, false
	}
	bound := func(far float64) float64 {
		in, out := math.Log(estimate), math.Log(far)
		if t.logEvidence(far) < limit {
			return far
		}
		for range 40 {
			mid := (in + out) / 2
			if t.logEvidence(math.Exp(mid)) < limit {
				in = mid
			} else {
				out = mid
			}
		}
		return math.Exp(in)
	}
	return bound(estimate / searchSpan), bound(estimate * searchSpan), true
}

// Read is the test's reading at level alpha, n the requests per arm so
// far.
func (t *SequentialTest) Read(alpha float64, n int) Sequential {
	estimate := t.commonRatio()
	s := Sequential{PValue: t.PValue(), Verdict: NoDifference}
	lo, hi, ok := t.RatioCI(estimate, alpha)
	switch {
	case len(t.strata) == 0:
		return s
	case !ok && s.PValue < alpha:
		// No one ratio fits every stratum (they differ each their own
		// way), yet the medians differ: the way the strata's weighted
		// ratio goes.
		s.Verdict, s.Decided = Faster, true
		if estimate > 1 {
			s.Verdict = Slower
		}
		return s
	case !ok:
		return s
	}
	if lo <= estimate/searchSpan*(1+1e-9) || hi >= estimate*searchSpan*(1-1e-9) {
		return s // wider than the search: no interval to show yet
	}
	s.RatioCI = &Interval{lo, hi}
	switch {
	case lo > 1:
		s.Verdict, s.Decided = Slower, true
	case hi < 1:
		s.Verdict, s.Decided = Faster, true
	case lo >= 1/(1+Margin) && hi <= 1+Margin:
		s.Decided = true
	default:
		s.More = more(estimate, lo, hi, n)
	}
	return s
}

// more is roughly the requests each arm needs, from n, for an interval
// [lo, hi] about estimate to decide: to leave 1 behind, or to fit inside
// the margin, whichever comes first, as the interval narrows as one over
// the square root of n. 0 when neither is in sight (ten times as many).
func more(estimate, lo, hi float64, n int) int {
	half := (math.Log(hi) - math.Log(lo)) / 2
	need := math.Inf(1)
	if d := math.Abs(math.Log(estimate)); d > 0 {
		need = float64(n) * (half / d) * (half / d)
	}
	if room := math.Log(1+Margin) - math.Abs(math.Log(estimate)); room > 0 {
		need = min(need, float64(n)*(half/room)*(half/room))
	}
	if need > 10*float64(n) {
		return 0
	}
	return max(0, int(math.Ceil(need))-n)
}
