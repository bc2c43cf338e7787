package kernels

/*
#cgo CFLAGS: -O2 -std=gnu11 -Wall -Wno-unused-function -I${SRCDIR}/../../../internal/dtype
#include <stdlib.h>
#include <string.h>
#include "emulate.h"

static uint64_t emu_malloc(size_t n) { return (uint64_t)(uintptr_t)calloc(n ? n : 1, 1); }
static void emu_free(uint64_t p) { free((void *)(uintptr_t)p); }
static void emu_write(uint64_t p, const void *src, size_t n) { memcpy((void *)(uintptr_t)p, src, n); }
static void emu_read(void *dst, uint64_t p, size_t n) { memcpy(dst, (const void *)(uintptr_t)p, n); }
static void emu_memset(uint64_t p, int v, size_t n) { memset((void *)(uintptr_t)p, v, n); }
static void emu_copy(uint64_t dst, uint64_t src, size_t n) { memmove((void *)(uintptr_t)dst, (const void *)(uintptr_t)src, n); }
*/
import "C"

import (
	"fmt"
	"sync"
	"unsafe"
)

// The emulator's thread indices are C globals: one launch at a time.
var emuMu sync.Mutex

// Emulate runs one launch of the named kernel on the CPU: grid blocks of
// block threads, one (block, thread) at a time in an order shuffled by seed.
// args are the kernel's parameters as cuLaunchKernel would get them: one
// 8-byte slot each, pointers being addresses from Malloc.
func Emulate(name string, grid, block uint32, args []uint64, seed uint64) error {
	k := Index(name)
	if k < 0 {
		return fmt.Errorf("kernels: no kernel %q", name)
	}
	if len(args) != len(List[k].Params) {
		return fmt.Errorf("kernels: %s takes %d arguments, got %d", name, len(List[k].Params), len(args))
	}
	if grid == 0 || block == 0 {
		return fmt.Errorf("kernels: %s: empty launch (grid %d, block %d)", name, grid, block)
	}
	emuMu.Lock()
	defer emuMu.Unlock()
	var a *C.uint64_t
	if len(args) > 0 {
		a = (*C.uint64_t)(unsafe.Pointer(&args[0]))
	}
	if rc := C.goep_emulate(C.int(k), C.uint(grid), C.uint(block), a, C.uint64_t(seed)); rc != 0 {
		return fmt.Errorf("kernels: emulating %s (grid %d, block %d) failed: code %d", name, grid, block, int(rc))
	}
	return nil
}

// Malloc returns the address of n zeroed bytes of C memory, the emulator's
// "device memory"; Free releases it.
func Malloc(n int) uint64 { return uint64(C.emu_malloc(C.size_t(n))) }

// Free releases memory from Malloc.
func Free(p uint64) { C.emu_free(C.uint64_t(p)) }

// Write copies src to address p.
func Write(p uint64, src []byte) {
	if len(src) > 0 {
		C.emu_write(C.uint64_t(p), unsafe.Pointer(&src[0]), C.size_t(len(src)))
	}
}

// Read copies len(dst) bytes from address p.
func Read(dst []byte, p uint64) {
	if len(dst) > 0 {
		C.emu_read(unsafe.Pointer(&dst[0]), C.uint64_t(p), C.size_t(len(dst)))
	}
}

// Memset sets n bytes at address p to v.
func Memset(p uint64, v byte, n int) { C.emu_memset(C.uint64_t(p), C.int(v), C.size_t(n)) }

// Copy copies n bytes from address src to address dst (the ranges may
// overlap).
func Copy(dst, src uint64, n int) {
	if n > 0 {
		C.emu_copy(C.uint64_t(dst), C.uint64_t(src), C.size_t(n))
	}
}
