package serve_test

import (
	"fmt"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goep/goep/ep"
	"github.com/goep/goep/internal/mpitesting"
	"github.com/goep/goep/moe"
	"github.com/goep/goep/moe/serve"
)

// The tests run on one rank with go test, and on every rank of an MPI job
// under the mpitest harness (make test-mpi); every test is collective.
func TestMain(m *testing.M) { mpitesting.Main(m) }

// small is a model and workload that run in a fraction of a second: more
// requests than fit at once (continuous batching), prompts longer than a
// prefill step takes (chunked prefill), a shared expert.
func small() (serve.Config, serve.Workload) {
	cfg := serve.Config{
		Model: serve.ModelConfig{Layers: 2, Vocab: 64, Hidden: 16, FFN: 24, SharedFFN: 8, Experts: 8, TopK: 2,
			Act: moe.SiLU, Seed: 5},
		DType: moe.Float32, Batch: 3, Prefill: ep.LowLatency, PrefillTokens: 6,
		Timeout: 30 * time.Second, ControlTimeout: time.Minute,
	}
	w := serve.Workload{Requests: 14, Rate: 0, PromptMin: 2, PromptMax: 13, GenMin: 1, GenMax: 7, Seed: 9}
	return cfg, w
}

// reference decodes every request of w alone (serve.Reference).
func reference(t *testing.T, cfg serve.Config, w serve.Workload) ([][]int32, []uint64) {
	t.Helper()
	m, err := serve.NewModel(cfg.Model, 0, cfg.Model.Experts, nil)
	require.NoError(t, err)
	arr := w.Arrivals()
	toks, hashes := make([][]int32, w.Requests), make([]uint64, w.Requests)
	for i := range toks {
		toks[i], hashes[i], err = serve.Reference(m, cfg.DType, w.Request(i, arr, cfg.Model.Vocab))
		require.NoError(t, err)
	}
	return toks, hashes
}

// Every configuration serves every request exactly as the reference
// decodes it alone: the same tokens and the same bits in every logit (the
// hash), with and without the two-batch overlap, prompts through LL or
// HT, at every number of ranks and nodes the harness runs.
func TestServeMatchesReference(t *testing.T) {
	world := mpitesting.World
	base, w := small()
	var want [][]int32
	var wantHash []uint64
	if world.Rank() == 0 {
		want, wantHash = reference(t, base, w)
	}
	for _, tc := range []struct {
		prefill ep.Mode
		overlap bool
		dtype   moe.DType
	}{
		{ep.LowLatency, true, moe.Float32}, {ep.LowLatency, false, moe.Float32},
		{ep.HighThroughput, true, moe.Float32}, {ep.HighThroughput, false, moe.Float32},
		{ep.LowLatency, true, moe.BFloat16},
	} {
		t.Run(fmt.Sprintf("prefill-%v/overlap-%v/%v", tc.prefill, tc.overlap, tc.dtype), func(t *testing.T) {
			defer mpitesting.Agree(t, world)
			cfg := base
			cfg.Prefill, cfg.Overlap, cfg.DType = tc.prefill, tc.overlap, tc.dtype
			res, err := serve.Serve(world, cfg, serve.Options{Workload: w})
			require.NoError(t, err)
			if world.Rank() != 0 {
				assert.Nil(t, res)
				return
			}
			require.NotNil(t, res)
			wt, wh := want, wantHash
			if tc.dtype != moe.Float32 {
				wt, wh = reference(t, cfg, w)
			}
			require.Len(t, res.Requests, w.Requests)
			for i, q := range res.Requests {
				assert.Equal(t, wt[i], q.Tokens, "request %d (rank %d): tokens", i, q.Rank)
				assert.Equal(t, wh[i], q.Hash, "request %d (rank %d): logits", i, q.Rank)
				assert.Equal(t, q.Gen, len(q.Tokens), "request %d", i)
				assert.Zero(t, q.DroppedPairs)
				assert.LessOrEqual(t, q.AdmittedUS, q.FirstTokenUS)
				assert.LessOrEqual(t, q.FirstTokenUS, q.DoneUS)
			}
			checkBatching(t, res, cfg, world.Size())
		})
	}
}

