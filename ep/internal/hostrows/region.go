package hostrows

import "github.com/goep/goep/ep/driver"

// The layout of an engine's memories as typed regions instead of raw
// offsets: a Region knows where it starts, how long one of its rows is and
// how many rows it holds, and gives a row's place by index, so that a
// stride is written once, where the Region is made, and not in every
// expression that reads it. A RowArea pairs the rows of a dispatch with
// their side data (FP8 scales), which always move together.

// Region is rows of stride bytes from byte off of a memory.
type Region struct {
	Off, Stride, Rows int
}

// at is the byte offset of row i.
func (r Region) At(i int) int { return r.Off + i*r.Stride }

// len is the bytes of n rows.
func (r Region) Len(n int) int { return n * r.Stride }

// RowArea is where dispatched rows lie: the rows, and their side data
// (FP8 scales, stride 0 where the wire format has none), row i of one
// beside row i of the other.
type RowArea struct{ Rows, Side Region }

// parts are the regions that move when rows of the area move.
func (a RowArea) Parts() []Region {
	if a.Side.Stride == 0 {
		return []Region{a.Rows}
	}
	return []Region{a.Rows, a.Side}
}

// Arena lays regions out in one memory, each aligned for rows (64 bytes,
// whole pages from a page up), and keeps their names for BufferPlan.
type Arena struct {
	memory string // "shared" or "staging"
	N      int
	Named  []driver.Area
}

// NewArenas are the arenas of a rank's shared segment and staging memory,
// both starting after the inbox.
func NewArenas(inbox int) (seg, win *Arena) {
	return &Arena{memory: "shared", N: inbox, Named: []driver.Area{{Memory: "shared", Name: "inbox (flags, counts, notes)", Bytes: inbox}}},
		&Arena{memory: "staging", N: inbox, Named: []driver.Area{{Memory: "staging", Name: "inbox (flags, counts, notes)", Bytes: inbox}}}
}

// take places a Region of rows rows of stride bytes.
func (a *Arena) Take(name string, rows, stride int) Region {
	size := rows * stride
	align := 64
	if size >= 4096 {
		align = 4096
	}
	a.N = (a.N + align - 1) / align * align
	r := Region{Off: a.N, Stride: stride, Rows: rows}
	a.N += size
	if size > 0 {
		a.Named = append(a.Named, driver.Area{Memory: a.memory, Name: name, Offset: r.Off, Bytes: size})
	}
	return r
}

// RowSizes are the sizes of a row and of its side data.
type RowSizes interface {
	RowBytes() int
	SideBytes() int
}

// takeRows places a RowArea of rows rows of w: the rows, and the side data
// where the wire format has any.
func (a *Arena) TakeRows(name string, rows int, w RowSizes) RowArea {
	ra := RowArea{Rows: a.Take(name, rows, w.RowBytes())}
	if w.SideBytes() > 0 {
		ra.Side = a.Take(name+" scales", rows, w.SideBytes())
	}
	return ra
}
