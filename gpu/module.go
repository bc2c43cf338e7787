package gpu

/*
#include <stdlib.h>
#include "shim.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"unsafe"

	"github.com/goep/goep/gpu/internal/kernels"
)

const cudaErrorUnsupportedPTXVersion = 222 // CUDA_ERROR_UNSUPPORTED_PTX_VERSION

// pickArch chooses the virtual architecture to compile for on a device of
// compute capability cc (90 = 9.0): the newest one NVRTC supports that the
// device can run; the driver JIT-compiles the PTX for the device itself.
// supported nil (an NVRTC that cannot list them) means cc itself.
func pickArch(cc int, supported []int) (int, error) {
	if supported == nil {
		return cc, nil
	}
	best := 0
	for _, a := range supported {
		if a <= cc && a > best {
			best = a
		}
	}
	if best == 0 {
		return 0, fmt.Errorf("gpu: NVRTC supports architectures %v, none of them runs on compute capability %d.%d",
			supported, cc/10, cc%10)
	}
	return best, nil
}

// cudaModule is the kernels loaded on a device.
type cudaModule struct {
	dev   *CUDADevice
	mod   unsafe.Pointer            // CUmodule
	fns   map[string]unsafe.Pointer // CUfunction by name
	pools bool                      // stream-ordered allocation available
}

func loadKernels(d *CUDADevice) (*Kernels, error) {
	major, minor, err := d.ComputeCapability()
	if err != nil {
		return nil, err
	}
	supported, err := NVRTCSupportedArchs()
	if err != nil {
		return nil, err
	}
	arch, err := pickArch(10*major+minor, supported)
	if err != nil {
		return nil, err
	}
	ptx, err := KernelPTX(arch)
	if err != nil {
		return nil, err
	}
	m := &cudaModule{dev: d, fns: map[string]unsafe.Pointer{}}
	image := C.CString(ptx)
	defer C.free(unsafe.Pointer(image))
	var jitLog [4096]C.char
	var mod unsafe.Pointer
	if r := C.goep_cu_module_load(d.ctx, &mod, image, &jitLog[0], C.size_t(len(jitLog))); r != 0 {
		err := cuErr("cuModuleLoadDataEx", r).(*CUDAError)
		err.Detail = C.GoString(&jitLog[0])
		if r == cudaErrorUnsupportedPTXVersion {
			vmaj, vmin, _ := NVRTCVersion()
			drv, _ := DriverVersion()
			err.Detail += fmt.Sprintf(" (PTX from NVRTC %d.%d, driver for CUDA %d.%d: set GOEP_NVRTC_LIB to an NVRTC no newer than the driver)",
				vmaj, vmin, drv/1000, drv%1000/10)
		}
		return nil, err
	}
	m.mod = mod
	for _, k := range kernels.List {
		name := C.CString(k.Name)
		var fn unsafe.Pointer
		r := C.goep_cu_module_get_function(d.ctx, &fn, mod, name)
		C.free(unsafe.Pointer(name))
		if err := cuErr("cuModuleGetFunction", r); err != nil {
			return nil, fmt.Errorf("%w (kernel %s)", err, k.Name)
		}
		m.fns[k.Name] = fn
	}
	pools, err := d.Attribute(AttrMemoryPoolsSupported)
	m.pools = err == nil && pools != 0
	if m.pools {
		// The default pool returns its memory to the system at every
		// synchronization unless told to keep some; the kernels' scratch
		// (a few hundred KiB a call) would then be mapped anew at each
		// call after one. Keeping poolKeep bytes (or what the program
		// set, if more) is a bounded change to the process's default pool.
		if err := cuErr("cuMemPoolSetAttribute", C.goep_cu_pool_keep(d.dev, poolKeep)); err != nil {
			return nil, err
		}
	}
	return newKernels(m, arch), nil
}

// cudaStream is the CUDA stream behind q: nil (the default stream) or a
// *CUDAStream; another kind of Queue (an emulated stream) is an error.
func cudaStream(q Queue) (*CUDAStream, error) {
	switch s := q.(type) {
	case nil:
		return nil, nil
	case *CUDAStream:
		return s, nil
	}
	return nil, fmt.Errorf("gpu: %T is not a CUDA stream: a CUDA device's kernels, copies and transfers run on its streams", q)
}

func (m *cudaModule) Launch(name string, grid, block uint32, args []uint64, q Queue) error {
	if err := checkArgs(name, args); err != nil {
		return err
	}
	s, err := cudaStream(q)
	if err != nil {
		return err
	}
	fn := m.fns[name]
	var a *C.uint64_t
	if len(args) > 0 {
		a = (*C.uint64_t)(unsafe.Pointer(&args[0]))
	}
	r := C.goep_cu_launch(m.dev.ctx, fn, C.uint(grid), C.uint(block), 0, s.handle(), a, C.int(len(args)))
	if err := cuErr("cuLaunchKernel", r); err != nil {
		return fmt.Errorf("%w (kernel %s, grid %d, block %d)", err, name, grid, block)
	}
	return nil
}

// poolKeep is how much memory the device's default pool keeps across
// synchronizations (its release threshold) once goep's kernels are loaded.
const poolKeep = 64 << 20

func (m *cudaModule) AllocAsync(n int, q Queue) (DevicePtr, error) {
	s, err := cudaStream(q)
	if err != nil {
		return 0, err
	}
	var ptr C.uint64_t
	if m.pools {
		if err := cuErr("cuMemAllocAsync", C.goep_cu_mem_alloc_async(m.dev.ctx, &ptr, C.size_t(n), s.handle())); err != nil {
			return 0, err
		}
		return DevicePtr(ptr), nil
	}
	if err := cuErr("cuMemAlloc", C.goep_cu_mem_alloc(m.dev.ctx, &ptr, C.size_t(n))); err != nil {
		return 0, err
	}
	return DevicePtr(ptr), nil
}

func (m *cudaModule) FreeAsync(ptr DevicePtr, q Queue) error {
	s, err := cudaStream(q)
	if err != nil {
		return err
	}
	if m.pools {
		return cuErr("cuMemFreeAsync", C.goep_cu_mem_free_async(m.dev.ctx, C.uint64_t(ptr), s.handle()))
	}
	// No memory pools: wait for the stream's work, then free.
	if s != nil {
		err = s.Synchronize()
	} else {
		err = m.dev.Synchronize()
	}
	return errors.Join(err, cuErr("cuMemFree", C.goep_cu_mem_free(m.dev.ctx, C.uint64_t(ptr))))
}

func (m *cudaModule) MemsetAsync(ptr DevicePtr, v byte, n int, q Queue) error {
	s, err := cudaStream(q)
	if err != nil {
		return err
	}
	return cuErr("cuMemsetD8Async", C.goep_cu_memset_d8_async(m.dev.ctx, C.uint64_t(ptr), C.uchar(v), C.size_t(n), s.handle()))
}
