package eptest

import (
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goep/goep/ep"
	"github.com/goep/goep/internal/race"
)

func itoa(i int) string { return strconv.Itoa(i) }

// Every rank makes the same bad call, so each gets its error without
// waiting for a peer; afterwards a normal round must still be right: nothing
// was written.
func (s Suite) testBadInput(t *testing.T) {
	R, me := s.Comm.Size(), s.Comm.Rank()
	for _, mode := range modes {
		t.Run(mode.String(), func(t *testing.T) {
			defer s.agree(t)
			sc := scenarios(R)[0]
			g := newGroup[float32](t, s, s.Backend, sc.config(mode))
			other := newGroup[float32](t, s, s.Backend, sc.config(mode))
			H, K, M, E := sc.hidden, sc.topk, sc.maxTok, sc.experts
			in := sc.input(me, R)
			x := upload(t, g, payload[float32](me, in.T, H))
			one := func(ids ...int32) []int32 { return ids }
			w1 := make([]float32, K)
			x1 := zeros[float32](t, g, H)
			dup := one(0, 0, -1)[:K]
			cases := []struct {
				name string
				call func() error
				want string
			}{
				{"expert id too large", func() error { _, err := g.Dispatch(ep.Tokens(x1, one(0, int32(E), -1)[:K], w1)); return err }, "topk[0][1] = " + itoa(E) + " is out of range [-1, " + itoa(E) + ")"},
				{"expert id below -1", func() error { _, err := g.Dispatch(ep.Tokens(x1, one(-2, 0, 1)[:K], w1)); return err }, "topk[0][0] = -2 is out of range"},
				{"expert repeated in a token", func() error { _, err := g.Dispatch(ep.Tokens(x1, dup, w1)); return err }, "token 0 names expert 0 twice"},
				{"more tokens than MaxTokensPerRank", func() error {
					_, err := g.Dispatch(ep.Tokens(zeros[float32](t, g, (M+1)*H), make([]int32, (M+1)*K), make([]float32, (M+1)*K)))
					return err
				}, "17 tokens exceed MaxTokensPerRank = 16"},
				{"x too short", func() error { _, err := g.Dispatch(ep.Tokens(x1.Slice(0, H-1), one(0, 1, 2)[:K], w1)); return err }, "len(x) = " + itoa(H-1)},
				{"weights too short", func() error { _, err := g.Dispatch(ep.Tokens(x1, one(0, 1, 2)[:K], w1[:K-1])); return err }, "len(weights) = " + itoa(K-1)},
				{"topk not a multiple of TopK", func() error { _, err := g.Dispatch(ep.Tokens(x1, one(0), w1)); return err }, "len(topk) = 1 is not a multiple of TopK"},
				{"layout of a bad id", func() error { _, err := g.Layout(one(0, int32(E+5), 1)[:K]); return err }, "out of range"},
				{"input with both tokens and codes", func() error {
					_, err := g.Dispatch(ep.DispatchInput[float32]{Tokens: x1, Codes: ep.Host(make([]ep.E4M3, H)), TopK: one(0, 1, 2)[:K], Weights: w1})
					return err
				}, "both Tokens and quantized rows"},
				{"zero handle", func() error { return g.Combine(ep.Handle[float32]{}, x1, x1, nil) }, "nil handle"},
				{"zero request", func() error { _, err := ep.DispatchRequest[float32]{}.Wait(); return err }, "zero or stale"},
			}
			if g.Memory() == ep.HostMemory {
				cases = append(cases, struct {
					name string
					call func() error
					want string
				}{"x in another memory", func() error {
					_, err := g.Dispatch(ep.Tokens(ep.OnDevice[float32](fakeDevice{}, 64, H), one(0, 1, 2)[:K], w1))
					return err
				}, "x is in fake memory"})
			} else {
				cases = append(cases, struct {
					name string
					call func() error
					want string
				}{"x in host memory", func() error {
					_, err := g.Dispatch(ep.Tokens(ep.Host(make([]float32, H)), one(0, 1, 2)[:K], w1))
					return err
				}, "x is in host memory"})
			}
			for _, c := range cases {
				err := c.call()
				if assert.Error(t, err, c.name) {
					assert.Contains(t, err.Error(), c.want, c.name)
					assert.ErrorIs(t, err, ep.ErrBadInput, c.name)
				}
			}
			checkHandleRefusals(t, s, g, other, mode, sc, in)

			// The refused calls wrote nothing: a normal round is still right.
			h, err := g.Dispatch(ep.Tokens(x, in.topk, in.weights))
			require.NoError(t, err)
			outg := zeros[float32](t, g, in.T*H)
			require.NoError(t, g.Combine(h, h.Recv(), outg, nil))
			checkIdentityCombine(t, s, mode, sc, in, host(t, outg))
		})
	}
}

