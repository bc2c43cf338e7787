package moe

import (
	"errors"
	"fmt"
	"time"

	"github.com/goep/goep/ep"
	"github.com/goep/goep/mpi"
)

// Layer is a MoE layer spread over the ranks of a communicator: a gate and
// an optional shared expert held by every rank (data parallel), and Experts
// two-layer MLPs, LocalExperts of them on each rank (rank r owns experts
// [r*L, (r+1)*L), as in ep). Forward and Backward are collective: every rank
// calls them in the same order, each with its own tokens.
type Layer struct {
	cfg        Config
	comm       *mpi.Comm
	rank, size int
	L          int
	p, g       Params
	w          wire

	// The last Forward, for Backward.
	forwarded bool
	r         router
	rt        *routed
	caches    []mlpCache
	y         []float64 // compact expert outputs (HT: weighted and summed over local slots)
	tokens    int       // tokens over all ranks
	counts    []int64   // (token, slot) pairs routed to each expert, over all ranks
	frac      []float64 // f_e = counts[e] / (tokens*TopK)
	meanP     []float64 // P_e = mean over all tokens of the router probability of e
	aux       float64

	shared mlpCache // the shared expert's forward over this rank's tokens

	sync    Syncer    // sums the data-parallel gradient over the ranks
	dpGrad  []float64 // this rank's data-parallel gradient: gate, then shared expert
	syncDur time.Duration
	syncB   int64

	scratch, dp, du []float64
}

// CommStats is what one rank spent in ep calls.
type CommStats struct {
	// Dispatch is the time in the dispatches: Forward's Dispatch and
	// Backward's dispatch reusing the forward's routing. Combine is the time in the combines:
	// Forward's and Backward's.
	Dispatch, Combine time.Duration
	// BytesSent is the payload (token rows; not weights, ids or flags) this
	// rank addressed to other ranks: the tokens' side sends one row per
	// (token, remote expert) pair in LL mode and one per (token, remote rank)
	// in HT mode, twice (the forward dispatch and the backward's cached
	// dispatch); the experts' side returns one row per row received from
	// another rank, twice (the forward combine and the backward one).
	BytesSent int64
	// Sync is the time in the data-parallel gradient sync (Config.GradSync)
	// of the gate and the shared expert, computation included; SyncBytes
	// what it sent (SyncStats.BytesSent).
	Sync      time.Duration
	SyncBytes int64
	// Per peer rank (indexed by rank, this rank included), from the ep
	// group's statistics (ep.Group.Stats): PeerWait is how long this rank
	// waited for the peer in the ep calls (nil where the engine does not
	// measure it); PeerSent and PeerRecv are the token rows sent to and
	// received from it, in bytes, the rows a rank keeps for itself
	// included (BytesSent is the sum of PeerSent over the other ranks).
	PeerWait           []time.Duration
	PeerSent, PeerRecv []int64
	// Copies, CopyBytes and CopyTime are the copies between the host and
	// the group's memory that the ep calls needed, outside Dispatch and
	// Combine: none with the CPU engine, whose tensors are host memory; on
	// a device (a GPU backend), the tokens uploaded before each dispatch
	// and the expert outputs (and the backward's row values) before each
	// combine, the received rows, weights and expert ids brought back
	// after each dispatch and the results after each combine. CopyBytes
	// counts both ways; CopyTime includes the waits for the device's queued
	// work that each copy makes first.
	Copies, CopyBytes int64
	CopyTime          time.Duration
}

// NewLayer creates the layer's ep group (collective) and its parameters,
// initialised from cfg.Seed (see the package doc).
func NewLayer(comm *mpi.Comm, cfg Config) (*Layer, error) {
	if err := cfg.Validate(comm.Size()); err != nil {
		return nil, err
	}
	w, err := newWire(comm, cfg)
	if err != nil {
		return nil, err
	}
	sync, err := NewSyncer(comm, cfg.GradSync, cfg.DataParallelParams())
	if err != nil {
		return nil, errors.Join(err, w.close())
	}
	L := cfg.Experts / comm.Size()
	l := &Layer{cfg: cfg, comm: comm, rank: comm.Rank(), size: comm.Size(), L: L, w: w, sync: sync,
		p: newParams(cfg, L), g: newParams(cfg, L), caches: make([]mlpCache, L),
		counts: make([]int64, cfg.Experts), frac: make([]float64, cfg.Experts), meanP: make([]float64, cfg.Experts)}
	initParams(&l.p, cfg, cfg.Seed, l.FirstExpert(), studentInit)
	return l, nil
}

// Syncer is the layer's data-parallel gradient sync (Config.GradSync): its
// Residual is this rank's error feedback, which a checkpoint holds.
func (l *Layer) Syncer() Syncer { return l.sync }

// Backend is the name of the ep backend that moves the layer's rows
// ("cpu", "gpu:emulated", "gpu:cuda").
func (l *Layer) Backend() string { return l.w.backend() }

