package serve

import (
	"errors"
	"fmt"
	"time"

	"github.com/goep/goep/ep"
	"github.com/goep/goep/moe"
	"github.com/goep/goep/mpi"
)

// Phase is a stretch of a micro-batch's work in one layer, as the trace's
// events record it.
type Phase int

// Phases.
const (
	PhaseAttention    Phase = iota // attention (with its norm), the norm of the MoE input and the router
	PhaseDispatchSend              // ep DispatchSend
	PhaseDispatchWait              // ep DispatchRequest.Wait
	PhaseExperts                   // the local experts on the received rows
	PhaseCombineSend               // ep CombineSend
	PhaseCombineWait               // ep CombineRequest.Wait, then the shared expert
	PhaseOutput                    // the last layer's norm, the logits and the greedy choice
	numPhases
)

var phaseNames = [numPhases]string{"attention", "dispatch_send", "dispatch_wait", "experts", "combine_send", "combine_wait", "output"}

func (p Phase) String() string {
	if p >= 0 && p < numPhases {
		return phaseNames[p]
	}
	return fmt.Sprintf("Phase(%d)", int(p))
}

// PhaseNames are the phases' names, by value.
func PhaseNames() []string { return append([]string(nil), phaseNames[:]...) }

// event is one phase of one micro-batch, in nanoseconds from the start.
type event struct {
	step              int64
	layer, mb, phase  int
	startNS, finishNS int64
}

// engine runs the steps of one rank: the micro-batches' attention, their
// dispatch, experts and combine through ep, and their next tokens.
type engine[E ep.Element] struct {
	cfg        Config
	m          *Model
	rank, size int
	L, span    int // local experts; rows per expert in the LL receive buffer
	ll         *ep.Group[E]
	ht         [2]*ep.Group[E]
	ones       []float32 // LL WeightsOverride: the experts' side applies the weights
	mbs        [2]mbatch[E]
	t0         time.Time
	events     []event
	eventSteps int64 // record the phases of steps up to this one (0: all)

	attnS, sharedS, nextS, moeS, expU, expO, expY []float64
}

// mbatch is one micro-batch of a step.
type mbatch[E ep.Element] struct {
	idx     int
	g       *ep.Group[E]
	works   []work
	rows    []attnRow
	workOf  []int     // per row: its work
	h       []float64 // [n][H] the residual stream
	uf      []float64 // [n][H] the MoE input as it travels, widened
	u, out  []E
	topk    []int32
	w       []float32
	dreq    ep.DispatchRequest[E]
	hd      ep.Handle[E]
	creq    ep.CombineRequest[E]
	dropped []int // per work: (token, expert) pairs dropped (masked ranks)
}

// newEngine opens the ep groups (collective).
func newEngine[E ep.Element](comm *mpi.Comm, cfg Config, m *Model, t0 time.Time) (_ *engine[E], err error) {
	mc := cfg.Model
	e := &engine[E]{cfg: cfg, m: m, rank: comm.Rank(), size: comm.Size(), L: mc.Experts / comm.Size(), t0: t0}
	e.span = e.size * cfg.llTokens()
	llc := ep.Config{Mode: ep.LowLatency, NumExperts: mc.Experts, MaxTokensPerRank: cfg.llTokens(), Hidden: mc.Hidden,
		TopK: mc.TopK, Timeout: cfg.Timeout, MaskStalledRanks: cfg.MaskStalled, Backend: cfg.Backend}
	if e.ll, err = ep.NewGroup[E](comm, llc); err != nil {
		return nil, err
	}
	if e.ll.Memory() != ep.HostMemory {
		err = fmt.Errorf("serve: backend %s keeps its tensors in %v: the serving loop hands ep host memory (Go slices), so it serves on backends of host memory only", cfg.Backend.Name(), e.ll.Memory())
		_ = e.ll.Close()
		e.ll = nil
		return nil, err
	}
	defer func() {
		if err != nil {
			err = errors.Join(err, e.close())
		}
	}()
	if cfg.Prefill == ep.HighThroughput {
		htc := ep.Config{Mode: ep.HighThroughput, NumExperts: mc.Experts, MaxTokensPerRank: cfg.PrefillTokens,
			Hidden: mc.Hidden, TopK: mc.TopK, Timeout: cfg.Timeout, Backend: cfg.Backend}
		n := 1
		if cfg.Overlap {
			n = 2
		}
		for i := 0; i < n; i++ {
			if e.ht[i], err = ep.NewGroup[E](comm, htc); err != nil {
				return nil, err
			}
		}
	}
	e.ones = make([]float32, cfg.llTokens()*mc.TopK)
	for i := range e.ones {
		e.ones[i] = 1
	}
	for i := range e.mbs {
		e.mbs[i].idx = i
	}
	return e, nil
}

