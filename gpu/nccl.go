package gpu

/*
#include <stdlib.h>
#include "shim.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"runtime"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"github.com/goep/goep/mpi"
)

// NCCLError is a failed NCCL call, with ncclGetErrorString's text and, when
// the NCCL has it (2.13+), ncclGetLastError's more specific message.
type NCCLError struct {
	Call    string
	Code    int
	Message string
	Last    string
}

func (e *NCCLError) Error() string {
	s := fmt.Sprintf("gpu: %s: %s (%d)", e.Call, e.Message, e.Code)
	if e.Last != "" {
		s += ": " + e.Last
	}
	return s
}

func ncclErr(call string, r C.int, comm unsafe.Pointer) error {
	if r == 0 {
		return nil
	}
	e := &NCCLError{Call: call, Code: int(r), Message: "unknown NCCL status"}
	if s := C.goep_nccl_error_string(r); s != nil {
		e.Message = C.GoString(s)
	}
	if s := C.goep_nccl_last_error(comm); s != nil {
		e.Last = C.GoString(s)
	}
	return e
}

// NCCLVersion returns the NCCL library's version code (22703 = 2.27.3).
func NCCLVersion() (int, error) {
	if err := ncclLib.load(); err != nil {
		return 0, err
	}
	var v C.int
	if err := ncclErr("ncclGetVersion", C.goep_nccl_version(&v), nil); err != nil {
		return 0, err
	}
	return int(v), nil
}

// NCCLUniqueID creates an NCCL unique ID (ncclGetUniqueId): an
// mpi.IDGenerator, for mpi.BootstrapID(world, 0, gpu.NCCLUniqueID). Without
// the NCCL library it returns the *LibraryError that says so, which
// BootstrapID hands to every rank.
func NCCLUniqueID() (mpi.UniqueID, error) { return ncclUniqueID(ncclLib) }

var _ mpi.IDGenerator = NCCLUniqueID

func ncclUniqueID(lib *library) (mpi.UniqueID, error) {
	var id mpi.UniqueID
	if err := lib.load(); err != nil {
		return id, err
	}
	var buf [mpi.UniqueIDBytes]C.uchar
	if err := ncclErr("ncclGetUniqueId", C.goep_nccl_get_unique_id(&buf[0]), nil); err != nil {
		return id, err
	}
	for i := range id {
		id[i] = byte(buf[i])
	}
	return id, nil
}

// NCCLComm is a non-blocking NCCL communicator of one rank, on one device:
// the Comm of a CUDA device. As NCCL requires, it is for one goroutine at a
// time, Abort included.
type NCCLComm struct {
	dev        *CUDADevice
	h          atomic.Pointer[ncclHandle] // nil once destroyed or aborted
	rank, size int
	timeout    time.Duration // how long Close and the set-up wait for the peers
}

// ncclHandle holds an ncclComm_t.
type ncclHandle struct{ comm unsafe.Pointer }

// handle is the live communicator, or an error naming op once it is gone.
func (c *NCCLComm) handle(op string) (unsafe.Pointer, error) {
	h := c.h.Load()
	if h == nil {
		return nil, fmt.Errorf("gpu: %s: the NCCL communicator has been closed or aborted", op)
	}
	return h.comm, nil
}

// NewNCCLComm creates an NCCL communicator over the ranks of world, one
// rank per MPI rank, as NCCL's MPI bootstrap does: each rank opens its
// device (DeviceForRank's choice when device is negative), rank 0 creates
// the unique ID (NCCLUniqueID) and mpi.BootstrapID broadcasts it, and every
// rank joins (NewNCCLCommFromID, within world's timeout). It is
// collective. Before NCCL is entered the ranks agree that each has its
// libraries and device, so that a rank that lacks them makes every rank
// return an error naming it, instead of leaving the others waiting inside
// NCCL.
func NewNCCLComm(world *mpi.Comm, device int) (*NCCLComm, error) {
	dev, err := openForNCCL(world, device, "NewNCCLComm")
	if err != nil {
		return nil, err
	}
	id, err := mpi.BootstrapID(world, 0, NCCLUniqueID)
	if err != nil {
		return nil, fmt.Errorf("gpu: NewNCCLComm: %w", err)
	}
	return NewNCCLCommFromID(dev, id, world.Rank(), world.Size(), world.Timeout())
}

// NewNCCLCommWithID is NewNCCLComm with the unique ID made beforehand, on
// one rank, and given to every rank of world (mpi.BootstrapID with
// NCCLUniqueID, at a job's start, say): every rank passes the same id. It
// is collective. Before NCCL is entered the ranks agree that each has its
// libraries and device, and that they hold one ID (mpi.CheckSameID), so
// that a rank that lacks them, or holds another ID, makes every rank
// return an error naming it.
func NewNCCLCommWithID(world *mpi.Comm, device int, id mpi.UniqueID) (*NCCLComm, error) {
	dev, err := openForNCCL(world, device, "NewNCCLCommWithID")
	if err != nil {
		return nil, err
	}
	if err := mpi.CheckSameID(world, 0, id); err != nil {
		return nil, fmt.Errorf("gpu: NewNCCLCommWithID: %w", err)
	}
	return NewNCCLCommFromID(dev, id, world.Rank(), world.Size(), world.Timeout())
}

// openForNCCL opens this rank's device (DeviceForRank's choice when device
// is negative) and NCCL, and agrees with the other ranks of world that
// every one did. It is collective.
func openForNCCL(world *mpi.Comm, device int, op string) (*CUDADevice, error) {
	local, lerr := localRank(world) // collective, whatever device is
	var dev *CUDADevice
	err := func() error {
		if lerr != nil {
			return lerr
		}
		ordinal := device
		if ordinal < 0 {
			var err error
			if ordinal, err = deviceFor(world.Rank(), local); err != nil {
				return err
			}
		}
		if err := ncclLib.load(); err != nil {
			return err
		}
		var err error
		dev, err = OpenDevice(ordinal)
		return err
	}()
	if err := agree(world, op, err); err != nil {
		return nil, err
	}
	return dev, nil
}

// NewNCCLCommFromID joins rank `rank` of a non-blocking NCCL communicator
// of `size` ranks whose unique ID the caller has shared by other means
// (ncclCommInitRankConfig with blocking = 0). It waits until every rank has
// joined, for at most timeout (0: no limit): past it, it aborts the
// communicator and returns an error.
func NewNCCLCommFromID(dev *CUDADevice, id mpi.UniqueID, rank, size int, timeout time.Duration) (*NCCLComm, error) {
	return newNCCLComm(dev, id, rank, size, timeout, false)
}

// newNCCLComm is NewNCCLCommFromID, or with blocking a blocking
// communicator (NCCL's default, whose ncclGroupEnd enqueues on the calling
// thread instead of a thread of its own): the device tests compare them.
func newNCCLComm(dev *CUDADevice, id mpi.UniqueID, rank, size int, timeout time.Duration, blocking bool) (*NCCLComm, error) {
	if size < 1 || rank < 0 || rank >= size {
		return nil, fmt.Errorf("gpu: NewNCCLCommFromID: rank %d of %d", rank, size)
	}
	if timeout < 0 {
		return nil, fmt.Errorf("gpu: NewNCCLCommFromID: negative timeout %v", timeout)
	}
	if err := ncclLib.load(); err != nil {
		return nil, err
	}
	var cid [mpi.UniqueIDBytes]C.uchar
	for i, b := range id {
		cid[i] = C.uchar(b)
	}
	var comm unsafe.Pointer
	block := 0
	if blocking {
		block = 1
	}
	r := C.goep_nccl_comm_init_rank_config(dev.ctx, &comm, C.int(size), &cid[0], C.int(rank), C.int(block))
	if r != 0 && r != ncclInProgress {
		err := ncclErr("ncclCommInitRankConfig", r, nil)
		if comm != nil {
			_ = C.goep_nccl_comm_abort(dev.ctx, comm)
		}
		return nil, fmt.Errorf("%w (rank %d of %d on %v)", err, rank, size, dev)
	}
	c := &NCCLComm{dev: dev, rank: rank, size: size, timeout: timeout}
	c.h.Store(&ncclHandle{comm: comm})
	if err := c.settle("ncclCommInitRankConfig"); err != nil {
		return nil, fmt.Errorf("%w (rank %d of %d on %v)", err, rank, size, dev)
	}
	return c, nil
}

// settle waits until the communicator's last call has taken effect
// (AsyncError is no longer ErrInProgress), for at most the communicator's
// timeout; on a failure or past the timeout it aborts the communicator.
func (c *NCCLComm) settle(op string) error {
	start := time.Now()
	for spin := 0; ; spin++ {
		err := c.AsyncError()
		if err == nil {
			return nil
		}
		if !errors.Is(err, ErrInProgress) {
			_ = c.Abort()
			return err
		}
		if c.timeout > 0 && time.Since(start) > c.timeout {
			_ = c.Abort()
			return fmt.Errorf("gpu: %s: not done within %v (a rank that never took part?): the communicator was aborted", op, c.timeout)
		}
		Backoff(time.Since(start))
	}
}

// Backoff pauses a loop that polls the device or a communicator, by how
// long it has polled so far: it yields for the first 200 us (a kernel or a
// transfer on a GPU takes tens of microseconds), then sleeps an eighth of
// the time waited, at most 1 ms, so that a machine with more ranks than
// cores stays responsive. It sleeps in nanosleep, not time.Sleep, which
// rounds a pause below a millisecond up to about one on Linux.
func Backoff(waited time.Duration) {
	if waited < 200*time.Microsecond {
		runtime.Gosched()
		return
	}
	ts := syscall.NsecToTimespec(int64(min(waited/8, time.Millisecond)))
	_ = syscall.Nanosleep(&ts, nil)
}

// DeviceForRank returns the device a rank of world uses by default: its
// local rank (mpi.Topology) modulo the number of visible devices. With
// simulated nodes (GOEP_RANKS_PER_NODE) the ranks of one host still share
// its devices, so the rank's place among the ranks of its host counts
// instead. It is collective.
func DeviceForRank(world *mpi.Comm) (int, error) {
	local, err := localRank(world)
	if err != nil {
		return 0, err
	}
	return deviceFor(world.Rank(), local)
}

func deviceFor(rank, local int) (int, error) {
	n, err := DeviceCount()
	if err != nil {
		return 0, err
	}
	if n == 0 {
		return 0, fmt.Errorf("%w visible to rank %d", ErrNoDevice, rank)
	}
	return local % n, nil
}

// localRank is the rank's place on its node, or on its host when nodes are
// simulated. It is collective.
func localRank(world *mpi.Comm) (int, error) {
	topo, err := world.Topology()
	if err != nil {
		return 0, err
	}
	local, simulated := topo.LocalRank, topo.Simulated
	if err := topo.Free(); err != nil {
		return 0, err
	}
	if simulated {
		return hostLocalRank(world)
	}
	return local, nil
}

// hostLocalRank returns the number of lower ranks of c on this host. It is
// collective.
func hostLocalRank(c *mpi.Comm) (int, error) {
	const width = 256
	host, err := mpi.ProcessorName()
	if err != nil {
		return 0, err
	}
	mine := make([]byte, width)
	copy(mine, host)
	all := make([]byte, width*c.Size())
	if err := c.Allgather(mine, all); err != nil {
		return 0, err
	}
	local := 0
	for r := 0; r < c.Rank(); r++ {
		if string(all[r*width:(r+1)*width]) == string(mine) {
			local++
		}
	}
	return local, nil
}

// agree makes every rank of c return an error if any rank's err is not nil
// (mpi.AgreeOnError: the lowest failing rank's message), naming op.
func agree(c *mpi.Comm, op string, err error) error {
	if err := mpi.AgreeOnError(c, err); err != nil {
		return fmt.Errorf("gpu: %s: %w", op, err)
	}
	return nil
}

// Rank returns this rank's place in the communicator.
func (c *NCCLComm) Rank() int { return c.rank }

// Size returns the number of ranks.
func (c *NCCLComm) Size() int { return c.size }

// Device returns the device this rank uses.
func (c *NCCLComm) Device() *CUDADevice { return c.dev }

// Transfer is one point-to-point message of SendRecv: Bytes bytes at device
// address Ptr, to or from rank Peer. Both sides give the same Bytes. A send
// may say that only its first Used bytes carry data (Partial): a transport
// that can move less than a fixed size (NodeComm's IPC) moves only those,
// and the receiver's bytes past them are then unspecified; an NCCL group
// moves Bytes whatever Used says.
type Transfer struct {
	Peer    int
	Ptr     DevicePtr
	Bytes   int
	Partial bool // only the first Used bytes carry data
	Used    int
}

// carried is the bytes of t that carry data.
func (t Transfer) carried() int {
	if t.Partial {
		return t.Used
	}
	return t.Bytes
}

// SendRecv posts sends and receives in one NCCL group (ncclGroupStart,
// ncclSend/ncclRecv per transfer, ncclGroupEnd) on stream s (nil: the
// default stream), so that they progress together and cannot deadlock on
// their order: the transport of a GPU dispatch or combine. Every send must
// match a receive of the same size on its peer. Transfers between this
// rank and itself are device-to-device copies queued on s first, the k-th
// send to itself going to the k-th receive from itself: NCCL moves them
// through its own channels, at a fraction of the device's copy bandwidth.
// The communicator being non-blocking, the group may still be being
// enqueued when SendRecv returns: AsyncError says ErrInProgress until it
// is on s.
func (c *NCCLComm) SendRecv(s Stream, sends, recvs []Transfer) error {
	if len(sends)+len(recvs) == 0 {
		return nil
	}
	cs, err := cudaStream(s)
	if err != nil {
		return err
	}
	if _, err := c.handle("SendRecv"); err != nil {
		return err
	}
	var self [2][]Transfer
	var peers [2][]Transfer
	for k, list := range [][]Transfer{sends, recvs} {
		for _, t := range list {
			if t.Peer < 0 || t.Peer >= c.size || t.Bytes < 0 || (t.Bytes > 0 && t.Ptr == 0) {
				return fmt.Errorf("gpu: SendRecv: bad transfer %+v for %d ranks", t, c.size)
			}
			if t.Peer == c.rank {
				self[k] = append(self[k], t)
			} else {
				peers[k] = append(peers[k], t)
			}
		}
	}
	if len(self[0]) != len(self[1]) {
		return fmt.Errorf("gpu: SendRecv: %d sends to this rank itself and %d receives from it", len(self[0]), len(self[1]))
	}
	for i, t := range self[0] {
		if t.Bytes != self[1][i].Bytes {
			return fmt.Errorf("gpu: SendRecv: send %d to this rank itself has %d bytes, its receive %d", i, t.Bytes, self[1][i].Bytes)
		}
	}
	for i, t := range self[0] {
		if t.Bytes == 0 {
			continue
		}
		if err := cuErr("cuMemcpyDtoDAsync", C.goep_cu_memcpy_dtod_async(c.dev.ctx, C.uint64_t(self[1][i].Ptr), C.uint64_t(t.Ptr), C.size_t(t.Bytes), cs.handle())); err != nil {
			return err
		}
	}
	return c.group(cs, peers[0], peers[1])
}

// group posts sends and receives as one NCCL group on cs, whatever their
// peers.
func (c *NCCLComm) group(cs *CUDAStream, sends, recvs []Transfer) error {
	n := len(sends) + len(recvs)
	if n == 0 {
		return nil
	}
	comm, err := c.handle("SendRecv")
	if err != nil {
		return err
	}
	isRecv := make([]C.int, 0, n)
	peers := make([]C.int, 0, n)
	ptrs := make([]C.uint64_t, 0, n)
	bytes := make([]C.uint64_t, 0, n)
	for k, list := range [][]Transfer{sends, recvs} {
		for _, t := range list {
			isRecv = append(isRecv, C.int(k))
			peers = append(peers, C.int(t.Peer))
			ptrs = append(ptrs, C.uint64_t(t.Ptr))
			bytes = append(bytes, C.uint64_t(t.Bytes))
		}
	}
	r := C.goep_nccl_send_recv(c.dev.ctx, comm, cs.handle(), C.int(n), &isRecv[0], &peers[0], &ptrs[0], &bytes[0])
	if r == ncclInProgress {
		return nil
	}
	return ncclErr("ncclSend/ncclRecv group", r, comm)
}

const ncclInProgress = 7 // ncclInProgress: a non-blocking operation still running

// AsyncError is the communicator's state (ncclCommGetAsyncError): nil while
// all is well, ErrInProgress while a call still runs in the background, an
// *NCCLError once an operation failed (a peer's connection broke, say), an
// error once the communicator is closed or aborted. NCCL has no timeouts:
// the caller polls this and calls Abort past its deadline.
func (c *NCCLComm) AsyncError() error {
	comm, err := c.handle("AsyncError")
	if err != nil {
		return err
	}
	var state C.int
	if err := ncclErr("ncclCommGetAsyncError", C.goep_nccl_comm_get_async_error(comm, &state), comm); err != nil {
		return err
	}
	switch state {
	case 0:
		return nil
	case ncclInProgress:
		return ErrInProgress
	}
	return ncclErr("an asynchronous NCCL operation", state, comm)
}

// Close flushes the communicator's queued work and frees it
// (ncclCommFinalize, polled until done, then ncclCommDestroy); past the
// communicator's timeout, or on a failure, it aborts it instead. Closing a
// closed or aborted communicator does nothing.
func (c *NCCLComm) Close() error {
	h := c.h.Load()
	if h == nil {
		return nil
	}
	r := C.goep_nccl_comm_finalize(c.dev.ctx, h.comm)
	if r != 0 && r != ncclInProgress {
		err := ncclErr("ncclCommFinalize", r, h.comm)
		_ = c.Abort()
		return err
	}
	if err := c.settle("ncclCommFinalize"); err != nil {
		return err // aborted
	}
	if h = c.h.Swap(nil); h == nil {
		return nil
	}
	return ncclErr("ncclCommDestroy", C.goep_nccl_comm_destroy(c.dev.ctx, h.comm), nil)
}

// Abort destroys the communicator at once, abandoning queued work (the
// kernels of queued groups return): for error paths, where a peer may
// never arrive. Only the first call of Abort or Close does anything.
func (c *NCCLComm) Abort() error {
	h := c.h.Swap(nil)
	if h == nil {
		return nil
	}
	return ncclErr("ncclCommAbort", C.goep_nccl_comm_abort(c.dev.ctx, h.comm), nil)
}
