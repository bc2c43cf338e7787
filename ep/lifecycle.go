package ep

// The handle's lifecycle, split as NCCL EP's: what a group's layout needs is
// made once, by NewGroup (NCCL EP's ncclEpCreateGroup and ncclEpInitHandle):
// the engine's buffers for the layout and its sizes, the records of the
// handle ring with every table a dispatch's routing fills, and, where the
// engine is a StateMaker, its per-dispatch state, all sized for the largest
// routing the Config allows. Each dispatch then brings its routing (NCCL
// EP's ncclEpUpdateHandle): the layout kernel fills the record's tables in
// place, and the engine's only collective beyond the rows is the count
// exchange (HighThroughput; LowLatency's count round; none with LL's slots
// or rank-major blocks), so that a routing change allocates nothing.
// BufferPlan answers ncclEpHandleMemSize's question before anything is
// allocated.

// reserve sizes r's tables for any routing of up to m tokens of shape sh.
func reserveRouting(r *Routing, sh shape, m int) {
	r.PerExpert = make([]int32, sh.E)
	r.PerRank = make([]int32, sh.R)
	r.PerNode = make([]int32, sh.nodes)
	r.PairOrd = make([]int32, 0, m*sh.K)
	r.TokRankOrd = make([]int32, 0, m*sh.R)
	r.TokNodeOrd = make([]int32, 0, m*sh.nodes)
}

// makeRecords makes every record of the handle ring, and the routing
// scratch, sized for any dispatch of the group.
func (g *Group[E]) makeRecords() {
	M, K := g.spec.MaxTokensPerRank, g.spec.TopK
	maker, _ := g.eng.(StateMaker)
	for i := range g.states {
		s := &handleState[E]{g: g, topk: make([]int32, 0, M*K), weights: make([]float32, 0, M*K),
			rowsTo: make([]int32, g.size), rowsFrom: make([]int32, g.size)}
		reserveRouting(&s.rt, g.sh, M)
		if maker != nil {
			s.d.State = maker.NewState()
		}
		g.states[i] = s
	}
	reserveRouting(&g.scratchRT, g.sh, M)
}