// close closes the groups. Collective.
func (e *engine[E]) close() error {
	var errs []error
	for _, g := range e.ht {
		if g != nil {
			errs = append(errs, g.Close())
		}
	}
	if e.ll != nil {
		errs = append(errs, e.ll.Close())
	}
	return errors.Join(errs...)
}

// masked lists the ranks this rank's LL group has masked.
func (e *engine[E]) masked() []int { return e.ll.Masked() }

func (e *engine[E]) now() int64 { return int64(time.Since(e.t0)) }

func (e *engine[E]) record(step int64, layer int, mb *mbatch[E], p Phase, start int64) {
	if e.eventSteps > 0 && step > e.eventSteps {
		return
	}
	e.events = append(e.events, event{step: step, layer: layer, mb: mb.idx, phase: int(p), startNS: start, finishNS: e.now()})
}

// stepOut is what a step gave: per work of the micro-batches, in order
// (a prompt cut in two is two works), the token it emitted (-1 if none),
// its logits' hash, and its dropped pairs.
type stepOut struct {
	works   []work
	ids     []int32
	hashes  []uint64
	dropped []int
}

// token is the input token of position pos of a request.
func token(st *reqState, pos int) int32 {
	if pos < len(st.req.Prompt) {
		return st.req.Prompt[pos]
	}
	return st.out[pos-len(st.req.Prompt)]
}

// load fills a micro-batch with the rows of its works.
func (e *engine[E]) load(mb *mbatch[E], g *ep.Group[E], ws []work) {
	H, K := e.m.Cfg.Hidden, e.m.Cfg.TopK
	mb.g, mb.works = g, ws
	n := rows(ws)
	mb.rows, mb.workOf = mb.rows[:0], mb.workOf[:0]
	mb.h, mb.uf = growF(mb.h, n*H), growF(mb.uf, n*H)
	mb.u, mb.out = growE(mb.u, n*H), growE(mb.out, n*H)
	mb.topk, mb.w = growI32(mb.topk, n*K), growF32(mb.w, n*K)
	mb.dropped = growInt(mb.dropped, len(ws))
	clear(mb.dropped)
	for i, w := range ws {
		for p := w.from; p < w.from+w.n; p++ {
			e.m.embed(token(w.s.st, p), mb.h[len(mb.rows)*H:(len(mb.rows)+1)*H])
			mb.rows = append(mb.rows, attnRow{kv: w.s.st.kv, pos: p})
			mb.workOf = append(mb.workOf, i)
		}
	}
}

