package gpu

import (
	"errors"
	"fmt"
	"github.com/goep/goep/internal/dtype"
	"math"

	"github.com/goep/goep/gpu/internal/kernels"
)

// A Queue is where device work runs in order: a Stream, CUDA (a nil Queue:
// the default stream) or emulated (package gpu/emulator). Kernels'
// methods queue their launches on one; its Synchronize waits for them.
type Queue interface {
	Synchronize() error
}

// A Launcher runs the package's kernels for Kernels: the CUDA module that
// CUDADevice.Kernels loads, or the CPU emulator of package gpu/emulator. Every
// method queues work on q and returns; args (one 8-byte slot per kernel
// parameter, see KernelParams) are the caller's until Launch returns, so a
// Launcher that runs later copies them.
type Launcher interface {
	// Launch runs the named kernel on grid blocks of block threads.
	Launch(name string, grid, block uint32, args []uint64, q Queue) error
	// AllocAsync and FreeAsync are scratch memory ordered by q.
	AllocAsync(n int, q Queue) (DevicePtr, error)
	FreeAsync(p DevicePtr, q Queue) error
	// MemsetAsync sets n bytes at p to v, in q's order.
	MemsetAsync(p DevicePtr, v byte, n int, q Queue) error
}

// Kernels runs the package's kernels on one device. Every method queues
// work on queue q (a Stream; nil: a CUDA device's default stream) and returns without
// waiting; arguments are device addresses (DevicePtr; 0 = none where
// allowed) and sizes, checked on the host before anything is queued. The
// kernels' exact semantics are in their sources (KernelSource), each the
// counterpart of a CPU kernel of package ep, whose results they reproduce
// bit for bit.
type Kernels struct {
	l       Launcher
	arch    int
	maxGrid uint32
	chunk   int64 // tokens per layout chunk; 0 = automatic
}

// Kernels compiles (or finds in the PTX cache) the kernels for this device
// and loads them, on first use; later calls return the same value.
func (d *CUDADevice) Kernels() (*Kernels, error) {
	d.kernelsOnce.Do(func() { d.kernels, d.kernelsErr = loadKernels(d) })
	return d.kernels, d.kernelsErr
}

// Arch returns the virtual architecture the kernels were compiled for (90
// = compute_90).
func (k *Kernels) Arch() int { return k.arch }

func newKernels(l Launcher, arch int) *Kernels { return &Kernels{l: l, arch: arch, maxGrid: 8192} }

// NewKernels runs the kernels through l: how package gpu/emulator runs them
// on the CPU. CUDADevice.Kernels is the CUDA one. Arch is 0.
func NewKernels(l Launcher) *Kernels { return newKernels(l, 0) }

// KernelParams returns the parameter letters of the named kernel (p: a
// device address, l: a 64-bit integer, i: a 32-bit int, one 8-byte slot
// each), or an error for a kernel that does not exist: a Launcher's check
// of its arguments.
func KernelParams(name string) (string, error) {
	x := kernels.Index(name)
	if x < 0 {
		return "", fmt.Errorf("gpu: no kernel %q", name)
	}
	return kernels.List[x].Params, nil
}

// DType is an element type of the row kernels: the codes of
// internal/dtype, which ep's C kernels use too.
type DType = dtype.Code

// The element types.
const (
	F32  = dtype.F32  // float32
	BF16 = dtype.BF16 // bfloat16 (ep.BF16)
)

// gridFor returns the blocks for n items handled one per block (perBlock =
// 1) or one per thread (perBlock = block size), at least 1, at most maxGrid
// (the kernels stride over the rest).
func (k *Kernels) gridFor(n int64, perBlock int64) uint32 {
	g := (n + perBlock - 1) / perBlock
	if g < 1 {
		g = 1
	}
	if g > int64(k.maxGrid) {
		g = int64(k.maxGrid)
	}
	return uint32(g)
}

