package emulator

import (
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/goep/goep/gpu"
	"github.com/goep/goep/gpu/internal/kernels"
	"github.com/goep/goep/mpi"
)

// ErrAborted is matched (errors.Is) by Comm's errors once it is aborted.
var ErrAborted = errors.New("emulator: the communicator was aborted")

// Comm is an emulated NCCL communicator of one rank, a gpu.Comm: grouped
// point-to-point transfers between the emulated devices of an MPI job's
// ranks.
type Comm struct {
	d          *Device
	mc         *mpi.Comm // the communicator's own, for its messages only
	rank, size int
	id         mpi.UniqueID
	aborted    atomic.Bool

	mu       sync.Mutex
	asyncErr error // the first failure of a queued group
	closed   bool
}

// idMagic opens every ID that UniqueID makes, so that NewComm tells them
// from IDs of another kind (an NCCL one, or none at all).
var idMagic = [8]byte{'g', 'o', 'e', 'p', 'e', 'm', 'u', 1}

// UniqueID makes the unique ID of an emulated communicator, as
// ncclGetUniqueId makes an NCCL one: an mpi.IDGenerator, for
// mpi.BootstrapID(world, 0, emulator.UniqueID). The ID carries a mark of
// its kind and random bytes (mpi.HostID), so that two jobs' IDs differ.
func UniqueID() (mpi.UniqueID, error) {
	id, err := mpi.HostID()
	if err != nil {
		return id, err
	}
	copy(id[:], idMagic[:])
	return id, nil
}

var _ mpi.IDGenerator = UniqueID

// NewComm creates a communicator over the ranks of c, this rank on device
// d, from id, the unique ID that one rank made (UniqueID) and every rank
// was given over MPI (mpi.BootstrapID), as ncclCommInitRank creates one
// from an NCCL ID. It is collective over c: every rank returns an error,
// the same, if any rank's id is not one UniqueID made or differs from
// rank 0's (where NCCL would wait for ever), naming the rank. The emulated
// transfers run on the streams' goroutines, so MPI must provide
// MPI_THREAD_MULTIPLE.
func NewComm(d *Device, c *mpi.Comm, id mpi.UniqueID) (*Comm, error) {
	if lvl := mpi.ThreadLevel(); lvl != mpi.ThreadMultiple {
		// Every rank has the same MPI library, so every rank returns this.
		return nil, fmt.Errorf("emulator: NewComm: MPI provides thread level %d, not MPI_THREAD_MULTIPLE (%d): the emulated transfers run on the streams' goroutines", lvl, mpi.ThreadMultiple)
	}
	var err error
	if [8]byte(id[:8]) != idMagic {
		err = fmt.Errorf("ID %s was not made by emulator.UniqueID (its first bytes are % x)", id.Digest(), id[:8])
	}
	if err = mpi.AgreeOnError(c, err); err == nil {
		err = mpi.CheckSameID(c, 0, id)
	}
	if err != nil {
		return nil, fmt.Errorf("emulator: NewComm: %w", err)
	}
	mc, err := c.Split(0, c.Rank(), "emulated nccl "+id.Digest())
	if err != nil {
		return nil, fmt.Errorf("emulator: NewComm: %w", err)
	}
	return &Comm{d: d, mc: mc, rank: mc.Rank(), size: mc.Size(), id: id}, nil
}

// ID is the unique ID the communicator was created from.
func (c *Comm) ID() mpi.UniqueID { return c.id }

// Rank is this rank's place in the communicator.
func (c *Comm) Rank() int { return c.rank }

// Size is the number of ranks.
func (c *Comm) Size() int { return c.size }

