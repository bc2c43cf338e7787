//go:build gpu

package gpu

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestGPUKernelBandwidth times every kernel on the device at the sizes of
// a decode step (LL: 128 tokens of hidden 7168 in bfloat16, top-8 of 64
// experts) and of a prefill step (HT: 4096 tokens), each against a
// device-to-device copy (cuMemcpyDtoDAsync) of the same bytes on the same
// stream: the kernel's bytes read plus written, over two. Times are device
// time from events, the median of 20 launches after 3 untimed ones. It
// asserts nothing about speed (figures, not checks: the kernel suite checks
// the values); it prints a table and, with GOEP_BENCH_OUT set, writes one
// JSON line per kernel to $GOEP_BENCH_OUT/kernels.jsonl.
func TestGPUKernelBandwidth(t *testing.T) {
	d := testDevice(t)
	k, err := d.Kernels()
	require.NoError(t, err)
	sq, err := d.NewStream()
	require.NoError(t, err)
	defer sq.Close()
	s := sq.(*CUDAStream)
	const H, E, K, R = 7168, 64, 8, 8
	rb := H * 2
	r := rand.New(rand.NewPCG(1, 2))

	alloc := func(n int) DevicePtr {
		b, err := d.Alloc(n)
		require.NoError(t, err)
		t.Cleanup(func() { require.NoError(t, d.Synchronize()); _ = b.Free() })
		return b.Ptr()
	}
	upload := func(b []byte) DevicePtr {
		p := alloc(len(b))
		require.NoError(t, (&Buffer{dev: d, ptr: p, n: len(b), view: true}).Upload(b))
		return p
	}
	randBytes := func(n int) []byte {
		b := make([]byte, n)
		for i := 0; i < n; i += 2 { // finite bfloat16 values: exponents away from Inf/NaN
			b[i], b[i+1] = byte(r.IntN(256)), byte(0x3c+r.IntN(8))
		}
		return b
	}
	i32s := func(v []int32) DevicePtr { return upload(bytesOf(v)) }

	type row struct {
		Kernel   string  `json:"kernel"`
		Case     string  `json:"case"`
		Bytes    int64   `json:"bytes"`
		KernelUS float64 `json:"kernel_us"`
		CopyUS   float64 `json:"copy_us"`
		GBps     float64 `json:"kernel_gbps"`
		CopyGBps float64 `json:"copy_gbps"`
		OfCopy   float64 `json:"of_copy"`
	}
	var rows []row
	start, end := mustEvent(t, d), mustEvent(t, d)
	timeIt := func(f func() error) float64 {
		var ts []float64
		for i := 0; i < 23; i++ {
			require.NoError(t, s.Record(start))
			require.NoError(t, f())
			require.NoError(t, s.Record(end))
			require.NoError(t, end.Synchronize())
			el, err := Elapsed(start, end)
			require.NoError(t, err)
			if i >= 3 {
				ts = append(ts, float64(el)/float64(time.Microsecond))
			}
		}
		slices.Sort(ts)
		return ts[len(ts)/2]
	}
	scratch := alloc(1 << 30)
	measure := func(kernel, kase string, bytes int64, f func() error) {
		ku := timeIt(f)
		half := int(bytes / 2)
		require.LessOrEqual(t, 2*half, 1<<30, "copy reference too large")
		cu := timeIt(func() error { return s.MemcpyDtoDAsync(scratch, scratch+DevicePtr(1<<29), half) })
		x := row{Kernel: kernel, Case: kase, Bytes: bytes, KernelUS: ku, CopyUS: cu,
			GBps: float64(bytes) / ku / 1e3, CopyGBps: float64(2*half) / cu / 1e3, OfCopy: cu / ku}
		rows = append(rows, x)
	}

	for _, c := range []struct {
		name string
		T    int
	}{{"ll", 128}, {"ht", 4096}} {
		T := c.T
		pairs := T * K
		x := upload(randBytes(T * rb))
		// Routing: pair j goes to expert j%E, the (j/E)-th of its pairs.
		topk, ord := make([]int32, pairs), make([]int32, pairs)
		base := make([]int32, E)
		for j := range topk {
			topk[j], ord[j] = int32(j%E), int32(j/E)
		}
		per := pairs / E
		for e := range base {
			base[e] = int32(e * per)
		}
		dTopK, dOrd, dBase := i32s(topk), i32s(ord), i32s(base)
		packed := alloc(pairs * rb)
		measure("PackRows", c.name, int64(2*pairs*rb), func() error {
			return k.PackRows(s, PackRowsArgs{Dst: packed, DstRows: pairs, Src: x, Ord: dOrd, Group: dTopK, Base: dBase,
				Groups: E, Tokens: T, Width: K, RowBytes: rb})
		})
		perm := make([]int32, pairs)
		for i, p := range r.Perm(pairs) {
			perm[i] = int32(p)
		}
		dPerm := i32s(perm)
		gathered := alloc(pairs * rb)
		measure("CopyRows", c.name, int64(2*pairs*rb), func() error {
			return k.CopyRows(s, CopyRowsArgs{Dst: gathered, DstRows: pairs, Src: packed, SrcIdx: dPerm, SrcRows: pairs, N: pairs, RowBytes: rb})
		})
		ptrs := alloc(8 * pairs)
		measure("RowPointers", c.name, int64(12*pairs), func() error {
			return k.RowPointers(s, ptrs, packed, dPerm, pairs, rb)
		})
		st := make([]int32, T+1)
		for i := range st {
			st[i] = int32(i * K)
		}
		w := make([]float32, pairs)
		for i := range w {
			w[i] = r.Float32()
		}
		dStart, dW := i32s(st), upload(bytesOf(w))
		out := alloc(T * rb)
		measure("ReduceRows", c.name, int64(pairs*rb+T*rb), func() error {
			return k.ReduceRows(s, ReduceArgs{Out: out, OutType: BF16, Src: ptrs, Weights: dW, Start: dStart, N: T, Hidden: H, InType: BF16})
		})
		f32 := alloc(T * H * 4)
		measure("FromBF16", c.name, int64(T*H*6), func() error { return k.FromBF16(s, f32, x, T*H) })
		measure("ToBF16", c.name, int64(T*H*6), func() error { return k.ToBF16(s, out, f32, T*H) })

		nodeOf := i32s(make([]int32, R))
		perE, perR, perN, pairOrd := alloc(4*E), alloc(4*R), alloc(4), alloc(4*pairs)
		tokR, tokN, bad := alloc(4*T*R), alloc(4*T), alloc(8)
		measure("Layout", c.name, int64(4*pairs+4*pairs+4*T*R+4*T), func() error {
			return k.Layout(s, LayoutArgs{TopK: dTopK, Tokens: T, K: K, Experts: E, ExpertsPerRank: E / R, Ranks: R, NodeOf: nodeOf, Nodes: 1,
				PerExpert: perE, PerRank: perR, PerNode: perN, PairOrd: pairOrd, TokRankOrd: tokR, TokNodeOrd: tokN, Bad: bad})
		})
		local := make([]int32, pairs)
		for j := range local {
			local[j] = int32(j%(E/R)) - int32(j%2) // some -1: not here
		}
		dLocal, counts := i32s(local), alloc(4*E)
		measure("CountLocal", c.name, int64(4*pairs), func() error { return k.CountLocal(s, counts, dLocal, T, K, E/R) })
		tokOut, topkOut, wOut := alloc(4*T), alloc(4*pairs), alloc(4*pairs)
		measure("HTMeta", c.name, int64(4*T+2*4*pairs+2*4*pairs), func() error {
			return k.HTMeta(s, HTMetaArgs{TokOut: tokOut, TopKOut: topkOut, WOut: wOut, N: T, SrcTopK: dTopK, SrcW: dW, K: K, L: E / R, Rank: 0})
		})
		// LLPlace: R source blocks of cap rows, each source sending T/R
		// tokens' pairs to this rank's L experts.
		L, capRows := E/R, T*min(K, E/R)
		words := LLMetaWords(L, capRows)
		meta := make([]int32, R*words)
		for src := 0; src < R; src++ {
			blk := meta[src*words:]
			blk[0] = 7
			n := capRows / R
			for l := 0; l < L; l++ {
				blk[2+l] = int32(n / L)
			}
			for p := 0; p < n/L*L; p++ {
				blk[2+L+p] = int32(p % T)
				blk[2+L+capRows+p] = 0x3f800000
			}
		}
		span := R * T
		dMeta := i32s(meta)
		dst, ptok, pw, pcnt := alloc(4*R*capRows), alloc(4*L*span), alloc(4*L*span), alloc(4*R*L)
		measure("LLPlace", c.name, int64(4*R*words+3*4*R*capRows), func() error {
			return k.LLPlace(s, LLPlaceArgs{Meta: dMeta, R: R, L: L, Cap: capRows, MetaWords: words, Span: span, Op: 7,
				DstRow: dst, TokOut: ptok, WOut: pw, Counts: pcnt, Bad: bad})
		})
	}

	t.Logf("%-12s %-4s %12s %10s %10s %9s %9s %7s", "kernel", "case", "bytes", "kernel us", "copy us", "GB/s", "copy GB/s", "of copy")
	for _, x := range rows {
		t.Logf("%-12s %-4s %12d %10.1f %10.1f %9.0f %9.0f %6.0f%%", x.Kernel, x.Case, x.Bytes, x.KernelUS, x.CopyUS, x.GBps, x.CopyGBps, 100*x.OfCopy)
	}
	if dir := os.Getenv("GOEP_BENCH_OUT"); dir != "" {
		f, err := os.Create(filepath.Join(dir, "kernels.jsonl"))
		require.NoError(t, err)
		defer f.Close()
		name, _ := d.Name()
		for _, x := range rows {
			b, err := json.Marshal(struct {
				row
				Device string `json:"device"`
			}{x, name})
			require.NoError(t, err)
			fmt.Fprintln(f, string(b))
		}
	}
}