// rowBlock is the block size for work on rows of `units` units: a warp
// multiple up to 256.
func rowBlock(units int64) uint32 {
	b := (units + 31) / 32 * 32
	if b < 32 {
		b = 32
	}
	if b > 256 {
		b = 256
	}
	return uint32(b)
}

func argErr(op, format string, a ...any) error {
	return fmt.Errorf("gpu: %s: %s", op, fmt.Sprintf(format, a...))
}

// LayoutArgs are the inputs and outputs of Layout: ep_layout's, on the
// device. Int32 arrays unless noted; outputs may be 0 when not wanted.
type LayoutArgs struct {
	TopK           DevicePtr // [Tokens][K] expert ids, -1 = none
	Tokens, K      int
	Experts        int       // E
	ExpertsPerRank int       // L: rank r owns experts [r*L, (r+1)*L)
	Ranks          int       // R, with E <= R*L
	NodeOf         DevicePtr // [Ranks]: each rank's node in [0, Nodes)
	Nodes          int

	PerExpert, PerRank, PerNode DevicePtr // [Experts], [Ranks], [Nodes]: counts
	PairOrd                     DevicePtr // [Tokens][K]: place among its expert's pairs, -1 = masked
	TokRankOrd                  DevicePtr // [Tokens][Ranks]: place among the tokens sent to the rank, -1 = not sent
	TokNodeOrd                  DevicePtr // [Tokens][Nodes]: the same per node
	// Bad, a uint64, becomes ^0 when every id is valid, else the first bad
	// entry i = t*K+k and its kind as i<<2 | kind (DecodeBad).
	Bad DevicePtr
}

// DecodeBad reads LayoutArgs.Bad: ok when every id was valid, else the
// index t*K+k of the first bad entry and its kind (1: id outside [-1, E);
// 2: an expert repeated within a token), as ep_layout reports them.
func DecodeBad(v uint64) (index int64, kind int, ok bool) {
	if v == math.MaxUint64 {
		return -1, 0, true
	}
	return int64(v >> 2), int(v & 3), false
}

// Layout computes the dispatch layout of TopK (ep_layout). It allocates
// its scratch memory on the stream.
func (k *Kernels) Layout(s Queue, a LayoutArgs) error {
	const op = "Layout"
	switch {
	case a.Tokens < 0 || a.K < 1:
		return argErr(op, "Tokens = %d, K = %d: need Tokens >= 0 and K >= 1", a.Tokens, a.K)
	case int64(a.Tokens)*int64(a.K) > math.MaxInt32:
		return argErr(op, "Tokens*K = %d pairs: at most %d", int64(a.Tokens)*int64(a.K), math.MaxInt32)
	case a.Experts < 1 || a.ExpertsPerRank < 1 || a.Ranks < 1 || a.Nodes < 1:
		return argErr(op, "Experts = %d, ExpertsPerRank = %d, Ranks = %d, Nodes = %d: each must be >= 1",
			a.Experts, a.ExpertsPerRank, a.Ranks, a.Nodes)
	case int64(a.Experts) > int64(a.Ranks)*int64(a.ExpertsPerRank):
		return argErr(op, "%d experts do not fit in %d ranks of %d", a.Experts, a.Ranks, a.ExpertsPerRank)
	case a.Tokens > 0 && a.TopK == 0:
		return argErr(op, "TopK is 0 for %d tokens", a.Tokens)
	case a.NodeOf == 0:
		return argErr(op, "NodeOf is 0")
	}
	if a.Bad != 0 {
		if err := k.l.MemsetAsync(a.Bad, 0xff, 8, s); err != nil {
			return err
		}
	}
	T := int64(a.Tokens)
	chunk := k.chunk
	if chunk <= 0 {
		// At most 512 chunks: the scan walks them a batch of loads at
		// a time (16 round trips to memory), and each (chunk, column)
		// thread walks its chunk (8 tokens at 4096).
		chunk = (T + 511) / 512
		if chunk < 1 {
			chunk = 1
		}
	}
	C := (T + chunk - 1) / chunk
	W := int64(a.Experts) + int64(a.Ranks) + int64(a.Nodes)
	countsBytes := C * W * 4
	if countsBytes < 4 {
		countsBytes = 4
	}
	counts, err := k.l.AllocAsync(int(countsBytes), s)
	if err != nil {
		return err
	}
	const block = 128
	grid := k.gridFor(C*W, block)
	err = k.launchLayoutCount(s, grid, block, a.TopK, int64(a.Tokens), int32(a.K), int32(a.Experts), int32(a.ExpertsPerRank),
		int32(a.Ranks), a.NodeOf, int32(a.Nodes), chunk, counts, a.Bad)
	if err == nil {
		err = k.launchLayoutScan(s, k.gridFor(W, block), block, counts, C, int32(a.Experts), int32(a.Ranks), int32(a.Nodes),
			a.PerExpert, a.PerRank, a.PerNode)
	}
	if err == nil {
		err = k.launchLayoutAssign(s, grid, block, a.TopK, int64(a.Tokens), int32(a.K), int32(a.Experts), int32(a.ExpertsPerRank),
			int32(a.Ranks), a.NodeOf, int32(a.Nodes), chunk, counts, a.PairOrd, a.TokRankOrd, a.TokNodeOrd)
	}
	return errors.Join(err, k.l.FreeAsync(counts, s))
}

