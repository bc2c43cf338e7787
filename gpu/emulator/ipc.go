package emulator

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/goep/goep/gpu"
)

// The emulated device's IPC, as CUDA IPC maps one process's device memory
// into another of the same host: every allocation is a shared mapping of a
// memory file of its own (memfd), so that IPCExport can name it (the
// process and the file) and another process IPCOpen map the same memory
// (through /proc/<pid>/fd/<fd>). Writes through either mapping are seen
// through the other, as writes through a CUDA IPC mapping are.

var _ gpu.IPCDevice = (*Device)(nil)

// ipcMagic opens every handle IPCExport makes.
var ipcMagic = [8]byte{'g', 'o', 'e', 'p', 'i', 'p', 'c', 1}

// sharedMemory maps n bytes of a new memory file.
func sharedMemory(n int) ([]byte, int, error) {
	fd, err := unix.MemfdCreate("goep-emulated-device", unix.MFD_CLOEXEC)
	if err != nil {
		return nil, -1, err
	}
	if err := unix.Ftruncate(fd, int64(n)); err != nil {
		unix.Close(fd)
		return nil, -1, err
	}
	mem, err := unix.Mmap(fd, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		unix.Close(fd)
		return nil, -1, err
	}
	return mem, fd, nil
}

// release unmaps a span and closes its memory file.
func (a span) release() error {
	err := unix.Munmap(a.mem)
	if a.fd >= 0 {
		err = errors.Join(err, unix.Close(a.fd))
	}
	return err
}

// IPCExport returns the handle of the allocation holding p and p's offset
// in it: this process, the allocation's memory file and its size.
func (d *Device) IPCExport(p gpu.DevicePtr) (gpu.IPCHandle, int, error) {
	var h gpu.IPCHandle
	d.mu.Lock()
	defer d.mu.Unlock()
	i := d.find(p)
	if i < 0 || d.allocs[i].imported {
		return h, 0, fmt.Errorf("emulator: IPCExport(%#x): not inside an allocation of %v", uint64(p), d)
	}
	a := d.allocs[i]
	copy(h[:8], ipcMagic[:])
	binary.LittleEndian.PutUint32(h[8:], uint32(os.Getpid()))
	binary.LittleEndian.PutUint32(h[12:], uint32(a.fd))
	binary.LittleEndian.PutUint64(h[16:], uint64(len(a.mem)))
	return h, int(p - a.p), nil
}

// IPCOpen maps the allocation of another process of this host that h
// names. As with CUDA, a process cannot open its own handles.
func (d *Device) IPCOpen(h gpu.IPCHandle) (gpu.DevicePtr, error) {
	if [8]byte(h[:8]) != ipcMagic {
		return 0, fmt.Errorf("emulator: IPCOpen: not a handle of an emulated device (first bytes % x)", h[:8])
	}
	pid, fd, n := binary.LittleEndian.Uint32(h[8:]), binary.LittleEndian.Uint32(h[12:]), int(binary.LittleEndian.Uint64(h[16:]))
	if int(pid) == os.Getpid() {
		return 0, fmt.Errorf("emulator: IPCOpen: a handle of this process itself (CUDA_ERROR_INVALID_CONTEXT, as cuIpcOpenMemHandle)")
	}
	f, err := unix.Open(fmt.Sprintf("/proc/%d/fd/%d", pid, fd), unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return 0, fmt.Errorf("emulator: IPCOpen: the allocation of process %d: %w", pid, err)
	}
	defer unix.Close(f)
	mem, err := unix.Mmap(f, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return 0, fmt.Errorf("emulator: IPCOpen: mapping %d bytes of process %d: %w", n, pid, err)
	}
	p := gpu.DevicePtr(uintptr(unsafe.Pointer(&mem[0])))
	d.insert(span{p: p, n: n, mem: mem, fd: -1, imported: true})
	return p, nil
}

// IPCClose unmaps what IPCOpen mapped at p.
func (d *Device) IPCClose(p gpu.DevicePtr) error {
	d.mu.Lock()
	i := d.find(p)
	if i < 0 || !d.allocs[i].imported || d.allocs[i].p != p {
		d.mu.Unlock()
		return fmt.Errorf("emulator: IPCClose(%#x): not a mapping IPCOpen made on %v", uint64(p), d)
	}
	a := d.allocs[i]
	d.allocs = append(d.allocs[:i], d.allocs[i+1:]...)
	d.mu.Unlock()
	return a.release()
}

// find is the index of the live span holding p, or -1; d.mu held.
func (d *Device) find(p gpu.DevicePtr) int {
	for i, a := range d.allocs {
		if p >= a.p && uint64(p) < uint64(a.p)+uint64(max(a.n, 1)) {
			return i
		}
	}
	return -1
}