// checkBatching checks the steps of a run: tokens per rank within the
// limits, prompts chunked, requests joining as others leave, and at more
// than one rank some steps where a rank has nothing while another runs.
func checkBatching(t *testing.T, res *serve.Result, cfg serve.Config, R int) {
	t.Helper()
	f := res.Figures()
	assert.Equal(t, R, res.Ranks)
	assert.Len(t, res.Hosts, R)
	assert.Positive(t, f.Decode.N)
	assert.Positive(t, f.Prefill.N)
	assert.Zero(t, f.StepsShort)
	emitted, idleBeside := 0, false
	for _, s := range res.Steps {
		limit := cfg.Batch
		if s.Kind == "prefill" {
			limit = cfg.PrefillTokens
		}
		zero, busy := false, false
		for r, n := range s.Rows {
			require.GreaterOrEqual(t, n, 0, "step %d rank %d took part", s.Step, r)
			assert.LessOrEqual(t, n, limit, "step %d (%s) rank %d", s.Step, s.Kind, r)
			emitted += s.Emitted[r]
			zero, busy = zero || n == 0, busy || n > 0
		}
		idleBeside = idleBeside || (zero && busy)
	}
	assert.Equal(t, f.Tokens, emitted)
	if R > 1 {
		assert.True(t, idleBeside, "some step has a rank with no tokens beside one with some")
	}
	// Continuous batching: some request was taken after another finished.
	joined := false
	for _, a := range res.Requests {
		for _, b := range res.Requests {
			joined = joined || (a.Rank == b.Rank && b.AdmittedUS >= a.DoneUS)
		}
	}
	assert.True(t, joined, "a request joined its rank's batch after another left it")
	// The overlap is real: on rank 0, in some layer, micro-batch 1's attention
	// ran while micro-batch 0's dispatch was in flight (after its send,
	// before its wait), or without overlap, there is one micro-batch.
	mbs := map[int]bool{}
	for _, e := range res.Events {
		mbs[e.MB] = true
	}
	if cfg.Overlap {
		assert.Len(t, mbs, 2)
		assert.True(t, interleaved(res), "an attention of micro-batch 1 between micro-batch 0's dispatch send and wait")
	} else {
		assert.Len(t, mbs, 1)
	}
}

// interleaved looks, on rank 0, for micro-batch 1's attention between
// micro-batch 0's dispatch send and its wait, in the same step and layer.
func interleaved(res *serve.Result) bool {
	type key struct {
		step  int64
		layer int
	}
	sent, waited := map[key]float64{}, map[key]float64{}
	var attn []serve.Event
	for _, e := range res.Events {
		k := key{e.Step, e.Layer}
		switch {
		case e.Rank != 0:
		case e.MB == 0 && e.Phase == serve.PhaseDispatchSend:
			sent[k] = e.FinishUS
		case e.MB == 0 && e.Phase == serve.PhaseDispatchWait:
			waited[k] = e.StartUS
		case e.MB == 1 && e.Phase == serve.PhaseAttention:
			attn = append(attn, e)
		}
	}
	for _, e := range attn {
		k := key{e.Step, e.Layer}
		if s, ok := sent[k]; ok && e.StartUS >= s && e.FinishUS <= waited[k] {
			return true
		}
	}
	return false
}

// stallAfter returns a BeforeStep that, at the first step at least after
// from its first call in which the rank holds requests, stops this process
// (SIGSTOP) for d, with a helper that resumes it (SIGCONT), as a debugger
// or the kernel's swapping would.
func stallAfter(t *testing.T, after, d time.Duration) func(int64, int) {
	var first time.Time
	done := false
	return func(_ int64, held int) {
		if first.IsZero() {
			first = time.Now()
		}
		if done || held == 0 || time.Since(first) < after {
			return
		}
		done = true
		cont := exec.Command("sh", "-c", fmt.Sprintf("sleep %.3f; kill -CONT %d", d.Seconds(), os.Getpid()))
		require.NoError(t, cont.Start())
		require.NoError(t, syscall.Kill(os.Getpid(), syscall.SIGSTOP))
		require.NoError(t, cont.Wait())
	}
}

