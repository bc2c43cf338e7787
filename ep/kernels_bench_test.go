package ep

import (
	"fmt"
	"runtime"
	"testing"
	"unsafe"

	"github.com/goep/goep/ep/internal/hostrows"
)

// Benchmarks of the C kernels on one core: the decode combine (128 tokens,
// top-8, hidden 7168) and the prefill layout (4096 tokens, top-8, 64 experts,
// 8 ranks). Run with: go test -bench Kernel -run ^$ ./ep

func benchReduce[E Element](b *testing.B, tokens, k, hidden int, weighted bool) {
	rowBytes := hidden * DTypeOf[E]().Size()
	rows := make([]E, tokens*k*hidden)
	var pin runtime.Pinner
	defer pin.Unpin()
	pin.Pin(&rows[0])
	one := E(1)
	if _, ok := any(one).(BF16); ok {
		one = E(BF16From(1)) // not the bit pattern 1, a denormal
	}
	for i := range rows {
		rows[i] = one
	}
	out := make([]E, tokens*hidden)
	var src hostrows.AddrTable
	start := make([]int32, tokens+1)
	w := make([]float32, tokens*k)
	for i := 0; i < tokens*k; i++ {
		src.Add(unsafe.Pointer(&rows[i*hidden]))
		w[i] = 0.5
	}
	for t := range start {
		start[t] = int32(t * k)
	}
	if !weighted {
		w = nil
	}
	dtype := DTypeOf[E]()
	b.SetBytes(int64(src.Len() * rowBytes))
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		hostrows.ReduceRows(unsafe.Pointer(&out[0]), dtype, &src, w, start, tokens, hidden, dtype)
	}
}

func BenchmarkKernelReduce(b *testing.B) {
	// HT prefill on 2 ranks: 4096 tokens, mostly 2 partial rows each, from memory
	b.Run("bf16/prefill-4096x2/sum", func(b *testing.B) { benchReduce[BF16](b, 4096, 2, 7168, false) })
	for _, k := range []int{1, 2, 8} {
		b.Run(fmt.Sprintf("bf16/top%d/weighted", k), func(b *testing.B) { benchReduce[BF16](b, 128, k, 7168, true) })
		b.Run(fmt.Sprintf("bf16/top%d/sum", k), func(b *testing.B) { benchReduce[BF16](b, 128, k, 7168, false) })
		b.Run(fmt.Sprintf("f32/top%d/weighted", k), func(b *testing.B) { benchReduce[float32](b, 128, k, 7168, true) })
	}
}

func BenchmarkKernelCopyRows(b *testing.B) {
	const n, rowBytes = 1024, 14336
	src := make([]byte, n*rowBytes)
	dst := make([]byte, n*rowBytes)
	var pin runtime.Pinner
	defer pin.Unpin()
	pin.Pin(&src[0])
	pin.Pin(&dst[0])
	var s, d hostrows.AddrTable
	for i := 0; i < n; i++ {
		s.Add(unsafe.Pointer(&src[i*rowBytes]))
		d.Add(unsafe.Pointer(&dst[(n-1-i)*rowBytes]))
	}
	b.SetBytes(n * rowBytes)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		hostrows.CopyRows(&d, &s, rowBytes)
	}
}

func BenchmarkKernelLayout(b *testing.B) {
	const T, K, E, R = 4096, 8, 64, 8
	sh := shape{E: E, L: E / R, R: R, K: K, nodeOf: make([]int32, R), nodes: 1}
	topk := make([]int32, T*K)
	for t := 0; t < T; t++ {
		for k := 0; k < K; k++ {
			topk[t*K+k] = int32((t*7 + k*9) % E)
		}
	}
	var r Routing
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if err := computeRouting(&r, "bench", sh, topk, T); err != nil {
			b.Fatal(err)
		}
	}
}

// The LL decode dispatch's copy on one core: 128 tokens, top-8, hidden
// 7168, each token to 8 rows; bfloat16 rows copied (the native wire), and
// cast to FP8 with their scales (fused: once per token, then copied).
func BenchmarkKernelDispatchCopy(b *testing.B) {
	const tokens, k, hidden = 128, 8, 7168
	x := make([]BF16, tokens*hidden)
	for i := range x {
		x[i] = BF16From(float32(i%977) - 488)
	}
	origin := unsafe.Slice((*byte)(unsafe.Pointer(&x[0])), 2*len(x))
	wire := make([]byte, tokens*k*(2*hidden))
	scales := make([]float32, tokens*k*ScaleGroups(hidden))
	var pin runtime.Pinner
	defer pin.Unpin()
	pin.Pin(&wire[0])
	pin.Pin(&scales[0])
	off := make([]int64, tokens*k)
	for i := range off {
		off[i] = int64(i / k * 2 * hidden)
	}
	b.Run("bf16", func(b *testing.B) {
		var d hostrows.AddrTable
		for i := 0; i < tokens*k; i++ {
			d.Add(unsafe.Pointer(&wire[i*2*hidden]))
		}
		b.SetBytes(tokens * k * 2 * hidden)
		for i := 0; i < b.N; i++ {
			hostrows.ScatterBlocks(&d, origin, off, lensOf(tokens*k, 2*hidden), false)
		}
	})
	for _, w := range []WireFormat{WireFP8, WireFP8UE8M0} {
		b.Run(w.String(), func(b *testing.B) {
			var d, s hostrows.AddrTable
			for i := 0; i < tokens*k; i++ {
				d.Add(unsafe.Pointer(&wire[i*hidden]))
				s.Add(unsafe.Pointer(&scales[i*ScaleGroups(hidden)]))
			}
			b.SetBytes(tokens * k * 2 * hidden) // the same tokens: bytes of the bf16 rows
			for i := 0; i < b.N; i++ {
				hostrows.QuantRows(&d, &s, origin, off, hidden, BFloat16, w, hostrows.CastFastest)
			}
		})
		b.Run(w.String()+"/no-repeat", func(b *testing.B) { // every row cast: the cost of the cast itself
			var d, s hostrows.AddrTable
			for i := 0; i < tokens; i++ {
				d.Add(unsafe.Pointer(&wire[i*hidden]))
				s.Add(unsafe.Pointer(&scales[i*ScaleGroups(hidden)]))
			}
			perToken := make([]int64, tokens)
			for i := range perToken {
				perToken[i] = int64(i * 2 * hidden)
			}
			b.SetBytes(tokens * 2 * hidden)
			for i := 0; i < b.N; i++ {
				hostrows.QuantRows(&d, &s, origin, perToken, hidden, BFloat16, w, hostrows.CastFastest)
			}
		})
	}
}

func lensOf(n, l int) []int64 {
	out := make([]int64, n)
	for i := range out {
		out[i] = int64(l)
	}
	return out
}
