package emulator

import (
	"errors"
	"fmt"
	"sort"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"github.com/goep/goep/gpu"
	"github.com/goep/goep/gpu/internal/kernels"
)

// ErrIllegalAddress is matched (errors.Is) by the error of a copy or
// transfer outside the device's live allocations, and by every later call
// on the device (the error is sticky, as CUDA's is).
var ErrIllegalAddress = errors.New("emulator: CUDA_ERROR_ILLEGAL_ADDRESS: an illegal memory access was encountered")

// Device is one emulated device of this process, a gpu.Device. Open returns
// the same Device for the same ordinal; it is never closed.
type Device struct {
	ordinal int
	jitter  atomic.Int64 // most delay before each queued operation, in ns
	seeds   atomic.Uint64

	mu      sync.Mutex
	allocs  []span // live allocations, by address
	held    []span // freed while an abandoned transfer may still read them: never released
	streams map[*Stream]bool
	sticky  error
	legacy  *Stream // the legacy default stream: the synchronous copies run on it

	kernelsOnce sync.Once
	kernels     *gpu.Kernels
}

// The emulated device implements package gpu's device interface.
var (
	_ gpu.Device     = (*Device)(nil)
	_ gpu.Stream     = (*Stream)(nil)
	_ gpu.Event      = (*Event)(nil)
	_ gpu.HostBuffer = (*HostBuffer)(nil)
	_ gpu.Comm       = (*Comm)(nil)
)

// span is a range of device addresses: an allocation (its memory a shared
// mapping of fd, so that other processes can map it: IPC), or another
// process's allocation mapped here (imported).
type span struct {
	p        gpu.DevicePtr
	n        int
	mem      []byte // the mapping
	fd       int    // the allocation's memory file; -1 for an imported mapping
	imported bool
}

func (s span) contains(p gpu.DevicePtr, n int) bool {
	return p >= s.p && uint64(p)+uint64(n) <= uint64(s.p)+uint64(s.n)
}

var (
	devMu   sync.Mutex
	devices = map[int]*Device{}
)

// Open returns emulated device number ordinal of this process.
func Open(ordinal int) *Device {
	devMu.Lock()
	defer devMu.Unlock()
	d := devices[ordinal]
	if d == nil {
		d = &Device{ordinal: ordinal, streams: map[*Stream]bool{}}
		d.legacy = d.newStream()
		devices[ordinal] = d
	}
	return d
}

func (d *Device) String() string { return fmt.Sprintf("emulated:%d", d.ordinal) }

// SetJitter makes every queued operation of the device's streams wait a
// random time in [0, max) before it runs (0: none), so that work ordered by
// neither a stream nor an event races visibly.
func (d *Device) SetJitter(max time.Duration) { d.jitter.Store(int64(max)) }

// err is the sticky error, if any.
func (d *Device) err() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.sticky
}

// fail makes err the device's sticky error (the first one stays).
func (d *Device) fail(err error) {
	d.mu.Lock()
	if d.sticky == nil {
		d.sticky = err
	}
	d.mu.Unlock()
}

// ResetForTest clears a sticky error: a device cannot recover from one,
// but the tests of this package provoke them on purpose.
func (d *Device) ResetForTest() {
	d.mu.Lock()
	d.sticky = nil
	d.mu.Unlock()
}

const garbage = 0xa5 // the bytes of new allocations

// MemAlloc returns n bytes of device memory, uninitialised (0xa5 bytes), as
// cuMemAlloc does.
func (d *Device) MemAlloc(n int) (gpu.DevicePtr, error) {
	if n < 0 {
		return 0, fmt.Errorf("emulator: MemAlloc: negative size %d", n)
	}
	if err := d.err(); err != nil {
		return 0, err
	}
	mem, fd, err := sharedMemory(max(n, 1))
	if err != nil {
		return 0, fmt.Errorf("emulator: MemAlloc: out of memory (%d bytes on %v): %w", n, d, err)
	}
	p := gpu.DevicePtr(uintptr(unsafe.Pointer(&mem[0])))
	kernels.Memset(uint64(p), garbage, max(n, 1))
	d.insert(span{p: p, n: n, mem: mem, fd: fd})
	return p, nil
}