// With MaskStalled, a rank stopped mid-run (SIGSTOP, then SIGCONT) is
// masked after the timeout and the others serve on without it: the
// requests that arrive meanwhile go to them, their tokens' pairs routed to
// its experts are dropped and counted, the step that waited for it shows
// the timeout. When it comes back it rejoins (SetMask) and serves its
// requests on from where they stood. Every request is served in full;
// those that lost no pair, the stalled rank's among them, exactly as the
// reference decodes them. The last rank stalls, then rank 0 (the
// scheduler) does. On one rank nothing can stall: masking masks nobody and
// changes nothing.
func TestServeMasksStalledRank(t *testing.T) {
	world := mpitesting.World
	R, me := world.Size(), world.Rank()
	cfg, w := small()
	// The timeout bounds every wait of the group, NewGroup's too: long
	// enough for 4 ranks on 2 cores shared with other jobs (500 ms failed
	// NewGroup at load 19), and the stall well past it.
	cfg.MaskStalled, cfg.Timeout = true, 2*time.Second
	w.Requests, w.Rate, w.GenMin, w.GenMax = 24, 12, 4, 12
	var want [][]int32
	var wantHash []uint64
	if me == 0 {
		want, wantHash = reference(t, cfg, w)
	}
	const after, stall = 150 * time.Millisecond, 5 * time.Second
	victims := []int{R - 1, 0}
	if R == 1 {
		victims = []int{-1}
	}
	for _, victim := range victims {
		t.Run(fmt.Sprintf("victim-%d", victim), func(t *testing.T) {
			defer mpitesting.Agree(t, world)
			opt := serve.Options{Workload: w}
			var notes []string
			opt.OnNote = func(s string) { notes = append(notes, s) }
			if me == victim {
				opt.BeforeStep = stallAfter(t, after, stall)
			}
			res, err := serve.Serve(world, cfg, opt)
			require.NoError(t, err)
			if me != 0 {
				return
			}
			f := res.Figures()
			clean := 0
			for i, q := range res.Requests {
				require.Len(t, q.Tokens, q.Gen, "request %d served in full", i)
				if q.DroppedPairs > 0 {
					continue
				}
				clean++
				assert.Equal(t, want[i], q.Tokens, "request %d (rank %d, nothing dropped): tokens", i, q.Rank)
				assert.Equal(t, wantHash[i], q.Hash, "request %d (rank %d, nothing dropped): logits", i, q.Rank)
			}
			assert.Equal(t, f.DegradedRequests, w.Requests-clean)
			if victim < 0 {
				assert.Empty(t, res.Masking)
				assert.Zero(t, f.DroppedPairs)
				assert.Zero(t, f.StepsShort)
				return
			}
			t.Logf("notes: %q", notes)
			require.Len(t, res.Masking, 1, "one rank masked once: %+v", res.Masking)
			mk := res.Masking[0]
			assert.Equal(t, victim, mk.Rank)
			require.Positive(t, mk.RejoinedAt, "it rejoined")
			assert.Greater(t, mk.RejoinedAt, mk.MaskedAt)
			spike := res.Steps[mk.MaskedAt-1]
			assert.GreaterOrEqual(t, spike.LatencyUS(), float64(cfg.Timeout.Microseconds()), "the step that masked it waited the timeout")
			assert.Equal(t, -1, spike.Rows[victim], "it did not finish the step it stalled in")
			served, short := 0, 0
			for _, s := range res.Steps[mk.MaskedAt : mk.RejoinedAt-1] { // while it was masked
				short++
				assert.Equal(t, -1, s.Rows[victim], "step %d: the masked rank takes no part", s.Step)
				for r := range s.Rows {
					if r != victim {
						served += s.Emitted[r]
						assert.Equal(t, 1, s.Masked[r], "step %d rank %d", s.Step, r)
					}
				}
			}
			for _, s := range res.Steps[mk.RejoinedAt-1:] {
				assert.Equal(t, R, s.TookPart(), "step %d, after the rejoin", s.Step)
				for r := range s.Rows {
					assert.Zero(t, s.Dropped[r], "step %d rank %d, after the rejoin", s.Step, r)
					assert.Zero(t, s.Masked[r], "step %d rank %d, after the rejoin", s.Step, r)
				}
			}
			resumed := 0
			for i, q := range res.Requests {
				if q.Rank == victim {
					assert.Zero(t, q.DroppedPairs, "request %d of the stalled rank: redone from where it stood", i)
					if q.AdmittedUS < mk.MaskedAtUS && q.DoneUS > mk.RejoinedAtUS {
						resumed++
					}
				}
			}
			t.Logf("masked in step %d, rejoined in step %d: %d steps without it, %d tokens served by the others meanwhile; %d pairs dropped, %d of %d requests degraded; %d requests of the stalled rank resumed",
				mk.MaskedAt, mk.RejoinedAt, short, served, f.DroppedPairs, f.DegradedRequests, w.Requests, resumed)
			assert.Positive(t, resumed, "the stalled rank held requests, and finished them after it rejoined")
			checkTrace(t, res)
			assert.Positive(t, clean, "some requests lost nothing")
			if victim != 0 {
				assert.Positive(t, served, "the others served on while it was stopped")
				assert.Positive(t, f.DroppedPairs, "their pairs routed to its experts were dropped")
			}
		})
	}
}
