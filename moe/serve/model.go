package serve

import (
	"fmt"
	"hash/fnv"
	"math"

	"gonum.org/v1/gonum/blas"
	"gonum.org/v1/gonum/blas/blas64"

	"github.com/goep/goep/moe"
	"github.com/goep/goep/moe/runs"
)

// Model is the decoder's parameters on one rank: the embedding, every
// layer's attention and gate (and shared expert), held by every rank, and
// the rank's share of each layer's routed experts, [First, First+N).
type Model struct {
	Cfg      ModelConfig
	First, N int
	Emb      []float64 // [Vocab][Hidden], also the output projection
	Layers   []LayerParams
}

// LayerParams are one decoder layer's parameters.
type LayerParams struct {
	Wq, Wk, Wv, Wo []float64 // [Hidden][Hidden], single-head attention
	MoE            moe.Params
}

// NewModel draws the model of cfg from cfg.Seed, with the routed experts
// [first, first+n) of each layer. With ck (a moe-train checkpoint, nil for
// none) every layer's MoE layer is the checkpoint's instead; cfg must have
// its shape.
func NewModel(cfg ModelConfig, first, n int, ck *runs.Checkpoint) (*Model, error) {
	if err := cfg.Validate(0); err != nil {
		return nil, err
	}
	if first < 0 || n < 0 || first+n > cfg.Experts {
		return nil, fmt.Errorf("serve: NewModel: experts [%d, %d) out of [0, %d)", first, first+n, cfg.Experts)
	}
	H := cfg.Hidden
	m := &Model{Cfg: cfg, First: first, N: n, Emb: make([]float64, cfg.Vocab*H), Layers: make([]LayerParams, cfg.Layers)}
	normal(newRand(cfg.Seed, streamEmbed, 0), m.Emb, 1)
	lc := cfg.layer()
	if ck != nil {
		c := ck.Config
		if c.Hidden != H || c.FFN != cfg.FFN || c.SharedFFN != cfg.SharedFFN || c.Experts != cfg.Experts || c.TopK != cfg.TopK || c.Act != cfg.Act {
			return nil, fmt.Errorf("serve: checkpoint %s has hidden %d, ffn %d, shared ffn %d, %d experts top-%d, %v; the model has hidden %d, ffn %d, shared ffn %d, %d experts top-%d, %v",
				ck.Path, c.Hidden, c.FFN, c.SharedFFN, c.Experts, c.TopK, c.Act, H, cfg.FFN, cfg.SharedFFN, cfg.Experts, cfg.TopK, cfg.Act)
		}
	}
	for l := range m.Layers {
		lp := &m.Layers[l]
		r := newRand(cfg.Seed, streamAttn, uint64(l))
		for _, w := range []*[]float64{&lp.Wq, &lp.Wk, &lp.Wv, &lp.Wo} {
			*w = make([]float64, H*H)
			normal(r, *w, 1/math.Sqrt(float64(H)))
		}
		if ck != nil {
			lp.MoE = shareOf(&ck.Model, lc, first, n)
		} else {
			lp.MoE = moe.TeacherParams(lc, mix(cfg.Seed^mix(streamMoE+uint64(l))), first, n)
		}
	}
	return m, nil
}

// shareOf is experts [first, first+n) of p (which holds them all), with its
// gate and shared expert.
func shareOf(p *moe.Params, c moe.Config, first, n int) moe.Params {
	H, F := c.Hidden, c.FFN
	return moe.Params{Gate: p.Gate, W1: p.W1[first*H*F : (first+n)*H*F], B1: p.B1[first*F : (first+n)*F],
		W2: p.W2[first*F*H : (first+n)*F*H], B2: p.B2[first*H : (first+n)*H],
		SharedW1: p.SharedW1, SharedB1: p.SharedB1, SharedW2: p.SharedW2, SharedB2: p.SharedB2}
}

func normal(r interface{ NormFloat64() float64 }, dst []float64, std float64) {
	for i := range dst {
		dst[i] = std * r.NormFloat64()
	}
}

