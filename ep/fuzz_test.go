package ep_test

import (
	"errors"
	"math"
	"sync"
	"testing"

	"github.com/goep/goep/ep"
	"github.com/goep/goep/internal/mpitesting"
)

// Groups of one rank that FuzzDispatchInput reuses from input to input, as
// a program reuses its group from step to step: LL and HT.
var fuzzGroups struct {
	once    sync.Once
	ll, ht  *ep.Group[float32]
	experts int // fuzzE per rank (under mpirun every rank takes the same input)
	err     error
}

const fuzzH, fuzzK, fuzzE, fuzzM = 4, 3, 8, 8

// FuzzDispatchInput feeds a group any routing and any lengths: top-k ids
// (any int8, -1 no expert), the number of ids, weights and token values. A
// dispatch either refuses with an *ep.InputError, writing nothing (the
// output keeps its sentinel) and leaving the group usable, or succeeds, and
// then the combine with identity experts gives every token its value times
// the sum of its slots' weights, exactly (small integers, dyadic weights).
// Ids out of range or repeated within a token must be refused. make test
// runs it for a bounded time; its corpus is testdata/fuzz.
func FuzzDispatchInput(f *testing.F) {
	f.Add(false, []byte{0, 1, 2, 3, 255, 4}, uint8(6), uint8(6), uint8(2))
	f.Add(true, []byte{7, 7, 1}, uint8(3), uint8(3), uint8(1))
	f.Add(true, []byte{0, 8, 255}, uint8(3), uint8(3), uint8(1))
	f.Add(false, []byte{5, 254, 3, 1, 2, 0}, uint8(6), uint8(5), uint8(2))
	f.Add(false, []byte{}, uint8(0), uint8(0), uint8(0))
	f.Fuzz(func(t *testing.T, ht bool, raw []byte, nids, nweights, ntokens uint8) {
		fuzzGroups.once.Do(func() {
			fuzzGroups.experts = fuzzE * mpitesting.World.Size()
			cfg := ep.Config{Mode: ep.LowLatency, NumExperts: fuzzGroups.experts, MaxTokensPerRank: fuzzM, Hidden: fuzzH, TopK: fuzzK}
			if fuzzGroups.ll, fuzzGroups.err = ep.NewGroup[float32](mpitesting.World, cfg); fuzzGroups.err == nil {
				cfg.Mode = ep.HighThroughput
				fuzzGroups.ht, fuzzGroups.err = ep.NewGroup[float32](mpitesting.World, cfg)
			}
		})
		if fuzzGroups.err != nil {
			t.Fatal(fuzzGroups.err)
		}
		g := fuzzGroups.ll
		if ht {
			g = fuzzGroups.ht
		}
		// The routing: ids from the bytes (int8), as many as nids asks
		// (repeating the bytes), weights k/8, tokens of small integers.
		topk := make([]int32, int(nids)%(3*fuzzM*fuzzK))
		for i := range topk {
			if len(raw) > 0 {
				topk[i] = int32(int8(raw[i%len(raw)]))
			}
		}
		weights := make([]float32, int(nweights)%(3*fuzzM*fuzzK))
		for i := range weights {
			weights[i] = float32(1+i%8) / 8
		}
		x := make([]float32, (int(ntokens)%(2*fuzzM))*fuzzH)
		for i := range x {
			x[i] = float32(i%7 - 3)
		}
		T := len(x) / fuzzH
		valid := len(topk) == T*fuzzK && len(weights) == T*fuzzK && T <= fuzzM
		for tk := 0; valid && tk < T; tk++ {
			for k := 0; k < fuzzK; k++ {
				e := topk[tk*fuzzK+k]
				valid = valid && e >= -1 && e < int32(fuzzGroups.experts)
				for j := 0; j < k && e >= 0; j++ {
					valid = valid && topk[tk*fuzzK+j] != e
				}
			}
		}
		out := make([]float32, len(x))
		for i := range out {
			out[i] = float32(math.NaN())
		}
		h, err := g.Dispatch(ep.Tokens(ep.Host(x), topk, weights))
		if err != nil {
			var ie *ep.InputError
			if !errors.As(err, &ie) {
				t.Fatalf("refused with %T, want an *ep.InputError: %v", err, err)
			}
			if valid {
				t.Fatalf("a valid routing refused: %v (topk %v, %d weights, %d tokens)", err, topk, len(weights), T)
			}
			return
		}
		if !valid {
			t.Fatalf("an invalid routing accepted: topk %v, %d weights, %d tokens", topk, len(weights), T)
		}
		y := h.Recv()
		if ht { // the experts apply the weights: each received row times the sum of its slots' weights
			rows, w := h.Recv().Host(), h.RecvWeights().Host()
			scaled := make([]float32, len(rows))
			for r := 0; r < h.NumRecv(); r++ {
				var s float32
				for k := 0; k < fuzzK; k++ {
					s += w[r*fuzzK+k]
				}
				for c := 0; c < fuzzH; c++ {
					scaled[r*fuzzH+c] = rows[r*fuzzH+c] * s
				}
			}
			y = ep.Host(scaled)
		}
		if err := g.Combine(h, y, ep.Host(out), nil); err != nil {
			t.Fatalf("combine: %v", err)
		}
		for tk := 0; tk < T; tk++ {
			var s float32
			for k := 0; k < fuzzK; k++ {
				if topk[tk*fuzzK+k] >= 0 {
					s += weights[tk*fuzzK+k]
				}
			}
			for c := 0; c < fuzzH; c++ {
				if want := x[tk*fuzzH+c] * s; out[tk*fuzzH+c] != want {
					t.Fatalf("token %d [%d] = %v, want %v (topk %v)", tk, c, out[tk*fuzzH+c], want, topk[tk*fuzzK:(tk+1)*fuzzK])
				}
			}
		}
	})
}