// MemFree releases memory that MemAlloc returned. Like cuMemFree it first
// waits for the work queued on every stream of the device: behind a
// transfer whose peer never comes, it waits for ever.
func (d *Device) MemFree(p gpu.DevicePtr) error {
	_ = d.Synchronize() // a sticky error stays the device's; the memory is released all the same
	return d.free(p)
}

// free releases an allocation now (cuMemFreeAsync's part, once its stream
// gets to it).
func (d *Device) free(p gpu.DevicePtr) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	i := sort.Search(len(d.allocs), func(i int) bool { return d.allocs[i].p >= p })
	if i == len(d.allocs) || d.allocs[i].p != p {
		return fmt.Errorf("emulator: MemFree(%#x): not an allocation of %v", uint64(p), d)
	}
	a := d.allocs[i]
	if a.imported {
		return fmt.Errorf("emulator: MemFree(%#x): another process's allocation, mapped by IPCOpen: IPCClose unmaps it", uint64(p))
	}
	d.allocs = append(d.allocs[:i], d.allocs[i+1:]...)
	for _, h := range d.held {
		if a.contains(h.p, h.n) {
			return nil // MPI may still read it: never released
		}
	}
	return a.release()
}

// insert adds a live span.
func (d *Device) insert(a span) {
	d.mu.Lock()
	defer d.mu.Unlock()
	i := sort.Search(len(d.allocs), func(i int) bool { return d.allocs[i].p > a.p })
	d.allocs = append(d.allocs, span{})
	copy(d.allocs[i+1:], d.allocs[i:])
	d.allocs[i] = a
}

// hold keeps the allocations that hold [p, p+n) from being released: an
// abandoned send may still read them.
func (d *Device) hold(p gpu.DevicePtr, n int) {
	d.mu.Lock()
	d.held = append(d.held, span{p: p, n: n})
	d.mu.Unlock()
}

// inside reports whether [p, p+n) lies in one live allocation; d.mu held.
func (d *Device) inside(p gpu.DevicePtr, n int) bool {
	i := sort.Search(len(d.allocs), func(i int) bool { return d.allocs[i].p > p }) - 1
	return n >= 0 && i >= 0 && d.allocs[i].contains(p, n)
}

// Inside reports whether [p, p+n) lies in one live allocation.
func (d *Device) Inside(p gpu.DevicePtr, n int) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return n == 0 || d.inside(p, n)
}

// check returns ErrIllegalAddress, making it sticky, unless [p, p+n) lies in
// one live allocation.
func (d *Device) check(op string, p gpu.DevicePtr, n int) error {
	if n == 0 {
		return nil
	}
	d.mu.Lock()
	ok := d.inside(p, n)
	if !ok && d.sticky == nil {
		d.sticky = fmt.Errorf("%w (%s of %d bytes at %#x on %v)", ErrIllegalAddress, op, n, uint64(p), d)
	}
	err := d.sticky
	d.mu.Unlock()
	if ok {
		return nil
	}
	return err
}

// Live reports the bytes of device memory allocated and not freed.
func (d *Device) Live() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	n := 0
	for _, a := range d.allocs {
		if !a.imported {
			n += a.n
		}
	}
	return n
}

// MemcpyHtoD copies src to device address dst as cuMemcpyHtoD does from
// pageable memory: src is read now (and may be reused), the bytes land when
// the legacy default stream gets to them, which no stream of NewStream
// waits for.
func (d *Device) MemcpyHtoD(dst gpu.DevicePtr, src []byte) error {
	if err := d.check("MemcpyHtoD", dst, len(src)); err != nil || len(src) == 0 {
		return err
	}
	staged := append([]byte(nil), src...)
	return d.legacy.enqueue(func() error {
		if err := d.check("MemcpyHtoD", dst, len(staged)); err != nil {
			return err
		}
		kernels.Write(uint64(dst), staged)
		return nil
	})
}

