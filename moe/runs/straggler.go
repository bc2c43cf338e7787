package runs

import "math"

// Straggler is the rank the others waited for most over a run, when it
// stands out (see FindStraggler).
type Straggler struct {
	Rank int
	Host string // where it ran ("" if unknown)
	// WaitedUS is how long the other ranks waited for it, summed over them
	// and the run's steps, in microseconds; Share is that part of all the
	// waiting the ranks did for each other; OthersMeanUS is the mean, over
	// the other ranks, of how long the ranks waited for each.
	WaitedUS, Share, OthersMeanUS float64
}

// Straggler thresholds: the rank waited for most stands out when the others
// waited for it at least StragglerFactor times as long as, on average, for
// each other rank, and at least StragglerMinUS microseconds in all.
const (
	StragglerFactor = 2.0
	StragglerMinUS  = 1000.0
)

// FindStraggler looks at waits, an R x R matrix (row-major) of how long rank
// i waited for rank j ([i][j], microseconds, summed over steps; NaN counts
// as nothing): for each rank j it sums the column, the others' waits for j
// (the diagonal left out), and returns the rank with the largest sum if that
// stands out (see StragglerFactor and StragglerMinUS); ok is false when no
// rank does, or R < 2.
func FindStraggler(waits []float64, R int) (s Straggler, ok bool) {
	if R < 2 || len(waits) != R*R {
		return Straggler{}, false
	}
	col := make([]float64, R)
	total := 0.0
	for i := 0; i < R; i++ {
		for j := 0; j < R; j++ {
			if v := waits[i*R+j]; i != j && !math.IsNaN(v) && v > 0 {
				col[j] += v
				total += v
			}
		}
	}
	top := 0
	for j, v := range col {
		if v > col[top] {
			top = j
		}
	}
	s = Straggler{Rank: top, WaitedUS: col[top], OthersMeanUS: (total - col[top]) / float64(R-1)}
	if total > 0 {
		s.Share = col[top] / total
	}
	return s, s.WaitedUS >= StragglerMinUS && s.WaitedUS >= StragglerFactor*s.OthersMeanUS
}
