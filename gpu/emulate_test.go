//go:build !mpi

package gpu

import (
	"fmt"
	"github.com/goep/goep/internal/dtype"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goep/goep/gpu/internal/kernels"
)

// The kernel suite on the CPU: the same kernel source, compiled as C by
// package kernels, run one (block, thread) at a time in a shuffled order
// that changes with every launch. It runs in every test run, with no GPU
// and no NVRTC, and checks the kernels' logic and the Go side's launch
// arguments (grid, block, argument slots) against the references.

// emuLauncher runs Kernels' launches on the emulator.
type emuLauncher struct {
	seed     uint64
	launches int
	live     int // scratch allocations not yet freed
}

func (e *emuLauncher) Launch(name string, grid, block uint32, args []uint64, q Queue) error {
	if err := checkArgs(name, args); err != nil {
		return err
	}
	if block == 0 || block > 1024 || block%32 != 0 {
		return fmt.Errorf("emulator: %s launched with block %d: not a warp multiple in [32, 1024]", name, block)
	}
	e.seed++
	e.launches++
	return kernels.Emulate(name, grid, block, args, e.seed)
}

func (e *emuLauncher) AllocAsync(n int, q Queue) (DevicePtr, error) {
	e.live++
	return DevicePtr(kernels.Malloc(n)), nil
}

func (e *emuLauncher) FreeAsync(p DevicePtr, q Queue) error {
	e.live--
	kernels.Free(uint64(p))
	return nil
}

func (e *emuLauncher) MemsetAsync(p DevicePtr, v byte, n int, q Queue) error {
	kernels.Memset(uint64(p), v, n)
	return nil
}

// emuEnv is the suite's kernelEnv on the emulator: "device memory" is C
// memory from kernels.Malloc.
type emuEnv struct {
	l *emuLauncher
	k *Kernels
}

func newEmuEnv() *emuEnv {
	l := &emuLauncher{}
	return &emuEnv{l: l, k: newKernels(l, 0)}
}

func (e *emuEnv) kernels() *Kernels { return e.k }
func (e *emuEnv) stream() Stream    { return nil }
func (e *emuEnv) sync(testing.TB)   {}

func (e *emuEnv) alloc(t testing.TB, n int) DevicePtr {
	p := kernels.Malloc(n)
	t.Cleanup(func() { kernels.Free(p) })
	return DevicePtr(p)
}

func (e *emuEnv) write(t testing.TB, p DevicePtr, b []byte) { kernels.Write(uint64(p), b) }
func (e *emuEnv) read(t testing.TB, b []byte, p DevicePtr)  { kernels.Read(b, uint64(p)) }

func TestKernelsOnEmulator(t *testing.T) {
	for _, c := range []struct {
		name    string
		maxGrid uint32
		chunk   int64
	}{
		{"defaults", 0, 0},
		{"grid3_chunk5", 3, 5}, // few blocks: every grid-stride loop goes round; many layout chunks
		{"grid1_chunk1", 1, 1},
		{"grid2_chunk64", 2, 64}, // chunks longer than the columns: each thread checks several of its chunk's tokens
	} {
		t.Run(c.name, func(t *testing.T) {
			env := newEmuEnv()
			if c.maxGrid > 0 {
				env.k.maxGrid = c.maxGrid
			}
			env.k.chunk = c.chunk
			runKernelSuite(t, env)
			assert.Zero(t, env.l.live, "Layout's scratch memory was not all freed")
			assert.NotZero(t, env.l.launches)
		})
	}
}

