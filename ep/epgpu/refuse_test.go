package epgpu_test

import (
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goep/goep/ep"
	"github.com/goep/goep/ep/epgpu"
	"github.com/goep/goep/internal/mpitesting"
)

// rig is a group on the emulated device with every rank's tokens,
// for the refusal checks: T = 2 + r mod 3 tokens on rank r (so that two
// ranks send each other different numbers of rows), of Hidden H, token t
// going to experts (r+t) mod E and (r+t+R) mod E with weights 1/2 and
// 1/4, its row all r*10+t+1, so that a round's results are exact.
type rig struct {
	g       *ep.Group[float32]
	mode    ep.Mode
	R, me   int
	T, H    int
	x, out  ep.Tensor[float32]
	topk    []int32
	weights []float32
}

const refusalTimeout = time.Minute

// tokensOf is the number of tokens rank r dispatches.
func tokensOf(r int) int { return 2 + r%3 }

func newRig(t *testing.T, b ep.Backend, mode ep.Mode) *rig {
	t.Helper()
	w := mpitesting.World
	R, me := w.Size(), w.Rank()
	rg := &rig{mode: mode, R: R, me: me, T: tokensOf(me), H: 4}
	E := 2 * R
	cfg := ep.Config{Mode: mode, NumExperts: E, MaxTokensPerRank: 8, Hidden: rg.H, TopK: 2, Timeout: refusalTimeout,
		Backend: b}
	g, err := ep.NewGroup[float32](w, cfg)
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, g.Close()) })
	rg.g = g
	rows := make([]float32, rg.T*rg.H)
	for tk := 0; tk < rg.T; tk++ {
		a := (me + tk) % E
		rg.topk = append(rg.topk, int32(a), int32((a+R)%E))
		rg.weights = append(rg.weights, 0.5, 0.25)
		for c := 0; c < rg.H; c++ {
			rows[tk*rg.H+c] = float32(me*10 + tk + 1)
		}
	}
	rg.x = rg.alloc(t, rows)
	rg.out = rg.alloc(t, make([]float32, rg.T*rg.H))
	return rg
}

// alloc is a device tensor holding host, freed when the test ends.
func (rg *rig) alloc(t *testing.T, host []float32) ep.Tensor[float32] {
	t.Helper()
	x, err := ep.Alloc[float32](rg.g.Memory(), len(host))
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, ep.Free(x)) })
	require.NoError(t, ep.Upload(x, host))
	return x
}

// want is what a round with identity experts gives token tk: LL, the
// weighted sum 3/4 of its row; HT, its row once per rank it went to.
func (rg *rig) want(tk int) float32 {
	row := float32(rg.me*10 + tk + 1)
	if rg.mode == ep.LowLatency {
		return 0.75 * row
	}
	E := 2 * rg.R
	if rg.topk[2*tk]/2 == rg.topk[2*tk+1]/2 || E == 2 {
		return row
	}
	return 2 * row
}

// checkCombined checks out after a combine of identity experts.
func (rg *rig) checkCombined(t *testing.T, what string) {
	t.Helper()
	got := make([]float32, rg.T*rg.H)
	require.NoError(t, ep.Download(got, rg.out))
	for tk := 0; tk < rg.T; tk++ {
		for c := 0; c < rg.H; c++ {
			if got[tk*rg.H+c] != rg.want(tk) {
				t.Errorf("%s: out[%d][%d] = %v, want %v", what, tk, c, got[tk*rg.H+c], rg.want(tk))
				return
			}
		}
	}
}

// round is a normal dispatch and combine, checked.
func (rg *rig) round(t *testing.T, what string) {
	t.Helper()
	h, err := rg.g.Dispatch(ep.Tokens(rg.x, rg.topk, rg.weights))
	require.NoError(t, err, what)
	require.NoError(t, rg.g.Combine(h, h.Recv(), rg.out, nil), what)
	rg.checkCombined(t, what)
}

// combined is the handle of a round, for a cached dispatch. (Combined
// first: in HT, a refused dispatch overwrites the receive buffer.)
func (rg *rig) combined(t *testing.T) ep.Handle[float32] {
	t.Helper()
	h, err := rg.g.Dispatch(ep.Tokens(rg.x, rg.topk, rg.weights))
	require.NoError(t, err)
	require.NoError(t, rg.g.Combine(h, h.Recv(), rg.out, nil))
	rg.checkCombined(t, "the round before a refused cached dispatch")
	return h
}

// checkRefused checks a call's error on this rank: a refusing rank gets its
// own reason, every other rank a *RefusedError naming the lowest refusing
// rank and its reason; all of them promptly, as bad input.
func (rg *rig) checkRefused(t *testing.T, name string, err error, elapsed time.Duration, refusers map[int]string) {
	t.Helper()
	if !assert.Error(t, err, name) {
		return
	}
	assert.ErrorIs(t, err, ep.ErrBadInput, name)
	assert.Less(t, elapsed, refusalTimeout/4, "%s: the refusal took %v: it waited for a timeout", name, elapsed)
	var refused *ep.RefusedError
	if reason, mine := refusers[rg.me]; mine {
		assert.ErrorContains(t, err, reason, name)
		assert.False(t, errors.As(err, &refused), "%s: rank %d refused the call itself: %v", name, rg.me, err)
		return
	}
	first := rg.R
	for r := range refusers {
		first = min(first, r)
	}
	if assert.ErrorAs(t, err, &refused, name) {
		assert.Equal(t, first, refused.Rank, name)
		assert.Contains(t, refused.Reason, refusers[first], name)
		assert.ErrorContains(t, err, fmt.Sprintf("rank %d refused the call", first), name)
	}
}

