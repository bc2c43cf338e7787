package ep_test

import (
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goep/goep/ep"
	"github.com/goep/goep/internal/mpitesting"
	"github.com/goep/goep/internal/sysmem"
	"github.com/goep/goep/mpi"
)

// BufferPlan, computed without allocating, is what a group of the same
// configuration holds.
func TestBufferPlanIsWhatAGroupHolds(t *testing.T) {
	w := mpitesting.World
	R := w.Size()
	layouts := []struct {
		mode   ep.Mode
		layout ep.RecvLayout
		align  int
		area   string // an area only this layout has
	}{
		{ep.LowLatency, ep.LayoutDefault, 0, "LL received rows (set 0)"},
		{ep.LowLatency, ep.LayoutRankMajor, 0, "LL rank-major received top-k ids (set 1)"},
		{ep.HighThroughput, ep.LayoutDefault, 0, "HT received top-k ids"},
		{ep.HighThroughput, ep.LayoutExpertMajor, 16, "HT received top-k slots"},
	}
	for _, l := range layouts {
		mode := l.mode
		for _, wire := range []ep.WireFormat{ep.WireNative, ep.WireFP8} {
			cfg := ep.Config{Mode: mode, NumExperts: 4 * R, MaxTokensPerRank: 32, Hidden: 200, TopK: 3, Wire: wire,
				Layout: l.layout, ExpertAlignment: l.align}
			g, err := ep.NewGroup[ep.BF16](w, cfg)
			require.NoError(t, err)
			f, err := ep.BufferPlan(cfg, ep.BFloat16, R, g.Nodes())
			require.NoError(t, err)
			if R%g.Nodes() == 0 { // the plan assumes nodes as equal as can be
				assert.Equal(t, g.BufferBytes(), f.SharedPerRank+f.WindowPerRank, "%v %v: %v", mode, wire, f)
			}
			assert.Equal(t, f.RanksPerNode*(f.SharedPerRank+f.WindowPerRank+f.CopiesPerRank), f.PerNode)
			assert.Equal(t, g.Nodes() > 1, f.WindowPerRank > 0)
			assert.True(t, slices.ContainsFunc(f.Layout, func(a ep.Area) bool { return a.Name == l.area }),
				"%v %v: the layout lists %q", l.layout, wire, l.area)
			// Its layout: every area in its memory, in order, none over another.
			end := map[string]int{}
			for _, a := range f.Layout {
				assert.GreaterOrEqual(t, a.Offset, end[a.Memory], "%v %v: %s starts inside the area before it", mode, wire, a.Name)
				end[a.Memory] = a.Offset + a.Bytes
			}
			assert.Equal(t, f.SharedPerRank, end["shared"], "%v %v: the shared areas end where the segment does", mode, wire)
			assert.Equal(t, f.WindowPerRank, end["staging"], "%v %v: the staging areas end where the staging memory does", mode, wire)
			assert.Equal(t, 2*f.WindowPerRank, f.CopiesPerRank, "messages across nodes: a send copy and a receive buffer")
			cfg.Backend = ep.CPUOneSided
			one, err := ep.BufferPlan(cfg, ep.BFloat16, R, g.Nodes())
			require.NoError(t, err)
			assert.Zero(t, one.CopiesPerRank, "one-sided puts copy nothing")
			require.NoError(t, g.Close())
		}
	}
	_, err := ep.BufferPlan(ep.Config{Mode: ep.LowLatency, NumExperts: 8, MaxTokensPerRank: 1, Hidden: 1, TopK: 1}, ep.Float32, 4, 5)
	assert.ErrorContains(t, err, "5 nodes for 4 ranks")
	mpitesting.Agree(t, w)
}

// A configuration larger than the machine is refused on every rank before
// anything is allocated, naming the bytes needed and available and the knobs
// that shrink it (without the check the kernel's OOM killer ends the job, or
// MPI_Win_allocate_shared fails with MPI_ERR_INTERN).
func TestTooLargeIsRefusedBeforeAllocating(t *testing.T) {
	w := mpitesting.World
	R := w.Size()
	for _, mode := range []ep.Mode{ep.LowLatency, ep.HighThroughput} {
		cfg := ep.Config{Mode: mode, NumExperts: 8 * R, MaxTokensPerRank: 1 << 16, Hidden: 1 << 18, TopK: 8}
		f, err := ep.BufferPlan(cfg, ep.BFloat16, R, 1)
		require.NoError(t, err)
		require.Greater(t, f.PerNode, 1<<36, "the configuration is meant to be far beyond any node")
		_, err = ep.NewGroup[ep.BF16](w, cfg)
		require.Error(t, err, "%v", mode)
		for _, want := range []string{"the buffers need", "per node", "can give", "MemAvailable", "lower MaxTokensPerRank (65536)"} {
			assert.Contains(t, err.Error(), want, "%v", mode)
		}
		if mode == ep.LowLatency {
			assert.Contains(t, err.Error(), "use HighThroughput instead of LowLatency")
		}
	}
	// Sized from this machine: one rank's buffers fit, the host's ranks'
	// together do not. On simulated nodes of one rank each, every node
	// alone would fit, and only counting the host's ranks refuses it. Every
	// rank decides alike: hosts may hold different numbers of ranks.
	if hostSize := hostRanks(t); hostSize >= 2 {
		cfg := ep.Config{Mode: ep.LowLatency, NumExperts: 8 * R, MaxTokensPerRank: 1, Hidden: 7168, TopK: 8}
		one, err := ep.BufferPlan(cfg, ep.BFloat16, R, 1)
		require.NoError(t, err)
		target := 0.7 * float64(sysmem.Read().Memory())
		// Each rank reads the memory available at its own moment: they
		// agree on the least, or NewGroup refuses the differing configs.
		tokens := []int64{0}
		require.NoError(t, mpi.Allreduce(w, mpi.OpMin, []int64{int64(target / float64(one.SharedPerRank))}, tokens))
		cfg.MaxTokensPerRank = int(tokens[0])
		_, err = ep.NewGroup[ep.BF16](w, cfg)
		require.Error(t, err, "%d ranks of about %.1f GB on one host", hostSize, target/1e9)
		assert.Contains(t, err.Error(), "the buffers need")
	}
	// The group after a refused one works.
	g, err := ep.NewGroup[float32](w, ep.Config{Mode: ep.LowLatency, NumExperts: 2 * R, MaxTokensPerRank: 4, Hidden: 8, TopK: 2})
	require.NoError(t, err)
	require.NoError(t, g.Close())
	mpitesting.Agree(t, w)
}

// hostRanks is the fewest ranks on one host, over every host.
func hostRanks(t *testing.T) int {
	topo, err := mpitesting.World.Topology()
	require.NoError(t, err)
	defer func() { require.NoError(t, topo.Free()) }()
	fewest := []int64{0}
	require.NoError(t, mpi.Allreduce(mpitesting.World, mpi.OpMin, []int64{int64(topo.HostSize)}, fewest))
	return int(fewest[0])
}
