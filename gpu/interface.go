package gpu

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

// Device is a GPU: device memory named by address, synchronous copies,
// streams and events, and the package's kernels. Synchronous copies do not
// wait for streams (as cuMemcpy does not wait for non-blocking streams);
// Synchronize does.
type Device interface {
	String() string
	// MemAlloc returns n bytes of device memory, not initialised (cuMemAlloc;
	// n = 0 still gives an address); MemFree releases them, without waiting
	// for the work that uses them: the caller synchronises first.
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
type Comm interface {
	// SendRecv queues one group of transfers on s (ncclGroupStart,
	// ncclSend/ncclRecv, ncclGroupEnd): the stream goes on when every one
	// has completed. Transfers between two ranks match in the order they
	// are listed and must agree in size; a rank may transfer to itself.
	SendRecv(s Stream, sends, recvs []Transfer) error
	// AsyncError reports the failure of a queued group
	// (ncclCommGetAsyncError); nil while all is well.
	AsyncError() error
	// Abort ends the queued groups (ncclCommAbort); any goroutine may call
	// it while another waits.
	Abort() error
	// Close releases the communicator. It is collective.
	Close() error
}

// The CUDA implementation.
var (
	_ Device     = (*CUDADevice)(nil)
	_ Stream     = (*CUDAStream)(nil)
	_ Event      = (*CUDAEvent)(nil)
	_ HostBuffer = (*CUDAHostBuffer)(nil)
	_ Comm       = (*NCCLComm)(nil)
)
