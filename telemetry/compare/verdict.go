package compare

import "math/rand/v2"

// Verdict is what a comparison concludes of arm b against arm a.
type Verdict string

const (
	Slower       Verdict = "slower"        // b's values tend to exceed a's
	Faster       Verdict = "faster"        // b's values tend to fall below a's
	NoDifference Verdict = "no difference" // none found that the data could detect
	TooFew       Verdict = "too few"       // an arm has fewer than MinN values
)

// Settings of a comparison.
const (
	// MinN is the fewest values an arm needs for a verdict.
	MinN = 20
	// Alpha is the rank test's level: the false-positive rate of a
	// verdict of one comparison.
	Alpha = 0.05
	// Level is the intervals' coverage.
	Level = 0.95
	// Draws is the bootstrap resamples behind a ratio's interval.
	Draws = 2000
)

// Result is one comparison of a figure between arms a and b.
type Result struct {
	Verdict Verdict
	// Effect is P(a < b) + P(a = b)/2: 0.5 when neither tends higher.
	Effect, PValue float64
	// P50Ratio is b's median over a's, with its interval; P90Ratio the
	// same of the 90th percentiles.
	P50Ratio, P50RatioLo, P50RatioHi float64
	P90Ratio, P90RatioLo, P90RatioHi float64
	// Detectable is, with no difference found, the smallest change of
	// the median the data could have shown: the interval's farther
	// bound from 1, as a fraction.
	Detectable float64
}

// Compare judges arm b against arm a. It says slower (or faster) only
// when both the Brunner-Munzel test finds b's values tend higher (lower)
// at Alpha and the median ratio's interval lies above (below) 1: a
// distribution shifted, and its median with it. Either alone would be
// wrong at its own rate; both together are wrong less often than either
// (TestSameArmsSayNoDifference measures it). rng draws the bootstrap.
func Compare(a, b *Arm, rng *rand.Rand) Result {
	if a.N() < MinN || b.N() < MinN {
		return Result{Verdict: TooFew}
	}
	var r Result
	r.Effect, _, r.PValue = BrunnerMunzel(a, b)
	r.P50Ratio, r.P50RatioLo, r.P50RatioHi = RatioCI(a, b, 0.5, Level, Draws, rng)
	r.P90Ratio, r.P90RatioLo, r.P90RatioHi = RatioCI(a, b, 0.9, Level, Draws, rng)
	r.Verdict = decide(&r, r.PValue)
	return r
}

// decide is r's verdict from its test's p-value p (r's own, or as
// adjusted for many comparisons) and its interval, setting Detectable
// when it finds no difference.
func decide(r *Result, p float64) Verdict {
	r.Detectable = 0
	switch {
	case p < Alpha && r.Effect > 0.5 && r.P50RatioLo > 1:
		return Slower
	case p < Alpha && r.Effect < 0.5 && r.P50RatioHi < 1:
		return Faster
	}
	r.Detectable = max(r.P50RatioHi-1, 1-r.P50RatioLo)
	return NoDifference
}
