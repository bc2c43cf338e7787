package moe_test

import (
	"path/filepath"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goep/goep/ep"
	"github.com/goep/goep/internal/mpitesting"
	"github.com/goep/goep/moe"
)

// Run writes a trace with a row per step and the checkpoints it was asked
// for; a second Run resumed from the middle checkpoint ends with the same
// final checkpoint, bit for bit, and the same losses in its trace.
func TestRunTraceCheckpointsResume(t *testing.T) {
	w := mpitesting.World
	R := w.Size()
	defer mpitesting.Agree(t, w)
	const N = 10
	dir := tempDir(t, w)
	o := moe.RunOptions{TrainConfig: smallConfig(ep.HighThroughput, moe.Float32), Steps: 2 * N,
		TracePath: filepath.Join(dir, "a", "trace.h5"), CheckpointDir: filepath.Join(dir, "a"), CheckpointEvery: N,
		Nodes: 1, Command: "test"}
	calls := 0
	o.OnStep = func(*moe.StepStats) { calls++ }
	res, err := moe.Run(w, o)
	require.NoError(t, err)
	assert.Equal(t, 2*N, calls)
	assert.Equal(t, int64(2*N), res.Steps)
	assert.Equal(t, int64(1), res.First.Step)
	assert.Equal(t, int64(2*N), res.Last.Step)
	assert.Equal(t, int64(2*N*32*R), res.Tokens)
	assert.Positive(t, res.TokensPerSecond())

	b := o
	b.TracePath, b.CheckpointDir, b.OnStep = filepath.Join(dir, "b", "trace.h5"), filepath.Join(dir, "b"), nil
	b.Resume = moe.CheckpointPath(o.CheckpointDir, N)
	resB, err := moe.Run(w, b)
	require.NoError(t, err)
	assert.Equal(t, int64(N), resB.Steps)
	assert.Equal(t, res.Last.Loss, resB.Last.Loss)

	if w.Rank() != 0 {
		assert.Empty(t, res.Files)
		return
	}
	assert.Equal(t, []string{o.TracePath, moe.CheckpointPath(o.CheckpointDir, N), moe.CheckpointPath(o.CheckpointDir, 2*N)}, res.Files)
	tr, err := moe.ReadTrace(o.TracePath)
	require.NoError(t, err)
	assert.Equal(t, o.TrainConfig, tr.Config)
	assert.Equal(t, R, tr.WorldSize)
	assert.Equal(t, moe.TraceVersion, tr.Version)
	require.Len(t, tr.Step, 2*N)
	for i := range tr.Step {
		assert.Equal(t, int64(i+1), tr.Step[i])
		sum := int64(0)
		for _, c := range tr.TokensPerExpert[i*8 : (i+1)*8] {
			sum += c
		}
		assert.Equal(t, int64(32*R*2), sum, "step %d: pairs over experts", i+1)
		if i > 0 {
			assert.GreaterOrEqual(t, tr.WallTime[i], tr.WallTime[i-1])
		}
	}
	require.Len(t, tr.DispatchUS, 2*N*R)
	require.Len(t, tr.BytesSent, 2*N*R)
	for i, v := range tr.DispatchUS {
		assert.Positive(t, v, "dispatch_us[%d][%d]", i/R, i%R)
		assert.Positive(t, tr.CombineUS[i], "combine_us[%d][%d]", i/R, i%R)
		if R > 1 {
			assert.Positive(t, tr.BytesSent[i], "bytes_sent[%d][%d]", i/R, i%R)
		} else {
			assert.Zero(t, tr.BytesSent[i])
		}
	}

	trB, err := moe.ReadTrace(b.TracePath)
	require.NoError(t, err)
	assert.Equal(t, int64(N), trB.StartStep)
	assert.Equal(t, b.Resume, trB.ResumedFrom)
	assert.Equal(t, tr.Step[N:], trB.Step)
	assert.Equal(t, tr.Loss[N:], trB.Loss, "losses after the resume")
	assert.Equal(t, tr.TokensPerExpert[N*8:], trB.TokensPerExpert)

	ckA, err := moe.ReadCheckpoint(moe.CheckpointPath(o.CheckpointDir, 2*N))
	require.NoError(t, err)
	ckB, err := moe.ReadCheckpoint(moe.CheckpointPath(b.CheckpointDir, 2*N))
	require.NoError(t, err)
	assert.True(t, paramsEqual(&ckA.Model, &ckB.Model), "final models differ")
	assert.True(t, paramsEqual(&ckA.AdamM, &ckB.AdamM) && paramsEqual(&ckA.AdamV, &ckB.AdamV), "final Adam states differ")
	assert.True(t, slices.Equal(ckA.Model.W2, ckB.Model.W2))
}

// Errors that every rank meets at the same point are CollectiveErrors: a
// bad config, a resume past the end.
func TestRunCollectiveErrors(t *testing.T) {
	w := mpitesting.World
	defer mpitesting.Agree(t, w)
	o := moe.RunOptions{TrainConfig: smallConfig(ep.LowLatency, moe.Float32), Steps: 2}
	o.TopK = 20
	_, err := moe.Run(w, o)
	var ce *moe.CollectiveError
	require.ErrorAs(t, err, &ce)
	assert.Contains(t, err.Error(), "topk = 20")

	dir := tempDir(t, w)
	o = moe.RunOptions{TrainConfig: smallConfig(ep.LowLatency, moe.Float32), Steps: 2, CheckpointDir: dir}
	_, err = moe.Run(w, o)
	require.NoError(t, err)
	o.Resume = moe.CheckpointPath(dir, 2)
	_, err = moe.Run(w, o)
	require.ErrorAs(t, err, &ce)
	assert.Contains(t, err.Error(), "nothing to do")
}
