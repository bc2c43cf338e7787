package driver

import (
	"fmt"
	"io"

	"github.com/goep/goep/internal/sysmem"
)

// Footprint is the memory a CPU group holds, in bytes.
type Footprint struct {
	SharedPerRank int // each rank's MPI shared-memory segment (its node's ranks map it)
	WindowPerRank int // each rank's staging memory for other nodes' rows (0 when the group is on one node)
	// CopiesPerRank bounds the messages across nodes a rank holds at once
	// (ep.CPU; 0 on one node and for ep.CPUOneSided): the packed copies
	// of what it sends, and the message it receives, each at most its
	// staging memory.
	CopiesPerRank int
	RanksPerNode  int // the most ranks on one node
	PerNode       int // what the most loaded node holds in all
	// Layout is every area of a rank's memories, as the engine lays them
	// out (BufferPlan only; WriteLayout prints it).
	Layout []Area
}

// PerRank is what one rank holds in all.
func (f Footprint) PerRank() int { return f.SharedPerRank + f.WindowPerRank + f.CopiesPerRank }

func (f Footprint) String() string {
	s := fmt.Sprintf("%s per node (%d ranks x %s shared", sysmem.Bytes(int64(f.PerNode)), f.RanksPerNode,
		sysmem.Bytes(int64(f.SharedPerRank)))
	if f.WindowPerRank > 0 {
		s += " + " + sysmem.Bytes(int64(f.WindowPerRank)) + " staging"
	}
	if f.CopiesPerRank > 0 {
		s += " + " + sysmem.Bytes(int64(f.CopiesPerRank)) + " message copies"
	}
	return s + ")"
}

// Area is one region of a CPU group's memory, as BufferPlan and
// Footprint.WriteLayout report it: which memory (a rank's "shared" segment,
// or its "staging" memory for other nodes), what it holds, where it starts
// and how many bytes it takes.
type Area struct {
	Memory string
	Name   string
	Offset int
	Bytes  int
}

// WriteLayout writes f's areas, one a line.
func (f Footprint) WriteLayout(w io.Writer) error {
	for _, a := range f.Layout {
		if _, err := fmt.Fprintf(w, "  %-8s %12d  %10s  %s\n", a.Memory, a.Offset, sysmem.Bytes(int64(a.Bytes)), a.Name); err != nil {
			return err
		}
	}
	return nil
}
