package epcpu

import (
	"fmt"

	"github.com/goep/goep/ep/driver"
	"github.com/goep/goep/ep/internal/hostrows"
	"github.com/goep/goep/internal/sysmem"
)

// Plan is the memory the engine of a group of spec holds over ranks ranks
// on nodes nodes of as equal sizes as can be, laid out as openEngine lays
// it out, without allocating anything (ep.BufferPlan).
func (b cpuBackend) Plan(spec driver.Spec, ranks, nodes int) (driver.Footprint, error) {
	perNode := (ranks + nodes - 1) / nodes
	maxSend := 1 // how many ranks of one node one rail peer serves
	if ranks%nodes != 0 {
		maxSend = (perNode + ranks/nodes - 1) / (ranks / nodes)
	}
	return footprint(spec, b.network().caps(), b.tune, ranks, nodes, nodes*maxSend, perNode), nil
}

// footprint lays the CPU engine's memories out as openEngine does, for a
// network of caps.
func footprint(s driver.Spec, caps networkCaps, tune tuning, ranks, nodes, slots, ranksPerNode int) driver.Footprint {
	in := inboxFor(s, ranks, nodes)
	seg, win := hostrows.NewArenas(in.size)
	switch {
	case s.LLRankMajor():
		layoutLLRank(s, ranks, seg, win)
	case s.Mode == driver.LowLatency:
		layoutLL(s, ranks, nodes, tune, seg, win)
	default:
		htDims(s, ranks, nodes, tune).takeAreas(slots, seg, win)
	}
	f := driver.Footprint{SharedPerRank: seg.N, RanksPerNode: ranksPerNode, Layout: seg.Named}
	if nodes > 1 {
		f.WindowPerRank = win.N
		f.Layout = append(f.Layout, win.Named...)
		f.CopiesPerRank = caps.copies * win.N
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
func checkFits(s driver.Spec, caps networkCaps, tune tuning, f driver.Footprint, avail sysmem.Avail, ranks, nodes, hostRanks int) error {
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
	if s.Mode == driver.HighThroughput {
		knobs += fmt.Sprintf(" or MaxRecvTokensPerRank (%d: 0 is ranks x MaxTokensPerRank)", s.MaxRecvTokensPerRank)
	} else {
		ht := s
		ht.Mode = driver.HighThroughput
		knobs += fmt.Sprintf(", or use HighThroughput instead of LowLatency (%s per node here)",
			sysmem.Bytes(int64(footprint(ht, caps, tune, ranks, nodes, nodes, f.RanksPerNode).PerNode)))
	}
	where := "this node"
	if hostRanks != f.RanksPerNode {
		where = fmt.Sprintf("this host (its %d ranks need %s)", hostRanks, sysmem.Bytes(need))
	}
	return fmt.Errorf("the buffers need %s but %s can give %s (%s): %s", f, where, sysmem.Bytes(free), avail, knobs)
}