// CopyRowsArgs describe CopyRows: for i < N, row SrcIdx[i] of Src goes to
// row DstIdx[i] of Dst (an index array of 0 means the identity). Negative
// indices, and indices past SrcRows or DstRows, skip the row.
type CopyRowsArgs struct {
	Dst     DevicePtr
	DstIdx  DevicePtr // int32 [N], or 0
	DstRows int
	Src     DevicePtr
	SrcIdx  DevicePtr // int32 [N], or 0
	SrcRows int
	N       int
	// RowBytes is the size of a row; rows move 16 bytes at a time when
	// addresses and size allow, else 4, else 1.
	RowBytes int
}

// CopyRows scatters, gathers or permutes rows (goep_copy_rows).
func (k *Kernels) CopyRows(s Queue, a CopyRowsArgs) error {
	const op = "CopyRows"
	if a.N < 0 || a.RowBytes < 0 || a.DstRows < 0 || a.SrcRows < 0 {
		return argErr(op, "negative size (N %d, RowBytes %d, DstRows %d, SrcRows %d)", a.N, a.RowBytes, a.DstRows, a.SrcRows)
	}
	if a.N == 0 || a.RowBytes == 0 {
		return nil
	}
	if a.Dst == 0 || a.Src == 0 {
		return argErr(op, "Dst or Src is 0")
	}
	return k.launchCopyRows(s, k.gridFor(int64(a.N), 1), rowBlock(int64(a.RowBytes)/16),
		a.Dst, a.DstIdx, int64(a.DstRows), a.Src, a.SrcIdx, int64(a.SrcRows), int64(a.N), int64(a.RowBytes))
}

// PackRowsArgs describe PackRows: for each item j = t*Width+w with
// o = Ord[j] >= 0, row t of Src goes to row Base[g]+o of Dst, where
// g = Group[j] (or w when Group is 0) and Base[g] = 0 when Base is 0.
// Items whose g is outside [0, Groups) or whose row is outside [0, DstRows)
// are skipped.
//
// LL (expert-major): Ord = the layout's PairOrd, Width = K, Group = TopK,
// Base[e] = first row of expert e's block. HT (rank-grouped): Ord =
// TokRankOrd, Width = Ranks, Group = 0, Base[r] = first row of rank r's
// block.
type PackRowsArgs struct {
	Dst     DevicePtr
	DstRows int
	Src     DevicePtr // [Tokens][RowBytes]
	Ord     DevicePtr // int32 [Tokens][Width]
	Group   DevicePtr // int32 [Tokens][Width], or 0
	Base    DevicePtr // int32 [Groups], or 0
	Groups  int       // 0: Width
	Tokens  int
	Width   int
	// RowBytes is the size of a row.
	RowBytes int
}