// Close releases the ep group. Collective.
func (l *Layer) Close() error { return l.w.close() }

// Config returns the layer's config.
func (l *Layer) Config() Config { return l.cfg }

// LocalExperts is the number of experts on each rank.
func (l *Layer) LocalExperts() int { return l.L }

// FirstExpert is the global index of this rank's first expert.
func (l *Layer) FirstExpert() int { return l.rank * l.L }

// Params returns the layer's parameters on this rank (the gate, the shared
// expert and the local experts). The caller may change them between calls.
func (l *Layer) Params() *Params { return &l.p }

// Grads returns the gradients that Backward accumulates, laid out like Params.
func (l *Layer) Grads() *Params { return &l.g }

// ZeroGrad sets the gradients to zero.
func (l *Layer) ZeroGrad() { l.g.Zero() }

// TokensPerExpert is, for the last Forward, the number of (token, slot)
// pairs routed to each expert over all ranks.
func (l *Layer) TokensPerExpert() []int64 { return append([]int64(nil), l.counts...) }

// TopK is the top-k experts that the last Forward chose for this rank's
// tokens ([T][TopK], a copy).
func (l *Layer) TopK() []int32 { return append([]int32(nil), l.r.topk...) }

// GlobalTokens is the number of tokens of the last Forward over all ranks.
func (l *Layer) GlobalTokens() int { return l.tokens }

// TakeCommStats returns this rank's ep time and bytes since the last call.
func (l *Layer) TakeCommStats() CommStats {
	s := l.w.takeStats()
	cs := CommStats{Dispatch: s.dispatch, Combine: s.combine, BytesSent: s.bytesSent, Sync: l.syncDur, SyncBytes: l.syncB,
		PeerWait: s.peerWait, PeerSent: s.peerSent, PeerRecv: s.peerRecv,
		Copies: s.copies, CopyBytes: s.copyBytes, CopyTime: s.copyTime}
	l.syncDur, l.syncB = 0, 0
	return cs
}

// Forward runs the layer on this rank's tokens x ([T][Hidden], T <=
// Tokens) and returns their outputs ([T][Hidden]) and the load-balancing
// loss of the whole batch (all ranks' tokens; the same on every rank).
// Collective.
func (l *Layer) Forward(x []float64) (out []float64, aux float64, err error) {
	c := l.cfg
	H, E, K, F := c.Hidden, c.Experts, c.TopK, c.FFN
	l.forwarded = false
	if len(x)%H != 0 || len(x)/H > c.Tokens {
		return nil, 0, fmt.Errorf("moe: Forward: len(x) = %d is not T*Hidden with T <= %d tokens (Hidden = %d)", len(x), c.Tokens, H)
	}
	T := len(x) / H
	l.r.route(l.p.Gate, x, T, H, E, K)

	// Routing statistics over all ranks: pairs and summed probabilities per
	// expert, and tokens.
	local := make([]float64, 2*E+1)
	for _, e := range l.r.topk {
		local[e]++
	}
	for t := 0; t < T; t++ {
		for e := 0; e < E; e++ {
			local[E+e] += l.r.p[t*E+e]
		}
	}
	local[2*E] = float64(T)
	global := make([]float64, len(local))
	if err := mpi.Allreduce(l.comm, mpi.OpSum, local, global); err != nil {
		return nil, 0, fmt.Errorf("moe: Forward: routing statistics: %w", err)
	}
	l.tokens = int(global[2*E])
	l.aux = 0
	for e := 0; e < E; e++ {
		l.counts[e] = int64(global[e])
		l.frac[e], l.meanP[e] = 0, 0
		if l.tokens > 0 {
			l.frac[e] = global[e] / float64(l.tokens*K)
			l.meanP[e] = global[E+e] / float64(l.tokens)
		}
		l.aux += l.frac[e] * l.meanP[e]
	}
	l.aux *= float64(E)

	rt, err := l.w.dispatch(x, l.r.topk, l.r.w)
	if err != nil {
		return nil, 0, err
	}
	l.rt = rt
	l.y = grow(l.y, rt.n*H)
	clear(l.y)
	for e, entries := range rt.byExpert {
		mc := &l.caches[e]
		mc.n = len(entries)
		mc.u = grow(mc.u, mc.n*H)
		for i, en := range entries {
			copy(mc.u[i*H:(i+1)*H], rt.x[int(en.row)*H:(int(en.row)+1)*H])
		}
		mlpForward(l.p.expert(c, e), c.Act, H, F, mc)
		for i, en := range entries {
			y, o := l.y[int(en.row)*H:(int(en.row)+1)*H], mc.o[i*H:(i+1)*H]
			if c.Mode == ep.LowLatency {
				copy(y, o) // one pair per row; combine applies the weight
			} else {
				for j, v := range o {
					y[j] += en.w * v
				}
			}
		}
	}
	out = make([]float64, T*H)
	if err := l.w.combine(rt, l.y, out); err != nil {
		return nil, 0, err
	}
	if c.SharedFFN > 0 {
		sharedForward(l.p.shared(), c, l.r.x, T, &l.shared, out)
	}
	l.forwarded = true
	return out, l.aux, nil
}

