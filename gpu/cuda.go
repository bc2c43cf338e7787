package gpu

/*
#include <stdlib.h>
#include "shim.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"github.com/goep/goep/internal/dtype"
	"sync"
	"time"
	"unsafe"
)

// ErrNoDevice is matched (errors.Is) by the error of a call that needs a
// CUDA device on a machine whose driver sees none.
var ErrNoDevice = errors.New("gpu: no CUDA device")

const cudaErrorNoDevice = 100 // CUDA_ERROR_NO_DEVICE

// CUDAError is a failed CUDA driver call, with the driver's own name and
// description of the status code.
type CUDAError struct {
	Call    string // e.g. "cuMemAlloc"
	Code    int    // the CUresult
	Name    string // e.g. "CUDA_ERROR_OUT_OF_MEMORY"
	Message string // e.g. "out of memory"
	Detail  string // more context (a JIT log, a hint), may be empty
}

func (e *CUDAError) Error() string {
	s := fmt.Sprintf("gpu: %s: %s (%d): %s", e.Call, e.Name, e.Code, e.Message)
	if e.Detail != "" {
		s += ": " + e.Detail
	}
	return s
}

// Is makes errors.Is(err, ErrNoDevice) true for CUDA_ERROR_NO_DEVICE.
func (e *CUDAError) Is(target error) bool {
	return target == ErrNoDevice && e.Code == cudaErrorNoDevice
}

func cuErr(call string, r C.int) error {
	if r == 0 {
		return nil
	}
	e := &CUDAError{Call: call, Code: int(r), Name: "CUDA_ERROR_UNKNOWN_CODE", Message: "unknown status code"}
	if s := C.goep_cu_error_name(r); s != nil {
		e.Name = C.GoString(s)
	}
	if s := C.goep_cu_error_string(r); s != nil {
		e.Message = C.GoString(s)
	}
	if r == C.GOEP_CUDA_ERROR_NOT_SUPPORTED && e.Name == "CUDA_ERROR_UNKNOWN_CODE" {
		e.Name, e.Message = "CUDA_ERROR_NOT_SUPPORTED", "operation not supported"
	}
	return e
}

var (
	initOnce sync.Once
	initErr  error
)

// driver loads the CUDA driver and initialises it, once.
func driver() error {
	if err := cudaLib.load(); err != nil {
		return err
	}
	initOnce.Do(func() { initErr = cuErr("cuInit", C.goep_cu_init()) })
	return initErr
}

// DriverVersion returns the CUDA version the driver supports, as
// 1000*major + 10*minor (13000 = CUDA 13.0).
func DriverVersion() (int, error) {
	if err := cudaLib.load(); err != nil {
		return 0, err
	}
	var v C.int
	if err := cuErr("cuDriverGetVersion", C.goep_cu_driver_version(&v)); err != nil {
		return 0, err
	}
	return int(v), nil
}

// DeviceCount returns the number of CUDA devices: 0 (and no error) when the
// driver is installed but sees no device, an error when the driver itself is
// missing (*LibraryError) or fails.
func DeviceCount() (int, error) {
	if err := driver(); err != nil {
		if errors.Is(err, ErrNoDevice) {
			return 0, nil
		}
		return 0, err
	}
	var n C.int
	if err := cuErr("cuDeviceGetCount", C.goep_cu_device_count(&n)); err != nil {
		return 0, err
	}
	return int(n), nil
}

// CUDADevice is one CUDA device and its primary context (the one the CUDA
// runtime, NCCL and PyTorch use): the Device of this package. A CUDADevice
// is shared by the whole process and never closed: OpenDevice returns the
// same value for the same ordinal.
type CUDADevice struct {
	ordinal int
	dev     C.int
	ctx     unsafe.Pointer // CUcontext

	kernelsOnce sync.Once
	kernels     *Kernels
	kernelsErr  error
}

var (
	devMu   sync.Mutex
	devices = map[int]*CUDADevice{}
)

// OpenDevice returns device number ordinal (as CUDA_VISIBLE_DEVICES
// numbers them), retaining its primary context for the life of the process.
func OpenDevice(ordinal int) (*CUDADevice, error) {
	if err := driver(); err != nil {
		return nil, err
	}
	devMu.Lock()
	defer devMu.Unlock()
	if d := devices[ordinal]; d != nil {
		return d, nil
	}
	var n C.int
	if err := cuErr("cuDeviceGetCount", C.goep_cu_device_count(&n)); err != nil {
		return nil, err
	}
	if ordinal < 0 || ordinal >= int(n) {
		return nil, fmt.Errorf("gpu: OpenDevice(%d): no such device (%d visible)", ordinal, int(n))
	}
	d := &CUDADevice{ordinal: ordinal}
	if err := cuErr("cuDeviceGet", C.goep_cu_device_get(C.int(ordinal), &d.dev)); err != nil {
		return nil, err
	}
	var ctx unsafe.Pointer
	if err := cuErr("cuDevicePrimaryCtxRetain", C.goep_cu_primary_ctx_retain(d.dev, &ctx)); err != nil {
		return nil, err
	}
	d.ctx = ctx
	devices[ordinal] = d
	return d, nil
}

// Ordinal returns the device's number.
func (d *CUDADevice) Ordinal() int { return d.ordinal }

func (d *CUDADevice) String() string { return fmt.Sprintf("cuda:%d", d.ordinal) }

// Name returns the device's product name, e.g. "NVIDIA H100 80GB HBM3".
func (d *CUDADevice) Name() (string, error) {
	var buf [256]C.char
	if err := cuErr("cuDeviceGetName", C.goep_cu_device_name(d.dev, &buf[0], C.int(len(buf)))); err != nil {
		return "", err
	}
	return C.GoString(&buf[0]), nil
}

// Attribute is a CUdevice_attribute.
type Attribute int

// The attributes this package uses; any other CUdevice_attribute value may
// be passed to CUDADevice.Attribute.
const (
	AttrMaxThreadsPerBlock     Attribute = 1
	AttrMultiprocessorCount    Attribute = 16
	AttrUnifiedAddressing      Attribute = 41
	AttrComputeCapabilityMajor Attribute = 75
	AttrComputeCapabilityMinor Attribute = 76
	AttrMemoryPoolsSupported   Attribute = 115
)

// Attribute returns one device attribute (cuDeviceGetAttribute).
func (d *CUDADevice) Attribute(a Attribute) (int, error) {
	var v C.int
	if err := cuErr("cuDeviceGetAttribute", C.goep_cu_device_attribute(d.dev, C.int(a), &v)); err != nil {
		return 0, err
	}
	return int(v), nil
}

// ComputeCapability returns the device's compute capability (9, 0 for an
// H100).
func (d *CUDADevice) ComputeCapability() (major, minor int, err error) {
	if major, err = d.Attribute(AttrComputeCapabilityMajor); err != nil {
		return 0, 0, err
	}
	if minor, err = d.Attribute(AttrComputeCapabilityMinor); err != nil {
		return 0, 0, err
	}
	return major, minor, nil
}

// TotalMemory returns the device's memory in bytes.
func (d *CUDADevice) TotalMemory() (int64, error) {
	var n C.size_t
	if err := cuErr("cuDeviceTotalMem", C.goep_cu_device_total_mem(d.dev, &n)); err != nil {
		return 0, err
	}
	return int64(n), nil
}

// MemoryInfo returns the free and total device memory in bytes.
func (d *CUDADevice) MemoryInfo() (free, total int64, err error) {
	var f, t C.size_t
	if err := cuErr("cuMemGetInfo", C.goep_cu_mem_get_info(d.ctx, &f, &t)); err != nil {
		return 0, 0, err
	}
	return int64(f), int64(t), nil
}

// PCIBusID returns the device's PCI address, e.g. "0000:19:00.0".
func (d *CUDADevice) PCIBusID() (string, error) {
	var buf [64]C.char
	if err := cuErr("cuDeviceGetPCIBusId", C.goep_cu_device_pci_bus_id(d.dev, &buf[0], C.int(len(buf)))); err != nil {
		return "", err
	}
	return C.GoString(&buf[0]), nil
}

// Synchronize waits until all work on the device has finished.
func (d *CUDADevice) Synchronize() error {
	return cuErr("cuCtxSynchronize", C.goep_cu_ctx_synchronize(d.ctx))
}

// DevicePtr is an address in device memory (a CUdeviceptr).
type DevicePtr uint64

// Add returns the address n bytes further.
func (p DevicePtr) Add(n int) DevicePtr { return p + DevicePtr(n) }

// Buffer is a range of device memory. Buffers from Alloc are freed with
// Free; views from Slice share their parent's memory and are not freed.
type Buffer struct {
	dev  *CUDADevice
	ptr  DevicePtr
	n    int
	view bool
}

// Alloc allocates n bytes of device memory (cuMemAlloc).
func (d *CUDADevice) Alloc(n int) (*Buffer, error) {
	if n < 0 {
		return nil, fmt.Errorf("gpu: Alloc: negative size %d", n)
	}
	b := &Buffer{dev: d, n: n}
	if n == 0 {
		return b, nil
	}
	var p C.uint64_t
	if err := cuErr("cuMemAlloc", C.goep_cu_mem_alloc(d.ctx, &p, C.size_t(n))); err != nil {
		return nil, fmt.Errorf("%w (allocating %d bytes on %v)", err, n, d)
	}
	b.ptr = DevicePtr(p)
	return b, nil
}

// Ptr returns the buffer's device address (0 for an empty buffer).
func (b *Buffer) Ptr() DevicePtr { return b.ptr }

// Len returns the buffer's size in bytes.
func (b *Buffer) Len() int { return b.n }

// Device returns the device the buffer lives on.
func (b *Buffer) Device() *CUDADevice { return b.dev }

// Free releases the buffer's memory; the buffer is then empty. Freeing an
// empty buffer does nothing; a view cannot be freed.
func (b *Buffer) Free() error {
	if b.view {
		return errors.New("gpu: Buffer.Free: a view (from Slice) is freed with its parent")
	}
	if b.ptr == 0 {
		b.n = 0
		return nil
	}
	err := cuErr("cuMemFree", C.goep_cu_mem_free(b.dev.ctx, C.uint64_t(b.ptr)))
	b.ptr, b.n = 0, 0
	return err
}

// Slice returns a view of n bytes from byte off.
func (b *Buffer) Slice(off, n int) (*Buffer, error) {
	if off < 0 || n < 0 || off+n > b.n {
		return nil, fmt.Errorf("gpu: Buffer.Slice(%d, %d) out of range of %d bytes", off, n, b.n)
	}
	return &Buffer{dev: b.dev, ptr: b.ptr.Add(off), n: n, view: true}, nil
}

func (b *Buffer) checkLen(op string, n int) error {
	if n != b.n {
		return fmt.Errorf("gpu: Buffer.%s: %d bytes given for a buffer of %d", op, n, b.n)
	}
	return nil
}

// Upload copies src (len(src) == Len()) from host memory to the buffer,
// and returns once the bytes are in device memory (cuMemcpyHtoD alone
// returns once src has been read).
func (b *Buffer) Upload(src []byte) error {
	if err := b.checkLen("Upload", len(src)); err != nil || len(src) == 0 {
		return err
	}
	if err := cuErr("cuMemcpyHtoD", C.goep_cu_memcpy_htod(b.dev.ctx, C.uint64_t(b.ptr), unsafe.Pointer(&src[0]), C.size_t(len(src)))); err != nil {
		return err
	}
	return b.dev.syncLegacy()
}

// syncLegacy waits for the synchronous copies queued so far: the legacy
// default stream's work.
func (d *CUDADevice) syncLegacy() error {
	return cuErr("cuStreamSynchronize", C.goep_cu_legacy_synchronize(d.ctx))
}

// Download copies the buffer to dst (len(dst) == Len()) in host memory.
func (b *Buffer) Download(dst []byte) error {
	if err := b.checkLen("Download", len(dst)); err != nil || len(dst) == 0 {
		return err
	}
	return cuErr("cuMemcpyDtoH", C.goep_cu_memcpy_dtoh(b.dev.ctx, unsafe.Pointer(&dst[0]), C.uint64_t(b.ptr), C.size_t(len(dst))))
}

// CopyFrom copies src (of the same length) into the buffer, device to
// device, and returns once the copy is done.
func (b *Buffer) CopyFrom(src *Buffer) error {
	if err := b.checkLen("CopyFrom", src.n); err != nil || b.n == 0 {
		return err
	}
	if err := cuErr("cuMemcpyDtoD", C.goep_cu_memcpy_dtod(b.dev.ctx, C.uint64_t(b.ptr), C.uint64_t(src.ptr), C.size_t(b.n))); err != nil {
		return err
	}
	return b.dev.syncLegacy()
}

// Memset sets every byte of the buffer to v, and returns once it is done.
func (b *Buffer) Memset(v byte) error {
	if b.n == 0 {
		return nil
	}
	if err := cuErr("cuMemsetD8", C.goep_cu_memset_d8(b.dev.ctx, C.uint64_t(b.ptr), C.uchar(v), C.size_t(b.n))); err != nil {
		return err
	}
	return b.dev.syncLegacy()
}

// UploadAsync queues a copy of src (pinned host memory of the same length)
// to the buffer on stream s (nil: the default stream).
func (b *Buffer) UploadAsync(src HostBuffer, s Stream) error {
	h, cs, err := cudaHostStream("UploadAsync", src, s)
	if err != nil {
		return err
	}
	if err := b.checkLen("UploadAsync", h.n); err != nil || b.n == 0 {
		return err
	}
	return cuErr("cuMemcpyHtoDAsync", C.goep_cu_memcpy_htod_async(b.dev.ctx, C.uint64_t(b.ptr), h.p, C.size_t(b.n), cs.handle()))
}

// DownloadAsync queues a copy of the buffer to dst (pinned host memory of
// the same length) on stream s.
func (b *Buffer) DownloadAsync(dst HostBuffer, s Stream) error {
	h, cs, err := cudaHostStream("DownloadAsync", dst, s)
	if err != nil {
		return err
	}
	if err := b.checkLen("DownloadAsync", h.n); err != nil || b.n == 0 {
		return err
	}
	return cuErr("cuMemcpyDtoHAsync", C.goep_cu_memcpy_dtoh_async(b.dev.ctx, h.p, C.uint64_t(b.ptr), C.size_t(b.n), cs.handle()))
}

// CopyFromAsync queues a device-to-device copy of src into the buffer on s.
func (b *Buffer) CopyFromAsync(src *Buffer, s Stream) error {
	cs, err := cudaStream(s)
	if err != nil {
		return err
	}
	if err := b.checkLen("CopyFromAsync", src.n); err != nil || b.n == 0 {
		return err
	}
	return cuErr("cuMemcpyDtoDAsync", C.goep_cu_memcpy_dtod_async(b.dev.ctx, C.uint64_t(b.ptr), C.uint64_t(src.ptr), C.size_t(b.n), cs.handle()))
}

// MemsetAsync queues setting every byte of the buffer to v on s.
func (b *Buffer) MemsetAsync(v byte, s Stream) error {
	cs, err := cudaStream(s)
	if err != nil || b.n == 0 {
		return err
	}
	return cuErr("cuMemsetD8Async", C.goep_cu_memset_d8_async(b.dev.ctx, C.uint64_t(b.ptr), C.uchar(v), C.size_t(b.n), cs.handle()))
}

// cudaHostStream is the pinned memory and the CUDA stream behind h and s.
func cudaHostStream(op string, h HostBuffer, s Stream) (*CUDAHostBuffer, *CUDAStream, error) {
	ch, err := cudaHost(op, h)
	if err != nil {
		return nil, nil, err
	}
	cs, err := cudaStream(s)
	return ch, cs, err
}

// Number is the element types Upload and Download move: fixed-size numbers
// (ep.BF16 among them), never anything holding a Go pointer.
type Number = dtype.Number

func bytesOf[T Number](s []T) []byte { return dtype.Bytes(s) }

// Upload copies src into b, whose length must be that of src in bytes.
func Upload[T Number](b *Buffer, src []T) error { return b.Upload(bytesOf(src)) }

// Download copies b into dst, whose length in bytes must be b's.
func Download[T Number](dst []T, b *Buffer) error { return b.Download(bytesOf(dst)) }

// AllocFor allocates a buffer for len(src) elements and uploads src.
func AllocFor[T Number](d *CUDADevice, src []T) (*Buffer, error) {
	b, err := d.Alloc(len(bytesOf(src)))
	if err != nil {
		return nil, err
	}
	if err := Upload(b, src); err != nil {
		_ = b.Free()
		return nil, err
	}
	return b, nil
}

// CUDAHostBuffer is page-locked ("pinned") host memory (cuMemHostAlloc),
// needed for asynchronous copies: the HostBuffer of a CUDA device. It is C
// memory: Bytes and HostSlice view it without copying, and those views must
// not be used after Free.
type CUDAHostBuffer struct {
	dev *CUDADevice
	p   unsafe.Pointer
	n   int
}

// CU_MEMHOSTALLOC_PORTABLE: usable from every context.
const memHostAllocPortable = 1

// AllocHost allocates n bytes of pinned host memory (a *CUDAHostBuffer).
func (d *CUDADevice) AllocHost(n int) (HostBuffer, error) {
	if n < 0 {
		return nil, fmt.Errorf("gpu: AllocHost: negative size %d", n)
	}
	h := &CUDAHostBuffer{dev: d, n: n}
	if n == 0 {
		return h, nil
	}
	var p unsafe.Pointer
	if err := cuErr("cuMemHostAlloc", C.goep_cu_mem_host_alloc(d.ctx, &p, C.size_t(n), memHostAllocPortable)); err != nil {
		return nil, fmt.Errorf("%w (allocating %d pinned bytes)", err, n)
	}
	h.p = p
	return h, nil
}

// cudaHost is the pinned memory behind h, or an error naming op.
func cudaHost(op string, h HostBuffer) (*CUDAHostBuffer, error) {
	ch, ok := h.(*CUDAHostBuffer)
	if !ok || ch == nil {
		return nil, fmt.Errorf("gpu: %s: %T is not pinned memory of a CUDA device", op, h)
	}
	return ch, nil
}

// Len returns the size in bytes.
func (h *CUDAHostBuffer) Len() int { return h.n }

// Bytes views the memory as bytes.
func (h *CUDAHostBuffer) Bytes() []byte {
	if h.p == nil {
		return nil
	}
	return unsafe.Slice((*byte)(h.p), h.n)
}

// HostSlice views host memory as a slice of T (its length rounded down).
func HostSlice[T Number](h HostBuffer) []T {
	b := h.Bytes()
	n := len(b) / int(unsafe.Sizeof(*new(T)))
	if n == 0 {
		return nil
	}
	return unsafe.Slice((*T)(unsafe.Pointer(&b[0])), n)
}

// Free releases the memory.
func (h *CUDAHostBuffer) Free() error {
	if h.p == nil {
		return nil
	}
	err := cuErr("cuMemFreeHost", C.goep_cu_mem_free_host(h.dev.ctx, h.p))
	h.p, h.n = nil, 0
	return err
}

// CUDAStream is a CUDA stream: the Stream of a CUDA device. A nil
// *CUDAStream, or a nil Stream, stands for the default (legacy NULL) stream
// wherever a stream is taken, but for the copies by address.
type CUDAStream struct {
	dev *CUDADevice
	s   unsafe.Pointer // CUstream
}

// CU_STREAM_NON_BLOCKING: no implicit synchronisation with the NULL stream.
const streamNonBlocking = 1

// NewStream creates a non-blocking stream (a *CUDAStream).
func (d *CUDADevice) NewStream() (Stream, error) {
	var s unsafe.Pointer
	if err := cuErr("cuStreamCreate", C.goep_cu_stream_create(d.ctx, &s, streamNonBlocking)); err != nil {
		return nil, err
	}
	return &CUDAStream{dev: d, s: s}, nil
}

func (s *CUDAStream) handle() unsafe.Pointer {
	if s == nil {
		return nil
	}
	return s.s
}

// Synchronize waits for the stream's work to finish.
func (s *CUDAStream) Synchronize() error {
	if s == nil {
		return errors.New("gpu: Synchronize on the nil (default) stream: use Device.Synchronize")
	}
	return cuErr("cuStreamSynchronize", C.goep_cu_stream_synchronize(s.dev.ctx, s.s))
}

// Done reports whether all work queued on the stream has finished.
func (s *CUDAStream) Done() (bool, error) {
	if s == nil {
		return false, errors.New("gpu: Done on the nil (default) stream: use Device.Synchronize")
	}
	r := C.goep_cu_stream_query(s.dev.ctx, s.s)
	if r == cudaErrorNotReady {
		return false, nil
	}
	return r == 0, cuErr("cuStreamQuery", r)
}

// Record marks e, a *CUDAEvent, at the current end of the stream's work
// (cuEventRecord).
func (s *CUDAStream) Record(e Event) error {
	ce, err := cudaEvent("Record", e)
	if err != nil {
		return err
	}
	return cuErr("cuEventRecord", C.goep_cu_event_record(ce.dev.ctx, ce.e, s.handle()))
}

// WaitEvent makes later work on the stream wait until e, a *CUDAEvent, has
// happened (cuStreamWaitEvent).
func (s *CUDAStream) WaitEvent(e Event) error {
	if s == nil {
		return errors.New("gpu: WaitEvent on the nil (default) stream: create a stream")
	}
	ce, err := cudaEvent("WaitEvent", e)
	if err != nil {
		return err
	}
	return cuErr("cuStreamWaitEvent", C.goep_cu_stream_wait_event(s.dev.ctx, s.s, ce.e))
}

// Close destroys the stream (after its work completes).
func (s *CUDAStream) Close() error {
	if s == nil || s.s == nil {
		return nil
	}
	err := cuErr("cuStreamDestroy", C.goep_cu_stream_destroy(s.dev.ctx, s.s))
	s.s = nil
	return err
}

const cudaErrorNotReady = 600 // CUDA_ERROR_NOT_READY

// CUDAEvent is a CUDA event, the Event of a CUDA device: it marks a point
// in a stream's work; two events time what lies between them.
type CUDAEvent struct {
	dev *CUDADevice
	e   unsafe.Pointer // CUevent
}

// NewEvent creates an event that records time (a *CUDAEvent).
func (d *CUDADevice) NewEvent() (Event, error) {
	var e unsafe.Pointer
	if err := cuErr("cuEventCreate", C.goep_cu_event_create(d.ctx, &e, 0)); err != nil {
		return nil, err
	}
	return &CUDAEvent{dev: d, e: e}, nil
}

// cudaEvent is the CUDA event behind e, or an error naming op.
func cudaEvent(op string, e Event) (*CUDAEvent, error) {
	ce, ok := e.(*CUDAEvent)
	if !ok || ce == nil || ce.e == nil {
		return nil, fmt.Errorf("gpu: %s: %T is not a live event of a CUDA device", op, e)
	}
	return ce, nil
}

// Synchronize waits until the event has happened.
func (e *CUDAEvent) Synchronize() error {
	return cuErr("cuEventSynchronize", C.goep_cu_event_synchronize(e.dev.ctx, e.e))
}

// Done reports whether the event has happened.
func (e *CUDAEvent) Done() (bool, error) {
	r := C.goep_cu_event_query(e.dev.ctx, e.e)
	if r == cudaErrorNotReady {
		return false, nil
	}
	return r == 0, cuErr("cuEventQuery", r)
}

// Close destroys the event.
func (e *CUDAEvent) Close() error {
	if e == nil || e.e == nil {
		return nil
	}
	err := cuErr("cuEventDestroy", C.goep_cu_event_destroy(e.dev.ctx, e.e))
	e.e = nil
	return err
}

// ElapsedSince is the time from start's mark to this event's, both
// recorded and reached (cuEventElapsedTime; about half a microsecond of
// resolution).
func (e *CUDAEvent) ElapsedSince(start Event) (time.Duration, error) { return Elapsed(start, e) }

// Elapsed returns the time between two recorded events of a CUDA device
// that have happened (resolution about half a microsecond).
func Elapsed(start, end Event) (time.Duration, error) {
	s, err := cudaEvent("Elapsed", start)
	if err != nil {
		return 0, err
	}
	e, err := cudaEvent("Elapsed", end)
	if err != nil {
		return 0, err
	}
	var ms C.float
	if err := cuErr("cuEventElapsedTime", C.goep_cu_event_elapsed(s.dev.ctx, &ms, s.e, e.e)); err != nil {
		return 0, err
	}
	return time.Duration(float64(ms) * float64(time.Millisecond)), nil
}