// SendRecv queues, on stream s, one group of transfers: every send and
// receive is posted when the stream reaches the group, and the stream goes
// on when all have completed, as an NCCL group does (ncclGroupStart,
// ncclSend and ncclRecv, ncclGroupEnd). Transfers between two ranks match
// in the order they are listed, and must agree in size. Transfers with this
// rank itself are copies, the k-th send to itself going to the k-th
// receive from itself. The arguments are checked now; a failure while the
// group runs (a size mismatch, an MPI error) is reported by AsyncError.
func (c *Comm) SendRecv(gs gpu.Stream, sends, recvs []gpu.Transfer) error {
	if err := c.usable("SendRecv"); err != nil {
		return err
	}
	s, ok := gs.(*Stream)
	if !ok || s == nil || s.d != c.d {
		return fmt.Errorf("emulator: SendRecv: needs a stream of %v, not %T", c.d, gs)
	}
	var msgs [2][]mpi.Message
	var self [2][]gpu.Transfer
	for k, list := range [][]gpu.Transfer{sends, recvs} {
		for _, t := range list {
			if t.Peer < 0 || t.Peer >= c.size || t.Bytes < 0 || (t.Bytes > 0 && t.Ptr == 0) {
				return fmt.Errorf("emulator: SendRecv: bad transfer %+v for %d ranks", t, c.size)
			}
			if !c.d.Inside(t.Ptr, t.Bytes) {
				return fmt.Errorf("emulator: SendRecv: transfer %+v is not inside an allocation of %v", t, c.d)
			}
			if t.Peer == c.rank {
				self[k] = append(self[k], t)
			} else {
				msgs[k] = append(msgs[k], mpi.Message{Peer: t.Peer, Addr: uintptr(t.Ptr), Bytes: t.Bytes})
			}
		}
	}
	if len(self[0]) != len(self[1]) {
		return fmt.Errorf("emulator: SendRecv: %d sends to this rank itself and %d receives from it", len(self[0]), len(self[1]))
	}
	for i := range self[0] {
		if self[0][i].Bytes != self[1][i].Bytes {
			return fmt.Errorf("emulator: SendRecv: send %d to this rank itself has %d bytes, its receive %d", i, self[0][i].Bytes, self[1][i].Bytes)
		}
	}
	if len(msgs[0])+len(msgs[1])+len(self[0]) == 0 {
		return nil
	}
	return s.enqueue(func() error {
		for i, t := range self[0] {
			kernels.Copy(uint64(self[1][i].Ptr), uint64(t.Ptr), t.Bytes)
		}
		c.run(msgs[0], msgs[1])
		return nil
	})
}

// run posts and completes one group's messages on a stream's goroutine;
// failures go to asyncErr.
func (c *Comm) run(sends, recvs []mpi.Message) {
	if len(sends)+len(recvs) == 0 || c.aborted.Load() {
		return
	}
	x, err := c.mc.Exchange(sends, recvs)
	if err != nil {
		c.setAsyncErr(err)
		return
	}
	for spin := 0; ; spin++ {
		done, err := x.Test()
		if err != nil {
			c.setAsyncErr(err)
			c.cancel(x, sends)
			return
		}
		if done {
			return
		}
		if c.aborted.Load() {
			c.cancel(x, sends)
			return
		}
		// Poll like a rank with fewer cores than ranks must: yield first,
		// then short sleeps.
		if spin < 64 {
			runtime.Gosched()
		} else {
			time.Sleep(time.Duration(min(spin, 400)) * time.Microsecond / 2)
		}
	}
}

// cancel abandons x; sends MPI keeps hold their device memory for ever.
func (c *Comm) cancel(x *mpi.Exchange, sends []mpi.Message) {
	if x.Cancel() {
		for _, m := range sends {
			c.d.hold(gpu.DevicePtr(m.Addr), m.Bytes)
		}
	}
}

func (c *Comm) setAsyncErr(err error) {
	c.mu.Lock()
	if c.asyncErr == nil {
		c.asyncErr = fmt.Errorf("emulator: a queued SendRecv group failed: %w", err)
	}
	c.mu.Unlock()
}

func (c *Comm) usable(op string) error {
	if c.aborted.Load() {
		return fmt.Errorf("emulator: %s: %w", op, ErrAborted)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return fmt.Errorf("emulator: %s: the communicator is closed", op)
	}
	return nil
}

// AsyncError reports the failure of a queued group (as
// ncclCommGetAsyncError): nil while all is well, ErrAborted after Abort.
// Any goroutine may call it.
func (c *Comm) AsyncError() error {
	if c.aborted.Load() {
		return ErrAborted
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.asyncErr
}

// Abort abandons the queued groups: a group waiting for a peer returns,
// and its stream goes on. Any goroutine may call it, once or more.
func (c *Comm) Abort() error {
	c.aborted.Store(true)
	return nil
}

// Close frees the communicator's MPI communicator. It is collective; the
// streams that ran its groups must have finished them.
func (c *Comm) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	c.mu.Unlock()
	return c.mc.Free()
}