// sharedForward runs the shared expert on the T tokens x and adds its
// outputs to out; c keeps the pass for the backward.
func sharedForward(e expert, cfg Config, x []float64, T int, c *mlpCache, out []float64) {
	c.n, c.u = T, x
	mlpForward(e, cfg.Act, cfg.Hidden, cfg.SharedFFN, c)
	for i, v := range c.o {
		out[i] += v
	}
}

// Backward takes the gradient of the loss with respect to the last
// Forward's outputs on this rank (gradOut, [T][Hidden]) and with respect to
// its load-balancing loss (auxGrad, the same on every rank: the loss's
// coefficient of it), adds the gradients of the local experts, the gate and
// the shared expert to Grads, and returns the gradient with respect to this
// rank's inputs. The gradient of the data-parallel parameters (the gate and
// the shared expert) is summed over ranks by Config.GradSync: exactly by the
// default allreduce, so that it is the same on every rank (the loss is taken
// to be a sum over ranks of per-rank terms, as a global mean is), or
// approximately. Collective; once per Forward.
func (l *Layer) Backward(gradOut []float64, auxGrad float64) (gradX []float64, err error) {
	c := l.cfg
	H, E, K, F := c.Hidden, c.Experts, c.TopK, c.FFN
	if !l.forwarded {
		return nil, errors.New("moe: Backward: no Forward to take the gradient of (one Backward per Forward)")
	}
	l.forwarded = false
	T := l.r.T
	if len(gradOut) != T*H {
		return nil, fmt.Errorf("moe: Backward: len(gradOut) = %d, want T*Hidden = %d*%d", len(gradOut), T, H)
	}
	rt := l.rt
	G, err := l.w.dispatchGrad(rt, gradOut)
	if err != nil {
		return nil, err
	}
	rowValues := make([]float64, rt.rvLen)
	dx := make([]float64, rt.n*H)
	var gO, du []float64
	for e, entries := range rt.byExpert {
		mc := &l.caches[e]
		gO, du = grow(gO, mc.n*H), grow(du, mc.n*H)
		for i, en := range entries {
			g, o := G[int(en.row)*H:(int(en.row)+1)*H], mc.o[i*H:(i+1)*H]
			dot := 0.0
			for j, v := range g {
				gO[i*H+j] = en.w * v
				dot += v * o[j]
			}
			rowValues[en.rv] = dot // d(loss)/d(weight of the pair)
		}
		mlpBackward(l.p.expert(c, e), l.g.expert(c, e), c.Act, H, F, mc, gO, du, &l.scratch)
		for i, en := range entries {
			d := dx[int(en.row)*H : (int(en.row)+1)*H]
			for j, v := range du[i*H : (i+1)*H] {
				d[j] += v
			}
		}
	}
	gradX = make([]float64, T*H)
	gw := make([]float64, T*K)
	if err := l.w.combineGrad(rt, dx, rowValues, gradX, gw); err != nil {
		return nil, err
	}
	// The load-balancing loss E * sum_e f_e P_e, with f_e held constant:
	// d/dp[t][e] = auxGrad * E * f_e / tokens for every token of every rank.
	gp := make([]float64, E)
	for e := range gp {
		if l.tokens == 0 {
			break
		}
		gp[e] = auxGrad * float64(E) * l.frac[e] / float64(l.tokens)
	}
	// This rank's gradient of the data-parallel parameters, in the order of
	// Params.dataParallelSlices: the gate's, then the shared expert's.
	l.dpGrad = grow(l.dpGrad, c.DataParallelParams())
	clear(l.dpGrad)
	l.r.backward(l.p.Gate, gw, gp, H, E, K, l.dpGrad[:H*E], gradX, &l.dp)
	if S := c.SharedFFN; S > 0 && T > 0 {
		var g Params
		g.SharedW1, g.SharedB1 = l.dpGrad[H*E:H*E+H*S], l.dpGrad[H*E+H*S:H*E+H*S+S]
		g.SharedW2, g.SharedB2 = l.dpGrad[H*E+H*S+S:H*E+2*H*S+S], l.dpGrad[H*E+2*H*S+S:]
		l.du = grow(l.du, T*H)
		mlpBackward(l.p.shared(), g.shared(), c.Act, H, S, &l.shared, gradOut, l.du, &l.scratch)
		for i, v := range l.du {
			gradX[i] += v
		}
	}
	st, err := l.sync.Sync(l.dpGrad)
	if err != nil {
		return nil, fmt.Errorf("moe: Backward: data-parallel gradient: %w", err)
	}
	l.syncDur += st.Time
	l.syncB += st.BytesSent
	g := l.dpGrad
	for _, s := range l.g.dataParallelSlices() {
		for i, v := range g[:len(s)] {
			s[i] += v
		}
		g = g[len(s):]
	}
	return gradX, nil
}
