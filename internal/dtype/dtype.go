package dtype

/*
#include "dtype.h"
*/
import "C"

import (
	_ "embed"
	"fmt"
	"unsafe"
)

// Header is the text of dtype.h, for kernel sources compiled without an
// include path.
//
//go:embed dtype.h
var Header string

// Code is an element type of the row kernels.
type Code int

// The element types.
const (
	F32  Code = C.GOEP_ELEM_F32  // float32
	BF16 Code = C.GOEP_ELEM_BF16 // bfloat16: the top 16 bits of a float32
)

// String names the type as users write it.
func (c Code) String() string {
	switch c {
	case F32:
		return "float32"
	case BF16:
		return "bfloat16"
	}
	return fmt.Sprintf("dtype.Code(%d)", int(c))
}

// Size is the size of one element in bytes.
func (c Code) Size() int {
	if c == BF16 {
		return 2
	}
	return 4
}

// Valid reports whether c is a known element type.
func (c Code) Valid() bool { return c == F32 || c == BF16 }

// Number is the fixed-size numeric types that move between memories as raw
// bytes.
type Number interface {
	~int8 | ~uint8 | ~int16 | ~uint16 | ~int32 | ~uint32 | ~int64 | ~uint64 | ~float32 | ~float64
}

// Bytes views s as its bytes, without copying (nil for an empty s).
func Bytes[T Number](s []T) []byte {
	if len(s) == 0 {
		return nil
	}
	var z T
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(s))), len(s)*int(unsafe.Sizeof(z)))
}

// SizeOf is the size of one T in bytes.
func SizeOf[T Number]() int {
	var z T
	return int(unsafe.Sizeof(z))
}
