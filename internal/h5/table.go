package h5

import (
	"fmt"
	"math"
)

// Table is an appendable dataset: shape [rows, rowShape...], chunked, its
// first dimension unlimited. Append adds rows at the end. A Table belongs to
// the File it came from and is closed with it.
type Table struct {
	f        *File
	name     string
	id       hid
	dtype    DType
	rowShape []int
	rowLen   int // elements per row: the product of rowShape
	rows     int
}

// chunkBytes is the chunk size aimed at when CreateTable is given chunkRows 0.
const chunkBytes = 64 << 10

// CreateTable creates an empty table at name (intermediate groups are
// created): a dataset of dtype with shape [0, rowShape...] whose first
// dimension grows without limit. rowShape may be empty (a table of scalars)
// and its sizes must be positive. chunkRows is the number of rows per chunk,
// the unit in which HDF5 stores and caches the table; 0 picks about 64 KiB
// per chunk.
func (f *File) CreateTable(name string, dtype DType, rowShape []int, chunkRows int) (*Table, error) {
	const op = "create table"
	p, err := cleanPath(name)
	if err != nil {
		return nil, &Error{op, f.Path(), name, err}
	}
	if p == "/" {
		return nil, &Error{op, f.Path(), name, wrap(ErrPath, "the root group is not a dataset")}
	}
	if !dtype.valid() {
		return nil, &Error{op, f.Path(), p, wrap(ErrType, fmt.Sprintf("element type %v", dtype))}
	}
	if len(rowShape)+1 > maxRank {
		return nil, &Error{op, f.Path(), p, wrap(ErrShape, fmt.Sprintf("row shape %v has more than %d dimensions", rowShape, maxRank-1))}
	}
	rowLen := 1
	for _, d := range rowShape {
		if d <= 0 {
			return nil, &Error{op, f.Path(), p, wrap(ErrShape, fmt.Sprintf("row shape %v: sizes must be positive", rowShape))}
		}
		if rowLen > math.MaxInt32/d {
			return nil, &Error{op, f.Path(), p, wrap(ErrShape, fmt.Sprintf("row shape %v is too large", rowShape))}
		}
		rowLen *= d
	}
	rowBytes := rowLen * dtype.size()
	if chunkRows < 0 {
		return nil, &Error{op, f.Path(), p, wrap(ErrShape, fmt.Sprintf("chunkRows %d is negative", chunkRows))}
	}
	if chunkRows == 0 {
		chunkRows = max(1, chunkBytes/rowBytes)
	}
	// HDF5 limits a chunk to 4 GiB.
	if int64(chunkRows)*int64(rowBytes) >= 1<<32 {
		return nil, &Error{op, f.Path(), p, wrap(ErrShape, fmt.Sprintf("chunkRows %d of %d-byte rows makes a chunk of 4 GiB or more", chunkRows, rowBytes))}
	}
	dims := make([]uint64, 1+len(rowShape))
	maxdims := make([]uint64, len(dims))
	chunk := make([]uint64, len(dims))
	maxdims[0], chunk[0] = unlimited, uint64(chunkRows)
	for i, d := range rowShape {
		dims[i+1], maxdims[i+1], chunk[i+1] = uint64(d), uint64(d), uint64(d)
	}

	lock()
	defer unlock()
	if err := f.check(op, p, true); err != nil {
		return nil, err
	}
	if err := f.requireAbsent(op, p); err != nil {
		return nil, err
	}
	id := cDatasetCreate(f.id, p, dtype, dims, maxdims, chunk)
	if id < 0 {
		return nil, &Error{op, f.path, p, libErr("")}
	}
	t := &Table{f: f, name: p, id: id, dtype: dtype, rowShape: append([]int{}, rowShape...), rowLen: rowLen}
	f.tables[p] = t
	return t, nil
}

// requireAbsent returns ErrExist if an object exists at p, and an error if
// one of p's parents exists but is not a group. Call with the lock held.
func (f *File) requireAbsent(op, p string) error {
	switch e := cExists(f.id, p); {
	case e < 0:
		return &Error{op, f.path, p, libErr("")}
	case e > 0:
		return &Error{op, f.path, p, ErrExist}
	}
	for i := 1; i < len(p); i++ {
		if p[i] != '/' {
			continue
		}
		parent := p[:i]
		switch e := cExists(f.id, parent); {
		case e < 0:
			return &Error{op, f.path, p, libErr("")}
		case e == 0:
			return nil // this parent and the rest are created
		}
		if k := cObjKind(f.id, parent); k != kindGroup {
			return &Error{op, f.path, p, wrap(ErrPath, fmt.Sprintf("%s is %s, not a group", parent, kindName(k)))}
		}
	}
	return nil
}

