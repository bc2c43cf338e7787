package ep

import (
	"github.com/goep/goep/ep/epcpu"
	"github.com/goep/goep/ep/internal/hostrows"
)

// CPUWithSlotProtocolMax is the CPU backend whose LL groups take the slot
// protocol for messages of at most n bytes a rank (n < 0: never): the tests
// run the conformance suite on both protocols.
func CPUWithSlotProtocolMax(n int) Backend {
	if n == 0 {
		n = -1
	}
	return epcpu.NewTuned(epcpu.Tuning{SlotProtocolMax: n})
}

// QuantizePortable is Quantize with the portable cast instead of the
// fastest this CPU has: the tests check both against the reference.
func QuantizePortable[E Element](q []E4M3, scales []float32, src []E, hidden int, w WireFormat) error {
	return quantize(q, scales, src, hidden, w, hostrows.CastPortable)
}

// CountStats adds a completed dispatch's and its combine's traffic to the
// group's statistics again: the bookkeeping every call pays for Stats
// (BenchmarkStatsCost times it).
func CountStats[E Element](g *Group[E], h Handle[E]) {
	g.traffic(h.s)
	g.count(h.s, false)
	g.count(h.s, true)
}

// CPUGeneralLL is the CPU backend whose LL dispatches take the general
// path where they would take the direct one (one node, slot protocol): the
// paths are one protocol (TestLLPathsInterop mixes them across ranks), and
// BenchmarkLLDirectPath compares them in one run.
var CPUGeneralLL Backend = epcpu.NewTuned(epcpu.Tuning{GeneralLL: true})

// CPUReduceKernelC is the CPU backend whose combines call the C kernel for
// the small reductions that would run in Go assembly:
// BenchmarkLLReduceKernel compares the two in one run.
var CPUReduceKernelC Backend = epcpu.NewTuned(epcpu.Tuning{ReduceInC: true})
