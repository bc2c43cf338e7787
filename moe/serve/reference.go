package serve

import (
	"fmt"

	"github.com/goep/goep/ep"
	"github.com/goep/goep/moe"
)

// Reference decodes one request alone, one position at a time, with every
// expert of m (a Model of all the experts: NewModel with first 0 and n
// Experts) and no ep, no batch and no MPI: what serving must give for it,
// its generated tokens and the hash of its logits (Served.Hash), bit for
// bit, whatever the number of ranks, the overlap, the batch it shares and
// the mode of its prefill. dtype is the element type on the wire: with
// moe.Float32 that holds in both modes; with moe.BFloat16 it holds for
// prefill through LL (in HT each rank rounds its partial sum to bfloat16,
// so the result depends on how the experts are spread).
func Reference(m *Model, dtype moe.DType, req Request) ([]int32, uint64, error) {
	c := m.Cfg
	if m.First != 0 || m.N != c.Experts {
		return nil, 0, fmt.Errorf("serve: Reference needs every expert: the model holds [%d, %d) of %d", m.First, m.First+m.N, c.Experts)
	}
	if dtype != moe.Float32 && dtype != moe.BFloat16 {
		return nil, 0, fmt.Errorf("serve: Reference: dtype %v: choose f32 or bf16", dtype)
	}
	H, K := c.Hidden, c.TopK
	kv := newKVCache(c.Layers)
	h, u := make([]float64, H), make([]float64, H)
	y, acc := make([]float64, H), make([]float64, H)
	topk, w := make([]int32, K), make([]float32, K)
	var attnS, sharedS, nextS []float64
	var out []int32
	var hash uint64
	id := make([]int32, 1)
	hs := make([]uint64, 1)
	P := len(req.Prompt)
	for pos := 0; pos < P+req.Gen-1; pos++ {
		tok := req.Prompt[min(pos, P-1)]
		if pos >= P {
			tok = out[pos-P]
		}
		m.embed(tok, h)
		for l := 0; l < c.Layers; l++ {
			if err := m.attend(l, h, []attnRow{{kv: kv, pos: pos}}, &attnS); err != nil {
				return nil, 0, err
			}
			rmsNorm(u, h, H)
			roundWire(dtype, u)
			m.route(l, u, topk, w)
			clear(acc)
			var acc32 []float32
			for k, e := range topk {
				m.expert(l, int(e), u, y)
				for j, v := range y {
					y[j] = grid(float64(w[k]) * v)
				}
				if dtype == moe.Float32 { // every sum of grid values is exact: any order
					for j, v := range y {
						acc[j] += v
					}
					continue
				}
				// bfloat16: each (token, expert) row is rounded to bfloat16;
				// the combine sums them in float32, in slot order, and rounds
				// the sum to bfloat16 once.
				roundWire(dtype, y)
				if acc32 == nil {
					acc32 = make([]float32, H)
					for j, v := range y {
						acc32[j] = float32(v)
					}
					continue
				}
				for j, v := range y {
					acc32[j] = float32(acc32[j] + float32(v))
				}
			}
			for j, v := range acc32 { // bfloat16 only
				acc[j] = float64(ep.BF16From(v).Float32())
			}
			for j, v := range acc {
				h[j] += v
			}
			m.shared(l, u, h, &sharedS)
		}
		if pos >= P-1 {
			hs[0] = hash
			m.next(h, id, hs, &nextS)
			out, hash = append(out, id[0]), hs[0]
		}
	}
	return out, hash, nil
}

// roundWire rounds v to the element type's values, in place.
func roundWire(dtype moe.DType, v []float64) {
	for i, x := range v {
		if dtype == moe.BFloat16 {
			v[i] = float64(ep.BF16From(float32(x)).Float32())
		} else {
			v[i] = float64(float32(x))
		}
	}
}
