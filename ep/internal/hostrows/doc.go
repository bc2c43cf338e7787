// Package hostrows is the work on rows in host memory that ep and its CPU
// engines share: the C kernels (copies, casts to FP8, the float32-accumulating
// reduction, the routing's layout kernel, bfloat16 conversion) with their Go
// wrappers, which make one cgo call per batch; the tables of addresses they
// read (AddrTable, ReduceTables); the wire formats of dispatched rows
// (RowFormat: native, cast to FP8, forwarded FP8) and the cast queue; and
// the typed regions an engine lays its memories out in (Region, RowArea,
// Arena).
//
// Each C kernel sits beside the Go file that wraps it: kernels.go (layout.c,
// convert.c, quant.c), rows.go (rows.c, sync.c), quant.go (quant.c).
package hostrows
