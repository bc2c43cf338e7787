package ep

import (
	"slices"
	"time"

	"github.com/goep/goep/internal/grow"
)

// Stats is what a group measured on this rank, per peer rank, since it was
// created or since ResetStats: the row payload it moved to and from each
// peer (dispatched rows, with their scales in FP8, and their combined
// outputs: the same bytes for every backend), and, where the engine
// measures them (ep.Meter: the CPU engine and the GPU engine of package
// epgpu do, the latter charging only waits long enough to read which peers
// were late), how long it waited for each peer and the bytes it put across
// nodes. Keeping them costs a few counters per call.
type Stats struct {
	Dispatches, Combines int
	SentBytes            []int64         // per peer: rows this rank sent it, in bytes
	RecvBytes            []int64         // per peer: rows it sent this rank, in bytes
	Wait                 []time.Duration // per peer: how long this rank waited for it (nil: not measured)
	NetworkBytes         int64           // bytes this rank put across nodes (rows, metadata, flags)
	NetworkSent          []int64         // per peer: the part of NetworkBytes sent to it (nil: not measured)
	Hosts                []string        // per peer: its host, to say where a slow rank runs
	// Where the engine is a TransferMeter (the GPU engine): the bytes its
	// transport moved into this rank's buffers from other ranks of its
	// node, and the bytes transfers of fixed size (an NCCL group's) would
	// have moved for the same calls; both 0 where it moves none itself.
	TransferBytes, TransferFullBytes int64
}

// stats is the Group's part of Stats, and the engine's counters at the
// last reset.
type stats struct {
	Stats
	waitBase []time.Duration
	netBase  int64
	sentBase []int64
	xferBase [2]int64
	hosts    []string
}

// Stats returns what the group measured on this rank since its creation or
// the last ResetStats (copies). Not collective.
func (g *Group[E]) Stats() Stats {
	s := g.stats.Stats
	s.SentBytes, s.RecvBytes = slices.Clone(s.SentBytes), slices.Clone(s.RecvBytes)
	s.Hosts = g.stats.hosts
	if m, ok := g.eng.(Meter); ok {
		waits, net := m.Meter()
		s.Wait = make([]time.Duration, len(waits))
		for i := range waits {
			s.Wait[i] = waits[i] - g.stats.waitBase[i]
		}
		s.NetworkBytes = net - g.stats.netBase
	}
	if m, ok := g.eng.(TransferMeter); ok {
		moved, full := m.TransferBytes()
		s.TransferBytes, s.TransferFullBytes = moved-g.stats.xferBase[0], full-g.stats.xferBase[1]
	}
	if m, ok := g.eng.(NetworkMeter); ok {
		sent := m.NetworkSent()
		s.NetworkSent = make([]int64, len(sent))
		for i := range sent {
			s.NetworkSent[i] = sent[i]
			if i < len(g.stats.sentBase) {
				s.NetworkSent[i] -= g.stats.sentBase[i]
			}
		}
	}
	return s
}

// ResetStats starts the statistics anew. Not collective.
func (g *Group[E]) ResetStats() {
	clear(g.stats.SentBytes)
	clear(g.stats.RecvBytes)
	g.stats.Dispatches, g.stats.Combines = 0, 0
	if m, ok := g.eng.(Meter); ok {
		waits, net := m.Meter()
		g.stats.waitBase = append(g.stats.waitBase[:0], waits...)
		g.stats.netBase = net
	}
	if m, ok := g.eng.(NetworkMeter); ok {
		g.stats.sentBase = append(g.stats.sentBase[:0], m.NetworkSent()...)
	}
	if m, ok := g.eng.(TransferMeter); ok {
		g.stats.xferBase[0], g.stats.xferBase[1] = m.TransferBytes()
	}
}

// traffic sets a dispatch's rows to and from each rank (rowsTo, rowsFrom:
// [R]), from its routing and what it received: the same for every backend.
// An expert-major layout receives a row per (token, expert) pair, the flat
// and rank-major ones a row per token and rank.
func (g *Group[E]) traffic(s *handleState[E]) {
	R, L := g.size, g.sh.L
	s.rowsTo, s.rowsFrom = grow.To(s.rowsTo, R), grow.To(s.rowsFrom, R)
	recv := &s.d.Recv
	for r := 0; r < R; r++ {
		var to, from int32
		if g.spec.Layout == LayoutExpertMajor {
			for e := r * L; e < (r+1)*L; e++ {
				to += s.rt.PerExpert[e]
			}
			for l := 0; l < L; l++ {
				from += int32(recv.SourceCounts[r*L+l])
			}
		} else {
			to, from = s.rt.PerRank[r], int32(recv.SourceCounts[r])
		}
		s.rowsTo[r], s.rowsFrom[r] = to, from
	}
}

// dispatchRowBytes is the payload of one dispatched row in the group's
// Wire format, its side data included.
func dispatchRowBytes(s Spec) int { return s.WireRowBytes + s.WireSideBytes }

// combineRowBytes is the payload of one combined row in the group's
// CombineWire format, its side data included.
func combineRowBytes(s Spec) int {
	w, _ := s.CombineWire.Info()
	return w.RowBytes(s.Hidden, s.Elem.Size()) + w.SideBytes(s.Hidden)
}

// count adds a completed dispatch (or, combine true, its combine) to the
// statistics: a combine moves the dispatch's rows back.
func (g *Group[E]) count(s *handleState[E], combine bool) {
	rb := int64(dispatchRowBytes(g.spec))
	sent, recv := s.rowsTo, s.rowsFrom
	if combine {
		rb = int64(combineRowBytes(g.spec))
		sent, recv = recv, sent
		g.stats.Combines++
	} else {
		g.stats.Dispatches++
	}
	for r := range sent {
		g.stats.SentBytes[r] += int64(sent[r]) * rb
		g.stats.RecvBytes[r] += int64(recv[r]) * rb
	}
}
