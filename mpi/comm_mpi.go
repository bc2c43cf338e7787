//go:build mpi

package mpi

/*
#cgo pkg-config: ompi
#include <stdlib.h>
#include "shim_mpi.h"
*/
import "C"

import (
	"fmt"
	"os"
	"reflect"
	"runtime"
	"sync"
	"time"
	"unsafe"

	empi "github.com/emer/empi/v2/mpi"
)

// Built reports whether this binary links MPI (the mpi build tag).
const Built = true

type commHandle struct {
	c        C.MPI_Comm
	world    bool
	borrowed bool // the caller's (Adopt): never freed here
	isFreed  bool
}

func (h commHandle) freed() bool { return h.isFreed }

var (
	initMu      sync.Mutex
	world       *Comm
	threadLevel int
	// leaked keeps buffers of collectives that timed out reachable: MPI may
	// still write into them, so the garbage collector must never free them.
	leaked [][]byte
)

// Thread levels, as MPI defines them.
const (
	ThreadSingle     = int(C.MPI_THREAD_SINGLE)
	ThreadFunneled   = int(C.MPI_THREAD_FUNNELED)
	ThreadSerialized = int(C.MPI_THREAD_SERIALIZED)
	ThreadMultiple   = int(C.MPI_THREAD_MULTIPLE)
)

// Init starts MPI and returns the world communicator. It checks the launch
// (see the package doc) and fails with a message saying what is wrong
// instead of running as a job of one rank by mistake. Calling it again
// returns the same communicator.
func Init() (*Comm, error) {
	initMu.Lock()
	defer initMu.Unlock()
	if world != nil {
		return world, nil
	}
	timeout, err := defaultTimeout()
	if err != nil {
		return nil, err
	}
	launch := DetectLaunch()
	if launch.Launcher == "" && !singletonAllowed() {
		return nil, checkLaunch(launch, 1, true)
	}
	if !empi.IsOn() {
		chooseOneSided() // before MPI_Init, which reads the choice
		if err := empi.InitThreadSafe(); err != nil {
			// Less than MPI_THREAD_MULTIPLE: calls must stay on this thread.
			runtime.LockOSThread()
		}
	} else {
		oneSided = OneSidedChoice{Reason: "MPI was initialised before mpi.Init: its choice"}
	}
	readOneSided()
	var provided C.int
	C.MPI_Query_thread(&provided)
	threadLevel = int(provided)
	if rc := C.MPI_Comm_set_errhandler(C.MPI_COMM_WORLD, C.MPI_ERRORS_RETURN); rc != C.MPI_SUCCESS {
		return nil, mpiError("MPI_Comm_set_errhandler", rc)
	}
	w := &Comm{name: "world", rank: empi.WorldRank(), size: empi.WorldSize(), timeout: timeout,
		h: commHandle{c: C.MPI_COMM_WORLD, world: true}}
	if err := checkLaunch(launch, w.size, true); err != nil {
		return nil, err
	}
	world = w
	return w, nil
}

// Finalize shuts MPI down. Every rank must call it after its last MPI call.
func Finalize() error {
	initMu.Lock()
	defer initMu.Unlock()
	if world == nil {
		return nil
	}
	world = nil
	empi.Finalize()
	return nil
}

// ThreadLevel is the thread support MPI provided (ThreadMultiple unless the
// library lacks it); valid after Init.
func ThreadLevel() int { return threadLevel }

// Abort prints msg to standard error with this rank's number and aborts every
// process of the job with the given exit code. It does not return.
func Abort(code int, msg string) {
	fmt.Fprintf(os.Stderr, "goep: rank %d: aborting the job: %s\n", empi.WorldRank(), msg)
	C.MPI_Abort(C.MPI_COMM_WORLD, C.int(code))
	os.Exit(code) // MPI_Abort should not return; make sure we do not either
}

// ProcessorName is MPI_Get_processor_name: the host this rank runs on.
func ProcessorName() (string, error) {
	buf := make([]byte, C.MPI_MAX_PROCESSOR_NAME+1)
	var n C.int
	if rc := C.MPI_Get_processor_name((*C.char)(unsafe.Pointer(&buf[0])), &n); rc != C.MPI_SUCCESS {
		return "", mpiError("MPI_Get_processor_name", rc)
	}
	return string(buf[:n]), nil
}

func mpiError(call string, rc C.int) error {
	var buf [C.MPI_MAX_ERROR_STRING + 1]C.char
	n := C.goep_error_string(rc, &buf[0], C.int(len(buf)))
	return &Error{Call: call, Code: int(rc), Msg: C.GoStringN(&buf[0], n)}
}

// result turns the return code of a shim call into an error, marking the
// communicator unusable after a timeout.
func (c *Comm) result(call string, rc C.int, keep ...[]byte) error {
	switch rc {
	case C.MPI_SUCCESS:
		return nil
	case C.GOEP_ERR_TIMEOUT:
		initMu.Lock()
		leaked = append(leaked, keep...)
		initMu.Unlock()
		err := &TimeoutError{Call: call, After: c.timeout, Comm: c.name}
		c.markBroken(err)
		return err
	}
	return mpiError(call, rc)
}

func ptr(b []byte) unsafe.Pointer {
	if len(b) == 0 {
		return nil
	}
	return unsafe.Pointer(unsafe.SliceData(b))
}

func (c *Comm) ns() C.int64_t { return C.int64_t(c.timeout / time.Nanosecond) }