// checkHandleRefusals checks the refusals that need a real handle, one of
// another group than the one it is used on: foreign, short outputs, options
// of the wrong mode, combined twice, buffers still in use, stale.
func checkHandleRefusals(t *testing.T, s Suite, g, other *ep.Group[float32], mode ep.Mode, sc scenario, in input) {
	t.Helper()
	H, me := sc.hidden, s.Comm.Rank()
	x2 := upload(t, other, payload[float32](me, in.T, H))
	out := zeros[float32](t, other, in.T*H)
	h2, err := other.Dispatch(ep.Tokens(x2, in.topk, in.weights))
	require.NoError(t, err)
	err = g.Combine(h2, h2.Recv(), out, nil)
	assert.ErrorContains(t, err, "belongs to another group")
	err = other.Combine(h2, h2.Recv().Slice(0, 1), out, nil)
	assert.ErrorContains(t, err, "len(y) = 1")
	err = other.Combine(h2, h2.Recv(), zeros[float32](t, other, in.T*H+1), nil)
	assert.ErrorContains(t, err, "len(out) = ")
	err = other.Combine(h2, h2.Recv(), out, &ep.CombineOptions{RowValues: upload(t, other, []float32{1})})
	assert.ErrorContains(t, err, "set both RowValues and SlotValues")
	if mode == ep.HighThroughput {
		err = other.Combine(h2, h2.Recv(), out, &ep.CombineOptions{WeightsOverride: in.weights})
		assert.ErrorContains(t, err, "WeightsOverride is for LL mode")
	}
	require.NoError(t, other.Combine(h2, h2.Recv(), out, nil))
	if mode == ep.LowLatency {
		err = other.Combine(h2, h2.Recv(), out, nil)
		assert.ErrorContains(t, err, "already been combined")
		// Two dispatches may wait for their combine; a third is refused.
		a, err := other.Dispatch(ep.Tokens(x2, in.topk, in.weights))
		require.NoError(t, err)
		b, err := other.Dispatch(ep.Tokens(x2, in.topk, in.weights))
		require.NoError(t, err)
		_, err = other.Dispatch(ep.Tokens(x2, in.topk, in.weights))
		assert.ErrorContains(t, err, "two LL dispatches are already waiting")
		require.NoError(t, other.Combine(a, a.Recv(), out, nil))
		require.NoError(t, other.Combine(b, b.Recv(), out, nil))
	} else {
		// A later dispatch overwrote the receive buffer h2.Recv() points to.
		h3, err := other.Dispatch(ep.Tokens(x2, in.topk, in.weights))
		require.NoError(t, err)
		if h3.NumRecv() > 0 {
			err = other.Combine(h2, h2.Recv(), out, nil)
			assert.ErrorContains(t, err, "a later dispatch has overwritten")
		}
		require.NoError(t, other.Combine(h3, h3.Recv(), out, nil))
	}
	// A handle whose record was reused by later dispatches is stale.
	for i := 0; i < 8; i++ {
		h, err := other.Dispatch(ep.Tokens(x2, in.topk, in.weights))
		require.NoError(t, err)
		require.NoError(t, other.Combine(h, h.Recv(), out, nil))
	}
	_, err = other.Dispatch(ep.Reuse(h2, x2, nil))
	assert.ErrorContains(t, err, "the handle is stale")
	// An input whose routing would come from both a handle and top-k ids
	// (a token's worth on every rank, whatever its tokens).
	both := ep.Reuse(h2, x2, nil)
	both.TopK = make([]int32, sc.topk)
	_, err = other.Dispatch(both)
	assert.ErrorContains(t, err, "both TopK and Reuse")
	assert.ErrorIs(t, err, ep.ErrBadInput)
	assert.True(t, h2.Recv().IsZero(), "a stale handle's views are empty")
}