// OpenTable opens the existing table at name, to append to it (the File must
// then come from OpenRW or Create) or to ask its length. Opening the same
// table twice returns the same *Table.
func (f *File) OpenTable(name string) (*Table, error) {
	const op = "open table"
	p, err := cleanPath(name)
	if err != nil {
		return nil, &Error{op, f.Path(), name, err}
	}
	lock()
	defer unlock()
	if err := f.check(op, p, false); err != nil {
		return nil, err
	}
	if t := f.tables[p]; t != nil {
		return t, nil
	}
	if err := f.requireKind(op, p, kindDataset); err != nil {
		return nil, err
	}
	id := cDatasetOpen(f.id, p)
	if id < 0 {
		return nil, &Error{op, f.path, p, libErr("")}
	}
	info, ok := cDatasetInfo(id)
	var bad error
	switch {
	case !ok:
		bad = libErr("")
	case !info.dtype.valid():
		bad = wrap(ErrType, "the dataset's element type is not one of float64, float32, int64, int32, uint64, uint8")
	case len(info.dims) == 0 || info.maxdims[0] != unlimited || !info.chunked:
		bad = wrap(ErrShape, fmt.Sprintf("not a table: shape %v, maximum %v; a table is chunked with an unlimited first dimension", info.dims, fmtMax(info.maxdims)))
	}
	if bad != nil {
		cClose(id)
		return nil, &Error{op, f.path, p, bad}
	}
	t := &Table{f: f, name: p, id: id, dtype: info.dtype, rowLen: 1}
	for _, d := range info.dims[1:] {
		t.rowShape = append(t.rowShape, int(d))
		t.rowLen *= int(d)
	}
	t.rows = int(info.dims[0])
	f.tables[p] = t
	return t, nil
}

func fmtMax(maxdims []uint64) string {
	s := "["
	for i, d := range maxdims {
		if i > 0 {
			s += " "
		}
		if d == unlimited {
			s += "unlimited"
		} else {
			s += fmt.Sprint(d)
		}
	}
	return s + "]"
}

// Name returns the table's object path ("/trace/loss").
func (t *Table) Name() string { return t.name }

// DType returns the table's element type.
func (t *Table) DType() DType { return t.dtype }

// RowShape returns the shape of one row (a copy).
func (t *Table) RowShape() []int { return append([]int{}, t.rowShape...) }

// Len returns the number of rows.
func (t *Table) Len() int {
	mu.Lock()
	defer mu.Unlock()
	return t.rows
}

// Append adds rows at the end of the table. rows is a []float64, []float32,
// []int64, []int32, []uint64 or []uint8 matching the table's element type,
// holding whole rows in row-major order: its length must be a multiple of
// the row length (the product of the row shape). An empty slice adds nothing.
// The rows reach the file at the next Flush or Close.
func (t *Table) Append(rows any) error {
	const op = "append"
	dtype, n, ptr, ok := sliceOf(rows)
	lock()
	defer unlock()
	if err := t.f.check(op, t.name, true); err != nil {
		return err
	}
	if !ok {
		return &Error{op, t.f.path, t.name, wrap(ErrType, fmt.Sprintf("rows are %s; Append takes []float64, []float32, []int64, []int32, []uint64 or []uint8", typeName(rows)))}
	}
	if dtype != t.dtype {
		return &Error{op, t.f.path, t.name, wrap(ErrType, fmt.Sprintf("rows are []%v, the table holds %v", dtype, t.dtype))}
	}
	if n%t.rowLen != 0 {
		return &Error{op, t.f.path, t.name, wrap(ErrShape, fmt.Sprintf("length %d is not a multiple of the row length %d (row shape %v)", n, t.rowLen, t.rowShape))}
	}
	if n == 0 {
		return nil
	}
	dims := make([]uint64, 1+len(t.rowShape))
	dims[0] = uint64(t.rows)
	for i, d := range t.rowShape {
		dims[i+1] = uint64(d)
	}
	if !cAppend(t.id, t.dtype, dims, uint64(n/t.rowLen), ptr) {
		err := &Error{op, t.f.path, t.name, libErr("")}
		// The extent may have grown before the write failed: keep Len true.
		if info, ok := cDatasetInfo(t.id); ok && len(info.dims) > 0 {
			t.rows = int(info.dims[0])
		}
		lastError()
		return err
	}
	t.rows += n / t.rowLen
	return nil
}
