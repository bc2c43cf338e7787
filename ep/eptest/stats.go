package eptest

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goep/goep/ep"
	"github.com/goep/goep/mpi"
)

// Stats count the rows moved to and from each peer, against a brute-force
// count from every rank's routing; what one rank sent another is what the
// other received; a reset starts anew. Where the backend declares
// ep.FeatureMeter they report a wait per peer and the bytes put across
// nodes (none on one node, some on several); where it does not, neither.
func (s Suite) testStats(t *testing.T) {
	R, me := s.Comm.Size(), s.Comm.Rank()
	for _, mode := range modes {
		t.Run(mode.String(), func(t *testing.T) {
			defer s.agree(t)
			sc := scenarios(R)[0]
			g := newGroup[float32](t, s, s.Backend, sc.config(mode))
			H := sc.hidden
			ins := allInputs(sc, R)
			in := ins[me]
			rowBytes := int64(4 * H)
			rows := rowsBetween(sc, ins, mode, R) // rows[s][d]: rows rank s sends rank d in a dispatch
			x := upload(t, g, payload[float32](me, in.T, H))
			out := zeros[float32](t, g, in.T*H)
			g.ResetStats()
			for i := 0; i < 2; i++ {
				h, err := g.Dispatch(ep.Tokens(x, in.topk, in.weights))
				require.NoError(t, err)
				require.NoError(t, g.Combine(h, h.Recv(), out, nil))
			}
			st := g.Stats()
			assert.Equal(t, 2, st.Dispatches)
			assert.Equal(t, 2, st.Combines)
			for p := 0; p < R; p++ {
				// each round: rows out and back
				want := 2 * (rows[me][p] + rows[p][me]) * rowBytes
				assert.Equal(t, want, st.SentBytes[p], "bytes sent to rank %d", p)
				assert.Equal(t, want, st.RecvBytes[p], "bytes received from rank %d", p)
			}
			require.Len(t, st.Hosts, R)
			host, err := mpi.ProcessorName()
			require.NoError(t, err)
			assert.Equal(t, host, st.Hosts[me])
			// Symmetry over the job: what I sent p is what p received from me.
			all := make([]int64, 2*R*R)
			require.NoError(t, mpi.AllgatherSlice(s.Comm, append(st.SentBytes, st.RecvBytes...), all))
			for a := 0; a < R; a++ {
				for b := 0; b < R; b++ {
					sentAB, recvBA := all[a*2*R+b], all[b*2*R+R+a]
					assert.Equal(t, sentAB, recvBA, "rank %d sent rank %d what it received", a, b)
				}
			}
			if !s.declares(ep.FeatureMeter) {
				assert.Nil(t, st.Wait, "waits from an engine whose backend does not declare %v", ep.FeatureMeter)
				assert.Zero(t, st.NetworkBytes, "network bytes from an engine whose backend does not declare %v", ep.FeatureMeter)
			} else {
				require.Len(t, st.Wait, R, "the waits of a backend that declares %v", ep.FeatureMeter)
				for p, w := range st.Wait {
					assert.GreaterOrEqual(t, w, time.Duration(0), "time waited for rank %d", p)
				}
				if g.Nodes() == 1 {
					assert.Zero(t, st.NetworkBytes, "bytes across nodes on one node")
				} else {
					assert.Positive(t, st.NetworkBytes, "bytes across nodes, on %d nodes", g.Nodes())
				}
			}
			g.ResetStats()
			st = g.Stats()
			assert.Zero(t, st.Dispatches)
			for p := 0; p < R; p++ {
				assert.Zero(t, st.SentBytes[p])
			}
		})
	}
}