// MemcpyDtoH copies len(dst) bytes from device address src once the
// legacy default stream's earlier work has run, and returns when they are
// in dst (it does not wait for the streams of NewStream).
func (d *Device) MemcpyDtoH(dst []byte, src gpu.DevicePtr) error {
	if err := d.check("MemcpyDtoH", src, len(dst)); err != nil || len(dst) == 0 {
		return err
	}
	err := d.legacy.enqueue(func() error {
		if err := d.check("MemcpyDtoH", src, len(dst)); err != nil {
			return err
		}
		kernels.Read(dst, uint64(src))
		return nil
	})
	if err != nil {
		return err
	}
	return d.legacy.Synchronize()
}

// MemcpyDtoD queues a copy of n bytes from src to dst on the legacy
// default stream, as cuMemcpyDtoD does: it returns before the copy runs.
func (d *Device) MemcpyDtoD(dst, src gpu.DevicePtr, n int) error {
	if err := d.checkCopy("MemcpyDtoD", dst, src, n); err != nil || n == 0 {
		return err
	}
	return d.legacy.enqueue(func() error { return d.copyNow(dst, src, n) })
}

// MemsetD8 queues setting n bytes at dst to v on the legacy default
// stream, as cuMemsetD8 does: it returns before the bytes are set.
func (d *Device) MemsetD8(dst gpu.DevicePtr, v byte, n int) error {
	if err := d.check("MemsetD8", dst, n); err != nil || n == 0 {
		return err
	}
	return d.legacy.enqueue(func() error { return d.memsetNow(dst, v, n) })
}

func (d *Device) checkCopy(op string, dst, src gpu.DevicePtr, n int) error {
	if n < 0 {
		return fmt.Errorf("emulator: %s: negative size %d", op, n)
	}
	if err := d.check(op, src, n); err != nil {
		return err
	}
	return d.check(op, dst, n)
}

// copyNow copies n bytes on the device, now: the part of a queued copy
// that runs when its stream gets to it.
func (d *Device) copyNow(dst, src gpu.DevicePtr, n int) error {
	if err := d.checkCopy("MemcpyDtoD", dst, src, n); err != nil {
		return err
	}
	kernels.Copy(uint64(dst), uint64(src), n)
	return nil
}

// memsetNow sets n bytes at dst to v, now.
func (d *Device) memsetNow(dst gpu.DevicePtr, v byte, n int) error {
	if err := d.check("MemsetD8", dst, n); err != nil {
		return err
	}
	kernels.Memset(uint64(dst), v, n)
	return nil
}

// Synchronize waits until the work queued on every stream of the device so
// far has run, and returns the sticky error if there is one.
func (d *Device) Synchronize() error {
	d.mu.Lock()
	streams := make([]*Stream, 0, len(d.streams))
	for s := range d.streams {
		streams = append(streams, s)
	}
	d.mu.Unlock()
	for _, s := range streams {
		s.wait(s.mark())
	}
	return d.err()
}

// HostBuffer is host memory for asynchronous copies, as pinned memory is on
// a device: outside the Go heap, viewed by Bytes. It is the gpu.HostBuffer
// of an emulated device.
type HostBuffer struct{ mem []byte }

