// Package rowsum sums a few rows with float32 weights into one row, in
// bfloat16 (BF16) or float32 (F32): the combine's reduction at decode
// sizes, where a cgo call to ep's C kernel (ep_reduce_rows) costs more
// than the arithmetic. On amd64 with AVX2 it runs in Go assembly;
// elsewhere, or built with the purego tag, in Go.
//
// The result is ep_reduce_rows's, bit for bit: the products and the sums
// are rounded to float32 one at a time, in the order of the sources
// (((w0*x0) + w1*x1) + w2*x2 ...), never fused, and a bfloat16 sum is
// rounded to bfloat16 once, to nearest even. One source of weight 1 is copied as it
// is, and no source gives zeros. Only the payload of a NaN may differ
// where two sources of one element are both NaN.
//
// The source rows are given by address, as the C kernel takes them: rows
// of another process's shared-memory segment are not Go memory.
package rowsum
