package moe_test

import (
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goep/goep/ep"
	"github.com/goep/goep/internal/mpitesting"
	"github.com/goep/goep/moe"
	"github.com/goep/goep/mpi"
)

// A rank that is late to the backward's first ep call (it sleeps between
// Forward and Backward) is the one the others waited for: each other rank
// waited for it more than for any other peer, the wait charged to it is at
// least half of the rank's time in the step's dispatches (no bound on the
// time itself: on a loaded machine the others may come late too), and in
// the gathered matrix the others' waits for it, summed, are more than for
// any other rank.
func TestLayerPeerWaits(t *testing.T) {
	w := mpitesting.World
	R := w.Size()
	defer mpitesting.Agree(t, w)
	if R < 2 {
		t.Log("one rank: no peer to wait for; checking only that the matrix is 1x1")
	}
	const late = 100 * time.Millisecond
	slow := R - 1
	cfg := smallConfig(ep.LowLatency, moe.Float32).Config
	l, err := moe.NewLayer(w, cfg)
	require.NoError(t, err)
	defer func() { require.NoError(t, l.Close()) }()
	_ = l.TakeCommStats()
	x, _ := moe.Batch(cfg, moe.NewTeacher(cfg, 2), 1, 1, w.Rank(), R)
	out, _, err := l.Forward(x)
	require.NoError(t, err)
	require.NoError(t, w.Barrier())
	if w.Rank() == slow {
		time.Sleep(late)
	}
	t0 := time.Now()
	_, err = l.Backward(out, 0)
	require.NoError(t, err)
	cs := l.TakeCommStats()
	t.Logf("rank %d: backward %v, waits per peer %v", w.Rank(), time.Since(t0), cs.PeerWait)
	require.Len(t, cs.PeerWait, R)
	require.Len(t, cs.PeerSent, R)
	mine := make([]float64, R)
	for p, d := range cs.PeerWait {
		mine[p] = float64(d.Nanoseconds()) / 1e3
	}
	all := make([]float64, R*R)
	require.NoError(t, mpi.AllgatherSlice(w, mine, all))
	if R < 2 {
		return
	}
	if w.Rank() != slow {
		assert.Equal(t, slices.Max(cs.PeerWait), cs.PeerWait[slow], "rank %d waited for the late rank %d most: %v", w.Rank(), slow, cs.PeerWait)
		// Most of the backward's dispatch was that wait, and it is charged,
		// on one node or across nodes (a ratio of two times of this call).
		assert.GreaterOrEqual(t, cs.PeerWait[slow], cs.Dispatch/2, "rank %d: %v of its %v in dispatches charged to the late rank %d", w.Rank(), cs.PeerWait[slow], cs.Dispatch, slow)
	}
	waitedFor := make([]float64, R) // column sums: the others' waits for each rank
	for i := 0; i < R; i++ {
		for j := 0; j < R; j++ {
			if i != j {
				waitedFor[j] += all[i*R+j]
			}
		}
	}
	assert.Equal(t, slow, slices.Index(waitedFor, slices.Max(waitedFor)), "waits %v", all)
}
