package main

import (
	"slices"
	"time"

	"github.com/goep/goep/ep"
	"github.com/goep/goep/mpi"
)

// The figures of a configuration, from every rank's samples.

// summarize gathers every rank's medians: times are the slowest rank's,
// bandwidths the mean over ranks of bytes over time.
func (b *bench[E]) summarize(s *samples) (_ *Result, err error) {
	R := b.world.Size()
	mine := []float64{median(s.dispatch), median(s.combine), median(s.baseDispatch), median(s.baseCombine), median(s.memcpy), b.bytes,
		median(s.cpuDispatch), median(s.cpuCombine), median(s.deviceCopy), median(s.nativeDispatch), median(s.nativeCombine), b.nbytes,
		median(s.steady), median(s.baseSteady), median(s.floorA2A[0]), median(s.floorA2A[1]), b.floorBytes(),
		median(s.floorP2P[0]), median(s.floorP2P[1]), median(s.epCPU), median(s.floorCPU),
		median(s.flatDispatch), median(s.flatCombine), median(s.permute), median(s.unpermute),
		median(s.devDispatch), median(s.devCombine)}
	all := make([]float64, len(mine)*R)
	if err := mpi.AllgatherSlice(b.world, mine, all); err != nil {
		return nil, err
	}
	col := func(i int) []float64 {
		v := make([]float64, R)
		for r := 0; r < R; r++ {
			v[r] = all[r*len(mine)+i]
		}
		return v
	}
	bwOf := func(i, bytes int) float64 { // mean over ranks of bytes/us -> GB/s
		var sum float64
		for r := 0; r < R; r++ {
			if t := all[r*len(mine)+i]; t > 0 {
				sum += all[r*len(mine)+bytes] / t / 1e3
			}
		}
		return sum / float64(R)
	}
	bw := func(i int) float64 { return bwOf(i, 5) }
	combineBytes := 5 // the rows a combine moves: with an fp8 dispatch, the bf16 rows
	if b.c.wire().FP8() {
		combineBytes = 11
	}
	c := b.c
	res := &Result{Mode: c.mode.String(), Ranks: R, Nodes: b.g.Nodes(), Tokens: c.tokens, Hidden: c.hidden, TopK: c.topk,
		Experts: c.experts, DType: c.dtype, Iters: b.o.iters, BytesPerRank: mean(col(5)),
		DispatchUS: slices.Max(col(0)), CombineUS: slices.Max(col(1)), DispatchGBps: bw(0), CombineGBps: bwOf(1, combineBytes),
		MemcpyGBps: bw(4), BufferBytesPerRank: b.g.BufferBytes()}
	if b.base != nil {
		res.AlltoallvDispatchUS, res.AlltoallvCombineUS = slices.Max(col(2)), slices.Max(col(3))
		res.AlltoallvDispatchGBps, res.AlltoallvCombineGBps = bw(2), bwOf(3, combineBytes)
		res.Speedup = (res.AlltoallvDispatchUS + res.AlltoallvCombineUS) / (res.DispatchUS + res.CombineUS)
	}
	if b.o.latency {
		res.SteadyRoundUS = slices.Max(col(12))
		if b.base != nil {
			res.AlltoallvSteadyRoundUS = slices.Max(col(13))
		}
	}
	if b.floor != nil {
		// The faster exchange of each half is its floor.
		res.FloorAlltoallvUS = slices.Max(col(14)) + slices.Max(col(15))
		res.FloorP2PUS = slices.Max(col(17)) + slices.Max(col(18))
		res.FloorDispatchUS = min(slices.Max(col(14)), slices.Max(col(17)))
		res.FloorCombineUS = min(slices.Max(col(15)), slices.Max(col(18)))
		res.FloorBytesPerCall = mean(col(16)) * float64(R)
		res.CPUPerRoundUS, res.FloorCPUPerRoundUS = mean(col(19)), mean(col(20))
		if res.XFloor, res.AlltoallvXFloor, err = b.pairedRatios(s); err != nil {
			return nil, err
		}
	}
	if res.Nodes > 1 {
		if res.NetworkBytesPerCall, err = netBytesOf(b.world, b.g); err != nil {
			return nil, err
		}
		if b.base != nil {
			if res.FlatNetworkBytesPerCall, err = b.flatNetworkBytes(); err != nil {
				return nil, err
			}
		}
	}
	if b.o.layout != ep.LayoutDefault {
		res.Layout, res.ExpertAlignment = b.o.layout.String(), b.o.align
	}
	if b.flat != nil {
		res.FlatPermuteDispatchUS, res.FlatPermuteCombineUS = slices.Max(col(21)), slices.Max(col(22))
		if res.ExpertMajorSpeedup, res.ExpertMajorDispatchSpeedup, err = b.layoutRatios(s); err != nil {
			return nil, err
		}
		res.PermuteUS, res.UnpermuteUS = slices.Max(col(23)), slices.Max(col(24))
	}
	if b.native != nil {
		res.BF16DispatchUS, res.BF16CombineUS, res.BF16BytesPerRank = slices.Max(col(9)), slices.Max(col(10)), mean(col(11))
		if b.c.wire().FP8() {
			res.FP8DispatchSpeedup = res.BF16DispatchUS / res.DispatchUS
		}
	}
	if b.c.combineFP8 {
		res.CombineWire = "fp8"
		res.FP8CombineSpeedup = res.BF16CombineUS / res.CombineUS
		cb := make([]float64, 1)
		if err := mpi.Allreduce(b.world, mpi.OpSum, []float64{b.cbytes}, cb); err != nil {
			return nil, err
		}
		res.CombineBytesPerRank = cb[0] / float64(R)
		if res.Nodes > 1 {
			if res.BF16NetworkBytesPerCall, err = netBytesOf(b.world, b.native); err != nil {
				return nil, err
			}
		}
	}
	if res.MemcpyGBps > 0 {
		res.DispatchOfMemcpy, res.CombineOfMemcpy = res.DispatchGBps/res.MemcpyGBps, res.CombineGBps/res.MemcpyGBps
	}
	if b.cpu != nil {
		res.Device = b.o.device
		res.CPUDispatchUS, res.CPUCombineUS = slices.Max(col(6)), slices.Max(col(7))
		res.DispatchDeviceUS, res.CombineDeviceUS = slices.Max(col(25)), slices.Max(col(26))
		if res.TransferBytesPerRound, res.TransferFullBytesPerRound, err = transferBytesOf(b.world, b.g); err != nil {
			return nil, err
		}
		if res.DeviceCopyGBps = bw(8); res.DeviceCopyGBps > 0 {
			res.DispatchOfDeviceCopy, res.CombineOfDeviceCopy = res.DispatchGBps/res.DeviceCopyGBps, res.CombineGBps/res.DeviceCopyGBps
		}
	}
	return res, nil
}

