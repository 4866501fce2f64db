package compare

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

// looks draws two arms' TTFT streams, in two strata (cache hits at 20 ms
// and misses at 100 ms, times ratio for b), and calls look after every
// step requests per arm, up to n, with the values so far, kept sorted (a
// sort of sorted values is quick, and looks are many).
func looks(rng *rand.Rand, n, step int, ratio float64, look func(a, b map[string][]float64, perArm int) bool) {
	a, b := map[string][]float64{}, map[string][]float64{}
	for got := step; got <= n; got += step {
		for _, arm := range []struct {
			m     map[string][]float64
			ratio float64
		}{{a, 1}, {b, ratio}} {
			arm.m["full"] = merged(arm.m["full"], ttft(rng, step/4, 20*arm.ratio))
			arm.m["none"] = merged(arm.m["none"], ttft(rng, step-step/4, 100*arm.ratio))
		}
		if !look(a, b, got) {
			return
		}
	}
}

// merged is sorted values and more, sorted.
func merged(sorted, more []float64) []float64 {
	slices.Sort(more)
	out := make([]float64, 0, len(sorted)+len(more))
	i, j := 0, 0
	for i < len(sorted) || j < len(more) {
		if j == len(more) || (i < len(sorted) && sorted[i] <= more[j]) {
			out = append(out, sorted[i])
			i++
		} else {
			out = append(out, more[j])
			j++
		}
	}
	return out
}

// TestSequentialAAAtEveryLook: two arms alike, looked at every 100
// requests an arm up to 3,000 (30 looks), over 300 seeds: the anytime
// test ever says they differ in at most Alpha of the seeds. The
// fixed-sample test looked at the same way says so far more often, which
// is why --follow does not use it.
func TestSequentialAAAtEveryLook(t *testing.T) {
	const seeds = 300
	anytime, fixed := 0, 0
	for seed := range seeds {
		rng := rand.New(rand.NewPCG(uint64(seed), 11))
		var anytimeSaid, fixedSaid bool
		looks(rng, 3000, 100, 1, func(a, b map[string][]float64, _ int) bool {
			if NewSequentialTest(a, b).PValue() < Alpha {
				anytimeSaid = true
			}
			if _, _, p := BrunnerMunzel(NewArm(a["none"]), NewArm(b["none"])); p < Alpha {
				fixedSaid = true
			}
			return true
		})
		if anytimeSaid {
			anytime++
		}
		if fixedSaid {
			fixed++
		}
	}
	t.Logf("A/A over %d looks, %d seeds: the anytime test ever said a difference in %.1f%%; the fixed-sample test looked at as often, %.1f%%",
		30, seeds, 100*float64(anytime)/seeds, 100*float64(fixed)/seeds)
	if float64(anytime)/seeds > Alpha {
		t.Errorf("anytime test: %d of %d seeds ever rejected, want at most %v", anytime, seeds, Alpha)
	}
	if fixed < 2*anytime || float64(fixed)/seeds <= Alpha {
		t.Errorf("the fixed-sample test looked at 30 times rejected in %d seeds; expected well above %v", fixed, Alpha)
	}
}

// TestTheConfidenceSequenceCoversAtEveryLook: with b's medians 1.2 times
// a's, the confidence sequence holds 1.2 at every look in at least
// 1 - Alpha of 300 seeds (the test at 1.2 never rejects).
func TestTheConfidenceSequenceCoversAtEveryLook(t *testing.T) {
	const seeds = 300
	missed := 0
	for seed := range seeds {
		rng := rand.New(rand.NewPCG(uint64(seed), 12))
		looks(rng, 3000, 100, 1.2, func(a, b map[string][]float64, _ int) bool {
			if NewSequentialTest(a, b).logEvidence(1.2) >= math.Log(1/Alpha) {
				missed++
				return false
			}
			return true
		})
	}
	t.Logf("the 95%% confidence sequence missed the true ratio at some look in %.1f%% of %d seeds", 100*float64(missed)/seeds, seeds)
	if float64(missed)/seeds > Alpha {
		t.Errorf("missed in %d of %d seeds", missed, seeds)
	}
}

// TestSequentialFindsAShift: b 10% slower in both strata is decided
// slower, looking every 250 requests an arm, by 8,000 an arm in at least
// 45 of 50 seeds; the interval at the decision lies above 1.
func TestSequentialFindsAShift(t *testing.T) {
	const seeds = 50
	found, at := 0, 0
	for seed := range seeds {
		rng := rand.New(rand.NewPCG(uint64(seed), 13))
		looks(rng, 8000, 250, 1.1, func(a, b map[string][]float64, n int) bool {
			r := NewSequentialTest(a, b).Read(Alpha/float64(len(Metrics)), n)
			if r.Verdict == Slower {
				found++
				at += n
				if r.RatioCI[0] <= 1 {
					t.Errorf("slower with interval %v", *r.RatioCI)
				}
				return false
			}
			return true
		})
	}
	t.Logf("+10%%: decided slower in %d of %d seeds, at %d requests an arm on average (alpha %.4f, one metric's share)", found, seeds, at/max(found, 1), Alpha/float64(len(Metrics)))
	if found < 45 {
		t.Errorf("found %d of %d", found, seeds)
	}
}

// TestMoreIsRough: an undecided interval says how many more requests it
// needs, and none when nothing is in sight.
func TestMoreIsRough(t *testing.T) {
	if n := more(1.1, 0.95, 1.27, 1000); n < 1000 || n > 5000 {
		t.Errorf("more(1.1, [0.95, 1.27], 1000) = %d", n)
	}
	if n := more(1.0, 0.5, 2, 100); n != 0 {
		t.Errorf("nothing in sight: %d", n)
	}
}

// TestStrataThatDifferEachTheirOwnWay: one stratum 30% slower, the other
// alike, and no one ratio fits both: the medians differ, the way the
// weighted ratio goes, and the reading says so without an interval.
func TestStrataThatDifferEachTheirOwnWay(t *testing.T) {
	rng := rand.New(rand.NewPCG(14, 14))
	a := map[string][]float64{"full": ttft(rng, 3000, 20), "none": ttft(rng, 3000, 100)}
	b := map[string][]float64{"full": ttft(rng, 3000, 20), "none": ttft(rng, 3000, 170)}
	test := NewSequentialTest(a, b)
	if _, _, ok := test.RatioCI(1.3, Alpha); ok {
		t.Fatal("a single ratio fits these strata: the case is not exercised")
	}
	if r := test.Read(Alpha, 6000); r.Verdict != Slower || !r.Decided || r.RatioCI != nil {
		t.Errorf("reading %+v", r)
	}
}
