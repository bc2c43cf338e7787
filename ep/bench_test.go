package ep_test

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/goep/goep/ep"
	"github.com/goep/goep/internal/mpitesting"
)

// benchCase is one configuration of the benchmarks.
type benchCase struct {
	name                          string
	mode                          ep.Mode
	tokens, hidden, topk, experts int
}

// openBench makes c's group on the world, with the same routing on every
// run and zeroed tokens and outputs in host memory.
func openBench(b *testing.B, c benchCase) (g *ep.Group[ep.BF16], topk []int32, weights []float32, x, out ep.Tensor[ep.BF16]) {
	return openBenchOn(b, c, nil)
}

// openBenchOn is openBench on backend (nil: the default).
func openBenchOn(b *testing.B, c benchCase, backend ep.Backend) (g *ep.Group[ep.BF16], topk []int32, weights []float32, x, out ep.Tensor[ep.BF16]) {
	b.Helper()
	w := mpitesting.World
	cfg := ep.Config{Mode: c.mode, NumExperts: c.experts, MaxTokensPerRank: c.tokens, Hidden: c.hidden, TopK: c.topk,
		Backend: backend}
	g, err := ep.NewGroup[ep.BF16](w, cfg)
	if err != nil {
		b.Fatal(err)
	}
	topk, weights = benchRouting(w.Rank(), c.tokens, c.topk, c.experts)
	x = ep.Host(make([]ep.BF16, c.tokens*c.hidden))
	out = ep.Host(make([]ep.BF16, c.tokens*c.hidden))
	return g, topk, weights, x, out
}