// TestKernelArgumentErrors: bad arguments are refused on the host, naming
// the call, before anything is launched.
func TestKernelArgumentErrors(t *testing.T) {
	env := newEmuEnv()
	k := env.k
	p := DevicePtr(0x1000) // never dereferenced: nothing may launch
	layout := LayoutArgs{TopK: p, Tokens: 4, K: 2, Experts: 8, ExpertsPerRank: 2, Ranks: 4, NodeOf: p, Nodes: 1}
	bad := func(f func(*LayoutArgs)) LayoutArgs { a := layout; f(&a); return a }
	for _, c := range []struct {
		err  error
		want string
	}{
		{k.Layout(nil, bad(func(a *LayoutArgs) { a.Tokens = -1 })), "Layout: Tokens = -1"},
		{k.Layout(nil, bad(func(a *LayoutArgs) { a.K = 0 })), "K = 0"},
		{k.Layout(nil, bad(func(a *LayoutArgs) { a.Experts = 9 })), "9 experts do not fit in 4 ranks of 2"},
		{k.Layout(nil, bad(func(a *LayoutArgs) { a.Nodes = 0 })), "Nodes = 0"},
		{k.Layout(nil, bad(func(a *LayoutArgs) { a.TopK = 0 })), "TopK is 0 for 4 tokens"},
		{k.Layout(nil, bad(func(a *LayoutArgs) { a.NodeOf = 0 })), "NodeOf is 0"},
		{k.Layout(nil, bad(func(a *LayoutArgs) { a.Tokens, a.K = 1<<30, 4 })), "at most 2147483647"},
		{k.CopyRows(nil, CopyRowsArgs{N: -1}), "CopyRows: negative size"},
		{k.CopyRows(nil, CopyRowsArgs{N: 3, RowBytes: 8, Src: p}), "Dst or Src is 0"},
		{k.PackRows(nil, PackRowsArgs{Tokens: 2, Width: 0, RowBytes: 4}), "PackRows: bad size"},
		{k.PackRows(nil, PackRowsArgs{Tokens: 2, Width: 2, RowBytes: 4, Dst: p, Src: p}), "Dst, Src or Ord is 0"},
		{k.RowPointers(nil, 0, p, 0, 3, 8), "RowPointers: dst is 0"},
		{k.RowPointers(nil, p, p, 0, -3, 8), "negative size"},
		{k.ReduceRows(nil, ReduceArgs{N: 1, Hidden: 1, OutType: 2, Out: p, Src: p, Start: p}), "element types float32 -> dtype.Code(2)"},
		{k.ReduceRows(nil, ReduceArgs{N: 1, Hidden: 1, Out: p, Src: p}), "Out, Start or Src is 0"},
		{k.ReduceRows(nil, ReduceArgs{N: -1}), "negative size"},
		{k.ToBF16(nil, p, 0, 5), "ToBF16: dst or src is 0"},
		{k.FromBF16(nil, p, p, -1), "FromBF16: negative length -1"},
		{k.HTMeta(nil, HTMetaArgs{N: 3, K: 0, L: 2}), "HTMeta: N = 3, K = 0"},
		{k.HTMeta(nil, HTMetaArgs{N: 3, K: 2, L: 2, TokOut: p, TopKOut: p, WOut: p, SrcW: p}), "SrcTopK or SrcW is 0"},
		{k.CountLocal(nil, p, p, -1, 2, 2), "CountLocal: n = -1"},
		{k.CountLocal(nil, 0, p, 4, 2, 2), "counts or topkLocal is 0"},
		{k.LLPlace(nil, LLPlaceArgs{R: 0, L: 2}), "LLPlace: R = 0"},
		{k.LLPlace(nil, LLPlaceArgs{R: 2, L: 2, Cap: 4, MetaWords: 9, Span: 8}), "MetaWords = 9, want at least 2 + L + 2*Cap = 12"},
		{k.LLPlace(nil, LLPlaceArgs{R: 2, L: 2, Cap: 4, MetaWords: 12, Span: 8, Meta: p, Counts: p}), "DstRow, TokOut or WOut is 0"},
	} {
		if assert.Error(t, c.err, c.want) {
			assert.Contains(t, c.err.Error(), c.want)
			assert.Contains(t, c.err.Error(), "gpu: ")
		}
	}
	// Empty work is no error and launches nothing.
	require.NoError(t, k.CopyRows(nil, CopyRowsArgs{}))
	require.NoError(t, k.PackRows(nil, PackRowsArgs{Width: 1}))
	require.NoError(t, k.ReduceRows(nil, ReduceArgs{}))
	require.NoError(t, k.RowPointers(nil, 0, 0, 0, 0, 0))
	require.NoError(t, k.FromBF16(nil, 0, 0, 0))
	require.NoError(t, k.HTMeta(nil, HTMetaArgs{K: 1, L: 1}))
	assert.Zero(t, env.l.launches, "a refused or empty call launched a kernel")
	assert.Zero(t, env.l.live)
}

// TestLaunchTable: the launch table and the Go side agree, and a wrong
// argument count is refused before anything runs.
func TestLaunchTable(t *testing.T) {
	assert.Equal(t, len(kernels.List), len(KernelNames()))
	for i, k := range kernels.List {
		assert.Equal(t, i, kernels.Index(k.Name))
		assert.Regexp(t, `^[pli]+$`, k.Params, k.Name)
		assert.Contains(t, KernelSource(), "GOEP_KERNEL "+k.Name+"(", "the source defines %s", k.Name)
	}
	assert.Equal(t, -1, kernels.Index("nope"))
	assert.ErrorContains(t, checkArgs("goep_f32_to_bf16", []uint64{1, 2}), "takes 3 arguments, got 2")
	assert.ErrorContains(t, checkArgs("nope", nil), `no kernel "nope"`)
	assert.ErrorContains(t, kernels.Emulate("goep_f32_to_bf16", 1, 32, []uint64{1}, 0), "takes 3 arguments")
	for _, f := range kernels.Files {
		src, err := kernels.File(f)
		require.NoError(t, err)
		// Every line of every file is in the program, but the include of
		// dtype.h, which NVRTC could not resolve: its text is there instead.
		for _, line := range strings.Split(src, "\n") {
			if line == `#include "dtype.h"` {
				continue
			}
			assert.Contains(t, KernelSource(), line)
		}
	}
	assert.NotContains(t, KernelSource(), `#include "dtype.h"`)
	assert.Contains(t, KernelSource(), dtype.Header)
	_, err := kernels.File("nope.cu")
	assert.Error(t, err)
}
