package compare

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

// TestAdjustBHAsR: R's p.adjust(c(0.005, 0.04, 0.01, 0.2, 0.03), "BH").
func TestAdjustBHAsR(t *testing.T) {
	got := AdjustBH([]float64{0.005, 0.04, 0.01, 0.2, 0.03})
	want := []float64{0.025, 0.05, 0.025, 0.2, 0.05}
	for i := range want {
		if math.Abs(got[i]-want[i]) > 1e-12 {
			t.Fatalf("q-values %v, R gives %v", got, want)
		}
	}
}

// TestManyComparisonsKeepTheFalseDiscoveryRate: 20 figures, 16 of them
// alike between the arms and 4 shifted 25%, over 500 seeds: the share of
// false verdicts among all verdicts taken at q < Alpha averages below
// Alpha (Benjamini-Hochberg promises Alpha × 16/20 = 0.04), while the
// shifted figures are found.
func TestManyComparisonsKeepTheFalseDiscoveryRate(t *testing.T) {
	const seeds, figures, shifted = 500, 20, 4
	var fdp []float64
	found := 0
	for seed := range seeds {
		rng := rand.New(rand.NewPCG(uint64(seed), 7))
		p := make([]float64, figures)
		for f := range p {
			median := 100.0
			if f < shifted {
				median = 125
			}
			a, b := NewArm(ttft(rng, 200, 100)), NewArm(ttft(rng, 200, median))
			_, _, p[f] = BrunnerMunzel(a, b)
		}
		q := AdjustBH(p)
		discoveries, wrong := 0, 0
		for f, v := range q {
			if v < Alpha {
				discoveries++
				if f >= shifted {
					wrong++
				} else {
					found++
				}
			}
		}
		if discoveries > 0 {
			fdp = append(fdp, float64(wrong)/float64(discoveries))
		} else {
			fdp = append(fdp, 0)
		}
	}
	var mean float64
	for _, v := range fdp {
		mean += v
	}
	mean /= float64(len(fdp))
	t.Logf("false discovery rate %.3f over %d seeds; %d of %d shifted figures found (max false share %.2f)",
		mean, seeds, found, seeds*shifted, slices.Max(fdp))
	if mean >= Alpha || found < seeds*shifted*80/100 {
		t.Errorf("false discovery rate %.3f (want below %v); found %d of %d", mean, Alpha, found, seeds*shifted)
	}
}