// PackRows writes token rows into grouped buffers (goep_pack_rows).
func (k *Kernels) PackRows(s Queue, a PackRowsArgs) error {
	const op = "PackRows"
	if a.Tokens < 0 || a.Width < 1 || a.RowBytes < 0 || a.DstRows < 0 || a.Groups < 0 {
		return argErr(op, "bad size (Tokens %d, Width %d, RowBytes %d, DstRows %d, Groups %d)",
			a.Tokens, a.Width, a.RowBytes, a.DstRows, a.Groups)
	}
	if a.Tokens == 0 || a.RowBytes == 0 {
		return nil
	}
	if a.Dst == 0 || a.Src == 0 || a.Ord == 0 {
		return argErr(op, "Dst, Src or Ord is 0")
	}
	groups := a.Groups
	if groups == 0 {
		groups = a.Width
	}
	n := int64(a.Tokens) * int64(a.Width)
	return k.launchPackRows(s, k.gridFor(n, 1), rowBlock(int64(a.RowBytes)/16),
		a.Dst, int64(a.DstRows), a.Src, a.Ord, a.Group, a.Base, int32(groups), int64(a.Tokens), int32(a.Width), int64(a.RowBytes))
}

// RowPointers sets dst[i] (uint64) to base + idx[i]*rowBytes, or to 0 where
// idx[i] < 0, for i < n (idx 0: the identity): the source list of
// ReduceRows from row numbers.
func (k *Kernels) RowPointers(s Queue, dst, base, idx DevicePtr, n, rowBytes int) error {
	if n < 0 || rowBytes < 0 {
		return argErr("RowPointers", "negative size (n %d, rowBytes %d)", n, rowBytes)
	}
	if n == 0 {
		return nil
	}
	if dst == 0 {
		return argErr("RowPointers", "dst is 0")
	}
	const block = 256
	return k.launchRowPtrs(s, k.gridFor(int64(n), block), block, dst, int64(base), idx, int64(n), int64(rowBytes))
}

// ReduceArgs describe ReduceRows: for each output row i < N,
// Out[i] = sum over j in [Start[i], Start[i+1]) of Weights[j] * row Src[j],
// accumulated in float32 in the order of j (ep_reduce_rows).
type ReduceArgs struct {
	Out     DevicePtr // [N][Hidden] of OutType
	OutType DType
	Src     DevicePtr // uint64 [Start[N]]: device addresses of rows of InType (0: skipped)
	Weights DevicePtr // float32 [Start[N]], or 0 for all ones
	Start   DevicePtr // int32 [N+1], non-decreasing
	N       int
	Hidden  int
	InType  DType
}

// ReduceRows is the weighted combine (goep_reduce_rows).
func (k *Kernels) ReduceRows(s Queue, a ReduceArgs) error {
	const op = "ReduceRows"
	if a.N < 0 || a.Hidden < 0 {
		return argErr(op, "negative size (N %d, Hidden %d)", a.N, a.Hidden)
	}
	if !a.OutType.Valid() || !a.InType.Valid() {
		return argErr(op, "element types %v -> %v: need F32 or BF16", a.InType, a.OutType)
	}
	if a.N == 0 || a.Hidden == 0 {
		return nil
	}
	if a.Out == 0 || a.Start == 0 || a.Src == 0 {
		return argErr(op, "Out, Start or Src is 0")
	}
	// One block per (row, segment), a segment being what the block's
	// threads take at once: 8 elements each on the kernel's vector path.
	block := rowBlock(int64(a.Hidden) / 8)
	segs := (int64(a.Hidden) + 8*int64(block) - 1) / (8 * int64(block))
	return k.launchReduceRows(s, k.gridFor(int64(a.N)*segs, 1), block,
		a.Out, int32(a.OutType), a.Src, a.Weights, a.Start, int64(a.N), int64(a.Hidden), int32(a.InType))
}

