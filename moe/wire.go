package moe

import (
	"time"
	"unsafe"

	"github.com/goep/goep/ep"
	"github.com/goep/goep/mpi"
)

// entry is one (received row, local expert) pair: the expert runs on the row.
type entry struct {
	row int32   // compact row index
	rv  int32   // index of the pair in Combine's RowValues
	w   float64 // the pair's top-k weight
}

// routed is what a dispatch delivered to this rank, in float64: the valid
// received rows, packed ("compact rows"), and for each local expert the pairs
// it runs on.
type routed struct {
	n        int
	rvLen    int       // length of Combine's RowValues
	bufRow   []int     // [n]: the row of Recv each compact row came from
	x        []float64 // [n][H]
	byExpert [][]entry // [L]
}

// wire moves float64 tokens through an ep.Group of the configured element
// type: the one place where the element type matters. Every method is
// collective.
type wire interface {
	// dispatch sends the tokens x ([T][H]) to their experts.
	dispatch(x []float64, topk []int32, w []float32) (*routed, error)
	// combine returns the expert outputs y (compact rows) to the tokens' ranks
	// and reduces them into out ([T][H]): weighted by the top-k weights in LL
	// mode; a plain sum in HT mode, where y already holds them.
	combine(r *routed, y, out []float64) error
	// dispatchGrad is the backward of combine: it brings the output gradient
	// g ([T][H]) to the rows of the last dispatch, returned as compact rows.
	dispatchGrad(r *routed, g []float64) ([]float64, error)
	// combineGrad is the backward of dispatch: it sums the input gradients of
	// the rows dx (compact) back into gx ([T][H]), and brings rowValues (one
	// per entry, indexed by entry.rv; [r.rvLen]) to gw ([T][K]).
	combineGrad(r *routed, dx, rowValues, gx, gw []float64) error
	// takeStats returns the time spent and bytes sent since the last call.
	takeStats() commStats
	close() error
}

// commStats is what a rank spent in ep calls.
type commStats struct {
	dispatch, combine time.Duration
	bytesSent         int64
	// Per peer rank, from the group's statistics (ep.Stats): how long this
	// rank waited for it (nil where the engine does not measure waits), and
	// the row payload sent to and received from it, itself included.
	peerWait           []time.Duration
	peerSent, peerRecv []int64
}

func newWire(comm *mpi.Comm, c Config) (wire, error) {
	cfg := ep.Config{Mode: c.Mode, NumExperts: c.Experts, MaxTokensPerRank: c.Tokens, Hidden: c.Hidden,
		TopK: c.TopK, Timeout: c.Timeout}
	switch c.DType {
	case BFloat16:
		return newEPWire[ep.BF16](comm, cfg)
	case FP8:
		cfg.Wire = ep.WireFP8
		return newEPWire[ep.BF16](comm, cfg)
	}
	return newEPWire[float32](comm, cfg)
}

type epWire[E ep.Element] struct {
	g          *ep.Group[E]
	c          ep.Config
	rank, size int
	L, span    int // local experts; rows per expert block in LL mode
	h, hb      ep.Handle[E]
	tok, out   []E       // [Tokens][H] staging of the tokens' side
	ones       []float32 // [Tokens][K] all ones: LL WeightsOverride
	rowValues  []float32
	slotValues []float32
	grad       []float64 // compact rows of the output gradient
	deq        []float32 // FP8: one row dequantized
	stats      commStats
	tokBytes   int64 // bytes the tokens' side of the last dispatch sent
	rowBytes   int64 // bytes the experts' side of the last dispatch will send back
}

func newEPWire[E ep.Element](comm *mpi.Comm, c ep.Config) (*epWire[E], error) {
	g, err := ep.NewGroup[E](comm, c)
	if err != nil {
		return nil, err
	}
	w := &epWire[E]{g: g, c: c, rank: comm.Rank(), size: comm.Size(), L: g.LocalExperts(),
		span: comm.Size() * c.MaxTokensPerRank,
		tok:  make([]E, c.MaxTokensPerRank*c.Hidden), out: make([]E, c.MaxTokensPerRank*c.Hidden),
		ones: make([]float32, c.MaxTokensPerRank*c.TopK)}
	for i := range w.ones {
		w.ones[i] = 1
	}
	return w, nil
}

