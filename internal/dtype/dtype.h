// dtype.h: the element types of goep's row kernels, the one definition that
// package ep's C kernels, package gpu's CUDA kernels (through NVRTC and the
// CPU emulator) and the Go code (package internal/dtype) all read.
#ifndef GOEP_DTYPE_H
#define GOEP_DTYPE_H
enum goep_elem { GOEP_ELEM_F32 = 0, GOEP_ELEM_BF16 = 1 };
#endif
