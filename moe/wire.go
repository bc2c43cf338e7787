package moe

import (
	"errors"
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

// span is a run of consecutive rows of a dispatch's receive buffer: the
// valid rows of one local expert's block (LL), or all the rows (HT).
type span struct{ first, n int }

// routed is what a dispatch delivered to this rank, in float64: the valid
// received rows, packed ("compact rows"), and for each local expert the pairs
// it runs on.
type routed struct {
	n        int
	rvLen    int       // length of Combine's RowValues
	spans    []span    // the rows of Recv the compact rows came from, in order
	x        []float64 // [n][H]
	byExpert [][]entry // [L]
}

// wire moves float64 tokens through an ep.Group of the configured element
// type: the one place where the element type and the group's memory
// matter. Every method is collective.
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
	// backend names the group's backend.
	backend() string
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
	// The copies between the host and the group's memory (see
	// CommStats.Copies): how many, their bytes (both ways) and time.
	copies, copyBytes int64
	copyTime          time.Duration
}

// copied counts one copy of n bytes that started at start.
func (s *commStats) copied(start time.Time, n int) {
	s.copyTime += time.Since(start)
	s.copies++
	s.copyBytes += int64(n)
}

func newWire(comm *mpi.Comm, c Config) (wire, error) {
	cfg := ep.Config{Mode: c.Mode, NumExperts: c.Experts, MaxTokensPerRank: c.Tokens, Hidden: c.Hidden,
		TopK: c.TopK, Timeout: c.Timeout, Backend: c.Backend}
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

	// In a device's memory (a GPU backend), the group's tensors: the
	// tokens and results of the tokens' side, and the values carried by
	// the backward's combine; and host copies of what comes back. All zero
	// in host memory, where the staging slices above are the tensors.
	dTok, dOut              ep.Tensor[E]
	dRowValues, dSlotValues ep.Tensor[float32]
	rows, cbuf              []E // received rows; combine rows to upload
	wts                     []float32
	ids                     []int32
	codes                   []ep.E4M3
	scales                  []float32
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
	if g.Memory() != ep.HostMemory { // (the same on every rank: one backend)
		// Close is collective: every rank learns of one that failed.
		if err := mpi.AgreeOnError(comm, w.allocDevice()); err != nil {
			return nil, errors.Join(err, w.close())
		}
	}
	return w, nil
}

// allocDevice allocates the group's tensors in its device's memory.
func (w *epWire[E]) allocDevice() error {
	m, T, H, K := w.g.Memory(), w.c.MaxTokensPerRank, w.c.Hidden, w.c.TopK
	var err error
	if w.dTok, err = ep.Alloc[E](m, T*H); err != nil {
		return err
	}
	if w.dOut, err = ep.Alloc[E](m, T*H); err != nil {
		return err
	}
	// RowValues: LL, one per row of the receive buffer ([L][span]); HT,
	// [NumRecv][K], NumRecv <= span.
	if w.dRowValues, err = ep.Alloc[float32](m, w.span*max(w.L, K)); err != nil {
		return err
	}
	w.dSlotValues, err = ep.Alloc[float32](m, T*K)
	return err
}

func (w *epWire[E]) close() error {
	var errs []error
	for _, t := range []ep.Tensor[E]{w.dTok, w.dOut} {
		errs = append(errs, ep.Free(t))
	}
	for _, t := range []ep.Tensor[float32]{w.dRowValues, w.dSlotValues} {
		errs = append(errs, ep.Free(t))
	}
	return errors.Join(append(errs, w.g.Close())...)
}

func (w *epWire[E]) backend() string { return w.g.Backend() }

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

// tensorOf is the host slice src as a tensor of the group: src itself in
// host memory; in a device's memory, the first len(src) elements of dev
// with src uploaded into them (a copy, counted in s).
func tensorOf[T ep.Scalar](s *commStats, src []T, dev ep.Tensor[T]) (ep.Tensor[T], error) {
	if dev.IsZero() {
		return ep.Host(src), nil
	}
	t := dev.Slice(0, len(src))
	start := time.Now()
	err := ep.Upload(t, src)
	s.copied(start, len(src)*int(unsafe.Sizeof(*new(T))))
	return t, err
}

// hostOf is the elements of t on the host: t's own slice in host memory;
// in a device's memory, a copy into *buf (grown as needed; counted in s).
func hostOf[T ep.Scalar](s *commStats, t ep.Tensor[T], buf *[]T) ([]T, error) {
	if t.Memory() == ep.HostMemory {
		return t.Host(), nil
	}
	if cap(*buf) < t.Len() {
		*buf = make([]T, t.Len())
	}
	h := (*buf)[:t.Len()]
	if len(h) == 0 {
		return h, nil
	}
	start := time.Now()
	err := ep.Download(h, t)
	s.copied(start, len(h)*int(unsafe.Sizeof(*new(T))))
	return h, err
}

