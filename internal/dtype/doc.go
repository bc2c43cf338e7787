// Package dtype is the one definition of the element types that goep's
// kernels move and reduce, shared by package ep's C kernels, package gpu's
// CUDA kernels and the Go code that calls them.
//
// The codes are defined in dtype.h. C code includes it (cgo: -I to this
// directory); the CUDA sources get its text through Header, since NVRTC
// compiles them with no include path; Go gets the constants below, read
// from the header by cgo. Number and Bytes are the numeric types that move
// as raw bytes, and their byte view.
package dtype