// ToBF16 rounds n float32 at src to bfloat16 at dst, to nearest even
// (ep_f32_to_bf16).
func (k *Kernels) ToBF16(s Queue, dst, src DevicePtr, n int) error {
	return k.convert("ToBF16", "goep_f32_to_bf16", s, dst, src, n)
}

// FromBF16 widens n bfloat16 at src to float32 at dst (ep_bf16_to_f32).
func (k *Kernels) FromBF16(s Queue, dst, src DevicePtr, n int) error {
	return k.convert("FromBF16", "goep_bf16_to_f32", s, dst, src, n)
}

func (k *Kernels) convert(op, name string, s Queue, dst, src DevicePtr, n int) error {
	if n < 0 {
		return argErr(op, "negative length %d", n)
	}
	if n == 0 {
		return nil
	}
	if dst == 0 || src == 0 {
		return argErr(op, "dst or src is 0")
	}
	const block = 256 // of threads that take 8 elements each
	grid := k.gridFor((int64(n)+7)/8, block)
	if name == "goep_f32_to_bf16" {
		return k.launchF32ToBf16(s, grid, block, dst, src, int64(n))
	}
	return k.launchBf16ToF32(s, grid, block, dst, src, int64(n))
}

// checkArgs checks a launch's arguments against the kernel table.
func checkArgs(name string, args []uint64) error {
	x := kernels.Index(name)
	if x < 0 {
		return fmt.Errorf("gpu: no kernel %q", name)
	}
	if want := len(kernels.List[x].Params); len(args) != want {
		return fmt.Errorf("gpu: kernel %s takes %d arguments, got %d", name, want, len(args))
	}
	return nil
}

// HTMetaArgs describe HTMeta (ep_ht_meta): for each of N rows i, with
// row = Rows[i] (Rows 0: row = i), TokOut[i] = SrcTok[row] (SrcTok 0: row),
// and the row's K top-k ids SrcTopK[row] made local to rank Rank, which
// owns experts [Rank*L, (Rank+1)*L): id - Rank*L there, else -1, with
// WOut the weights SrcW[row], zeroed where the id is -1. int32 arrays but
// the float32 weights.
type HTMetaArgs struct {
	TokOut, TopKOut, WOut DevicePtr // [N], [N][K], [N][K]
	Rows                  DevicePtr // [N], or 0
	N                     int
	SrcTok                DevicePtr // indexed by row, or 0
	SrcTopK, SrcW         DevicePtr // [rows][K]
	K, L, Rank            int
}

// HTMeta writes the metadata a rank keeps with its received HT rows
// (goep_ht_meta).
func (k *Kernels) HTMeta(s Queue, a HTMetaArgs) error {
	const op = "HTMeta"
	switch {
	case a.N < 0 || a.K < 1 || a.L < 1 || a.Rank < 0:
		return argErr(op, "N = %d, K = %d, L = %d, Rank = %d: need N >= 0, K and L >= 1, Rank >= 0", a.N, a.K, a.L, a.Rank)
	case int64(a.Rank+1)*int64(a.L) > math.MaxInt32:
		return argErr(op, "experts of rank %d (%d each) exceed the 32-bit ids", a.Rank, a.L)
	case a.N == 0:
		return nil
	case a.TokOut == 0 || a.TopKOut == 0 || a.WOut == 0 || a.SrcTopK == 0 || a.SrcW == 0:
		return argErr(op, "TokOut, TopKOut, WOut, SrcTopK or SrcW is 0")
	}
	const block = 128
	return k.launchHtMeta(s, k.gridFor(int64(a.N), block), block, a.TokOut, a.TopKOut, a.WOut, a.Rows, int64(a.N), a.SrcTok,
		a.SrcTopK, a.SrcW, int32(a.K), int32(a.L), int32(a.Rank))
}