// fakeDevice is a Memory that is not the backend's, to check refusals.
type fakeDevice struct{}

func (fakeDevice) String() string                                 { return "fake" }
func (fakeDevice) Alloc(int) (ep.Tensor[byte], error)             { return ep.Tensor[byte]{}, errors.New("fake") }
func (fakeDevice) Free(ep.Tensor[byte]) error                     { return nil }
func (fakeDevice) Upload(ep.Tensor[byte], []byte) error           { return errors.New("fake") }
func (fakeDevice) Download(dst []byte, src ep.Tensor[byte]) error { return errors.New("fake") }

func (s Suite) testInvalidConfigs(t *testing.T) {
	defer s.agree(t)
	w := s.Comm
	R := w.Size()
	good := ep.Config{Mode: ep.LowLatency, NumExperts: 2 * R, MaxTokensPerRank: 4, Hidden: 8, TopK: 2, Backend: s.Backend}
	type badConfig struct {
		name string
		edit func(*ep.Config)
		want string
	}
	cases := []badConfig{
		{"no mode", func(c *ep.Config) { c.Mode = 0 }, "choose ep.LowLatency or ep.HighThroughput"},
		{"top-k above experts", func(c *ep.Config) { c.TopK = 2*R + 1 }, "TopK = " + itoa(2*R+1)},
		{"zero hidden", func(c *ep.Config) { c.Hidden = 0 }, "Hidden = 0"},
		{"zero tokens", func(c *ep.Config) { c.MaxTokensPerRank = 0 }, "MaxTokensPerRank = 0"},
		{"unknown wire format", func(c *ep.Config) { c.Wire = 7 }, "Wire = WireFormat(7): choose one of ep.WireNative, ep.WireFP8, "},
	}
	if R > 1 { // with one rank every expert count divides
		cases = append(cases, badConfig{"experts not a multiple of ranks", func(c *ep.Config) { c.NumExperts = 2*R + 1 },
			"not a multiple of the " + itoa(R) + " ranks"})
	}
	for _, tc := range cases {
		cfg := good
		tc.edit(&cfg)
		_, err := ep.NewGroup[float32](w, cfg)
		if assert.Error(t, err, tc.name) {
			assert.Contains(t, err.Error(), tc.want, tc.name)
		}
	}
	if R > 1 {
		cfg := good
		if w.Rank() == R-1 {
			cfg.Hidden = 16
		}
		_, err := ep.NewGroup[float32](w, cfg)
		require.Error(t, err, "every rank must see the mismatch")
		assert.Contains(t, err.Error(), "ranks passed different configs")
		assert.Contains(t, err.Error(), "rank "+itoa(R-1)+" has Hidden = 16, rank 0 has 8")
		// element types differ
		if w.Rank() == R-1 {
			_, err = ep.NewGroup[ep.BF16](w, good)
		} else {
			_, err = ep.NewGroup[float32](w, good)
		}
		assert.ErrorContains(t, err, "element type = bfloat16, rank 0 has float32")
	}
}

