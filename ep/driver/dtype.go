package driver

import "github.com/goep/goep/internal/dtype"

// DType names an element type to a Backend: Float32 or BFloat16.
type DType = dtype.Code

// The element types of Element, as DType.
const (
	Float32  DType = dtype.F32
	BFloat16 DType = dtype.BF16
)
