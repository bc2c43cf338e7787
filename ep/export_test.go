package ep

// SetSlotProtocolMax sets the largest LL message that takes the slot
// protocol, for groups made afterwards (0: never), and returns a function
// that restores it: the tests run the conformance suite on both protocols.
func SetSlotProtocolMax(n int) (restore func()) {
	old := slotProtocolMax
	slotProtocolMax = n
	return func() { slotProtocolMax = old }
}

// UsePortableCast makes the FP8 cast the portable one instead of the
// fastest this CPU has, and returns a function that restores it: the tests
// check both against the reference.
func UsePortableCast() (restore func()) {
	old := quantImpl
	quantImpl = 1
	return func() { quantImpl = old }
}

// CountStats adds a completed dispatch's and its combine's traffic to the
// group's statistics again: the bookkeeping every call pays for Stats
// (BenchmarkStatsCost times it).
func CountStats[E Element](g *Group[E], h Handle[E]) {
	g.traffic(h.s)
	g.count(h.s, false)
	g.count(h.s, true)
}

// UseGeneralLL makes LL dispatches take the general path where they would
// take the direct one (one node, slot protocol), and returns a function
// that restores it: BenchmarkLLDirectPath compares the two in one run.
func UseGeneralLL() (restore func()) {
	old := llDirect
	llDirect = false
	return func() { llDirect = old }
}

// UseReduceKernelC makes the combine's small reductions call the C kernel
// where they would run in Go assembly, and returns a function that
// restores it: BenchmarkLLReduceKernel compares the two in one run.
func UseReduceKernelC() (restore func()) {
	old := reduceInGo
	reduceInGo = false
	return func() { reduceInGo = old }
}
