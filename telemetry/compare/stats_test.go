package compare

import (
	"math"
	"math/rand/v2"
	"testing"

	"gonum.org/v1/gonum/stat/distuv"
)

// TestBrunnerMunzelAsPublished: the pain scores in SciPy's documentation
// of stats.brunnermunzel, from Brunner and Munzel's paper, give its
// statistic and p-value.
func TestBrunnerMunzelAsPublished(t *testing.T) {
	a := NewArm([]float64{1, 2, 1, 1, 1, 1, 1, 1, 1, 1, 2, 4, 1, 1})
	b := NewArm([]float64{3, 3, 4, 3, 1, 2, 3, 1, 1, 5, 4})
	_, w, p := BrunnerMunzel(a, b)
	if math.Abs(w-3.1374674823029505) > 1e-9 || math.Abs(p-0.0057862086661515377) > 1e-9 {
		t.Errorf("w %v p %v; SciPy gives 3.1374674823029505 and 0.0057862086661515377", w, p)
	}
}

// TestBrunnerMunzelSeparated: arms whose values do not overlap differ
// beyond doubt (p 0, as SciPy says); arms of one value do not (p 1).
func TestBrunnerMunzelSeparated(t *testing.T) {
	low, high := make([]float64, 30), make([]float64, 30)
	for i := range low {
		low[i], high[i] = 40+float64(i)/10, 60+float64(i)/10
	}
	if e, _, p := BrunnerMunzel(NewArm(low), NewArm(high)); e != 1 || p != 0 {
		t.Errorf("separated: effect %v p %v", e, p)
	}
	if r := Compare(NewArm(low), NewArm(high), rand.New(rand.NewPCG(1, 1))); r.Verdict != Slower {
		t.Errorf("separated: %q", r.Verdict)
	}
	same := []float64{5, 5, 5, 5}
	if e, _, p := BrunnerMunzel(NewArm(same), NewArm(same)); e != 0.5 || p != 1 {
		t.Errorf("one value: effect %v p %v", e, p)
	}
}

// ttft draws n TTFT-like values in ms: log-normal around median ms.
func ttft(rng *rand.Rand, n int, median float64) []float64 {
	d := distuv.LogNormal{Mu: math.Log(median), Sigma: 0.5, Src: rng}
	out := make([]float64, n)
	for i := range out {
		out[i] = d.Rand()
	}
	return out
}

// TestQuantileIntervalsCover: over 400 seeds, the 95% interval of a
// median and of a p90 holds the true value in at least 92% of them (the
// exact order-statistic bootstrap is conservative: measured, not assumed).
func TestQuantileIntervalsCover(t *testing.T) {
	truth := map[float64]float64{0.5: 100, 0.9: 100 * math.Exp(0.5*1.2815515655446004)}
	for _, p := range []float64{0.5, 0.9} {
		held := 0
		const seeds = 400
		for seed := range seeds {
			a := NewArm(ttft(rand.New(rand.NewPCG(uint64(seed), 1)), 300, 100))
			_, lo, hi := a.QuantileCI(p, Level)
			if lo <= truth[p] && truth[p] <= hi {
				held++
			}
		}
		rate := float64(held) / seeds
		t.Logf("p%v: the interval held the truth in %.1f%% of %d seeds", p*100, 100*rate, seeds)
		if rate < 0.92 {
			t.Errorf("p%v interval covers %.1f%%, want at least 92%%", p*100, 100*rate)
		}
	}
}

// TestSameArmsSayNoDifference: two arms from one distribution (A/A) say
// "no difference" in at least 95% of 1,000 seeds.
func TestSameArmsSayNoDifference(t *testing.T) {
	const seeds = 1000
	same := 0
	for seed := range seeds {
		rng := rand.New(rand.NewPCG(uint64(seed), 2))
		r := Compare(NewArm(ttft(rng, 500, 100)), NewArm(ttft(rng, 500, 100)), rng)
		if r.Verdict == NoDifference {
			same++
		}
	}
	rate := float64(same) / seeds
	t.Logf("A/A: %d of %d seeds say no difference (%.1f%%)", same, seeds, 100*rate)
	if rate < 0.95 {
		t.Errorf("A/A said no difference in %.1f%% of seeds, want at least 95%%", 100*rate)
	}
}

// TestATenPercentShiftIsFound: b's TTFT 10% higher at 2,000 requests an
// arm is found slower in at least 95% of 50 seeds, with the median ratio's
// interval around 1.10.
func TestATenPercentShiftIsFound(t *testing.T) {
	const seeds = 50
	found, covered := 0, 0
	for seed := range seeds {
		rng := rand.New(rand.NewPCG(uint64(seed), 3))
		r := Compare(NewArm(ttft(rng, 2000, 100)), NewArm(ttft(rng, 2000, 110)), rng)
		if r.Verdict == Slower {
			found++
		}
		if r.P50RatioLo <= 1.1 && 1.1 <= r.P50RatioHi {
			covered++
		}
	}
	t.Logf("+10%%: slower in %d of %d seeds; the ratio's interval held 1.10 in %d", found, seeds, covered)
	if found < seeds*95/100 || covered < seeds*90/100 {
		t.Errorf("+10%%: slower in %d of %d seeds, ratio interval held 1.10 in %d", found, seeds, covered)
	}
}