// received widens the rows of a dispatch in spans into dst (compact,
// [rows][H]): the elements, or in FP8 the codes times their scales.
func (w *epWire[E]) received(h ep.Handle[E], spans []span, dst []float64) error {
	H := w.c.Hidden
	i := 0
	for _, sp := range spans {
		if sp.n == 0 {
			continue
		}
		out := dst[i*H : (i+sp.n)*H]
		i += sp.n
		if !w.c.Wire.FP8() {
			rows, err := hostOf(&w.stats, h.Recv().Slice(sp.first*H, (sp.first+sp.n)*H), &w.rows)
			if err != nil {
				return err
			}
			FromWire(out, rows)
			continue
		}
		G := ep.ScaleGroups(H)
		codes, err := hostOf(&w.stats, h.RecvFP8().Slice(sp.first*H, (sp.first+sp.n)*H), &w.codes)
		if err != nil {
			return err
		}
		scales, err := hostOf(&w.stats, h.RecvScales().Slice(sp.first*G, (sp.first+sp.n)*G), &w.scales)
		if err != nil {
			return err
		}
		if cap(w.deq) < H {
			w.deq = make([]float32, H)
		}
		w.deq = w.deq[:H]
		for j := 0; j < sp.n; j++ {
			if err := ep.Dequantize(w.deq, codes[j*H:(j+1)*H], scales[j*G:(j+1)*G], H); err != nil {
				return err
			}
			for c, v := range w.deq {
				out[j*H+c] = float64(v)
			}
		}
	}
	return nil
}

// ToWire rounds float64 values to the element type E that rows travel
// in (bfloat16 through float32): how the model's float64 activations
// become dispatch rows. FromWire widens them back.
func ToWire[E ep.Element](dst []E, src []float64) {
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

// FromWire widens E values to float64.
func FromWire[E ep.Element](dst []float64, src []E) {
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
	ToWire(tok, x)
	xt, err := tensorOf(&w.stats, tok, w.dTok)
	if err != nil {
		return nil, err
	}
	start := time.Now()
	h, err := w.g.Dispatch(ep.Tokens(xt, topk, wts))
	w.stats.dispatch += time.Since(start)
	if err != nil {
		return nil, err
	}
	w.h, w.hb = h, ep.Handle[E]{}
	r := &routed{byExpert: make([][]entry, w.L), rvLen: w.L * w.span}
	// Bytes: the tokens' side sends one row per (token, remote expert) pair in
	// LL mode, one per (token, remote rank) in HT mode (in FP8: its codes and
	// scales); the experts' side sends one row back per received row from
	// another rank: every row but those of this rank's own tokens, one per
	// pair (LL) or per token (HT) whose expert is here.
	rowB := int64(H) * elemBytes[E]()
	dispB := rowB
	if w.c.Wire.FP8() {
		dispB = int64(H + 4*ep.ScaleGroups(H))
	}
	w.tokBytes, w.rowBytes = 0, 0
	own := 0 // rows this rank sent itself
	if w.c.Mode == ep.LowLatency {
		for _, e := range topk {
			if e >= 0 && int(e)/w.L != w.rank {
				w.tokBytes += dispB
			} else if e >= 0 {
				own++
			}
		}
		for l, cnt := range h.ExpertCounts() {
			first := l * w.span
			r.spans = append(r.spans, span{first, cnt})
			rw, err := hostOf(&w.stats, h.RecvWeights().Slice(first, first+cnt), &w.wts)
			if err != nil {
				return nil, err
			}
			for j := 0; j < cnt; j++ {
				r.byExpert[l] = append(r.byExpert[l], entry{row: int32(r.n), rv: int32(first + j), w: float64(rw[j])})
				r.n++
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
				} else if ok {
					own++
				}
			}
		}
		r.n = h.NumRecv()
		r.rvLen = r.n * K
		r.spans = []span{{0, r.n}}
		ids, err := hostOf(&w.stats, h.RecvTopK().Slice(0, r.n*K), &w.ids)
		if err != nil {
			return nil, err
		}
		rw, err := hostOf(&w.stats, h.RecvWeights().Slice(0, r.n*K), &w.wts)
		if err != nil {
			return nil, err
		}
		for row := 0; row < r.n; row++ {
			for k := 0; k < K; k++ {
				if l := ids[row*K+k]; l >= 0 {
					r.byExpert[l] = append(r.byExpert[l], entry{row: int32(row), rv: int32(row*K + k), w: float64(rw[row*K+k])})
				}
			}
		}
	}
	w.rowBytes = int64(r.n-own) * rowB
	r.x = make([]float64, r.n*H)
	if err := w.received(h, r.spans, r.x); err != nil {
		return nil, err
	}
	w.stats.bytesSent += w.tokBytes
	return r, nil
}

