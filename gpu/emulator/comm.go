package emulator

import (
	"errors"
	"fmt"
	"math/rand/v2"
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

// Comm is an emulated NCCL communicator of one rank, a gpu.Comm:
// grouped point-to-point transfers between the emulated devices of an MPI
// job's ranks, with an NCCL communicator's rules, never kinder:
//
//   - It is non-blocking (ncclCommInitRankConfig with blocking = 0):
//     SendRecv returns at once and puts its group on the stream later, in
//     the background; until then AsyncError says gpu.ErrInProgress, the
//     stream refuses other work, and another SendRecv or Close is a
//     misuse. The first group a rank posts with a peer waits, before it
//     reaches the stream, until that peer has posted its first group with
//     this rank, as NCCL connects a pair only when both sides take part.
//   - One goroutine at a time: a call made while another goroutine is
//     inside one (an Abort from a watchdog during SendRecv, say) is a
//     misuse. A misuse is sticky: AsyncError, SendRecv and Close return
//     it from then on.
//   - A send and a receive of different sizes hang, as NCCL's do, until
//     Abort (a timeout then names the peer), instead of failing clearly.
type Comm struct {
	d          *Device
	mc         *mpi.Comm // the communicator's own, for its transfers
	hs         *mpi.Comm // and its connections' handshakes
	rank, size int
	id         mpi.UniqueID
	timeout    time.Duration // how long Close waits for the queued groups
	aborted    atomic.Bool
	busy       atomic.Int32 // goroutines inside a call
	pending    atomic.Bool  // a group is being put on its stream
	inflight   atomic.Int64 // groups on a stream and not finished
	connected  []bool       // per peer: the pair has posted a group together (the caller's goroutine only)

	mu       sync.Mutex
	asyncErr error // the first failure of a queued group
	misuse   error // the first call NCCL would not allow
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
// rank 0's (where NCCL would wait for ever), naming the rank. Close waits
// for the queued groups for at most c's timeout. The emulated transfers
// run on the streams' goroutines, so MPI must provide MPI_THREAD_MULTIPLE.
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
	hs, err := c.Split(0, c.Rank(), "emulated nccl connections "+id.Digest())
	if err != nil {
		_ = mc.Free()
		return nil, fmt.Errorf("emulator: NewComm: %w", err)
	}
	return &Comm{d: d, mc: mc, hs: hs, rank: mc.Rank(), size: mc.Size(), id: id, timeout: c.Timeout(),
		connected: make([]bool, mc.Size())}, nil
}

// ID is the unique ID the communicator was created from.
func (c *Comm) ID() mpi.UniqueID { return c.id }

// Rank is this rank's place in the communicator.
func (c *Comm) Rank() int { return c.rank }

// Size is the number of ranks.
func (c *Comm) Size() int { return c.size }

// enter marks a call as in progress; a second goroutine inside a call at
// the same time is a misuse. The caller defers leave.
func (c *Comm) enter(op string) {
	if c.busy.Add(1) != 1 {
		_ = c.misused(fmt.Errorf("emulator: %s called while another goroutine was inside a call on the same communicator: NCCL allows no concurrent calls on one communicator (and ncclCommAbort frees it)", op))
	}
	if c.d.jitter.Load() > 0 {
		runtime.Gosched() // widen the window in which a concurrent call shows
	}
}

func (c *Comm) leave() { c.busy.Add(-1) }

// misused records err as the communicator's first misuse and returns the
// first one.
func (c *Comm) misused(err error) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.misuse == nil {
		c.misuse = err
	}
	return c.misuse
}

