package moe_test

import (
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goep/goep/ep"
	"github.com/goep/goep/moe"
)

// The building blocks put together give the teacher's forward pass: route,
// run each chosen expert, sum with the weights (float32 here, float64 in
// the teacher), add the shared expert. TeacherParams draws any share of the
// teacher's experts identically.
func TestBuildingBlocksMakeTheTeacher(t *testing.T) {
	cfg := moe.Config{Mode: ep.LowLatency, DType: moe.Float32, Experts: 6, TopK: 2, Hidden: 8, FFN: 12, Tokens: 5,
		Act: moe.GELU, SharedFFN: 4}
	const seed = 7
	teacher := moe.NewTeacher(cfg, seed)
	all := teacher.Params()
	x, _ := moe.Batch(cfg, teacher, 3, 1, 0, 1)
	want := teacher.Forward(x)

	H, K, T := cfg.Hidden, cfg.TopK, cfg.Tokens
	topk, w := make([]int32, T*K), make([]float32, T*K)
	moe.Route(all.Gate, x, H, cfg.Experts, K, topk, w)
	got := make([]float64, T*H)
	all.SharedForward(cfg, x, got)
	row := make([]float64, H)
	for tk := 0; tk < T; tk++ {
		for k := 0; k < K; k++ {
			e := int(topk[tk*K+k])
			share := moe.TeacherParams(cfg, seed, e, 1) // expert e alone
			share.ExpertForward(cfg, 0, x[tk*H:(tk+1)*H], row)
			for j, v := range row {
				got[tk*H+j] += float64(w[tk*K+k]) * v
			}
		}
	}
	for i := range want {
		require.InDelta(t, want[i], got[i], 1e-6*(1+math.Abs(want[i])), "element %d", i)
	}

	share := moe.TeacherParams(cfg, seed, 2, 3)
	assert.Equal(t, all.Gate, share.Gate)
	assert.Equal(t, all.SharedW1, share.SharedW1)
	n := cfg.Hidden * cfg.FFN
	assert.Equal(t, all.W1[2*n:5*n], share.W1, "experts 2..4")
	assert.Equal(t, all.B2[2*H:5*H], share.B2)
}