// run runs one step of kind k over the plan ws: with Overlap, as two
// micro-batches (DeepEP's two-batch overlap: while one's dispatch or
// combine is in flight, the other computes), else as one. Every rank runs
// the same sequence of ep calls, whatever its rows. On an error the
// requests' caches may hold part of the step: the caller rolls back.
func (e *engine[E]) run(step int64, k stepKind, ws []work) (*stepOut, error) {
	groups := [2]*ep.Group[E]{e.ll, e.ll}
	if k == prefillStep && e.cfg.Prefill == ep.HighThroughput {
		groups = e.ht
	}
	var mbs []*mbatch[E]
	if e.cfg.Overlap {
		a, b := split(ws)
		e.load(&e.mbs[0], groups[0], a)
		e.load(&e.mbs[1], groups[1], b)
		mbs = []*mbatch[E]{&e.mbs[0], &e.mbs[1]}
	} else {
		e.load(&e.mbs[0], groups[0], ws)
		mbs = []*mbatch[E]{&e.mbs[0]}
	}
	layers := e.m.Cfg.Layers
	for _, mb := range mbs {
		if err := e.front(step, 0, mb); err != nil {
			return nil, err
		}
	}
	for l := 0; l < layers; l++ {
		for _, mb := range mbs {
			if err := e.expertSide(step, l, mb); err != nil {
				return nil, err
			}
		}
		for _, mb := range mbs {
			if err := e.back(step, l, mb); err != nil {
				return nil, err
			}
			if l+1 < layers {
				if err := e.front(step, l+1, mb); err != nil {
					return nil, err
				}
			}
		}
	}
	out := &stepOut{}
	for _, mb := range mbs {
		e.output(step, mb, out)
	}
	return out, nil
}

// front runs layer l's attention and router on a micro-batch and sends its
// dispatch.
func (e *engine[E]) front(step int64, l int, mb *mbatch[E]) error {
	H := e.m.Cfg.Hidden
	t := e.now()
	if err := e.m.attend(l, mb.h, mb.rows, &e.attnS); err != nil {
		return err
	}
	rmsNorm(mb.uf, mb.h, H)
	moe.ToWire(mb.u, mb.uf)
	moe.FromWire(mb.uf, mb.u)
	e.m.route(l, mb.uf, mb.topk, mb.w)
	e.record(step, l, mb, PhaseAttention, t)
	t = e.now()
	req, err := mb.g.DispatchSend(ep.Tokens(ep.Host(mb.u), mb.topk, mb.w))
	e.record(step, l, mb, PhaseDispatchSend, t)
	if err != nil {
		return fmt.Errorf("serve: step %d layer %d: %w", step, l, err)
	}
	mb.dreq = req
	return nil
}

// expertSide completes a micro-batch's dispatch, runs the local experts on
// what arrived and sends the combine.
func (e *engine[E]) expertSide(step int64, l int, mb *mbatch[E]) error {
	t := e.now()
	hd, err := mb.dreq.Wait()
	e.record(step, l, mb, PhaseDispatchWait, t)
	if err != nil {
		return fmt.Errorf("serve: step %d layer %d: %w", step, l, err)
	}
	mb.hd = hd
	t = e.now()
	e.experts(l, hd)
	e.record(step, l, mb, PhaseExperts, t)
	var opts *ep.CombineOptions
	if hd.Mode() == ep.LowLatency {
		opts = &ep.CombineOptions{WeightsOverride: e.ones[:hd.NumTokens()*e.m.Cfg.TopK]}
	}
	t = e.now()
	req, err := mb.g.CombineSend(hd, hd.CombineBuffer(), ep.Host(mb.out), opts)
	e.record(step, l, mb, PhaseCombineSend, t)
	if err != nil {
		return fmt.Errorf("serve: step %d layer %d: %w", step, l, err)
	}
	mb.creq = req
	return nil
}