// usable is nil unless the communicator was aborted, closed or misused.
func (c *Comm) usable(op string) error {
	if c.aborted.Load() {
		return fmt.Errorf("emulator: %s: %w", op, ErrAborted)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.misuse != nil {
		return c.misuse
	}
	if c.closed {
		return fmt.Errorf("emulator: %s: the communicator is closed", op)
	}
	return nil
}

// SendRecv posts, for stream s, one group of transfers: every send and
// receive is posted when the stream reaches the group, and the stream goes
// on when all have completed, as an NCCL group does (ncclGroupStart,
// ncclSend and ncclRecv, ncclGroupEnd). Transfers between two ranks match
// in the order they are listed, and must agree in size. Transfers with this
// rank itself are copies, the k-th send to itself going to the k-th
// receive from itself. The arguments are checked now; the group reaches
// the stream in the background (AsyncError says gpu.ErrInProgress until
// it has), after this rank's first group with each new peer has met that
// peer's. A failure while the group runs (an MPI error) is reported by
// AsyncError.
func (c *Comm) SendRecv(gs gpu.Stream, sends, recvs []gpu.Transfer) error {
	c.enter("SendRecv")
	defer c.leave()
	if err := c.usable("SendRecv"); err != nil {
		return err
	}
	if c.pending.Load() {
		return c.misused(errors.New("emulator: SendRecv while the previous one was still in progress: NCCL requires polling AsyncError until it is no longer ncclInProgress first"))
	}
	s, ok := gs.(*Stream)
	if !ok || s == nil || s.d != c.d {
		return fmt.Errorf("emulator: SendRecv: needs a stream of %v, not %T", c.d, gs)
	}
	var msgs [2][]mpi.Message
	var self [2][]gpu.Transfer
	var fresh []int // peers this rank has not posted a group with before
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
				continue
			}
			msgs[k] = append(msgs[k], mpi.Message{Peer: t.Peer, Addr: uintptr(t.Ptr), Bytes: t.Bytes})
			if !c.connected[t.Peer] {
				c.connected[t.Peer] = true
				fresh = append(fresh, t.Peer)
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
	group := op{f: func() error {
		defer c.inflight.Add(-1)
		for i, t := range self[0] {
			kernels.Copy(uint64(self[1][i].Ptr), uint64(t.Ptr), t.Bytes)
		}
		c.run(msgs[0], msgs[1])
		return nil
	}}
	c.pending.Store(true)
	s.enqueuing.Store(c)
	go c.enqueue(s, group, fresh)
	return nil
}

// enqueue puts a group on its stream in the background, as a non-blocking
// NCCL communicator does: after a delay (the jitter), and, for a peer this
// rank meets for the first time, after that peer has posted its own first
// group with this rank. An abort meanwhile drops the group.
func (c *Comm) enqueue(s *Stream, group op, fresh []int) {
	defer func() {
		s.enqueuing.Store(nil)
		c.pending.Store(false)
	}()
	if j := c.d.jitter.Load(); j > 0 {
		time.Sleep(time.Duration(rand.Int64N(j)))
	}
	if len(fresh) > 0 && !c.connect(fresh) {
		return
	}
	c.inflight.Add(1)
	if err := s.pushNow(group); err != nil {
		c.inflight.Add(-1)
		c.setAsyncErr(err)
	}
}

// connect exchanges a handshake with each peer, as NCCL connects a pair
// when both have posted a transfer to each other; false if the
// communicator was aborted first.
func (c *Comm) connect(peers []int) bool {
	buf, err := mpi.NewBuffer(2 * len(peers))
	if err != nil {
		c.setAsyncErr(err)
		return false
	}
	defer func() { _ = buf.Free() }()
	var sends, recvs []mpi.Message
	for i, p := range peers {
		sends = append(sends, mpi.Message{Peer: p, Addr: buf.Addr(2 * i), Bytes: 1})
		recvs = append(recvs, mpi.Message{Peer: p, Addr: buf.Addr(2*i + 1), Bytes: 1})
	}
	x, err := c.hs.Exchange(sends, recvs)
	if err != nil {
		c.setAsyncErr(err)
		return false
	}
	start := time.Now()
	for {
		done, err := x.Test()
		if err != nil {
			c.setAsyncErr(err)
			x.Cancel()
			return false
		}
		if done {
			return true
		}
		if c.aborted.Load() {
			x.Cancel() // the handshake's buffer is freed only if no send is left
			return false
		}
		gpu.Backoff(time.Since(start))
	}
}

// run posts and completes one group's messages on a stream's goroutine;
// failures go to asyncErr. Messages of sizes the two sides disagree on
// hang until Abort, as NCCL's do.
func (c *Comm) run(sends, recvs []mpi.Message) {
	if len(sends)+len(recvs) == 0 || c.aborted.Load() {
		return
	}
	x, err := c.mc.Exchange(sends, recvs)
	if err != nil {
		c.setAsyncErr(err)
		return
	}
	start := time.Now()
	for {
		done, err := x.Test()
		if errors.Is(err, mpi.ErrMessageSize) {
			for !c.aborted.Load() {
				time.Sleep(time.Millisecond)
			}
			c.cancel(x, sends)
			return
		}
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
		gpu.Backoff(time.Since(start))
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

// AsyncError is the communicator's state (as ncclCommGetAsyncError): nil
// while all is well, gpu.ErrInProgress while a group is being put on its
// stream, the first failure of a queued group or the first misuse, and
// ErrAborted after Abort.
func (c *Comm) AsyncError() error {
	c.enter("AsyncError")
	defer c.leave()
	if c.aborted.Load() {
		return ErrAborted
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.misuse != nil {
		return c.misuse
	}
	if c.asyncErr != nil {
		return c.asyncErr
	}
	if c.pending.Load() {
		return gpu.ErrInProgress
	}
	return nil
}

// Abort abandons the queued groups: a group waiting for a peer returns,
// and its stream goes on. Later calls return ErrAborted.
func (c *Comm) Abort() error {
	c.enter("Abort")
	defer c.leave()
	c.aborted.Store(true)
	return nil
}

// Close waits for the queued groups to finish, for at most the timeout the
// communicator was made with (past it, it aborts them), and frees the
// communicator's MPI communicators. It is collective. It returns the
// communicator's misuse, if there was one, so that a test sees it.
func (c *Comm) Close() error {
	c.enter("Close")
	defer c.leave()
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	c.mu.Unlock()
	var errs []error
	if c.pending.Load() && !c.aborted.Load() {
		errs = append(errs, c.misused(errors.New("emulator: Close while a SendRecv was still in progress: NCCL requires polling AsyncError until it is no longer ncclInProgress first")))
	}
	start := time.Now()
	for !c.aborted.Load() && (c.inflight.Load() > 0 || c.pending.Load()) {
		if c.timeout > 0 && time.Since(start) > c.timeout {
			c.aborted.Store(true)
			errs = append(errs, fmt.Errorf("emulator: Close: the queued groups did not finish within %v: aborted", c.timeout))
			break
		}
		gpu.Backoff(time.Since(start))
	}
	c.mu.Lock()
	if c.misuse != nil && len(errs) == 0 {
		errs = append(errs, c.misuse)
	}
	c.mu.Unlock()
	errs = append(errs, c.hs.Free(), c.mc.Free())
	return errors.Join(errs...)
}