// TestTooFew: an arm under MinN gets no verdict.
func TestTooFew(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 4))
	if r := Compare(NewArm(ttft(rng, MinN-1, 100)), NewArm(ttft(rng, 500, 100)), rng); r.Verdict != TooFew {
		t.Errorf("verdict %q with %d values", r.Verdict, MinN-1)
	}
}

// confounded draws two arms over two strata, cache hits ("full", 20 ms)
// and misses ("none", 100 ms), alike within each: arm a serves 20% hits,
// arm b 60%.
func confounded(rng *rand.Rand, n int) (a, b map[string][]float64) {
	a, b = map[string][]float64{}, map[string][]float64{}
	for _, arm := range []struct {
		m    map[string][]float64
		hits int
	}{{a, n / 5}, {b, n * 3 / 5}} {
		arm.m["full"] = ttft(rng, arm.hits, 20)
		arm.m["none"] = ttft(rng, n-arm.hits, 100)
	}
	return a, b
}

// TestLikeWithLike: arms alike on like requests, one of which served
// more cache hits, are "faster" to a naive pooled comparison and "no
// difference" within strata; the mix check flags the difference of mix.
func TestLikeWithLike(t *testing.T) {
	const seeds = 50
	naive, strat, flagged := 0, 0, 0
	for seed := range seeds {
		rng := rand.New(rand.NewPCG(uint64(seed), 5))
		a, b := confounded(rng, 1000)
		if r := Compare(NewArm(append(a["full"], a["none"]...)), NewArm(append(b["full"], b["none"]...)), rng); r.Verdict == Faster {
			naive++
		}
		s := CompareStrata(a, b, rng)
		if s.Pooled.Verdict == NoDifference {
			strat++
		}
		if s.MixPValue < 0.001 {
			flagged++
		}
	}
	t.Logf("of %d confounded pairs: naive says faster %d, within strata no difference %d, mix flagged %d", seeds, naive, strat, flagged)
	if naive < seeds || strat < seeds*90/100 || flagged < seeds {
		t.Errorf("naive faster %d, stratified no difference %d, mix flagged %d, of %d", naive, strat, flagged, seeds)
	}
}

// TestStrataFindAShift: a 10% shift within every stratum, at 2,000
// requests an arm, is found pooled in at least 45 of 50 seeds, and A/A
// within strata says no difference in at least 95% of 400 seeds. The
// pooled median of a mix of cache hits (20 ms) and misses (100 ms) lies
// in the misses' lower tail, where values are sparse: its interval is
// wider than one stratum's, the price of a pooled ratio that is the
// ratio of the quantiles shown.
func TestStrataFindAShift(t *testing.T) {
	const seeds = 400
	same, found := 0, 0
	for seed := range seeds {
		rng := rand.New(rand.NewPCG(uint64(seed), 6))
		a, b := confounded(rng, 1000)
		if CompareStrata(a, b, rng).Pooled.Verdict == NoDifference {
			same++
		}
		if seed < 50 {
			// At 2,000 requests an arm.
			a, b = confounded(rng, 2000)
			b["full"], b["none"] = ttft(rng, 1200, 22), ttft(rng, 800, 110)
			if CompareStrata(a, b, rng).Pooled.Verdict == Slower {
				found++
			}
		}
	}
	t.Logf("within strata: A/A no difference in %d of %d; +10%% found slower in %d of 50", same, seeds, found)
	if same < seeds*95/100 || found < 45 {
		t.Errorf("A/A no difference %d of %d; +10%% slower %d of 50", same, seeds, found)
	}
}

// TestPooledRatioIntervalsCover: with b's values 1.1 times a's in every
// stratum, b's standardized quantiles are 1.1 times a's, whatever the
// mix: the pooled p50 and p90 ratios' 95% intervals hold 1.1 in at least
// 93% of 400 seeds.
func TestPooledRatioIntervalsCover(t *testing.T) {
	const seeds = 400
	held50, held90 := 0, 0
	for seed := range seeds {
		rng := rand.New(rand.NewPCG(uint64(seed), 15))
		a, b := confounded(rng, 1000)
		b["full"], b["none"] = ttft(rng, 600, 22), ttft(rng, 400, 110)
		p := CompareStrata(a, b, rng).Pooled
		if p.P50RatioLo <= 1.1 && 1.1 <= p.P50RatioHi {
			held50++
		}
		if p.P90RatioLo <= 1.1 && 1.1 <= p.P90RatioHi {
			held90++
		}
	}
	t.Logf("pooled ratios' 95%% intervals held the truth: p50 in %.1f%%, p90 in %.1f%% of %d seeds", 100*float64(held50)/seeds, 100*float64(held90)/seeds, seeds)
	if held50 < seeds*93/100 || held90 < seeds*93/100 {
		t.Errorf("held p50 %d, p90 %d of %d", held50, held90, seeds)
	}
}
