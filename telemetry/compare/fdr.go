package compare

import (
	"slices"
)

// AdjustBH is Benjamini and Hochberg's adjustment of p-values for the
// false discovery rate ("Controlling the false discovery rate", JRSS B
// 57(1), 1995), as R's p.adjust(p, "BH"): each p-value's q-value, the
// least FDR at which it would be a discovery. Comparing many figures in
// many strata, a verdict taken at q < Alpha keeps the expected share of
// false ones among all verdicts below Alpha.
func AdjustBH(p []float64) []float64 {
	m := len(p)
	order := make([]int, m)
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(i, j int) int {
		switch {
		case p[i] < p[j]:
			return -1
		case p[i] > p[j]:
			return 1
		}
		return 0
	})
	q := make([]float64, m)
	least := 1.0
	for k := m - 1; k >= 0; k-- {
		i := order[k]
		least = min(least, p[i]*float64(m)/float64(k+1))
		q[i] = least
	}
	return q
}
