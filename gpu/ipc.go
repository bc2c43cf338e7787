package gpu

/*
#include "shim.h"
*/
import "C"

import (
	"fmt"
	"unsafe"
)

// IPCHandle names a device allocation to the other processes of its host
// (a CUipcMemHandle's 64 bytes): they map it with IPCDevice.IPCOpen.
type IPCHandle [64]byte

// An IPCDevice is a Device whose memory other processes of the same host can
// map and write straight into (CUDA IPC, on the same GPU or a peer GPU of
// the host): the intra-node transport of NodeComm.
type IPCDevice interface {
	Device
	// IPCExport returns the handle of the allocation that holds p and p's
	// offset in it (cuMemGetAddressRange, cuIpcGetMemHandle).
	IPCExport(p DevicePtr) (h IPCHandle, off int, err error)
	// IPCOpen maps an allocation another process exported, and returns its
	// address in this process (cuIpcOpenMemHandle). A process cannot open
	// its own handles.
	IPCOpen(h IPCHandle) (DevicePtr, error)
	// IPCClose unmaps what IPCOpen mapped (cuIpcCloseMemHandle).
	IPCClose(p DevicePtr) error
}

var _ IPCDevice = (*CUDADevice)(nil)

// IPCExport returns the handle of the allocation holding p and p's offset
// in it.
func (d *CUDADevice) IPCExport(p DevicePtr) (IPCHandle, int, error) {
	var h IPCHandle
	if p == 0 {
		return h, 0, fmt.Errorf("gpu: IPCExport: address 0")
	}
	var buf [64]C.uchar
	var base C.uint64_t
	var size C.size_t
	if err := cuErr("cuIpcGetMemHandle", C.goep_cu_ipc_export(d.ctx, C.uint64_t(p), &buf[0], &base, &size)); err != nil {
		return h, 0, fmt.Errorf("%w (exporting %#x on %v)", err, uint64(p), d)
	}
	for i := range h {
		h[i] = byte(buf[i])
	}
	return h, int(uint64(p) - uint64(base)), nil
}

// IPCOpen maps an allocation another process of this host exported.
func (d *CUDADevice) IPCOpen(h IPCHandle) (DevicePtr, error) {
	var p C.uint64_t
	if err := cuErr("cuIpcOpenMemHandle", C.goep_cu_ipc_open(d.ctx, &p, (*C.uchar)(unsafe.Pointer(&h[0])))); err != nil {
		return 0, fmt.Errorf("%w (on %v)", err, d)
	}
	return DevicePtr(p), nil
}

// IPCClose unmaps an allocation IPCOpen mapped.
func (d *CUDADevice) IPCClose(p DevicePtr) error {
	return cuErr("cuIpcCloseMemHandle", C.goep_cu_ipc_close(d.ctx, C.uint64_t(p)))
}