func (w *epWire[E]) close() error { return w.g.Close() }

func (w *epWire[E]) takeStats() commStats {
	s := w.stats
	w.stats = commStats{}
	gs := w.g.Stats()
	w.g.ResetStats()
	s.peerWait, s.peerSent, s.peerRecv = gs.Wait, gs.SentBytes, gs.RecvBytes
	return s
}

func elemBytes[E ep.Element]() int64 {
	var z E
	return int64(unsafe.Sizeof(z))
}

// received widens the rows of a dispatch listed in rows into dst (compact,
// [len(rows)][H]): the elements, or in FP8 the codes times their scales.
func (w *epWire[E]) received(h ep.Handle[E], rows []int, dst []float64) error {
	H := w.c.Hidden
	if !w.c.Wire.FP8() {
		recv := h.Recv().Host()
		for i, row := range rows {
			fromWire(dst[i*H:(i+1)*H], recv[row*H:(row+1)*H])
		}
		return nil
	}
	codes, scales, G := h.RecvFP8().Host(), h.RecvScales().Host(), ep.ScaleGroups(H)
	if cap(w.deq) < H {
		w.deq = make([]float32, H)
	}
	w.deq = w.deq[:H]
	for i, row := range rows {
		if err := ep.Dequantize(w.deq, codes[row*H:(row+1)*H], scales[row*G:(row+1)*G], H); err != nil {
			return err
		}
		for c, v := range w.deq {
			dst[i*H+c] = float64(v)
		}
	}
	return nil
}

// toWire rounds float64 values to E (bfloat16 through float32).
func toWire[E ep.Element](dst []E, src []float64) {
	switch d := any(dst).(type) {
	case []float32:
		for i, v := range src {
			d[i] = float32(v)
		}
	case []ep.BF16:
		for i, v := range src {
			d[i] = ep.BF16From(float32(v))
		}
	}
}

// fromWire widens E values to float64.
func fromWire[E ep.Element](dst []float64, src []E) {
	switch s := any(src).(type) {
	case []float32:
		for i, v := range s {
			dst[i] = float64(v)
		}
	case []ep.BF16:
		for i, v := range s {
			dst[i] = float64(v.Float32())
		}
	}
}

func (w *epWire[E]) dispatch(x []float64, topk []int32, wts []float32) (*routed, error) {
	H, K := w.c.Hidden, w.c.TopK
	T := len(topk) / K
	tok := w.tok[:T*H]
	toWire(tok, x)
	start := time.Now()
	h, err := w.g.Dispatch(ep.Host(tok), topk, wts)
	w.stats.dispatch += time.Since(start)
	if err != nil {
		return nil, err
	}
	w.h, w.hb = h, ep.Handle[E]{}
	r := &routed{byExpert: make([][]entry, w.L), rvLen: w.L * w.span}
	rw := h.RecvWeights().Host()
	// Bytes: the tokens' side sends one row per (token, remote expert) pair in
	// LL mode, one per (token, remote rank) in HT mode (in FP8: its codes and
	// scales); the experts' side sends one row back per received row from
	// another rank.
	rowB := int64(H) * elemBytes[E]()
	dispB := rowB
	if w.c.Wire.FP8() {
		dispB = int64(H + 4*ep.ScaleGroups(H))
	}
	w.tokBytes, w.rowBytes = 0, 0
	if w.c.Mode == ep.LowLatency {
		for _, e := range topk {
			if e >= 0 && int(e)/w.L != w.rank {
				w.tokBytes += dispB
			}
		}
		for l, cnt := range h.ExpertCounts() {
			for j := 0; j < cnt; j++ {
				row := l*w.span + j
				r.byExpert[l] = append(r.byExpert[l], entry{row: int32(r.n), rv: int32(row), w: float64(rw[row])})
				r.bufRow = append(r.bufRow, row)
				r.n++
				if src, _, err := h.Source(row); err != nil {
					return nil, err
				} else if src != w.rank {
					w.rowBytes += rowB
				}
			}
		}
	} else {
		dest := make([]bool, w.size)
		for t := 0; t < T; t++ {
			clear(dest)
			for _, e := range topk[t*K : (t+1)*K] {
				if e >= 0 {
					dest[int(e)/w.L] = true
				}
			}
			for d, ok := range dest {
				if ok && d != w.rank {
					w.tokBytes += dispB
				}
			}
		}
		ids := h.RecvTopK().Host()
		r.n = h.NumRecv()
		r.rvLen = r.n * K
		for row := 0; row < r.n; row++ {
			r.bufRow = append(r.bufRow, row)
			for k := 0; k < K; k++ {
				if l := ids[row*K+k]; l >= 0 {
					r.byExpert[l] = append(r.byExpert[l], entry{row: int32(row), rv: int32(row*K + k), w: float64(rw[row*K+k])})
				}
			}
			if src, _, err := h.Source(row); err != nil {
				return nil, err
			} else if src != w.rank {
				w.rowBytes += rowB
			}
		}
	}
	r.x = make([]float64, r.n*H)
	if err := w.received(h, r.bufRow, r.x); err != nil {
		return nil, err
	}
	w.stats.bytesSent += w.tokBytes
	return r, nil
}

