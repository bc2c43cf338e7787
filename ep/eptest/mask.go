package eptest

import (
	"fmt"
	"os"
	"os/exec"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goep/goep/ep"
)

// maskTimeout is the group's timeout in testMaskStalledRank, which bounds
// NewGroup's collectives too: long enough for ranks that share 2 cores with
// other jobs (a rank late by the timeout after SetMask is masked again, by
// design, and the test fails: at 2 s that happened under make test's load);
// maskStall, how long the stalled rank stays stopped, is past it and the
// three masked calls after it.
const (
	maskTimeout = 4 * time.Second
	maskStall   = 3*maskTimeout + time.Second
)

// A rank stopped by SIGSTOP is masked by the others (MaskStalledRanks):
// their calls finish without it, exactly as a reference without its experts
// says, with the dropped pairs reported; later calls skip it at no timeout
// cost; when it comes back (SIGCONT) its call returns ErrMasked, and after
// a SetMask with the others every rank takes part again.
func (s Suite) testMaskStalledRank(t *testing.T) {
	R, me := s.Comm.Size(), s.Comm.Rank()
	if R < 2 {
		t.Skip("needs a rank to stall: run under mpirun with 2 or more ranks")
	}
	defer s.agree(t)
	victim := R - 1
	r := s.newRound(t, ep.LowLatency, func(c *ep.Config) { c.Timeout, c.MaskStalledRanks = maskTimeout, true })
	sc, in, g, x, out := r.sc, r.in, r.g, r.x, r.out
	H, K, L := sc.hidden, sc.topk, sc.experts/R
	// round does a dispatch and a combine with identity experts and checks
	// every token against x times the weights of its slots whose expert is
	// on a rank not in masked, and the dropped pairs against those that are.
	round := func(name string, masked []int) {
		h, err := g.Dispatch(ep.Tokens(x, in.topk, in.weights))
		require.NoError(t, err, name)
		require.NoError(t, g.Combine(h, h.Recv(), out, nil), name)
		var wantDropped []int32
		got := host(t, out)
		for tk := 0; tk < in.T; tk++ {
			var f float32
			for k := 0; k < K; k++ {
				e := in.topk[tk*K+k]
				switch {
				case e < 0:
				case slices.Contains(masked, int(e)/L):
					wantDropped = append(wantDropped, int32(tk*K+k))
				default:
					f += in.weights[tk*K+k]
				}
			}
			if !rowsEqual(t, fmt.Sprintf("%s: token %d (x * %v)", name, tk, f), got[tk*H:(tk+1)*H], scaled[float32](me, tk, H, f)) {
				return
			}
		}
		dropped := slices.Clone(h.Dropped())
		slices.Sort(dropped)
		assert.Equal(t, len(wantDropped), len(dropped), "%s: dropped pairs", name)
		if len(wantDropped) > 0 {
			assert.Equal(t, wantDropped, dropped, "%s: dropped pairs", name)
		}
	}

	round("before the stall", nil)
	if me == victim {
		// Stop this process; a helper resumes it once the others have masked
		// it and gone on for a while.
		cont := exec.Command("sh", "-c", fmt.Sprintf("sleep %g; kill -CONT %d", maskStall.Seconds(), os.Getpid()))
		require.NoError(t, cont.Start())
		require.NoError(t, syscall.Kill(os.Getpid(), syscall.SIGSTOP))
		require.NoError(t, cont.Wait())
		_, err := g.Dispatch(ep.Tokens(x, in.topk, in.weights))
		assert.ErrorIs(t, err, ep.ErrMasked, "the others went on without this rank")
		_, err = g.Dispatch(ep.Tokens(x, in.topk, in.weights))
		assert.ErrorIs(t, err, ep.ErrMasked, "and calls are refused until SetMask")
		require.NoError(t, s.Comm.Barrier(), "back: the others learn it")
	} else {
		start := time.Now()
		round("the call that masks the stalled rank", []int{victim})
		assert.GreaterOrEqual(t, time.Since(start), maskTimeout, "it waited for the stalled rank")
		assert.Equal(t, []int{victim}, g.Masked())
		for i := 0; i < 3; i++ {
			start := time.Now()
			round(fmt.Sprintf("masked call %d", i), []int{victim})
			assert.Less(t, time.Since(start), maskTimeout, "a later call waits for no masked rank (a wait for it would take the timeout)")
		}
		require.NoError(t, s.Comm.Barrier(), "the stalled rank is back")
	}
	require.NoError(t, g.SetMask(nil), "every rank, the stalled one back with them")
	assert.Empty(t, g.Masked())
	round("after SetMask", nil)
	round("and again", nil)
}
