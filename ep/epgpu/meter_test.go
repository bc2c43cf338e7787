package epgpu_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goep/goep/ep"
	"github.com/goep/goep/gpu"
	"github.com/goep/goep/internal/mpitesting"
)

// Group.Stats on the device: the last rank arrives late at every dispatch
// (it sleeps first), and every other rank charges most of its waiting to
// that rank, well over the sleeps' total; the bytes put across nodes are,
// in LL, exactly the fixed-capacity blocks and headers sent to the ranks
// of other nodes (zero on one node), and in HT at least the rows sent
// there.
func TestStatsEmulated(t *testing.T) { testStats(t, jittery) }

// Over IPC the group waits on the host for the late rank, and charges it.
func TestStatsEmulatedIPC(t *testing.T) { testStats(t, jitteryIPC) }

func testStats(t *testing.T, b ep.Backend) {
	w := mpitesting.World
	R, me := w.Size(), w.Rank()
	const rounds, late = 3, 150 * time.Millisecond
	for _, mode := range []ep.Mode{ep.LowLatency, ep.HighThroughput} {
		t.Run(mode.String(), func(t *testing.T) {
			defer mpitesting.Agree(t, w)
			rg := newRig(t, b, mode)
			g := rg.g
			g.ResetStats()
			for i := 0; i < rounds; i++ {
				if me == R-1 {
					time.Sleep(late)
				}
				h, err := g.Dispatch(ep.Tokens(rg.x, rg.topk, rg.weights))
				require.NoError(t, err)
				require.NoError(t, g.Combine(h, h.Recv(), rg.out, nil))
				rg.checkCombined(t, "a round")
			}
			st := g.Stats()
			t.Logf("rank %d: waited %v per rank; %d bytes across nodes", me, st.Wait, st.NetworkBytes)
			require.Len(t, st.Wait, R)
			if me != R-1 {
				for p := 0; p < R; p++ {
					if p != R-1 {
						assert.Less(t, st.Wait[p], st.Wait[R-1], "the time waited for rank %d, against the late rank %d", p, R-1)
					}
				}
				assert.Greater(t, st.Wait[R-1], rounds*late/2, "the time waited for the late rank %d", R-1)
			}

			// Bytes across nodes.
			var remote int
			var remoteRows int64
			for p := 0; p < R; p++ {
				if g.NodeOf(p) != g.Node() {
					remote++
					remoteRows += st.SentBytes[p]
				}
			}
			if remote == 0 {
				assert.Zero(t, st.NetworkBytes, "one node: nothing crosses nodes")
				return
			}
			if mode == ep.HighThroughput {
				assert.GreaterOrEqual(t, st.NetworkBytes, remoteRows, "at least the rows sent to other nodes")
				return
			}
			cfg := g.Config()
			L := cfg.NumExperts / R
			capRows := cfg.MaxTokensPerRank * min(cfg.TopK, L)
			rowBytes := cfg.Hidden * 4
			dispatch := capRows*rowBytes + 4*gpu.LLMetaWords(L, capRows)
			combine := capRows*rowBytes + 4*capRows + 8
			assert.Equal(t, int64(rounds*remote*(dispatch+combine)), st.NetworkBytes,
				"LL: %d rounds of fixed blocks to %d ranks on other nodes", rounds, remote)
		})
	}
}
