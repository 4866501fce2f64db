package timing

import (
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

func TestDelaysMedianAndMax(t *testing.T) {
	for _, tc := range []struct {
		name   string
		delays []time.Duration
		median time.Duration // exact; the summary's must be within 13%
		max    time.Duration
	}{
		{"one", []time.Duration{40 * time.Microsecond}, 40 * time.Microsecond, 40 * time.Microsecond},
		{"odd count", []time.Duration{10 * time.Microsecond, 300 * time.Microsecond, 20 * time.Microsecond}, 20 * time.Microsecond, 300 * time.Microsecond},
		{"a stall does not move the median", []time.Duration{50 * time.Microsecond, 55 * time.Microsecond, 60 * time.Microsecond, 2 * time.Second, 52 * time.Microsecond}, 55 * time.Microsecond, 2 * time.Second},
		{"milliseconds", []time.Duration{8 * time.Millisecond, 9 * time.Millisecond, 11 * time.Millisecond}, 9 * time.Millisecond, 11 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var d Delays
			for _, x := range tc.delays {
				d.Observe(x)
			}
			if d.Count() != len(tc.delays) || d.Max() != tc.max {
				t.Errorf("count %d max %v, want %d and %v", d.Count(), d.Max(), len(tc.delays), tc.max)
			}
			if got := d.Median(); !within(got, tc.median, 0.13) {
				t.Errorf("median %v, want %v within 13%%", got, tc.median)
			}
		})
	}
}

func TestDelaysEdges(t *testing.T) {
	var d Delays
	if d.Median() != 0 || d.Max() != 0 || d.Count() != 0 {
		t.Errorf("empty: median %v max %v count %d, want zeros", d.Median(), d.Max(), d.Count())
	}
	d.Observe(-time.Millisecond) // a clock step: zero, not negative
	d.Observe(300 * time.Nanosecond)
	if d.Max() != 300*time.Nanosecond || d.Median() > d.Max() {
		t.Errorf("sub-µs: median %v max %v, want max 300ns and the median no larger", d.Median(), d.Max())
	}
	var huge Delays
	huge.Observe(time.Hour) // past the last bucket
	if huge.Median() != time.Hour || huge.Max() != time.Hour {
		t.Errorf("an hour: median %v max %v", huge.Median(), huge.Max())
	}
}

// TestDelaysMedianResolution compares the median with the exact one over
// random delays spread from microseconds to seconds.
func TestDelaysMedianResolution(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for range 200 {
		var d Delays
		xs := make([]time.Duration, 1+rng.IntN(300))
		for i := range xs {
			xs[i] = time.Duration(float64(time.Microsecond) * float64(uint64(1)<<rng.IntN(20)) * (1 + rng.Float64()))
			d.Observe(xs[i])
		}
		slices.Sort(xs)
		exact := xs[(len(xs)-1)/2]
		if got := d.Median(); !within(got, exact, 0.13) {
			t.Fatalf("median %v, exact %v (n=%d)", got, exact, len(xs))
		}
	}
}

func TestDelaysObserveAllocatesNothing(t *testing.T) {
	var d Delays
	if n := testing.AllocsPerRun(100, func() { d.Observe(37 * time.Microsecond) }); n != 0 {
		t.Errorf("Observe allocates %v times", n)
	}
}

func within(got, want time.Duration, rel float64) bool {
	diff := float64(got - want)
	return diff <= rel*float64(want) && -diff <= rel*float64(want)
}
