package ep

import (
	"fmt"
	"io"

	"github.com/goep/goep/internal/sysmem"
)

// The layout of an engine's memories as typed regions instead of raw
// offsets: a region knows where it starts, how long one of its rows is and
// how many rows it holds, and gives a row's place by index, so that a
// stride is written once, where the region is made, and not in every
// expression that reads it. A rowArea pairs the rows of a dispatch with
// their side data (FP8 scales), which always move together.

// region is rows of stride bytes from byte off of a memory.
type region struct {
	off, stride, rows int
}

// at is the byte offset of row i.
func (r region) at(i int) int { return r.off + i*r.stride }

// len is the bytes of n rows.
func (r region) len(n int) int { return n * r.stride }

// rowArea is where dispatched rows lie: the rows, and their side data
// (FP8 scales, stride 0 where the wire format has none), row i of one
// beside row i of the other.
type rowArea struct{ rows, side region }

// parts are the regions that move when rows of the area move.
func (a rowArea) parts() []region {
	if a.side.stride == 0 {
		return []region{a.rows}
	}
	return []region{a.rows, a.side}
}

// arena lays regions out in one memory, each aligned for rows (64 bytes,
// whole pages from a page up), and keeps their names for BufferPlan.
type arena struct {
	memory string // "shared" or "staging"
	n      int
	named  []Area
}

// newArenas are the arenas of a rank's shared segment and staging memory,
// both starting after the inbox.
func newArenas(inbox int) (seg, win *arena) {
	return &arena{memory: "shared", n: inbox, named: []Area{{Memory: "shared", Name: "inbox (flags, counts, notes)", Bytes: inbox}}},
		&arena{memory: "staging", n: inbox, named: []Area{{Memory: "staging", Name: "inbox (flags, counts, notes)", Bytes: inbox}}}
}

// take places a region of rows rows of stride bytes.
func (a *arena) take(name string, rows, stride int) region {
	size := rows * stride
	align := 64
	if size >= 4096 {
		align = 4096
	}
	a.n = (a.n + align - 1) / align * align
	r := region{off: a.n, stride: stride, rows: rows}
	a.n += size
	if size > 0 {
		a.named = append(a.named, Area{Memory: a.memory, Name: name, Offset: r.off, Bytes: size})
	}
	return r
}

// rowSizes are the sizes of a row and of its side data.
type rowSizes interface {
	rowBytes() int
	sideBytes() int
}

// takeRows places a rowArea of rows rows of w: the rows, and the side data
// where the wire format has any.
func (a *arena) takeRows(name string, rows int, w rowSizes) rowArea {
	ra := rowArea{rows: a.take(name, rows, w.rowBytes())}
	if w.sideBytes() > 0 {
		ra.side = a.take(name+" scales", rows, w.sideBytes())
	}
	return ra
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
