package h5

import (
	"fmt"
	"math"
	"unsafe"
)

// WriteDataset creates the dataset name (intermediate groups are created) of
// the given shape and writes data into it, in row-major order. data is a
// []float64, []float32, []int64, []int32, []uint64 or []uint8 of exactly
// prod(shape) elements; an empty shape writes a scalar (one element). The
// dataset must not exist yet.
func (f *File) WriteDataset(name string, shape []int, data any) error {
	const op = "write"
	p, err := cleanPath(name)
	if err != nil {
		return &Error{op, f.Path(), name, err}
	}
	if p == "/" {
		return &Error{op, f.Path(), name, wrap(ErrPath, "the root group is not a dataset")}
	}
	dtype, n, ptr, ok := sliceOf(data)
	if !ok {
		return &Error{op, f.Path(), p, wrap(ErrType, fmt.Sprintf("data is %s; WriteDataset takes []float64, []float32, []int64, []int32, []uint64 or []uint8", typeName(data)))}
	}
	if len(shape) > maxRank {
		return &Error{op, f.Path(), p, wrap(ErrShape, fmt.Sprintf("shape %v has more than %d dimensions", shape, maxRank))}
	}
	want := 1
	dims := make([]uint64, len(shape))
	for i, d := range shape {
		if d < 0 {
			return &Error{op, f.Path(), p, wrap(ErrShape, fmt.Sprintf("shape %v has a negative size", shape))}
		}
		if d > 0 && want > math.MaxInt/d {
			return &Error{op, f.Path(), p, wrap(ErrShape, fmt.Sprintf("shape %v is too large", shape))}
		}
		want *= d
		dims[i] = uint64(d)
	}
	if n != want {
		return &Error{op, f.Path(), p, wrap(ErrShape, fmt.Sprintf("length %d does not match shape %v (%d elements)", n, shape, want))}
	}

	lock()
	defer unlock()
	if err := f.check(op, p, true); err != nil {
		return err
	}
	if err := f.requireAbsent(op, p); err != nil {
		return err
	}
	id := cDatasetCreate(f.id, p, dtype, dims, nil, nil)
	if id < 0 {
		return &Error{op, f.path, p, libErr("")}
	}
	if n > 0 && !cDatasetWrite(id, dtype, ptr) {
		err := &Error{op, f.path, p, libErr("")}
		cClose(id)
		return err
	}
	if !cClose(id) {
		return &Error{op, f.path, p, libErr("")}
	}
	return nil
}

// ReadFloat64 reads the whole float64 dataset name (a Table too) and returns
// its data in row-major order and its shape (empty for a scalar). A dataset
// of any other element type is an error (ErrType): there is no conversion.
func (f *File) ReadFloat64(name string) ([]float64, []int, error) {
	return read[float64](f, name, Float64)
}

// ReadFloat32 is ReadFloat64 for float32 datasets.
func (f *File) ReadFloat32(name string) ([]float32, []int, error) {
	return read[float32](f, name, Float32)
}

// ReadInt64 is ReadFloat64 for int64 datasets.
func (f *File) ReadInt64(name string) ([]int64, []int, error) { return read[int64](f, name, Int64) }

// ReadInt32 is ReadFloat64 for int32 datasets.
func (f *File) ReadInt32(name string) ([]int32, []int, error) { return read[int32](f, name, Int32) }

// ReadUint64 is ReadFloat64 for uint64 datasets.
func (f *File) ReadUint64(name string) ([]uint64, []int, error) { return read[uint64](f, name, Uint64) }

// ReadUint8 is ReadFloat64 for uint8 datasets.
func (f *File) ReadUint8(name string) ([]uint8, []int, error) { return read[uint8](f, name, Uint8) }

// DatasetInfo returns the element type and shape of the dataset name.
func (f *File) DatasetInfo(name string) (DType, []int, error) {
	const op = "stat"
	p, err := cleanPath(name)
	if err != nil {
		return 0, nil, &Error{op, f.Path(), name, err}
	}
	lock()
	defer unlock()
	info, err := f.datasetInfo(op, p)
	if err != nil {
		return 0, nil, err
	}
	shape, err := f.shapeOf(op, p, info)
	return info.dtype, shape, err
}

// datasetInfo opens dataset p and describes it. Call with the lock held.
func (f *File) datasetInfo(op, p string) (dsetInfo, error) {
	if err := f.check(op, p, false); err != nil {
		return dsetInfo{}, err
	}
	if err := f.requireKind(op, p, kindDataset); err != nil {
		return dsetInfo{}, err
	}
	id := cDatasetOpen(f.id, p)
	if id < 0 {
		return dsetInfo{}, &Error{op, f.path, p, libErr("")}
	}
	defer cClose(id)
	info, ok := cDatasetInfo(id)
	if !ok {
		return dsetInfo{}, &Error{op, f.path, p, libErr("")}
	}
	return info, nil
}

// shapeOf converts dims to a Go shape, checking that the element count fits
// an int.
func (f *File) shapeOf(op, p string, info dsetInfo) ([]int, error) {
	shape := make([]int, len(info.dims))
	n := uint64(1)
	for i, d := range info.dims {
		if d > math.MaxInt || (d > 0 && n > math.MaxInt/d) {
			return nil, &Error{op, f.path, p, wrap(ErrShape, fmt.Sprintf("shape %v is too large to read", info.dims))}
		}
		n *= d
		shape[i] = int(d)
	}
	return shape, nil
}

func read[T any](f *File, name string, want DType) ([]T, []int, error) {
	const op = "read"
	p, err := cleanPath(name)
	if err != nil {
		return nil, nil, &Error{op, f.Path(), name, err}
	}
	lock()
	defer unlock()
	info, err := f.datasetInfo(op, p)
	if err != nil {
		return nil, nil, err
	}
	if info.dtype != want {
		stored := "of a type this package does not read"
		if info.dtype.valid() {
			stored = info.dtype.String()
		}
		return nil, nil, &Error{op, f.path, p, wrap(ErrType, fmt.Sprintf("dataset is %s, not %v", stored, want))}
	}
	shape, err := f.shapeOf(op, p, info)
	if err != nil {
		return nil, nil, err
	}
	n := 1
	for _, d := range shape {
		n *= d
	}
	if uint64(n) > uint64(math.MaxInt)/uint64(want.size()) {
		return nil, nil, &Error{op, f.path, p, wrap(ErrShape, fmt.Sprintf("shape %v is too large to read", shape))}
	}
	out := make([]T, n)
	if n == 0 {
		return out, shape, nil
	}
	id := cDatasetOpen(f.id, p)
	if id < 0 {
		return nil, nil, &Error{op, f.path, p, libErr("")}
	}
	defer cClose(id)
	if !cDatasetRead(id, want, unsafe.Pointer(&out[0])) {
		return nil, nil, &Error{op, f.path, p, libErr("reading the data (is the file truncated or corrupt?)")}
	}
	return out, shape, nil
}
