package compare

import (
	"math"

	"gonum.org/v1/gonum/stat/distuv"
)

// Verdicts of an error rate.
const (
	MoreFailures  Verdict = "more failures"
	FewerFailures Verdict = "fewer failures"
)

// ErrorComparison is an arm's error rate against the base's: failed
// requests are compared as a rate, never dropped from the comparison.
type ErrorComparison struct {
	Arm        string   `json:"arm"`
	BaseRate   float64  `json:"base_rate"`
	BaseRateCI Interval `json:"base_rate_ci"`
	Rate       float64  `json:"rate"`
	RateCI     Interval `json:"rate_ci"`
	// Difference is the arm's rate less the base's, with its interval.
	Difference   float64  `json:"difference"`
	DifferenceCI Interval `json:"difference_ci"`
	PValue       *float64 `json:"p_value"`
	QValue       *float64 `json:"q_value"`
	Verdict      Verdict  `json:"verdict"`
}

// CompareErrors compares b's failures among its requests with a's: each
// rate with Wilson's score interval, the difference with Newcombe's
// hybrid score interval ("Interval estimation for the difference between
// independent proportions", Statistics in Medicine 17, 1998, method 10),
// and the two-proportion z-test's p-value. A rate of no failures in
// either arm has p 1.
func CompareErrors(na, fa, nb, fb int) ErrorComparison {
	if na < MinN || nb < MinN {
		return ErrorComparison{Verdict: TooFew}
	}
	z := distuv.UnitNormal.Quantile(1 - (1-Level)/2)
	pa, pb := float64(fa)/float64(na), float64(fb)/float64(nb)
	la, ua := wilson(fa, na, z)
	lb, ub := wilson(fb, nb, z)
	d := pb - pa
	e := ErrorComparison{
		BaseRate: pa, BaseRateCI: Interval{la, ua}, Rate: pb, RateCI: Interval{lb, ub}, Difference: d,
		DifferenceCI: Interval{
			d - math.Sqrt((pb-lb)*(pb-lb)+(ua-pa)*(ua-pa)),
			d + math.Sqrt((ub-pb)*(ub-pb)+(pa-la)*(pa-la)),
		},
	}
	pooled := float64(fa+fb) / float64(na+nb)
	p := 1.0
	if se := math.Sqrt(pooled * (1 - pooled) * (1/float64(na) + 1/float64(nb))); se > 0 {
		p = 2 * distuv.UnitNormal.Survival(math.Abs(d)/se)
	}
	e.PValue = &p
	e.Verdict = e.decide(p)
	return e
}

// decide is the verdict at p-value p: a difference only where the test
// finds one and the difference's interval excludes 0.
func (e *ErrorComparison) decide(p float64) Verdict {
	switch {
	case p < Alpha && e.DifferenceCI[0] > 0:
		return MoreFailures
	case p < Alpha && e.DifferenceCI[1] < 0:
		return FewerFailures
	}
	return NoDifference
}

// wilson is the Wilson score interval of k successes in n at z.
func wilson(k, n int, z float64) (lo, hi float64) {
	p, nf := float64(k)/float64(n), float64(n)
	centre := (p + z*z/(2*nf)) / (1 + z*z/nf)
	half := z / (1 + z*z/nf) * math.Sqrt(p*(1-p)/nf+z*z/(4*nf*nf))
	return max(0, centre-half), min(1, centre+half)
}