// BenchmarkDispatchCombine times a dispatch+combine round with identity
// experts, in place. Under mpirun every rank must run the same number of
// iterations: use a count, e.g.
//
//	go run ./internal/cmd/mpitest -np 2 -sim "" -run '^$' -bench DispatchCombine -benchtime 20x ./ep
//
// Bytes per op are this rank's rows: (token, expert) pairs (LL) or
// (token, rank) pairs (HT) times the row size.
func BenchmarkDispatchCombine(b *testing.B) {
	w := mpitesting.World
	R := w.Size()
	for _, c := range []benchCase{
		{"decode-ll", ep.LowLatency, 128, 7168, 8, 64},
		{"small-ll", ep.LowLatency, 32, 1024, 4, 8 * R},
		{"prefill-ht", ep.HighThroughput, 1024, 7168, 8, 64},
		{"small-ht", ep.HighThroughput, 256, 1024, 4, 8 * R},
	} {
		if c.experts%R != 0 {
			continue
		}
		b.Run(fmt.Sprintf("%s/%dtok/h%d/top%d", c.name, c.tokens, c.hidden, c.topk), func(b *testing.B) {
			g, topk, weights, x, out := openBench(b, c)
			defer g.Close()
			lay, err := g.Layout(topk)
			if err != nil {
				b.Fatal(err)
			}
			rows := 0
			for _, n := range lay.TokensPerExpert {
				rows += n
			}
			if c.mode == ep.HighThroughput {
				rows = 0
				for _, n := range lay.TokensPerRank {
					rows += n
				}
			}
			b.SetBytes(int64(rows * c.hidden * 2))
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				h, err := g.Dispatch(ep.Tokens(x, topk, weights))
				if err != nil {
					b.Fatal(err)
				}
				if err := g.Combine(h, h.Recv(), out, nil); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// benchRouting draws each token's top-k experts uniformly (distinct).
func benchRouting(rank, T, K, E int) ([]int32, []float32) {
	rng := rand.New(rand.NewPCG(5, uint64(rank)))
	topk, w := make([]int32, T*K), make([]float32, T*K)
	for t := 0; t < T; t++ {
		for k, e := range rng.Perm(E)[:K] {
			topk[t*K+k], w[t*K+k] = int32(e), rng.Float32()
		}
	}
	return topk, w
}

// decodeStep is the smallest decode step: 1 token, hidden 128, top-2, 4
// experts per rank.
func decodeStep() benchCase {
	return benchCase{"decode-step", ep.LowLatency, 1, 128, 2, 4 * mpitesting.World.Size()}
}

// BenchmarkLLLatency is one decode step at the smallest size: 1 token,
// hidden 128, top-2, 8 experts on every rank, dispatch then combine with
// identity experts, back to back as a decode loop runs them. ns/op is the
// round; one round in 16 is also timed per phase (the send and wait
// halves: *-ns/phase), the others read no clock (a clock read costs tens of
// ns in a VM, a good part of a phase). Under mpirun every rank must run the
// same count (-benchtime Nx):
//
//	go run ./internal/cmd/mpitest -np 1,2 -sim "" -run '^$' -bench LLLatency -benchtime 200000x ./ep
func BenchmarkLLLatency(b *testing.B) {
	g, topk, weights, x, out := openBench(b, decodeStep())
	defer g.Close()
	const every = 16
	var phase [4]time.Duration
	var at [5]time.Time
	timed := 0
	mark := func(i, p int) {
		if i%every == 0 {
			at[p] = time.Now()
		}
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		mark(i, 0)
		req, err := g.DispatchSend(ep.Tokens(x, topk, weights))
		mark(i, 1)
		if err != nil {
			b.Fatal(err)
		}
		h, err := req.Wait()
		mark(i, 2)
		if err != nil {
			b.Fatal(err)
		}
		creq, err := g.CombineSend(h, h.Recv(), out, nil)
		mark(i, 3)
		if err != nil {
			b.Fatal(err)
		}
		if err := creq.Wait(); err != nil {
			b.Fatal(err)
		}
		mark(i, 4)
		if i%every == 0 {
			for p := range phase {
				phase[p] += at[p+1].Sub(at[p])
			}
			timed++
		}
	}
	for i, name := range []string{"dispatch-send", "dispatch-wait", "combine-send", "combine-wait"} {
		b.ReportMetric(float64(phase[i].Nanoseconds())/float64(timed), name+"-ns/phase")
	}
}

// BenchmarkStatsCost measures what keeping the per-peer statistics costs
// against a dispatch+combine round measured beside it, in the same
// iterations: even iterations time a plain round; odd ones the same round
// followed by Stats and ResetStats (what moe does once per step: read the
// per-peer counters and start them anew). The bookkeeping every call does
// for them (its rows to and from each rank, the bytes; the waits' clock is
// read only in waits that are already late) is inside the plain round;
// it is timed on its own too (CountStats, on the round's handle) and
// reported against the round. Metrics: plain-ns/round, with-stats-ns/round,
// take-ratio (with / plain), count-ns/round and count-share (count / plain).
// Under mpirun every rank must run the same count:
//
//	go run ./internal/cmd/mpitest -np 2,4 -sim "" -run '^$' -bench StatsCost -benchtime 2000x ./ep
func BenchmarkStatsCost(b *testing.B) {
	w := mpitesting.World
	R := w.Size()
	for _, c := range []benchCase{
		{"decode-ll", ep.LowLatency, 1, 128, 2, 4 * R},
		{"small-ll", ep.LowLatency, 32, 1024, 4, 8 * R},
		{"small-ht", ep.HighThroughput, 256, 1024, 4, 8 * R},
	} {
		b.Run(fmt.Sprintf("%s/%dtok/h%d/top%d", c.name, c.tokens, c.hidden, c.topk), func(b *testing.B) {
			g, topk, weights, x, out := openBench(b, c)
			defer g.Close()
			var plain, with, count time.Duration
			var rounds [2]int
			var h ep.Handle[ep.BF16]
			var err error
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				t0 := time.Now()
				h, err = g.Dispatch(ep.Tokens(x, topk, weights))
				if err != nil {
					b.Fatal(err)
				}
				if err := g.Combine(h, h.Recv(), out, nil); err != nil {
					b.Fatal(err)
				}
				if i%2 == 1 {
					if s := g.Stats(); len(s.SentBytes) != R {
						b.Fatalf("Stats: %d peers, want %d", len(s.SentBytes), R)
					}
					g.ResetStats()
					with += time.Since(t0)
				} else {
					plain += time.Since(t0)
				}
				rounds[i%2]++
			}
			b.StopTimer()
			t0 := time.Now()
			for i := 0; i < b.N; i++ {
				ep.CountStats(g, h)
			}
			count = time.Since(t0)
			if rounds[0] == 0 || rounds[1] == 0 {
				return // b.N = 1: nothing to compare
			}
			p, wi := float64(plain.Nanoseconds())/float64(rounds[0]), float64(with.Nanoseconds())/float64(rounds[1])
			cn := float64(count.Nanoseconds()) / float64(b.N)
			b.ReportMetric(p, "plain-ns/round")
			b.ReportMetric(wi, "with-stats-ns/round")
			b.ReportMetric(wi/p, "take-ratio")
			b.ReportMetric(cn, "count-ns/round")
			b.ReportMetric(cn/p, "count-share")
		})
	}
}

// BenchmarkLLDirectPath measures what LL's direct path (one node, slot
// protocol: rows stored straight into their slots) saves over the general
// path on the same group, in the same run (see alternateRounds):
// general-ns/round, direct-ns/round and their ratio. Every rank must run
// the same count:
//
//	go run ./internal/cmd/mpitest -np 2 -sim "" -run '^$' -bench LLDirectPath -benchtime 60x ./ep
func BenchmarkLLDirectPath(b *testing.B) {
	alternateRounds(b, "general", "direct", ep.CPUGeneralLL)
}

// BenchmarkLLReduceKernel measures what summing the combine's rows in Go
// assembly (package rowsum) saves over the cgo call to the C kernel, in a
// decode round, in the same run (see alternateRounds): cgo-ns/round,
// assembly-ns/round and their ratio. Every rank must run the same count:
//
//	go run ./internal/cmd/mpitest -np 2 -sim "" -run '^$' -bench LLReduceKernel -benchtime 60x ./ep
func BenchmarkLLReduceKernel(b *testing.B) {
	alternateRounds(b, "cgo", "assembly", ep.CPUReduceKernelC)
}

// alternateRounds times bursts of 2000 decode rounds (1 token, hidden 128,
// top-2, 4 experts per rank) alternating between two groups, one on the
// backend old (named oldName) and one on the default (newName), and
// reports the medians of each and their ratio, which a noisy machine
// shifts alike.
func alternateRounds(b *testing.B, oldName, newName string, old ep.Backend) {
	w := mpitesting.World
	var groups [2]*ep.Group[ep.BF16] // old, new
	groups[0], _, _, _, _ = openBenchOn(b, decodeStep(), old)
	defer groups[0].Close()
	g, topk, weights, x, out := openBench(b, decodeStep())
	defer g.Close()
	groups[1] = g
	const rounds = 2000
	var perRound [2][]float64 // old, new
	for i := 0; i < b.N; i++ {
		path := i % 2
		g := groups[path]
		if err := w.Barrier(); err != nil {
			b.Fatal(err)
		}
		t0 := time.Now()
		for r := 0; r < rounds; r++ {
			h, err := g.Dispatch(ep.Tokens(x, topk, weights))
			if err != nil {
				b.Fatal(err)
			}
			if err := g.Combine(h, h.Recv(), out, nil); err != nil {
				b.Fatal(err)
			}
		}
		perRound[path] = append(perRound[path], float64(time.Since(t0).Nanoseconds())/rounds)
	}
	if len(perRound[1]) == 0 {
		return // b.N = 1: nothing to compare
	}
	before, after := median(perRound[0]), median(perRound[1])
	b.ReportMetric(before, oldName+"-ns/round")
	b.ReportMetric(after, newName+"-ns/round")
	b.ReportMetric(after/before, newName+"/"+oldName)
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}
