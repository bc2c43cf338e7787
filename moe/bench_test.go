package moe_test

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/goep/goep/internal/mpitesting"
	"github.com/goep/goep/moe"
)

// BenchmarkSync times one data-parallel gradient sync of each method alone
// (every iteration starts at a barrier, so a rank's time is the sync's, not
// its wait for a slower peer's step), on the gradient sizes of the toy's
// gate alone and of the study's gate plus shared expert (hidden 1024, 8
// experts, shared FFN 4096). Under mpirun every rank must run the same
// iterations:
//
//	go run ./internal/cmd/mpitest -np 4 -sim "" -run '^$' -bench Sync -benchtime 10x ./moe
//
// Bytes per op are what the rank sends (SyncStats.BytesSent); ns/op is rank
// 0's time, computation included. Top-K sends 0.1% of the entries.
func BenchmarkSync(b *testing.B) {
	w := mpitesting.World
	for _, n := range []int{32 * 8, 1024*8 + 2*1024*4096 + 4096 + 1024} {
		g0 := make([]float64, n)
		r := rand.New(rand.NewPCG(7, uint64(w.Rank())))
		for i := range g0 {
			g0[i] = r.NormFloat64()
		}
		for _, gs := range []moe.GradSync{{}, {Method: moe.SyncA2SGD}, {Method: moe.SyncTopK, K: max(1, n/1000)}} {
			b.Run(fmt.Sprintf("n=%d/%v", n, gs), func(b *testing.B) {
				s, err := moe.NewSyncer(w, gs, n)
				if err != nil {
					b.Fatal(err)
				}
				g := make([]float64, n)
				var sent int64
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					b.StopTimer()
					copy(g, g0)
					if err := w.Barrier(); err != nil {
						b.Fatal(err)
					}
					b.StartTimer()
					st, err := s.Sync(g)
					if err != nil {
						b.Fatal(err)
					}
					sent = st.BytesSent
				}
				b.SetBytes(sent)
			})
		}
	}
}