// AllocHost returns n bytes of host memory for asynchronous copies (a
// *HostBuffer).
func (d *Device) AllocHost(n int) (gpu.HostBuffer, error) {
	if n < 0 {
		return nil, fmt.Errorf("emulator: AllocHost: negative size %d", n)
	}
	if n == 0 {
		return &HostBuffer{mem: []byte{}}, nil
	}
	mem, err := syscall.Mmap(-1, 0, n, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
	if err != nil {
		return nil, fmt.Errorf("emulator: AllocHost(%d): %w", n, err)
	}
	return &HostBuffer{mem: mem}, nil
}

// Bytes views the memory (nil after Free).
func (h *HostBuffer) Bytes() []byte { return h.mem }

// Free releases the memory; no queued copy may still use it.
func (h *HostBuffer) Free() error {
	if len(h.mem) == 0 {
		h.mem = nil
		return nil
	}
	err := syscall.Munmap(h.mem)
	h.mem = nil
	return err
}

// hostRange is n bytes of h, host memory of an emulated device, from off.
func hostRange(op string, h gpu.HostBuffer, off, n int) ([]byte, error) {
	eh, ok := h.(*HostBuffer)
	if !ok || eh == nil {
		return nil, fmt.Errorf("emulator: %s: %T is not host memory of an emulated device", op, h)
	}
	return eh.hostRange(op, off, n)
}

func (h *HostBuffer) hostRange(op string, off, n int) ([]byte, error) {
	if off < 0 || n < 0 || off+n > len(h.mem) {
		return nil, fmt.Errorf("emulator: %s: bytes [%d, %d) out of range of %d host bytes", op, off, off+n, len(h.mem))
	}
	return h.mem[off : off+n], nil
}

// Kernels returns package gpu's kernels, run on this device's streams by
// the CPU emulator. It does not fail: the error is the gpu.Device
// interface's, for a device that compiles them.
func (d *Device) Kernels() (*gpu.Kernels, error) {
	d.kernelsOnce.Do(func() { d.kernels = gpu.NewKernels(launcher{d}) })
	return d.kernels, nil
}

// launcher is gpu.Launcher on the emulated device.
type launcher struct{ d *Device }

func (l launcher) stream(q gpu.Queue) (*Stream, error) {
	s, ok := q.(*Stream)
	if !ok || s == nil {
		return nil, fmt.Errorf("emulator: %T is not a stream of %v (the emulator has no default stream)", q, l.d)
	}
	if s.d != l.d {
		return nil, fmt.Errorf("emulator: a stream of %v used on %v", s.d, l.d)
	}
	return s, nil
}

func (l launcher) Launch(name string, grid, block uint32, args []uint64, q gpu.Queue) error {
	params, err := gpu.KernelParams(name)
	if err != nil {
		return err
	}
	if len(args) != len(params) {
		return fmt.Errorf("emulator: kernel %s takes %d arguments, got %d", name, len(params), len(args))
	}
	if grid == 0 || block == 0 || block > 1024 || block%32 != 0 {
		return fmt.Errorf("emulator: %s launched on %d blocks of %d threads: need at least one block of a warp multiple up to 1024", name, grid, block)
	}
	s, err := l.stream(q)
	if err != nil {
		return err
	}
	a := append([]uint64(nil), args...) // the caller's slice is its own once Launch returns
	seed := l.d.seeds.Add(1)
	return s.enqueue(func() error {
		if err := kernels.Emulate(name, grid, block, a, seed); err != nil {
			return fmt.Errorf("emulator: %w", err)
		}
		return nil
	})
}

func (l launcher) AllocAsync(n int, q gpu.Queue) (gpu.DevicePtr, error) {
	if _, err := l.stream(q); err != nil {
		return 0, err
	}
	return l.d.MemAlloc(n)
}

func (l launcher) FreeAsync(p gpu.DevicePtr, q gpu.Queue) error {
	s, err := l.stream(q)
	if err != nil {
		return err
	}
	return s.enqueue(func() error { return l.d.free(p) })
}

func (l launcher) MemsetAsync(p gpu.DevicePtr, v byte, n int, q gpu.Queue) error {
	s, err := l.stream(q)
	if err != nil {
		return err
	}
	return s.MemsetD8Async(p, v, n)
}
