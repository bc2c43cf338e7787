package runs_test

import (
	"fmt"
	"math"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goep/goep/ep"
	"github.com/goep/goep/internal/mpitesting"
	"github.com/goep/goep/moe"
	"github.com/goep/goep/moe/runs"
)

// FindStraggler's rule: the column sums (the others' waits for a rank, its
// own left out) against the mean of the other columns and the floor.
func TestFindStraggler(t *testing.T) {
	nan := math.NaN()
	for _, c := range []struct {
		name   string
		R      int
		waits  []float64
		ok     bool
		rank   int
		waited float64
		share  float64
	}{
		{"one rank", 1, []float64{5000}, false, 0, 0, 0},
		{"wrong length", 2, []float64{0, 1, 2}, false, 0, 0, 0},
		{"no waits", 3, make([]float64, 9), false, 0, 0, 0},
		// Rank 1 waited 3000 for rank 0, rank 0 1000 for rank 1: 3x.
		{"two ranks, rank 0 slow", 2, []float64{0, 1000, 3000, 0}, true, 0, 3000, 0.75},
		// 1.5x the other column: not enough.
		{"two ranks, close", 2, []float64{0, 2000, 3000, 0}, false, 0, 3000, 0.6},
		// The diagonal and NaN count as nothing: columns 0, 4000 (rank 1),
		// 1000 (rank 2); mean of the others 500.
		{"diagonal and NaN ignored", 3, []float64{1e9, 2000, nan, 0, 1e9, 1000, 0, 2000, 1e9}, true, 1, 4000, 0.8},
		// Everyone waits a little for everyone: no rank stands out.
		{"balanced", 3, []float64{0, 900, 1000, 1100, 0, 1000, 1000, 1000, 0}, false, 0, 2100, 0.35},
		// 4x the mean of the others but under the 1 ms floor.
		{"too little to tell", 2, []float64{0, 100, 400, 0}, false, 0, 400, 0.8},
	} {
		t.Run(c.name, func(t *testing.T) {
			s, ok := runs.FindStraggler(c.waits, c.R)
			assert.Equal(t, c.ok, ok)
			if c.R < 2 || len(c.waits) != c.R*c.R {
				return
			}
			assert.Equal(t, c.rank, s.Rank)
			assert.InDelta(t, c.waited, s.WaitedUS, 1e-9)
			assert.InDelta(t, c.share, s.Share, 1e-12)
		})
	}
}

// Every trace row holds the step's per-peer matrices, and they agree with
// what moe counts itself (CommStats): the bytes a rank sent to the others are its
// bytes_sent, what i sent j is what j received from i, and every wait is
// measured (the CPU engine measures them) and not negative. h5dump reads the
// new tables; the run's summed waits are the trace's.
func TestRunPerPeerStats(t *testing.T) {
	w := mpitesting.World
	R := w.Size()
	defer mpitesting.Agree(t, w)
	for _, c := range []struct {
		mode  ep.Mode
		dtype moe.DType
	}{{ep.LowLatency, moe.Float32}, {ep.HighThroughput, moe.FP8}} {
		t.Run(fmt.Sprintf("%v/%v", c.mode, c.dtype), func(t *testing.T) {
			const N = 6
			dir := tempDir(t, w)
			o := runs.Options{TrainConfig: smallConfig(c.mode, c.dtype), Steps: N, TracePath: filepath.Join(dir, "trace.h5"), Nodes: 1}
			res, err := runs.Train(w, o)
			require.NoError(t, err)
			require.Len(t, res.WaitUS, R*R)
			require.Len(t, res.Hosts, R)
			if w.Rank() != 0 {
				return
			}
			tr, err := runs.ReadTrace(o.TracePath)
			require.NoError(t, err)
			require.Len(t, tr.Step, N)
			require.Len(t, tr.WaitUS, N*R*R)
			sum := make([]float64, R*R)
			for s := 0; s < N; s++ {
				m := func(v []int64, i, j int) int64 { return v[s*R*R+i*R+j] }
				for i := 0; i < R; i++ {
					others := int64(0)
					for j := 0; j < R; j++ {
						if j != i {
							others += m(tr.PeerSent, i, j)
						}
						assert.Equal(t, m(tr.PeerSent, i, j), m(tr.PeerRecv, j, i), "step %d: %d sent %d, %d received", s+1, i, j, j)
						wait := tr.WaitUS[s*R*R+i*R+j]
						assert.False(t, math.IsNaN(wait) || wait < 0, "step %d: wait_us[%d][%d] = %g", s+1, i, j, wait)
						sum[i*R+j] += wait
					}
					assert.Equal(t, tr.BytesSent[s*R+i], others, "step %d: rank %d's bytes to the others, per peer and in bytes_sent", s+1, i)
					assert.Positive(t, m(tr.PeerSent, i, i)+others, "step %d: rank %d sent rows", s+1, i)
				}
			}
			assert.InDeltaSlice(t, sum, res.WaitUS, 1e-6, "the run's waits are the trace's summed")
			dump, err := exec.Command("h5dump", "-H", "-d", "/trace/wait_us", "-d", "/trace/peer_sent_bytes", "-d", "/trace/peer_recv_bytes", o.TracePath).CombinedOutput()
			require.NoError(t, err, "%s", dump)
			assert.Equal(t, 3, strings.Count(string(dump), fmt.Sprintf("SIMPLE { ( %d, %d, %d ) / ( H5S_UNLIMITED, %d, %d ) }", N, R, R, R, R)), "%s", dump)
		})
	}
}
