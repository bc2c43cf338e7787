//go:build !amd64 || purego

package rowsum

import "unsafe"

// Assembly is whether BF16 and F32 run in assembly on this machine.
const Assembly = false

func sumBF16(dst []uint16, src []unsafe.Pointer, w []float32) { sumBF16Go(dst, src, w, 0) }

func sumF32(dst []float32, src []unsafe.Pointer, w []float32) { sumF32Go(dst, src, w, 0) }
