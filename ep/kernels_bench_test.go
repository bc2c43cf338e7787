package ep

import (
	"fmt"
	"runtime"
	"testing"
	"unsafe"
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
	var src addrTable
	start := make([]int32, tokens+1)
	w := make([]float32, tokens*k)
	for i := 0; i < tokens*k; i++ {
		src.add(unsafe.Pointer(&rows[i*hidden]))
		w[i] = 0.5
	}
	for t := range start {
		start[t] = int32(t * k)
	}
	if !weighted {
		w = nil
	}
	dtype := DTypeOf[E]()
	b.SetBytes(int64(src.len() * rowBytes))
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		reduceRows(unsafe.Pointer(&out[0]), dtype, &src, w, start, tokens, hidden, dtype)
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
	var s, d addrTable
	for i := 0; i < n; i++ {
		s.add(unsafe.Pointer(&src[i*rowBytes]))
		d.add(unsafe.Pointer(&dst[(n-1-i)*rowBytes]))
	}
	b.SetBytes(n * rowBytes)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		copyRows(&d, &s, rowBytes)
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
		if err := r.compute("bench", sh, topk, T); err != nil {
			b.Fatal(err)
		}
	}
}