// publish writes compact rows into a handle's combine buffer: in place in
// host memory, by one upload per span in a device's.
func (w *epWire[E]) publish(h ep.Handle[E], r *routed, y []float64) (ep.Tensor[E], error) {
	H := w.c.Hidden
	t := h.CombineBuffer()
	i := 0
	for _, sp := range r.spans {
		if sp.n == 0 {
			continue
		}
		dst := t.Slice(sp.first*H, (sp.first+sp.n)*H)
		src := y[i*H : (i+sp.n)*H]
		i += sp.n
		if dst.Memory() == ep.HostMemory {
			ToWire(dst.Host(), src)
			continue
		}
		if cap(w.cbuf) < len(src) {
			w.cbuf = make([]E, len(src))
		}
		ToWire(w.cbuf[:len(src)], src)
		start := time.Now()
		err := ep.Upload(dst, w.cbuf[:len(src)])
		w.stats.copied(start, len(src)*int(elemBytes[E]()))
		if err != nil {
			return t, err
		}
	}
	return t, nil
}

// outTensor is the tensor a combine of T tokens writes: the host staging
// itself, or the device's.
func (w *epWire[E]) outTensor(T int) ep.Tensor[E] {
	if w.dOut.IsZero() {
		return ep.Host(w.out[:T*w.c.Hidden])
	}
	return w.dOut.Slice(0, T*w.c.Hidden)
}

func (w *epWire[E]) combine(r *routed, y, out []float64) error {
	buf, err := w.publish(w.h, r, y)
	if err != nil {
		return err
	}
	ot := w.outTensor(w.h.NumTokens())
	start := time.Now()
	err = w.g.Combine(w.h, buf, ot, nil)
	w.stats.combine += time.Since(start)
	if err != nil {
		return err
	}
	o, err := hostOf(&w.stats, ot, &w.out)
	if err != nil {
		return err
	}
	FromWire(out, o)
	w.stats.bytesSent += w.rowBytes
	return nil
}

func (w *epWire[E]) dispatchGrad(r *routed, g []float64) ([]float64, error) {
	H := w.c.Hidden
	tok := w.tok[:w.h.NumTokens()*H]
	ToWire(tok, g)
	xt, err := tensorOf(&w.stats, tok, w.dTok)
	if err != nil {
		return nil, err
	}
	start := time.Now()
	hb, err := w.g.Dispatch(ep.Reuse(w.h, xt, nil))
	w.stats.dispatch += time.Since(start)
	if err != nil {
		return nil, err
	}
	w.hb = hb
	w.stats.bytesSent += w.tokBytes
	w.grad = grow(w.grad, r.n*H)
	if err := w.received(hb, r.spans, w.grad); err != nil {
		return nil, err
	}
	return w.grad, nil
}

func (w *epWire[E]) combineGrad(r *routed, dx, rowValues, gx, gw []float64) error {
	K := w.c.TopK
	hb := w.hb
	T := hb.NumTokens()
	buf, err := w.publish(hb, r, dx)
	if err != nil {
		return err
	}
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
	rv, err := tensorOf(&w.stats, w.rowValues, w.dRowValues)
	if err != nil {
		return err
	}
	sv := ep.Host(w.slotValues)
	if !w.dSlotValues.IsZero() {
		sv = w.dSlotValues.Slice(0, T*K)
	}
	opts := &ep.CombineOptions{RowValues: rv, SlotValues: sv}
	if w.c.Mode == ep.LowLatency {
		opts.WeightsOverride = w.ones[:T*K] // the experts' side applied the weights
	}
	ot := w.outTensor(T)
	start := time.Now()
	err = w.g.Combine(hb, buf, ot, opts)
	w.stats.combine += time.Since(start)
	if err != nil {
		return err
	}
	w.hb = ep.Handle[E]{}
	w.stats.bytesSent += w.rowBytes
	o, err := hostOf(&w.stats, ot, &w.out)
	if err != nil {
		return err
	}
	FromWire(gx, o)
	slots, err := hostOf(&w.stats, sv, &w.slotValues)
	if err != nil {
		return err
	}
	for i, v := range slots {
		gw[i] = float64(v)
	}
	return nil
}