// jittery is the emulated device with every stream operation delayed by up
// to 20 us, so that work ordered by neither its stream nor an event races.
var jittery = epgpu.NewEmulated(epgpu.EmulatorOptions{Jitter: 20 * time.Microsecond})

// The refusals the conformance suite does not make, on the device's
// protocol: cached dispatches refused with and without the handle (in HT,
// a rank without its handle sizes its part from the peers' headers),
// several ranks refusing one call (the others name the lowest), a
// refusal found in a Wait after later calls, and refusals in a row (each
// names its own rank and reason). After each, a normal round is exact.
func TestRefusalsEmulated(t *testing.T) { testRefusals(t, jittery) }

// The same over the IPC transport inside a node.
func TestRefusalsEmulatedIPC(t *testing.T) { testRefusals(t, jitteryIPC) }

var jitteryIPC = epgpu.NewEmulated(epgpu.EmulatorOptions{Jitter: 20 * time.Microsecond, IPC: true})

func testRefusals(t *testing.T, b ep.Backend) {
	w := mpitesting.World
	R, me := w.Size(), w.Rank()
	origin := R - 1
	type refusalCase struct {
		name     string
		modes    []ep.Mode
		refusers map[int]string
		call     func(t *testing.T, rg *rig) error
	}
	both := []ep.Mode{ep.LowLatency, ep.HighThroughput}
	twoRefusers := map[int]string{origin: fmt.Sprintf("len(out) = %d,", tokensOf(origin)*4+1)}
	twoRefusers[0] = "nil handle" // with one rank, rank 0 passes no handle
	cases := []refusalCase{
		{"cached dispatch, the handle known", both, map[int]string{origin: "len(weights) = 1"},
			func(t *testing.T, rg *rig) error {
				h := rg.combined(t)
				weights := rg.weights
				if me == origin {
					weights = weights[:1]
				}
				_, err := rg.g.Dispatch(ep.Reuse(h, rg.x, weights))
				return err
			}},
		{"cached dispatch, the handle unknown", both, map[int]string{origin: "nil handle"},
			func(t *testing.T, rg *rig) error {
				prev := rg.combined(t)
				if me == origin {
					prev = ep.Handle[float32]{}
				}
				_, err := rg.g.Dispatch(ep.Reuse(prev, rg.x, nil))
				return err
			}},
		{"combine refused by two ranks, one without its handle", both, twoRefusers,
			func(t *testing.T, rg *rig) error {
				h, err := rg.g.Dispatch(ep.Tokens(rg.x, rg.topk, rg.weights))
				require.NoError(t, err)
				hh, out := h, rg.out
				switch me {
				case 0:
					hh = ep.Handle[float32]{}
				case origin:
					out = rg.alloc(t, make([]float32, rg.T*rg.H+1))
				}
				err = rg.g.Combine(hh, h.Recv(), out, nil)
				if err != nil && rg.mode == ep.LowLatency { // the handle is still to combine
					require.NoError(t, rg.g.Combine(h, h.Recv(), rg.out, nil))
					rg.checkCombined(t, "the handle combined after the refusal")
				}
				return err
			}},
		{"LL dispatch refused, found in its Wait after a later combine", []ep.Mode{ep.LowLatency}, map[int]string{origin: "is out of range"},
			func(t *testing.T, rg *rig) error {
				first, err := rg.g.DispatchSend(ep.Tokens(rg.x, rg.topk, rg.weights))
				require.NoError(t, err)
				topk := rg.topk
				if me == origin {
					topk = append([]int32{int32(2 * R)}, topk[1:]...)
				}
				second, err := rg.g.DispatchSend(ep.Tokens(rg.x, topk, rg.weights))
				if me == origin {
					require.Error(t, err)
				}
				h, werr := first.Wait()
				require.NoError(t, werr)
				require.NoError(t, rg.g.Combine(h, h.Recv(), rg.out, nil)) // a later call than the refused one
				rg.checkCombined(t, "the dispatch before the refused one")
				if err == nil {
					_, err = second.Wait()
				}
				return err
			}},
	}
	for _, mode := range both {
		t.Run(mode.String(), func(t *testing.T) {
			defer mpitesting.Agree(t, w)
			rg := newRig(t, b, mode)
			for _, c := range cases {
				if !slices.Contains(c.modes, mode) {
					continue
				}
				start := time.Now()
				err := c.call(t, rg)
				rg.checkRefused(t, c.name, err, time.Since(start), c.refusers)
				rg.round(t, "a round after: "+c.name)
			}
			// Refusals in a row: each names its own rank and reason
			// (the reasons travel in order, one per refusing rank).
			for i := 0; i < 3; i++ {
				who := i % R
				h, err := rg.g.Dispatch(ep.Tokens(rg.x, rg.topk, rg.weights))
				require.NoError(t, err)
				out := rg.out
				n := tokensOf(who)*rg.H + 1 + i
				if me == who {
					out = rg.alloc(t, make([]float32, n))
				}
				start := time.Now()
				err = rg.g.Combine(h, h.Recv(), out, nil)
				name := fmt.Sprintf("refusal %d in a row", i)
				rg.checkRefused(t, name, err, time.Since(start), map[int]string{who: fmt.Sprintf("len(out) = %d,", n)})
				if mode == ep.LowLatency {
					require.NoError(t, rg.g.Combine(h, h.Recv(), rg.out, nil))
					rg.checkCombined(t, name)
				}
			}
			rg.round(t, "the last round")
		})
	}
}
