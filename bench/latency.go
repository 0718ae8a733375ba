package main

import (
	"slices"
	"time"
)

// latencies is a record of request latencies. Sorting a slice is exact and
// cheap at the sizes one round produces (tens of thousands of samples).
type latencies []time.Duration

// quantile returns the q-quantile (0 < q <= 1) by the nearest-rank method,
// or 0 for an empty record. It sorts the record in place.
func (l latencies) quantile(q float64) time.Duration {
	if len(l) == 0 {
		return 0
	}
	if !slices.IsSorted(l) {
		slices.Sort(l)
	}
	rank := int(q*float64(len(l)) + 0.999999999) // ceil without float noise
	rank = max(1, min(rank, len(l)))
	return l[rank-1]
}