// The MoE layer's expert outputs, weighted, are rounded to multiples of
// gridStep and clamped to +-gridLimit before they travel. Such values, and
// every sum of up to ep.MaxTopK of them, are exact in float32 (at most 2^24
// steps), so a token's MoE output is the same whatever adds it up: in LL
// the combine sums one row per (token, expert), in HT each rank first sums
// the rows of its own experts; tokens therefore do not depend on the mode,
// the number of ranks or the order of reduction.
const (
	gridStep  = 1.0 / 1024
	gridLimit = 256.0
)

// grid rounds v to the grid.
func grid(v float64) float64 {
	return math.Round(max(-gridLimit, min(gridLimit, v))/gridStep) * gridStep
}

// rmsNorm writes x / sqrt(mean(x^2) + 1e-6), row by row ([n][H]), into dst.
func rmsNorm(dst, x []float64, H int) {
	for i := 0; i+H <= len(x); i += H {
		s := 0.0
		for _, v := range x[i : i+H] {
			s += v * v
		}
		f := 1 / math.Sqrt(s/float64(H)+1e-6)
		for j, v := range x[i : i+H] {
			dst[i+j] = v * f
		}
	}
}

// matmul is c = a·b (beta 0) or c += a·b (beta 1), a [n][k], b [k][m]; each
// row of c depends on its row of a alone.
func matmul(a, b, c []float64, k, m int, beta float64) {
	n := len(a) / k
	if n == 0 || m == 0 {
		return
	}
	blas64.Gemm(blas.NoTrans, blas.NoTrans, 1, blas64.General{Rows: n, Cols: k, Stride: k, Data: a},
		blas64.General{Rows: k, Cols: m, Stride: m, Data: b}, beta, blas64.General{Rows: n, Cols: m, Stride: m, Data: c})
}

// kvCache is one request's attention keys and values, per layer, [pos][H].
type kvCache struct{ k, v [][]float64 }

func newKVCache(layers int) *kvCache {
	return &kvCache{k: make([][]float64, layers), v: make([][]float64, layers)}
}

// truncate drops the positions from pos on, in every layer.
func (c *kvCache) truncate(pos, H int) {
	for l := range c.k {
		c.k[l], c.v[l] = c.k[l][:min(len(c.k[l]), pos*H)], c.v[l][:min(len(c.v[l]), pos*H)]
	}
}

// attnRow is one row of an attention pass: the request's cache, and the
// row's position in its sequence (the rows of one request come in
// position order, the first at the cache's length).
type attnRow struct {
	kv  *kvCache
	pos int
}

// attend runs layer l's attention on the rows h ([n][H]) and adds its
// output to them: a = rms(h), q, k, v = a·Wq, a·Wk, a·Wv; the keys and
// values join their requests' caches; row i attends, causally, to its
// request's positions 0..pos_i, and h += softmax(q·K/sqrt(H))·V · Wo. Each
// row's result depends on its request's earlier positions alone, not on
// the other rows. scratch is reused.
func (m *Model) attend(l int, h []float64, rows []attnRow, scratch *[]float64) error {
	H := m.Cfg.Hidden
	n := len(rows)
	if n == 0 {
		return nil
	}
	lp := &m.Layers[l]
	*scratch = growF(*scratch, 5*n*H)
	s := *scratch
	a, q, k, v, o := s[:n*H], s[n*H:2*n*H], s[2*n*H:3*n*H], s[3*n*H:4*n*H], s[4*n*H:5*n*H]
	rmsNorm(a, h, H)
	matmul(a, lp.Wq, q, H, H, 0)
	matmul(a, lp.Wk, k, H, H, 0)
	matmul(a, lp.Wv, v, H, H, 0)
	for i, r := range rows {
		if len(r.kv.k[l]) != r.pos*H {
			return fmt.Errorf("serve: layer %d: attention row at position %d, its cache holds %d positions", l, r.pos, len(r.kv.k[l])/H)
		}
		r.kv.k[l] = append(r.kv.k[l], k[i*H:(i+1)*H]...)
		r.kv.v[l] = append(r.kv.v[l], v[i*H:(i+1)*H]...)
	}
	scale := 1 / math.Sqrt(float64(H))
	var w []float64
	for i, r := range rows {
		keys, vals, qi, oi := r.kv.k[l], r.kv.v[l], q[i*H:(i+1)*H], o[i*H:(i+1)*H]
		w = growF(w, r.pos+1)
		best := math.Inf(-1)
		for p := range w {
			d := 0.0
			for j, x := range keys[p*H : (p+1)*H] {
				d += qi[j] * x
			}
			w[p] = d * scale
			best = max(best, w[p])
		}
		sum := 0.0
		for p, x := range w {
			w[p] = math.Exp(x - best)
			sum += w[p]
		}
		clear(oi)
		for p, x := range w {
			f := x / sum
			for j, y := range vals[p*H : (p+1)*H] {
				oi[j] += f * y
			}
		}
	}
	matmul(o, lp.Wo, h, H, H, 1)
	return nil
}