// pairedRatios are ep's and the baseline's times over the floor's, each the
// median over the timed rounds of the round's ratio (the slowest rank's
// dispatch+combine over the slowest rank's floor, each half of the floor
// the faster of its two exchanges): a ratio within one round, so that the
// machine's drift between rounds, which moves both, cancels.
func (b *bench[E]) pairedRatios(s *samples) (ep, base float64, err error) {
	n := len(s.dispatch)
	mine := make([]float64, 3*n)
	for i := 0; i < n; i++ {
		mine[3*i] = s.dispatch[i] + s.combine[i]
		mine[3*i+1] = s.baseDispatch[i] + s.baseCombine[i]
		mine[3*i+2] = min(s.floorA2A[0][i], s.floorP2P[0][i]) + min(s.floorA2A[1][i], s.floorP2P[1][i])
	}
	R := b.world.Size()
	all := make([]float64, len(mine)*R)
	if err := mpi.AllgatherSlice(b.world, mine, all); err != nil {
		return 0, 0, err
	}
	var re, rb []float64
	for i := 0; i < n; i++ {
		var e, bl, f float64
		for r := 0; r < R; r++ {
			e, bl, f = max(e, all[r*len(mine)+3*i]), max(bl, all[r*len(mine)+3*i+1]), max(f, all[r*len(mine)+3*i+2])
		}
		re, rb = append(re, e/f), append(rb, bl/f)
	}
	if b.base == nil {
		return median(re), 0, nil
	}
	return median(re), median(rb), nil
}