func (s Suite) testUseAfterClose(t *testing.T) {
	defer s.agree(t)
	w := s.Comm
	sc := scenarios(w.Size())[1]
	cfg := sc.config(ep.HighThroughput)
	cfg.Backend = s.Backend
	g, err := ep.NewGroup[float32](w, cfg)
	require.NoError(t, err)
	in := sc.input(w.Rank(), w.Size())
	x, err := ep.Alloc[float32](g.Memory(), in.T*sc.hidden)
	require.NoError(t, err)
	defer func() { assert.NoError(t, ep.Free(x)) }()
	out, err := ep.Alloc[float32](g.Memory(), in.T*sc.hidden)
	require.NoError(t, err)
	defer func() { assert.NoError(t, ep.Free(out)) }()
	h, err := g.Dispatch(ep.Tokens(x, in.topk, in.weights))
	require.NoError(t, err)
	require.NoError(t, g.Combine(h, h.Recv(), out, nil))
	require.NoError(t, g.Close())
	_, err = g.Dispatch(ep.Tokens(x, in.topk, in.weights))
	assert.ErrorIs(t, err, ep.ErrClosed)
	err = g.Combine(h, x, out, nil)
	assert.ErrorIs(t, err, ep.ErrClosed)
	_, err = g.Layout(in.topk)
	assert.ErrorIs(t, err, ep.ErrClosed)
	assert.NoError(t, g.Close(), "closing twice is harmless")
}

// stallTimeout is the group's timeout in testStalledRank: it also bounds
// NewGroup's collectives and how far apart the ranks may reach the
// barrier after the stall, which the race detector's slowdown and other
// jobs on a loaded machine stretch (500 ms once failed).
const stallTimeout = race.Slowdown * 2 * time.Second

// The last rank stops taking part: the others get a timeout within the
// group's timeout, naming it and its host where the backend declares
// ep.FeatureNamedTimeouts (else the stalled rank or -1), and the group
// refuses further work.
func (s Suite) testStalledRank(t *testing.T) {
	w := s.Comm
	R, me := w.Size(), w.Rank()
	if R < 2 {
		t.Skip("needs a second rank to stall: run under mpirun with 2 or more ranks")
	}
	for _, mode := range modes {
		t.Run(mode.String(), func(t *testing.T) {
			defer s.agree(t)
			sc := scenarios(R)[1]
			cfg := sc.config(mode)
			cfg.Timeout = stallTimeout
			cfg.Backend = s.Backend
			g, err := ep.NewGroup[float32](w, cfg)
			require.NoError(t, err)
			in := sc.input(me, R)
			x := upload(t, g, payload[float32](me, in.T, sc.hidden))
			if me != R-1 {
				start := time.Now()
				_, err := g.Dispatch(ep.Tokens(x, in.topk, in.weights))
				elapsed := time.Since(start)
				require.Error(t, err)
				assert.True(t, errors.Is(err, ep.ErrTimeout), "want a timeout, got %v", err)
				var te *ep.TimeoutError
				if assert.ErrorAs(t, err, &te) {
					if !s.declares(ep.FeatureNamedTimeouts) {
						assert.Contains(t, []int{-1, R - 1}, te.Peer, "the stalled rank, or -1: %v", err)
					} else {
						assert.Equal(t, R-1, te.Peer, "the stalled rank is named: %v", err)
						assert.Equal(t, g.Stats().Hosts[R-1], te.Host, "and its host: %v", err)
						assert.Contains(t, err.Error(), "on host "+te.Host)
					}
				}
				assert.GreaterOrEqual(t, elapsed, cfg.Timeout, "it waited for the stalled rank")
				_, err = g.Dispatch(ep.Tokens(x, in.topk, in.weights))
				assert.ErrorContains(t, err, "unusable after an earlier failure")
			} else {
				time.Sleep(cfg.Timeout + time.Second) // stalled, out of MPI, well past the others' timeout
			}
			// Everybody meets again before the collective Close.
			require.NoError(t, w.Barrier())
			require.NoError(t, g.Close())
		})
	}
}

// Steady-state dispatch+combine cycles allocate nothing, in both modes,
// fresh and cached, and in FP8 where the backend declares it.
func (s Suite) testZeroAllocs(t *testing.T) {
	R, me := s.Comm.Size(), s.Comm.Rank()
	wires := []ep.WireFormat{ep.WireNative}
	if s.declares(ep.FeatureFP8Wire) {
		wires = append(wires, ep.WireFP8)
	}
	for _, mode := range modes {
		for _, wire := range wires {
			t.Run(mode.String()+"/"+wire.String(), func(t *testing.T) { checkZeroAllocs(t, s, mode, wire, scenarios(R)[1], me) })
		}
		if R > 1 {
			t.Run(mode.String()+"/late-peer", func(t *testing.T) { checkLatePeerAllocs(t, s, mode, scenarios(R)[1], me) })
		}
	}
}

