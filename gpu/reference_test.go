package gpu

import (
	"math"

	"github.com/goep/goep/ep"
)

// CPU references of the kernels, written from the comment blocks of ep's C
// kernels (ep/internal/hostrows/layout.c, ep/internal/hostrows/rows.c, ep/internal/hostrows/convert.c) with no knowledge of the
// device code. The kernel suite (kernels_suite_test.go) compares every
// kernel with them: on the CPU emulator in every test run, on a device in
// the gpu-tagged tests. bfloat16 conversion is checked against ep's own C
// kernels (ep.ToBF16, ep.FromBF16).

// refRouting is ep_layout's full result.
type refRouting struct {
	perExpert, perRank, perNode     []int32
	pairOrd, tokRankOrd, tokNodeOrd []int32
	bad                             int64 // first bad entry t*K+k, or -1
	badKind                         int   // 1: id out of [-1, E); 2: repeated within its token
}

// refLayout is ep_layout: counts per expert, rank and node, and the
// ordinals of pairs and tokens, in token order.
func refLayout(topk []int32, T, K, E, L, R int, nodeOf []int32, nodes int) *refRouting {
	r := &refRouting{perExpert: make([]int32, E), perRank: make([]int32, R), perNode: make([]int32, nodes),
		pairOrd: make([]int32, T*K), tokRankOrd: make([]int32, T*R), tokNodeOrd: make([]int32, T*nodes), bad: -1}
	for i := range r.tokRankOrd {
		r.tokRankOrd[i] = -1
	}
	for i := range r.tokNodeOrd {
		r.tokNodeOrd[i] = -1
	}
	for t := 0; t < T; t++ {
		ids := topk[t*K : (t+1)*K]
		rankSeen := map[int]bool{}
		nodeSeen := map[int]bool{}
		for k, e := range ids {
			if e == -1 {
				r.pairOrd[t*K+k] = -1
				continue
			}
			if e < -1 || int(e) >= E {
				r.bad, r.badKind = int64(t*K+k), 1
				return r
			}
			for _, prev := range ids[:k] {
				if prev == e {
					r.bad, r.badKind = int64(t*K+k), 2
					return r
				}
			}
			r.pairOrd[t*K+k] = r.perExpert[e]
			r.perExpert[e]++
			rank := int(e) / L
			if !rankSeen[rank] {
				rankSeen[rank] = true
				r.tokRankOrd[t*R+rank] = r.perRank[rank]
				r.perRank[rank]++
				n := int(nodeOf[rank])
				if !nodeSeen[n] {
					nodeSeen[n] = true
					r.tokNodeOrd[t*nodes+n] = r.perNode[n]
					r.perNode[n]++
				}
			}
		}
	}
	return r
}

// refCopyRows: for i < n, row srcIdx[i] of src to row dstIdx[i] of dst (nil
// index: the identity), skipping negative and out-of-range indices.
func refCopyRows(dst []byte, dstIdx []int32, dstRows int, src []byte, srcIdx []int32, srcRows, n, rowBytes int) {
	for i := 0; i < n; i++ {
		s, d := i, i
		if srcIdx != nil {
			s = int(srcIdx[i])
		}
		if dstIdx != nil {
			d = int(dstIdx[i])
		}
		if s < 0 || s >= srcRows || d < 0 || d >= dstRows {
			continue
		}
		copy(dst[d*rowBytes:(d+1)*rowBytes], src[s*rowBytes:(s+1)*rowBytes])
	}
}

// refPackRows: for item j = t*W+w with o = ord[j] >= 0, row t of src to row
// base[g]+o of dst, g = group[j] (nil: w), base nil: 0; items with g outside
// [0, groups) or the row outside [0, dstRows) skipped.
func refPackRows(dst []byte, dstRows int, src []byte, ord, group, base []int32, groups, T, W, rowBytes int) {
	for j := 0; j < T*W; j++ {
		o := int(ord[j])
		if o < 0 {
			continue
		}
		g := j % W
		if group != nil {
			g = int(group[j])
		}
		if g < 0 || g >= groups {
			continue
		}
		d := o
		if base != nil {
			d += int(base[g])
		}
		if d < 0 || d >= dstRows {
			continue
		}
		t := j / W
		copy(dst[d*rowBytes:(d+1)*rowBytes], src[t*rowBytes:(t+1)*rowBytes])
	}
}

// refRowPtrs: base + idx[i]*rowBytes (idx nil: i), 0 where idx[i] < 0.
func refRowPtrs(base uint64, idx []int32, n, rowBytes int) []uint64 {
	out := make([]uint64, n)
	for i := range out {
		r := int64(i)
		if idx != nil {
			r = int64(idx[i])
		}
		if r >= 0 {
			out[i] = base + uint64(r)*uint64(rowBytes)
		}
	}
	return out
}

