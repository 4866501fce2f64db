package compare

import (
	"maps"
	"math"
	"math/rand/v2"
	"slices"

	"gonum.org/v1/gonum/stat"
	"gonum.org/v1/gonum/stat/distuv"
)

// Like with like: an arm that served more prompt-cache hits, or shorter
// prompts, looks faster while being no faster on like requests. Requests
// are compared within strata (a key such as cache class, prompt-length
// bucket, model), and the strata's results pooled with weights: each
// stratum's Brunner-Munzel effect, weighted by its share of the requests
// both arms have in comparable strata, and the same weights on the
// logarithm of each stratum's median ratio.

// StratumResult is one stratum's comparison.
type StratumResult struct {
	Key    string
	NA, NB int
	Result
}

// Stratified is a comparison within strata, and pooled over them.
type Stratified struct {
	// Pooled is the strata's results weighted by their requests: its
	// effect the strata's weighted, its ratios those of the arms'
	// standardized quantiles (pooled.go).
	Pooled Result
	Strata []StratumResult
	// MixPValue is the chi-square test's p-value that both arms drew
	// their requests from the strata in the same proportions: small
	// when the arms' mixes differ, the confounding pooling corrects.
	MixPValue float64
	// a and b are the arms' standardized distributions, nil when no
	// stratum is pooled.
	a, b *standardDist
}

// CompareStrata compares arm b against arm a within each stratum of
// values (by key), and pooled. Strata where an arm has fewer than MinN
// values are reported too few and left out of the pooled result.
func CompareStrata(a, b map[string][]float64, rng *rand.Rand) Stratified {
	keys := slices.Sorted(maps.Keys(a))
	for k := range b {
		if _, ok := a[k]; !ok {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	var out Stratified
	out.MixPValue = MixPValue(counts(a), counts(b))
	var us []used
	total := 0.0
	for _, k := range keys {
		armA, armB := NewArm(a[k]), NewArm(b[k])
		r := Compare(armA, armB, rng)
		out.Strata = append(out.Strata, StratumResult{Key: k, NA: armA.N(), NB: armB.N(), Result: r})
		if r.Verdict != TooFew {
			us = append(us, used{armA, armB, float64(armA.N() + armB.N())})
			total += float64(armA.N() + armB.N())
		}
	}
	if len(us) == 0 {
		out.Pooled = Result{Verdict: TooFew}
		return out
	}
	var effect, variance float64
	for _, u := range us {
		w := u.weight / total
		e, se := effectSE(u.a, u.b)
		effect += w * e
		variance += w * w * se * se
	}
	p := &out.Pooled
	p.Effect = effect
	var sa, sb []standardStratum
	for _, u := range us {
		sa = append(sa, standardStratum{u.a.x, u.weight / total})
		sb = append(sb, standardStratum{u.b.x, u.weight / total})
	}
	out.a, out.b = newStandardDist(sa), newStandardDist(sb)
	p.P50Ratio, p.P50RatioLo, p.P50RatioHi = standardizedRatio(out.a, out.b, 0.5)
	p.P90Ratio, p.P90RatioLo, p.P90RatioHi = standardizedRatio(out.a, out.b, 0.9)
	switch {
	case variance > 0:
		z := (effect - 0.5) / math.Sqrt(variance)
		p.PValue = 2 * distuv.UnitNormal.Survival(math.Abs(z))
	case effect != 0.5:
		p.PValue = 0 // every stratum's arms separated, one way
	default:
		p.PValue = 1
	}
	p.Verdict = decide(p, p.PValue)
	return out
}

// used is a stratum in the pooled result, with its requests as weight.
type used struct {
	a, b   *Arm
	weight float64
}

// effectSE is the Brunner-Munzel effect of b against a and its standard
// error: the statistic is (effect − ½) over it.
func effectSE(a, b *Arm) (effect, se float64) {
	effect, w, _ := BrunnerMunzel(a, b)
	if w == 0 {
		return effect, 0
	}
	return effect, (effect - 0.5) / w
}

func counts(values map[string][]float64) map[string]int {
	c := make(map[string]int, len(values))
	for k, v := range values {
		c[k] = len(v)
	}
	return c
}

// MixPValue is the chi-square test of two arms' requests over strata
// (counts by key) against the counts were both arms to draw from the
// strata alike.
func MixPValue(a, b map[string]int) float64 {
	keys := slices.Sorted(maps.Keys(a))
	for k := range b {
		if _, ok := a[k]; !ok {
			keys = append(keys, k)
		}
	}
	if len(keys) < 2 {
		return 1
	}
	var na, nb float64
	for _, k := range keys {
		na += float64(a[k])
		nb += float64(b[k])
	}
	if na == 0 || nb == 0 {
		return 1
	}
	var obs, exp []float64
	for _, k := range keys {
		row := float64(a[k] + b[k])
		obs = append(obs, float64(a[k]), float64(b[k]))
		exp = append(exp, row*na/(na+nb), row*nb/(na+nb))
	}
	chi := stat.ChiSquare(obs, exp)
	return distuv.ChiSquared{K: float64(len(keys) - 1)}.Survival(chi)
}
