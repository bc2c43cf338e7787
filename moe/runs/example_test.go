package runs_test

import (
	"fmt"

	"github.com/goep/goep/moe/runs"
)

// A run's wait matrix (microseconds rank i waited for rank j, summed over
// the steps): ranks 0, 1 and 3 each waited about 4 ms for rank 2, which is
// the one that stands out.
func ExampleFindStraggler() {
	waits := []float64{
		0, 300, 4000, 200,
		250, 0, 4200, 100,
		150, 200, 0, 300,
		100, 150, 3900, 0,
	}
	if s, ok := runs.FindStraggler(waits, 4); ok {
		fmt.Printf("rank %d: the others waited %.1f ms for it, %.0f%% of all waiting\n", s.Rank, s.WaitedUS/1e3, 100*s.Share)
	}
	// Output: rank 2: the others waited 12.1 ms for it, 87% of all waiting
}