func (c *Comm) arrive(within time.Duration) (int, error) {
	var missing C.int
	rc := C.goep_arrive(c.h.c, C.int(arriveTag), C.int64_t(within.Nanoseconds()), &missing)
	if rc == C.GOEP_ERR_TIMEOUT { // rank 0 did not answer: it is the one missing
		// This rank's token may still be pending at rank 0, where a later
		// Arrive would take it for a new one: the communicator is done.
		c.markBroken(&MissingError{What: "Arrive", Rank: 0, After: within, Comm: c.name})
		return 0, nil
	}
	if rc != C.MPI_SUCCESS {
		return -1, mpiError("MPI_Send/MPI_Recv (Arrive)", rc)
	}
	return int(missing), nil
}

func (c *Comm) barrier() error {
	return c.result("MPI_Barrier", C.goep_barrier(c.h.c, c.ns()))
}

func (c *Comm) bcast(buf []byte, root int) error {
	return c.result("MPI_Bcast", C.goep_bcast(ptr(buf), C.int(len(buf)), C.int(root), c.h.c, c.ns()), buf)
}

func (c *Comm) allgather(send, recv []byte) error {
	return c.result("MPI_Allgather", C.goep_allgather(ptr(send), C.int(len(send)), ptr(recv), c.h.c, c.ns()), send, recv)
}

func (c *Comm) alltoall(send, recv []byte, block int) error {
	return c.result("MPI_Alltoall", C.goep_alltoall(ptr(send), C.int(block), ptr(recv), c.h.c, c.ns()), send, recv)
}

func (c *Comm) alltoallv(send []byte, sc, sd []int32, recv []byte, rc, rd []int32) error {
	code := C.goep_alltoallv(ptr(send), (*C.int)(&sc[0]), (*C.int)(&sd[0]),
		ptr(recv), (*C.int)(&rc[0]), (*C.int)(&rd[0]), c.h.c, c.ns())
	return c.result("MPI_Alltoallv", code, send, recv, asBytes(sc), asBytes(sd), asBytes(rc), asBytes(rd))
}

var dtypeCodes = map[reflect.Kind]C.int{
	reflect.Int8: C.GOEP_I8, reflect.Uint8: C.GOEP_U8, reflect.Int16: C.GOEP_I16, reflect.Uint16: C.GOEP_U16,
	reflect.Int32: C.GOEP_I32, reflect.Uint32: C.GOEP_U32, reflect.Int64: C.GOEP_I64, reflect.Uint64: C.GOEP_U64,
	reflect.Float32: C.GOEP_F32, reflect.Float64: C.GOEP_F64,
}

func (c *Comm) allreduce(send, recv []byte, n int, kind reflect.Kind, op Op) error {
	code := C.goep_allreduce(ptr(send), ptr(recv), C.int(n), dtypeCodes[kind], C.int(op), c.h.c, c.ns())
	return c.result("MPI_Allreduce", code, send, recv)
}

func (c *Comm) split(color, key int) (*Comm, error) {
	col := C.int(color)
	if color < 0 {
		col = C.MPI_UNDEFINED
	}
	var nc C.MPI_Comm
	if rc := C.MPI_Comm_split(c.h.c, col, C.int(key), &nc); rc != C.MPI_SUCCESS {
		return nil, mpiError("MPI_Comm_split", rc)
	}
	if nc == C.MPI_COMM_NULL {
		return nil, nil
	}
	return newComm(nc)
}

func (c *Comm) splitShared() (*Comm, error) {
	var nc C.MPI_Comm
	if rc := C.MPI_Comm_split_type(c.h.c, C.MPI_COMM_TYPE_SHARED, C.int(c.rank), C.MPI_INFO_NULL, &nc); rc != C.MPI_SUCCESS {
		return nil, mpiError("MPI_Comm_split_type", rc)
	}
	return newComm(nc)
}

func newComm(nc C.MPI_Comm) (*Comm, error) {
	var r, s C.int
	if rc := C.MPI_Comm_rank(nc, &r); rc != C.MPI_SUCCESS {
		return nil, mpiError("MPI_Comm_rank", rc)
	}
	if rc := C.MPI_Comm_size(nc, &s); rc != C.MPI_SUCCESS {
		return nil, mpiError("MPI_Comm_size", rc)
	}
	return &Comm{rank: int(r), size: int(s), h: commHandle{c: nc}}, nil
}

func (c *Comm) free() error {
	if c.h.world || c.h.borrowed {
		return nil
	}
	if rc := C.MPI_Comm_free(&c.h.c); rc != C.MPI_SUCCESS {
		return mpiError("MPI_Comm_free", rc)
	}
	c.h.isFreed = true
	return nil
}

// Raw is the MPI_Comm handle as an integer, for cgo code in other packages
// that links the same MPI library (Open MPI's MPI_Comm is a pointer). It is
// not collective.
func (c *Comm) Raw() uintptr { return uintptr(unsafe.Pointer(c.h.c)) }

// badRootForTest issues MPI_Bcast with a root MPI must reject, bypassing this
// package's own checks, so tests can see an MPI failure come back as *Error.
func (c *Comm) badRootForTest() error {
	var b [1]byte
	return c.result("MPI_Bcast", C.goep_bcast(unsafe.Pointer(&b[0]), 1, C.int(c.size+7), c.h.c, 0))
}
