package h5

import (
	"fmt"
	"unsafe"
)

// DType is the element type of a dataset. Its zero value is not a type: a
// caller must choose one.
type DType int

// The element types. Files store them little-endian (IEEE floats, two's
// complement integers) whatever the host.
const (
	Float64 DType = 1 // Go float64, HDF5 H5T_IEEE_F64LE
	Float32 DType = 2 // Go float32, HDF5 H5T_IEEE_F32LE
	Int64   DType = 3 // Go int64, HDF5 H5T_STD_I64LE
	Int32   DType = 4 // Go int32, HDF5 H5T_STD_I32LE
	Uint64  DType = 5 // Go uint64, HDF5 H5T_STD_U64LE
	Uint8   DType = 6 // Go uint8 (byte), HDF5 H5T_STD_U8LE
)

// String returns the Go name of the element type ("float64", ...).
func (d DType) String() string {
	switch d {
	case Float64:
		return "float64"
	case Float32:
		return "float32"
	case Int64:
		return "int64"
	case Int32:
		return "int32"
	case Uint64:
		return "uint64"
	case Uint8:
		return "uint8"
	case 0:
		return "unset"
	}
	return fmt.Sprintf("DType(%d)", int(d))
}

func (d DType) valid() bool { return d >= Float64 && d <= Uint8 }

// size is the element size in bytes.
func (d DType) size() int {
	switch d {
	case Float64, Int64, Uint64:
		return 8
	case Float32, Int32:
		return 4
	case Uint8:
		return 1
	}
	return 0
}

// sliceOf returns the element type of a supported slice, its length and a
// pointer to its first element (nil when empty). ok is false for any other
// value.
func sliceOf(data any) (d DType, n int, p unsafe.Pointer, ok bool) {
	switch s := data.(type) {
	case []float64:
		return Float64, len(s), first(s), true
	case []float32:
		return Float32, len(s), first(s), true
	case []int64:
		return Int64, len(s), first(s), true
	case []int32:
		return Int32, len(s), first(s), true
	case []uint64:
		return Uint64, len(s), first(s), true
	case []uint8:
		return Uint8, len(s), first(s), true
	}
	return 0, 0, nil, false
}

func first[T any](s []T) unsafe.Pointer {
	if len(s) == 0 {
		return nil
	}
	return unsafe.Pointer(&s[0])
}

// typeName names a Go value's type for error messages.
func typeName(v any) string {
	if v == nil {
		return "nil"
	}
	return fmt.Sprintf("%T", v)
}
