package gpu

import (
	"errors"
	"time"
)

// The device interface: what code written for a GPU needs of one, so that
// it runs unchanged on a CUDA device (this package) and on the emulated
// device of package gpu/emulator, which implement it directly:
//
//	interface   CUDA (this package)   emulated (gpu/emulator)
//	Device      *CUDADevice           *emulator.Device
//	Stream      *CUDAStream           *emulator.Stream
//	Event       *CUDAEvent            *emulator.Event
//	HostBuffer  *CUDAHostBuffer       *emulator.HostBuffer
//	Comm        *NCCLComm             *emulator.Comm
//
// Streams, events, host buffers and communicators work with those of their
// own device only: a CUDA stream handed an emulated event returns an error
// naming both types.

// Device is a GPU: device memory named by address, copies on the legacy
// default stream, streams and events, and the package's kernels.
//
// The copies by address keep CUDA's own synchronization rules (the
// driver's "API synchronization behavior"), which an emulated device
// keeps too: MemcpyHtoD returns once src has been read, but the bytes
// reach device memory later; MemcpyDtoD and MemsetD8 are asynchronous to
// the host; all three run on the legacy default stream, which the
// non-blocking streams of NewStream do not wait for. MemcpyDtoH returns
// once the bytes are in dst, after the earlier work of the legacy stream
// (not of other streams). So work on a stream that reads what a
// synchronous copy wrote must come after Synchronize, or use the stream's
// own asynchronous copy. Synchronize waits for every stream, the legacy
// one included.
type Device interface {
	String() string
	// MemAlloc returns n bytes of device memory, not initialised (cuMemAlloc;
	// n = 0 still gives an address); MemFree releases them. Like cuMemFree,
	// MemFree first waits for the work queued on every stream of the
	// device: it blocks for ever behind a transfer whose peer never comes,
	// so a communicator with such work is aborted before memory is freed.
	MemAlloc(n int) (DevicePtr, error)
	MemFree(p DevicePtr) error
	// AllocHost returns n bytes of host memory for asynchronous copies
	// (pinned memory on a CUDA device).
	AllocHost(n int) (HostBuffer, error)
	NewStream() (Stream, error)
	NewEvent() (Event, error)
	// Kernels are the package's kernels on this device, run on its streams.
	Kernels() (*Kernels, error)
	MemcpyHtoD(dst DevicePtr, src []byte) error
	MemcpyDtoH(dst []byte, src DevicePtr) error
	MemcpyDtoD(dst, src DevicePtr, n int) error
	MemsetD8(dst DevicePtr, v byte, n int) error
	// Synchronize waits for the work queued on every stream of the device.
	Synchronize() error
}

// Stream runs the work queued on it in order, later than it was queued;
// only events order two streams. A Stream is the Queue that Kernels'
// methods take.
type Stream interface {
	Queue
	// Done reports whether the work queued so far has run.
	Done() (bool, error)
	// MemcpyHtoDAsync copies n bytes of src from byte off to dst, and
	// MemcpyDtoHAsync n bytes at src into dst from byte off, when the
	// stream runs them: the host memory must stay untouched until then.
	MemcpyHtoDAsync(dst DevicePtr, src HostBuffer, off, n int) error
	MemcpyDtoHAsync(dst HostBuffer, off int, src DevicePtr, n int) error
	MemcpyDtoDAsync(dst, src DevicePtr, n int) error
	MemsetD8Async(dst DevicePtr, v byte, n int) error
	// Record marks e at the current end of the stream's work
	// (cuEventRecord); WaitEvent makes the work queued from now on wait
	// until e's latest mark has been reached (cuStreamWaitEvent).
	Record(e Event) error
	WaitEvent(e Event) error
	// Close releases the stream once its work has run.
	Close() error
}

// Event marks a point in a stream's work (Stream.Record).
type Event interface {
	// Done reports whether the work before the latest mark has run;
	// Synchronize waits for it.
	Done() (bool, error)
	Synchronize() error
	// ElapsedSince is the device's time from start's latest mark to this
	// event's (cuEventElapsedTime), both reached; start is an event of
	// the same device.
	ElapsedSince(start Event) (time.Duration, error)
	Close() error
}

// HostBuffer is host memory that asynchronous copies read and write: they
// use it when they run, not when they are queued. It is C memory, outside
// the Go heap.
type HostBuffer interface {
	// Bytes views the memory (nil after Free).
	Bytes() []byte
	Free() error
}

// Comm is NCCL's part: grouped point-to-point transfers between the ranks'
// devices, queued on a stream, and the means to end them when a peer
// stalls (NCCL has no timeouts).
//
// A Comm is non-blocking, as an NCCL communicator made with blocking = 0:
// SendRecv may return before its group is on the stream (NCCL connects
// to new peers in the background, which needs them to post their side).
// Until AsyncError returns nil, the caller must queue nothing on the
// group's stream and call nothing on the Comm but AsyncError and Abort.
// A Comm is used by one goroutine at a time, Abort included: NCCL allows
// no concurrent calls on a communicator, and ncclCommAbort frees it, so
// the goroutine that waits on the Comm is the one that aborts it. After
// Abort, every method returns an error and does nothing.
type Comm interface {
	// SendRecv posts one group of transfers on s (ncclGroupStart,
	// ncclSend/ncclRecv, ncclGroupEnd): the stream goes on when every one
	// has completed. Transfers between two ranks match in the order they
	// are listed and must agree in size (a send and a receive of
	// different sizes hang, as NCCL's do); a rank may transfer to itself.
	SendRecv(s Stream, sends, recvs []Transfer) error
	// AsyncError is the communicator's state (ncclCommGetAsyncError):
	// nil when the last call has taken effect and nothing has failed,
	// ErrInProgress while a SendRecv is still being enqueued, or the
	// failure of a queued group.
	AsyncError() error
	// Abort ends the queued groups and frees the communicator
	// (ncclCommAbort); the streams that ran its groups go on.
	Abort() error
	// Close waits for the communicator's queued work, up to the timeout
	// it was made with, and frees it (ncclCommFinalize, then
	// ncclCommDestroy); past the timeout it aborts it instead. It is
	// collective.
	Close() error
}

// ErrInProgress is what Comm.AsyncError returns while a call is still
// taking effect in the background (ncclInProgress).
var ErrInProgress = errors.New("gpu: the communicator's last call is still in progress (ncclInProgress)")

// The CUDA implementation.
var (
	_ Device     = (*CUDADevice)(nil)
	_ Stream     = (*CUDAStream)(nil)
	_ Event      = (*CUDAEvent)(nil)
	_ HostBuffer = (*CUDAHostBuffer)(nil)
	_ Comm       = (*NCCLComm)(nil)
)