func mustEvent(t *testing.T, d *CUDADevice) *CUDAEvent {
	t.Helper()
	e, err := d.NewEvent()
	require.NoError(t, err)
	t.Cleanup(func() { _ = e.Close() })
	return e.(*CUDAEvent)
}

// TestGPUNCCLGroupCost times, on one rank, an NCCL group that sends to
// this rank itself, on a non-blocking communicator (the engine's: NCCL
// starts a thread per group to enqueue it) and on a blocking one (enqueued
// on the calling thread): the host's time from posting the group to its
// completion, for 4 bytes and for a decode step's 14.7 MB, beside a
// cuMemcpyDtoDAsync of the same bytes (what SendRecv does for transfers
// to this rank itself). Medians of 50 after 5 untimed; figures, not
// checks. With GOEP_BENCH_OUT set: $GOEP_BENCH_OUT/nccl.jsonl.
func TestGPUNCCLGroupCost(t *testing.T) {
	d := testDevice(t)
	sq, err := d.NewStream()
	require.NoError(t, err)
	defer sq.Close()
	s := sq.(*CUDAStream)
	const big = 1024 * 7168 * 2
	a, err := d.Alloc(big)
	require.NoError(t, err)
	defer a.Free()
	b, err := d.Alloc(big)
	require.NoError(t, err)
	defer b.Free()
	type result struct {
		Path  string  `json:"path"`
		Bytes int     `json:"bytes"`
		US    float64 `json:"host_us"`
	}
	var out []result
	timeIt := func(post func() error, settle func() error) float64 {
		var ts []float64
		for i := 0; i < 55; i++ {
			t0 := time.Now()
			require.NoError(t, post())
			require.NoError(t, settle())
			require.NoError(t, s.Synchronize())
			if i >= 5 {
				ts = append(ts, float64(time.Since(t0))/float64(time.Microsecond))
			}
		}
		slices.Sort(ts)
		return ts[len(ts)/2]
	}
	for _, blocking := range []bool{false, true} {
		id, err := NCCLUniqueID()
		require.NoError(t, err)
		c, err := newNCCLComm(d, id, 0, 1, time.Minute, blocking)
		require.NoError(t, err)
		name := "nccl non-blocking"
		if blocking {
			name = "nccl blocking"
		}
		for _, n := range []int{4, big} {
			us := timeIt(func() error {
				return c.group(s, []Transfer{{Peer: 0, Ptr: a.Ptr(), Bytes: n}}, []Transfer{{Peer: 0, Ptr: b.Ptr(), Bytes: n}})
			}, func() error { return c.settle("group") })
			out = append(out, result{name, n, us})
		}
		require.NoError(t, c.Close())
	}
	for _, n := range []int{4, big} {
		us := timeIt(func() error { return s.MemcpyDtoDAsync(b.Ptr(), a.Ptr(), n) }, func() error { return nil })
		out = append(out, result{"cuMemcpyDtoDAsync", n, us})
	}
	for _, r := range out {
		t.Logf("%-20s %10d bytes %10.1f us", r.Path, r.Bytes, r.US)
	}
	if dir := os.Getenv("GOEP_BENCH_OUT"); dir != "" {
		f, err := os.Create(filepath.Join(dir, "nccl.jsonl"))
		require.NoError(t, err)
		defer f.Close()
		for _, r := range out {
			b, _ := json.Marshal(r)
			fmt.Fprintln(f, string(b))
		}
	}
}