// publish writes compact rows into a handle's combine buffer.
func (w *epWire[E]) publish(h ep.Handle[E], r *routed, y []float64) ep.Tensor[E] {
	H := w.c.Hidden
	t := h.CombineBuffer()
	buf := t.Host()
	for i, row := range r.bufRow {
		toWire(buf[row*H:(row+1)*H], y[i*H:(i+1)*H])
	}
	return t
}

func (w *epWire[E]) combine(r *routed, y, out []float64) error {
	buf := w.publish(w.h, r, y)
	o := w.out[:w.h.NumTokens()*w.c.Hidden]
	start := time.Now()
	err := w.g.Combine(w.h, buf, ep.Host(o), nil)
	w.stats.combine += time.Since(start)
	if err != nil {
		return err
	}
	fromWire(out, o)
	w.stats.bytesSent += w.rowBytes
	return nil
}

func (w *epWire[E]) dispatchGrad(r *routed, g []float64) ([]float64, error) {
	H := w.c.Hidden
	tok := w.tok[:w.h.NumTokens()*H]
	toWire(tok, g)
	start := time.Now()
	hb, err := w.g.DispatchCached(w.h, ep.Host(tok), nil)
	w.stats.dispatch += time.Since(start)
	if err != nil {
		return nil, err
	}
	w.hb = hb
	w.stats.bytesSent += w.tokBytes
	w.grad = grow(w.grad, r.n*H)
	if err := w.received(hb, r.bufRow, w.grad); err != nil {
		return nil, err
	}
	return w.grad, nil
}

func (w *epWire[E]) combineGrad(r *routed, dx, rowValues, gx, gw []float64) error {
	H, K := w.c.Hidden, w.c.TopK
	hb := w.hb
	T := hb.NumTokens()
	buf := w.publish(hb, r, dx)
	n := r.rvLen
	if cap(w.rowValues) < n {
		w.rowValues = make([]float32, n)
	}
	w.rowValues = w.rowValues[:n]
	clear(w.rowValues)
	for _, es := range r.byExpert {
		for _, e := range es {
			w.rowValues[e.rv] = float32(rowValues[e.rv])
		}
	}
	if cap(w.slotValues) < T*K {
		w.slotValues = make([]float32, T*K)
	}
	w.slotValues = w.slotValues[:T*K]
	opts := &ep.CombineOptions{RowValues: ep.Host(w.rowValues), SlotValues: ep.Host(w.slotValues)}
	if w.c.Mode == ep.LowLatency {
		opts.WeightsOverride = w.ones[:T*K] // the experts' side applied the weights
	}
	o := w.out[:T*H]
	start := time.Now()
	err := w.g.Combine(hb, buf, ep.Host(o), opts)
	w.stats.combine += time.Since(start)
	if err != nil {
		return err
	}
	w.hb = ep.Handle[E]{}
	w.stats.bytesSent += w.rowBytes
	fromWire(gx, o)
	for i, v := range w.slotValues {
		gw[i] = float64(v)
	}
	return nil
}