// experts runs layer l's local experts on the rows of a dispatch and
// writes, into its combine buffer, each row's weighted outputs on the grid:
// in LL one row per (token, expert), in HT one per token, summed over the
// token's experts on this rank (exactly: see grid).
func (e *engine[E]) experts(l int, hd ep.Handle[E]) {
	H, K := e.m.Cfg.Hidden, e.m.Cfg.TopK
	recv, buf, rw := hd.Recv().Host(), hd.CombineBuffer().Host(), hd.RecvWeights().Host()
	if hd.Mode() == ep.LowLatency {
		for le, n := range hd.ExpertCounts() {
			if n == 0 {
				continue
			}
			lo := le * e.span
			e.expU, e.expO = growF(e.expU, n*H), growF(e.expO, n*H)
			moe.FromWire(e.expU, recv[lo*H:(lo+n)*H])
			e.m.expert(l, le, e.expU, e.expO)
			for j := 0; j < n; j++ {
				w := float64(rw[lo+j])
				o := e.expO[j*H : (j+1)*H]
				for c, v := range o {
					o[c] = grid(w * v)
				}
			}
			moe.ToWire(buf[lo*H:(lo+n)*H], e.expO)
		}
		return
	}
	n := hd.NumRecv()
	ids := hd.RecvTopK().Host()
	e.expY = growF(e.expY, n*H)
	clear(e.expY)
	var sel []int
	for le := 0; le < e.L; le++ {
		sel = sel[:0]
		for i := 0; i < n*K; i++ {
			if int(ids[i]) == le {
				sel = append(sel, i)
			}
		}
		if len(sel) == 0 {
			continue
		}
		m := len(sel)
		e.expU, e.expO = growF(e.expU, m*H), growF(e.expO, m*H)
		for j, i := range sel {
			row := i / K
			moe.FromWire(e.expU[j*H:(j+1)*H], recv[row*H:(row+1)*H])
		}
		e.m.expert(l, le, e.expU, e.expO)
		for j, i := range sel {
			row, w := i/K, float64(rw[i])
			y := e.expY[row*H : (row+1)*H]
			for c, v := range e.expO[j*H : (j+1)*H] {
				y[c] += grid(w * v)
			}
		}
	}
	moe.ToWire(buf[:n*H], e.expY)
}

// back completes a micro-batch's combine and adds the MoE output (and the
// shared expert's) to its residual stream.
func (e *engine[E]) back(step int64, l int, mb *mbatch[E]) error {
	H, K := e.m.Cfg.Hidden, e.m.Cfg.TopK
	t := e.now()
	err := mb.creq.Wait()
	if err != nil {
		e.record(step, l, mb, PhaseCombineWait, t)
		return fmt.Errorf("serve: step %d layer %d: %w", step, l, err)
	}
	for _, p := range mb.hd.Dropped() {
		mb.dropped[mb.workOf[int(p)/K]]++
	}
	n := len(mb.rows)
	e.moeS = growF(e.moeS, n*H)
	moeOut := e.moeS
	moe.FromWire(moeOut, mb.out)
	for i, v := range moeOut {
		mb.h[i] += v
	}
	e.m.shared(l, mb.uf, mb.h, &e.sharedS)
	e.record(step, l, mb, PhaseCombineWait, t)
	return nil
}

// output takes the next token of every work that emits one.
func (e *engine[E]) output(step int64, mb *mbatch[E], out *stepOut) {
	H := e.m.Cfg.Hidden
	t := e.now()
	var last []float64
	var ids []int32
	var hashes []uint64
	r := 0
	for _, w := range mb.works {
		r += w.n
		if w.emits {
			last = append(last, mb.h[(r-1)*H:r*H]...)
			ids = append(ids, 0)
			hashes = append(hashes, w.s.st.hash)
		}
	}
	e.m.next(last, ids, hashes, &e.nextS)
	j := 0
	for i, w := range mb.works {
		var id int32 = -1
		var hash uint64
		if w.emits {
			id, hash = ids[j], hashes[j]
			j++
		}
		out.works = append(out.works, w)
		out.ids = append(out.ids, id)
		out.hashes = append(out.hashes, hash)
		out.dropped = append(out.dropped, mb.dropped[i])
	}
	e.record(step, e.m.Cfg.Layers-1, mb, PhaseOutput, t)
}

func growE[E any](s []E, n int) []E {
	if cap(s) >= n {
		return s[:n]
	}
	return make([]E, n)
}

func growI32(s []int32, n int) []int32     { return growE(s, n) }
func growF32(s []float32, n int) []float32 { return growE(s, n) }
func growInt(s []int, n int) []int         { return growE(s, n) }
