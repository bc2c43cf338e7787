package ep

import (
	"fmt"

	"github.com/goep/goep/ep/driver"
	"github.com/goep/goep/ep/internal/hostrows"
	"github.com/goep/goep/internal/sysmem"
)

// BufferPlan is the memory the CPU backend holds for a group of cfg over
// ranks ranks on nodes nodes of as equal sizes as can be, with rows of
// element type elem, computed without allocating anything: NCCL EP's
// ncclEpHandleMemSize and DeepEP's buffer size hints, for planning. It
// follows every option of cfg that sizes memory (the mode, the receive
// layout and its alignment, MaxRecvTokensPerRank, the wire format), and
// Footprint.Layout lists every area. NewGroup checks the same against what
// the machine can give before it allocates.
func BufferPlan(cfg Config, elem DType, ranks, nodes int) (Footprint, error) {
	if err := cfg.Validate(ranks); err != nil {
		return Footprint{}, err
	}
	if nodes < 1 || nodes > ranks {
		return Footprint{}, fmt.Errorf("ep: BufferPlan: %d nodes for %d ranks: want 1 to %d", nodes, ranks, ranks)
	}
	perNode := (ranks + nodes - 1) / nodes
	maxSend := 1 // how many ranks of one node one rail peer serves
	if ranks%nodes != 0 {
		maxSend = (perNode + ranks/nodes - 1) / (ranks / nodes)
	}
	return footprint(driver.NewSpec(cfg, elem), ranks, nodes, nodes*maxSend, perNode), nil
}

// footprint lays the CPU engine's memories out as openEngine does.
func footprint(s Spec, ranks, nodes, slots, ranksPerNode int) Footprint {
	in := inboxFor(s, ranks, nodes)
	seg, win := hostrows.NewArenas(in.size)
	switch {
	case s.LLRankMajor():
		layoutLLRank(s, ranks, seg, win)
	case s.Mode == LowLatency:
		layoutLL(s, ranks, nodes, tuning{}, seg, win)
	default:
		htDims(s, ranks, nodes, tuning{}).takeAreas(slots, seg, win)
	}
	f := Footprint{SharedPerRank: seg.N, RanksPerNode: ranksPerNode, Layout: seg.Named}
	if nodes > 1 {
		f.WindowPerRank = win.N
		f.Layout = append(f.Layout, win.Named...)
		if s.Backend != CPUOneSided {
			f.CopiesPerRank = 2 * win.N
		}
	}
	f.PerNode = ranksPerNode * f.PerRank()
	return f
}

// checkFits refuses, before anything is allocated, a footprint this host
// cannot give to its hostRanks ranks (a node's, or more where nodes are
// simulated on one host): their shared segments against the shared-memory
// file system and the memory available, and everything against the memory
// available (with a cgroup limit). The message names the bytes needed and
// available and the knobs that shrink it.
func checkFits(s Spec, f Footprint, avail sysmem.Avail, ranks, nodes, hostRanks int) error {
	shared := int64(hostRanks) * int64(f.SharedPerRank)
	need, free := int64(hostRanks)*int64(f.PerRank()), avail.Memory()
	short := free != sysmem.Unknown && need > free
	if sh := avail.Shared(); sh != sysmem.Unknown && shared > sh {
		short, free = true, min(free, sh)
	}
	if !short {
		return nil
	}
	knobs := fmt.Sprintf("lower MaxTokensPerRank (%d)", s.MaxTokensPerRank)
	if s.Mode == HighThroughput {
		knobs += fmt.Sprintf(" or MaxRecvTokensPerRank (%d: 0 is ranks x MaxTokensPerRank)", s.MaxRecvTokensPerRank)
	} else {
		ht := s
		ht.Mode = HighThroughput
		knobs += fmt.Sprintf(", or use HighThroughput instead of LowLatency (%s per node here)",
			sysmem.Bytes(int64(footprint(ht, ranks, nodes, nodes, f.RanksPerNode).PerNode)))
	}
	where := "this node"
	if hostRanks != f.RanksPerNode {
		where = fmt.Sprintf("this host (its %d ranks need %s)", hostRanks, sysmem.Bytes(need))
	}
	return fmt.Errorf("the buffers need %s but %s can give %s (%s): %s", f, where, sysmem.Bytes(free), avail, knobs)
}