// layoutRatios are the flat layout plus the permutation's time over the
// expert-major layout's, dispatch+combine and dispatch alone, each the
// median over the timed rounds of the round's ratio (the slowest ranks'),
// so that the machine's drift between rounds cancels.
func (b *bench[E]) layoutRatios(s *samples) (total, dispatch float64, err error) {
	n := len(s.dispatch)
	mine := make([]float64, 4*n)
	for i := 0; i < n; i++ {
		mine[4*i], mine[4*i+1] = s.dispatch[i], s.combine[i]
		mine[4*i+2], mine[4*i+3] = s.flatDispatch[i], s.flatCombine[i]
	}
	R := b.world.Size()
	all := make([]float64, len(mine)*R)
	if err := mpi.AllgatherSlice(b.world, mine, all); err != nil {
		return 0, 0, err
	}
	var rt, rd []float64
	for i := 0; i < n; i++ {
		var v [4]float64
		for r := 0; r < R; r++ {
			for j := range v {
				v[j] = max(v[j], all[r*len(mine)+4*i+j])
			}
		}
		rt, rd = append(rt, (v[2]+v[3])/(v[0]+v[1])), append(rd, v[2]/v[0])
	}
	return median(rt), median(rd), nil
}

// floorBytes is what this rank sends across nodes in the floor's exchange.
func (b *bench[E]) floorBytes() float64 {
	if b.floor == nil {
		return 0
	}
	return float64(b.floor.halves[0].bytes + b.floor.halves[1].bytes)
}

// flatNetworkBytes is, per dispatch and combine and over all ranks, the
// bytes the baseline sent to and received from ranks of other nodes (a
// flat exchange's), from its Stats.
func (b *bench[E]) flatNetworkBytes() (float64, error) {
	base := b.base.Stats()
	if base.Dispatches == 0 {
		return 0, nil
	}
	var cross int64
	for p, n := range base.SentBytes {
		if b.g.NodeOf(p) != b.g.Node() {
			cross += n
		}
	}
	sum := make([]float64, 1)
	err := mpi.Allreduce(b.world, mpi.OpSum, []float64{float64(cross) / float64(base.Dispatches)}, sum)
	return sum[0], err
}

// netBytesOf is g's bytes across nodes per dispatch+combine, over all ranks.
func netBytesOf[E ep.Element](world *mpi.Comm, g *ep.Group[E]) (float64, error) {
	st := g.Stats()
	mine := []float64{0}
	if st.Dispatches > 0 {
		mine[0] = float64(st.NetworkBytes) / float64(st.Dispatches)
	}
	sum := make([]float64, 1)
	err := mpi.Allreduce(world, mpi.OpSum, mine, sum)
	return sum[0], err
}

// transferBytesOf is, summed over the ranks, the bytes g's transport moved
// between the ranks of a node per dispatch+combine round, and what
// transfers of fixed size would have moved (zeros for engines that move
// none themselves): it counts since the group was made, warm-up included,
// which moves what the timed rounds move.
func transferBytesOf[E ep.Element](world *mpi.Comm, g *ep.Group[E]) (moved, full float64, err error) {
	st := g.Stats()
	mine := []float64{0, 0}
	if st.Dispatches > 0 {
		mine[0], mine[1] = float64(st.TransferBytes)/float64(st.Dispatches), float64(st.TransferFullBytes)/float64(st.Dispatches)
	}
	sum := make([]float64, 2)
	err = mpi.Allreduce(world, mpi.OpSum, mine, sum)
	return sum[0], sum[1], err
}

func us(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 }

func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func mean(v []float64) float64 {
	var s float64
	for _, x := range v {
		s += x
	}
	return s / float64(len(v))
}
