package moe_test

import (
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goep/goep/ep"
	"github.com/goep/goep/moe"
)

// A step's global batch is one stretch of a token stream, whatever the
// number of ranks: the shares of R ranks of T tokens, put end to end, are the
// batch of one rank of R*T tokens, and consecutive steps are consecutive
// stretches. Another seed gives other data.
func TestBatchIsCutFromOneTokenStream(t *testing.T) {
	cfg := smallConfig(ep.LowLatency, moe.Float32).Config
	const G = 24 // tokens per step over all ranks
	whole := cfg
	whole.Tokens = 2 * G // two steps' worth in one batch of step 1
	teacher := moe.NewTeacher(cfg, 2)
	stream, streamTarget := moe.Batch(whole, teacher, 7, 1, 0, 1)
	for _, ranks := range []int{1, 2, 3, 4, 6, 8, 12} {
		c := cfg
		c.Tokens = G / ranks
		for step := int64(1); step <= 2; step++ {
			var x, y []float64
			for r := 0; r < ranks; r++ {
				xr, yr := moe.Batch(c, teacher, 7, step, r, ranks)
				require.Len(t, xr, c.Tokens*c.Hidden)
				x, y = append(x, xr...), append(y, yr...)
			}
			lo, hi := int(step-1)*G*cfg.Hidden, int(step)*G*cfg.Hidden
			assert.True(t, slices.Equal(stream[lo:hi], x), "%d ranks, step %d: tokens differ from the stream", ranks, step)
			assert.True(t, slices.Equal(streamTarget[lo:hi], y), "%d ranks, step %d: targets differ", ranks, step)
		}
	}
	other, _ := moe.Batch(whole, teacher, 8, 1, 0, 1)
	assert.False(t, slices.Equal(stream, other), "seed 8 draws the same tokens as seed 7")
	// Values of a standard normal: mean near 0, variance near 1.
	sum, sq := 0.0, 0.0
	for _, v := range stream {
		sum, sq = sum+v, sq+v*v
	}
	n := float64(len(stream))
	assert.InDelta(t, 0, sum/n, 0.1)
	assert.InDelta(t, 1, sq/n, 0.15)
}