// latePeerDelay is how late rank 0 comes to each call in checkLatePeerAllocs:
// past the 5 ms after which a wait sleeps between its sweeps.
const latePeerDelay = 8 * time.Millisecond

// checkLatePeerAllocs: the waits for a peer that comes late allocate nothing
// either, on the slow path they take then (sleeping between sweeps), the
// first time too. Rank 0 sleeps before each call measured, so every other
// rank waits for it, on a goroutine that has not waited as long before
// (each subtest has its own). The count is
// every allocation of the rounds measured, not an average over them, which
// would round one allocation in several rounds down to zero (engineAllocs).
func checkLatePeerAllocs(t *testing.T, s Suite, mode ep.Mode, sc scenario, me int) {
	defer s.agree(t)
	g := newGroup[ep.BF16](t, s, s.Backend, sc.config(mode))
	in := sc.input(me, s.Comm.Size())
	x := upload(t, g, payload[ep.BF16](me, in.T, sc.hidden))
	out := zeros[ep.BF16](t, g, in.T*sc.hidden)
	var failed error
	lateNow := false // the rounds that fill the buffers come on time: a wait's first slow path is measured
	late := func() {
		if me == 0 && lateNow {
			time.Sleep(latePeerDelay)
		}
	}
	cycle := func() {
		late()
		h, err := g.Dispatch(ep.Tokens(x, in.topk, in.weights))
		if err == nil {
			late()
			err = g.Combine(h, h.Recv(), out, nil)
		}
		if err != nil && failed == nil {
			failed = err
		}
	}
	for i := 0; i < 2*8; i++ { // fill the handle ring and every buffer
		cycle()
	}
	if me == 0 {
		time.Sleep(time.Microsecond) // Sleep gives this goroutine a timer the first time: not in what is measured
	}
	lateNow = true
	n, where := engineAllocs(func() {
		for i := 0; i < 4; i++ {
			cycle()
		}
	})
	require.NoError(t, failed)
	assert.Zero(t, n, "allocations of 4 dispatch+combine rounds, rank 0 late to each call, at:\n%s", where)
	checkRound(t, mode, sc, in, me, s.Comm.Size(), host(t, out))
}

func checkZeroAllocs(t *testing.T, s Suite, mode ep.Mode, wire ep.WireFormat, sc scenario, me int) {
	defer s.agree(t)
	cfg := sc.config(mode)
	cfg.Wire = wire
	g := newGroup[ep.BF16](t, s, s.Backend, cfg)
	in := sc.input(me, s.Comm.Size())
	x := upload(t, g, payload[ep.BF16](me, in.T, sc.hidden))
	out := zeros[ep.BF16](t, g, in.T*sc.hidden)
	var failed error
	cycle := func() {
		h, err := g.Dispatch(ep.Tokens(x, in.topk, in.weights))
		if err == nil {
			y := h.Recv() // in place
			if wire.FP8() {
				y = h.CombineBuffer()
			}
			err = g.Combine(h, y, out, nil)
		}
		if err == nil {
			h, err = g.Dispatch(ep.Reuse(h, x, nil))
		}
		if err == nil {
			err = g.Combine(h, h.CombineBuffer(), out, nil)
		}
		if err != nil && failed == nil {
			failed = err
		}
	}
	for i := 0; i < 2*8; i++ { // fill the handle ring and every buffer
		cycle()
	}
	n, where := engineAllocs(func() {
		for i := 0; i < 20; i++ {
			cycle()
		}
	})
	require.NoError(t, failed)
	assert.Zero(t, n, "allocations of 20 dispatch+combine+cached dispatch+combine cycles, at:\n%s", where)
}