// refReduceRows is ep_reduce_rows on rows given as float32 values (bf16
// inputs already widened; nil: a skipped source): out[i] = sum over j in
// [start[i], start[i+1]) of w[j]*src[j], in float32 in the order of j, the
// first term assigned; a row with no sources is zero. float32(...) keeps Go
// from fusing a multiply and an add. The result is float32; the caller
// rounds it to bfloat16 for a bfloat16 output.
func refReduceRows(src [][]float32, w []float32, start []int32, n, hidden int) []float32 {
	out := make([]float32, n*hidden)
	for i := 0; i < n; i++ {
		for h := 0; h < hidden; h++ {
			var acc float32
			first := true
			for j := start[i]; j < start[i+1]; j++ {
				if src[j] == nil {
					continue
				}
				wj := float32(1)
				if w != nil {
					wj = w[j]
				}
				term := float32(wj * src[j][h])
				if first {
					acc = term
				} else {
					acc = float32(acc + term)
				}
				first = false
			}
			out[i*hidden+h] = acc
		}
	}
	return out
}

// refToBF16 rounds with ep's C kernel (ep_f32_to_bf16).
func refToBF16(src []float32) []uint16 {
	out := make([]ep.BF16, len(src))
	if err := ep.ToBF16(out, src); err != nil {
		panic(err)
	}
	u := make([]uint16, len(out))
	for i, v := range out {
		u[i] = uint16(v)
	}
	return u
}

// refFromBF16 widens with ep's C kernel (ep_bf16_to_f32).
func refFromBF16(src []uint16) []float32 {
	in := make([]ep.BF16, len(src))
	for i, v := range src {
		in[i] = ep.BF16(v)
	}
	out := make([]float32, len(src))
	if err := ep.FromBF16(out, in); err != nil {
		panic(err)
	}
	return out
}

// sameF32 reports whether two float32 are the same bits, or both NaN (the
// device makes NaNs that arithmetic produced canonical).
func sameF32(a, b float32) bool {
	return math.Float32bits(a) == math.Float32bits(b) || (a != a && b != b)
}

// sameBF16 is sameF32 for bfloat16 bits.
func sameBF16(a, b uint16) bool {
	nan := func(x uint16) bool { return x&0x7fff > 0x7f80 }
	return a == b || (nan(a) && nan(b))
}

// refHTMeta is ep_ht_meta: for each row i (rows nil: row i itself), its
// source token (srcTok nil: the row), its top-k ids made local to rank d of
// L experts each (-1 where d does not own the expert) and its weights
// (zero there).
func refHTMeta(rows []int32, n int, srcTok, srcTopK []int32, srcW []float32, K, L, d int) (tok, topk []int32, w []float32) {
	tok, topk, w = make([]int32, n), make([]int32, n*K), make([]float32, n*K)
	for i := 0; i < n; i++ {
		row := i
		if rows != nil {
			row = int(rows[i])
		}
		tok[i] = int32(row)
		if srcTok != nil {
			tok[i] = srcTok[row]
		}
		for k := 0; k < K; k++ {
			e := int(srcTopK[row*K+k])
			topk[i*K+k] = -1
			if e >= d*L && e < (d+1)*L {
				topk[i*K+k] = int32(e - d*L)
				w[i*K+k] = srcW[row*K+k]
			}
		}
	}
	return tok, topk, w
}

// refCountLocal is ep_count_local: per local expert, the entries naming it.
func refCountLocal(topkLocal []int32, L int) []int32 {
	counts := make([]int32, L)
	for _, l := range topkLocal {
		if l >= 0 && int(l) < L {
			counts[l]++
		}
	}
	return counts
}

// llBlock is what one source sends with its staged rows in a low-latency
// dispatch: the counts of its rows per expert of the receiver, the token
// and weight of each staged row (grouped by expert, then in token order).
type llBlock struct {
	op     uint32
	counts []int32
	tok    []int32
	w      []float32
}

// words is the block as LLPlace reads it, meta words long.
func (b llBlock) words(metaWords, cap int) []int32 {
	out := make([]int32, metaWords)
	out[0] = int32(b.op)
	L := len(b.counts)
	copy(out[2:], b.counts)
	copy(out[2+L:], b.tok)
	for i, w := range b.w {
		out[2+L+cap+i] = int32(math.Float32bits(w))
	}
	return out
}

// refLLPlace places the staged rows of R sources by brute force: expert l's
// rows are source 0's rows of l, then source 1's, ...; it returns the
// receive row of each staged row (-1: none), the tokens and weights at
// those rows (zero elsewhere) and the counts [R][L].
func refLLPlace(blocks []llBlock, cap, span int) (dstRow, tok []int32, w []float32, counts []int32) {
	R, L := len(blocks), len(blocks[0].counts)
	dstRow = make([]int32, R*cap)
	tok, w = make([]int32, L*span), make([]float32, L*span)
	for i := range dstRow {
		dstRow[i] = -1
	}
	next := make([]int, L) // next free row of each expert
	for s, b := range blocks {
		p := 0
		for l, c := range b.counts {
			for j := 0; j < int(c); j++ {
				row := l*span + next[l]
				dstRow[s*cap+p] = int32(row)
				tok[row], w[row] = b.tok[p], b.w[p]
				next[l]++
				p++
			}
		}
		counts = append(counts, b.counts...)
	}
	return dstRow, tok, w, counts
}