// CountLocal sets counts[l] (int32 [l]) to the number of entries of
// topkLocal (int32 [n][k], -1 = an expert elsewhere) equal to l, for l < L
// (ep_count_local): the rows per local expert of an HT dispatch.
func (k *Kernels) CountLocal(s Queue, counts, topkLocal DevicePtr, n, K, L int) error {
	const op = "CountLocal"
	switch {
	case n < 0 || K < 1 || L < 1:
		return argErr(op, "n = %d, K = %d, L = %d: need n >= 0, K and L >= 1", n, K, L)
	case int64(n)*int64(K) > math.MaxInt32:
		return argErr(op, "n*K = %d entries: at most %d", int64(n)*int64(K), math.MaxInt32)
	case counts == 0 || (n > 0 && topkLocal == 0):
		return argErr(op, "counts or topkLocal is 0")
	}
	if err := k.l.MemsetAsync(counts, 0, 4*L, s); err != nil {
		return err
	}
	if n == 0 {
		return nil
	}
	const block = 256
	return k.launchCountLocal(s, k.gridFor(int64(n)*int64(K), block), block, topkLocal, int64(n), int32(K), int32(L), counts)
}

// LLPlaceArgs describe LLPlace (goep_ll_place): the blocks that R sources
// sent in a low-latency dispatch, Cap staged rows each with MetaWords int32
// words of metadata (Op, flags, L counts, Cap tokens, Cap weights), placed
// into the expert-major receive buffer of L experts of Span rows.
type LLPlaceArgs struct {
	Meta           DevicePtr // int32 [R][MetaWords]
	R, L           int
	Cap, MetaWords int
	Span           int
	Op             uint32    // the call's sequence number, low 32 bits
	DstRow         DevicePtr // int32 [R][Cap]: the receive row of each staged row, -1 = none
	TokOut, WOut   DevicePtr // int32 and float32 [L][Span]
	Counts         DevicePtr // int32 [R][L]
	// Bad, a uint64, becomes ^0 when every block is of call Op and fits,
	// else the lowest source whose block is not.
	Bad DevicePtr
}

// LLMetaWords is the size in int32 words of the metadata block one source
// sends with cap staged rows for l local experts (LLPlace's MetaWords).
func LLMetaWords(l, cap int) int { return 2 + l + 2*cap }

// LLPlace computes where each staged row of a low-latency dispatch goes, and
// writes the rows' tokens and weights there (goep_ll_place); CopyRows with
// DstIdx = DstRow then moves the rows.
func (k *Kernels) LLPlace(s Queue, a LLPlaceArgs) error {
	const op = "LLPlace"
	switch {
	case a.R < 1 || a.L < 1 || a.Cap < 0 || a.Span < 0:
		return argErr(op, "R = %d, L = %d, Cap = %d, Span = %d: need R and L >= 1, Cap and Span >= 0", a.R, a.L, a.Cap, a.Span)
	case a.MetaWords < LLMetaWords(a.L, a.Cap):
		return argErr(op, "MetaWords = %d, want at least 2 + L + 2*Cap = %d", a.MetaWords, LLMetaWords(a.L, a.Cap))
	case int64(a.R)*int64(a.Cap) > math.MaxInt32 || int64(a.L)*int64(a.Span) > math.MaxInt32:
		return argErr(op, "R*Cap = %d staged or L*Span = %d received rows: at most %d", int64(a.R)*int64(a.Cap),
			int64(a.L)*int64(a.Span), math.MaxInt32)
	case a.Meta == 0 || a.Counts == 0 || (a.Cap > 0 && (a.DstRow == 0 || a.TokOut == 0 || a.WOut == 0)):
		return argErr(op, "Meta, Counts, DstRow, TokOut or WOut is 0")
	}
	if a.Bad != 0 {
		if err := k.l.MemsetAsync(a.Bad, 0xff, 8, s); err != nil {
			return err
		}
	}
	n := max(int64(a.R)*int64(a.Cap), int64(a.R)*int64(a.L))
	const block = 128
	return k.launchLlPlace(s, k.gridFor(n, block), block, a.Meta, int32(a.R), int32(a.L), int64(a.Cap), int64(a.MetaWords), int64(a.Span),
		int32(a.Op), a.DstRow, a.TokOut, a.WOut, a.Counts, a.Bad)
}