// route chooses layer l's experts for the rows u ([n][H], the values as
// they travel): topk and w are [n][TopK].
func (m *Model) route(l int, u []float64, topk []int32, w []float32) {
	c := m.Cfg
	moe.Route(m.Layers[l].MoE.Gate, u, c.Hidden, c.Experts, c.TopK, topk, w)
}

// expert runs layer l's local expert i (0-based among this rank's) on the
// rows u ([n][H]) into out.
func (m *Model) expert(l, i int, u, out []float64) {
	m.Layers[l].MoE.ExpertForward(m.Cfg.layer(), i, u, out)
}

// shared adds layer l's shared expert's output for the rows u to h; no-op
// without one.
func (m *Model) shared(l int, u, h []float64, scratch *[]float64) {
	if m.Cfg.SharedFFN == 0 || len(u) == 0 {
		return
	}
	*scratch = growF(*scratch, len(u))
	s := *scratch
	m.Layers[l].MoE.SharedForward(m.Cfg.layer(), u, s)
	for i, v := range s {
		h[i] += v
	}
}

// next is the greedy choice for each row of h ([n][H]): the argmax (ties
// to the lower id) of rms(h)·Embᵀ, and a hash of the logits' bits, fed
// into hashes[i] (FNV-1a), so that two runs can be compared bit for bit.
func (m *Model) next(h []float64, ids []int32, hashes []uint64, scratch *[]float64) {
	H, V := m.Cfg.Hidden, m.Cfg.Vocab
	n := len(h) / H
	if n == 0 {
		return
	}
	*scratch = growF(*scratch, n*H+n*V)
	a, logits := (*scratch)[:n*H], (*scratch)[n*H:n*H+n*V]
	rmsNorm(a, h, H)
	blas64.Gemm(blas.NoTrans, blas.Trans, 1, blas64.General{Rows: n, Cols: H, Stride: H, Data: a},
		blas64.General{Rows: V, Cols: H, Stride: H, Data: m.Emb}, 0, blas64.General{Rows: n, Cols: V, Stride: V, Data: logits})
	var b [8]byte
	for i := 0; i < n; i++ {
		row := logits[i*V : (i+1)*V]
		best := 0
		hs := fnv.New64a()
		seed := hashes[i]
		for j := range b {
			b[j] = byte(seed >> (8 * j))
		}
		hs.Write(b[:])
		for j, v := range row {
			if v > row[best] {
				best = j
			}
			bits := math.Float64bits(v)
			for k := range b {
				b[k] = byte(bits >> (8 * k))
			}
			hs.Write(b[:])
		}
		ids[i], hashes[i] = int32(best), hs.Sum64()
	}
}

// embed writes the embedding of token id into row.
func (m *Model) embed(id int32, row []float64) {
	H := m.Cfg.Hidden
	copy(row, m.Emb[int(id)*H:(int(id)+1)*H])
}

func growF(s []float64, n int) []float64 {
	if cap(s) >= n {
		return s[:n]
	}
	return make([]float64, n)
}
