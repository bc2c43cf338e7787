package gpu

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/goep/goep/mpi"
)

// NodeComm is a Comm whose transfers between the ranks of one node go
// through CUDA IPC, each moving only the bytes its send carries
// (Transfer.Partial, Used), and whose transfers to ranks of other nodes go through an
// inner communicator (NCCL's; none when every rank is on one node). It needs
// no NCCL inside a node, so several ranks may share one GPU whatever NCCL's
// version.
//
// The ranks of a node share a window of host memory (MPI_Win_allocate_shared)
// that holds, for every ordered pair, a ring of transfer descriptors and two
// counters. A group runs in the background, as a non-blocking NCCL group
// does (AsyncError says ErrInProgress until it is done):
//
//  1. the transfers to this rank itself are copies on the stream, and the
//     other nodes' transfers are posted on the inner communicator;
//  2. with sends to node peers: the stream's work before the group is
//     waited for (an event), then each send is published to its receiver
//     as a descriptor: the IPC handle of the allocation that holds it, its
//     offset, its size and its used bytes;
//  3. each receive from a node peer waits for the peer's next descriptor,
//     maps its allocation (once; IPCOpen), and copies the used bytes from
//     it, on a stream of the communicator's own that first waits for the
//     caller's stream's work before the group; once those copies are done
//     (an event), the receiver counts them consumed in the sender's part
//     of the window, and the caller's stream waits for them;
//  4. the group waits until its receivers have consumed every send, so
//     that the sender may reuse its buffers.
//
// Transfers between two ranks match in the order they are listed, across
// groups (as NCCL's do): the k-th send to a peer is its k-th receive from
// this rank. A send whose size differs from its receive's is an error of
// AsyncError naming both, not a hang. The host is on the path: each group
// with node peers waits for two events; the device moves only the rows
// the routing needs.
type NodeComm struct {
	dev        IPCDevice
	inner      Comm // the other nodes' transfers; nil on one node
	rank, size int
	local      []int // per rank: its place in the node window, -1 on another node
	nodeComm   *mpi.Comm
	win        *mpi.SharedWindow
	lay        ringLayout
	timeout    time.Duration
	cp         Stream // the copies from node peers
	ready      Event  // the caller's stream before a group
	pulled     Event  // a group's copies from its node peers, on cp

	// Per node peer (by place in the window): descriptors this rank has
	// published to it, and taken from it.
	sent, taken []uint64

	opened map[IPCHandle]DevicePtr // node peers' allocations mapped here

	pending atomic.Bool   // a group is running in the background
	waiting atomic.Int64  // the rank the group waits for, -1 for none
	stop    atomic.Bool   // Abort asks the group to stop
	done    chan struct{} // closed when the background group returns

	mu      sync.Mutex
	failure error
	aborted bool
	closed  bool

	moved, full atomic.Int64 // bytes copied between node peers, and what their transfers' sizes were
}

// ringSlots is how many descriptors a pair's ring holds: a sender publishes
// at most that many ahead of its receiver.
const ringSlots = 32

// A descriptor: the handle, the offset in the allocation, the transfer's
// bytes and used bytes.
const descBytes = 64 + 3*8

// ringLayout places, in each rank's part of the window, for each node peer
// s: the ring of descriptors s publishes to this rank and the count s has
// published (written by s), then the count of this rank's descriptors s has
// consumed (written by s).
type ringLayout struct{ peers, ring, counters, size int }

func newRingLayout(peers int) ringLayout {
	ring := (ringSlots*descBytes + 63) / 64 * 64
	l := ringLayout{peers: peers, ring: ring}
	l.counters = peers * ring
	l.size = l.counters + 2*peers*64
	return l
}

func (l ringLayout) slot(from, k int) int   { return from*l.ring + (k%ringSlots)*descBytes }
func (l ringLayout) published(from int) int { return l.counters + 2*from*64 }
func (l ringLayout) consumed(by int) int    { return l.counters + (2*by+1)*64 }

// NewNodeComm makes a NodeComm over the ranks of world, this rank on dev,
// with inner for the transfers to other nodes (nil when world is one node;
// it must span world's ranks, with world's numbering). It is collective.
// Groups and Close wait for the node peers for at most timeout.
func NewNodeComm(world *mpi.Comm, dev IPCDevice, inner Comm, timeout time.Duration) (*NodeComm, error) {
	topo, err := world.Topology()
	if err != nil {
		return nil, err
	}
	c := &NodeComm{dev: dev, inner: inner, rank: world.Rank(), size: world.Size(), local: make([]int, world.Size()),
		nodeComm: topo.NodeComm, timeout: timeout, opened: map[IPCHandle]DevicePtr{}}
	c.waiting.Store(-1)
	for r := range c.local {
		c.local[r] = -1
		if topo.NodeOf[r] == topo.Node {
			c.local[r] = topo.LocalRankOf[r]
		}
	}
	if inner == nil && topo.Nodes > 1 {
		err = fmt.Errorf("gpu: NewNodeComm: %d nodes, and no communicator for the transfers between them", topo.Nodes)
	}
	if err == nil {
		c.lay = newRingLayout(topo.LocalSize)
		c.sent, c.taken = make([]uint64, topo.LocalSize), make([]uint64, topo.LocalSize)
		c.win, err = topo.NodeComm.AllocateShared(c.lay.size)
	}
	if err == nil {
		if c.ready, err = dev.NewEvent(); err == nil {
			if c.pulled, err = dev.NewEvent(); err == nil {
				c.cp, err = dev.NewStream()
			}
		}
	}
	if err != nil {
		_ = topo.NodeComm.Free()
		return nil, fmt.Errorf("gpu: NewNodeComm: %w", err)
	}
	return c, nil
}

// Moved is what the node's transfers moved since the communicator was made:
// the bytes copied between node peers, and the bytes a transport of fixed
// sizes (NCCL's) would have moved for the same transfers.
func (c *NodeComm) Moved() (moved, full int64) { return c.moved.Load(), c.full.Load() }

// word is the 64-bit counter at off in rank r's part of the window (r by
// place in the node), for atomic loads and stores.
func (c *NodeComm) word(r, off int) (*uint64, error) {
	seg, err := c.win.Peer(r)
	if err != nil {
		return nil, err
	}
	return (*uint64)(unsafe.Pointer(&seg[off])), nil
}

func (c *NodeComm) usable(op string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case c.aborted:
		return fmt.Errorf("gpu: %s: the node communicator has been aborted", op)
	case c.closed:
		return fmt.Errorf("gpu: %s: the node communicator is closed", op)
	case c.failure != nil:
		return c.failure
	}
	return nil
}

func (c *NodeComm) fail(err error) {
	c.mu.Lock()
	if c.failure == nil {
		c.failure = err
	}
	c.mu.Unlock()
}

// SendRecv posts one group on s (see NodeComm); it runs in the background
// until AsyncError is no longer ErrInProgress.
func (c *NodeComm) SendRecv(s Stream, sends, recvs []Transfer) error {
	if err := c.usable("SendRecv"); err != nil {
		return err
	}
	if c.pending.Load() {
		return errors.New("gpu: NodeComm.SendRecv: the previous group is still in progress: poll AsyncError until it is no longer ErrInProgress")
	}
	if s == nil {
		return errors.New("gpu: NodeComm.SendRecv: needs a stream")
	}
	var g nodeGroup
	for k, list := range [][]Transfer{sends, recvs} {
		for _, t := range list {
			if t.Peer < 0 || t.Peer >= c.size || t.Bytes < 0 || (t.Bytes > 0 && t.Ptr == 0) || t.Used < 0 || t.Used > t.Bytes {
				return fmt.Errorf("gpu: NodeComm.SendRecv: bad transfer %+v for %d ranks", t, c.size)
			}
			switch {
			case t.Peer == c.rank:
				g.self[k] = append(g.self[k], t)
			case c.local[t.Peer] >= 0:
				g.node[k] = append(g.node[k], t)
			default:
				g.remote[k] = append(g.remote[k], t)
			}
		}
	}
	if len(g.self[0]) != len(g.self[1]) {
		return fmt.Errorf("gpu: NodeComm.SendRecv: %d sends to this rank itself and %d receives from it", len(g.self[0]), len(g.self[1]))
	}
	for i, t := range g.self[0] {
		if t.Bytes != g.self[1][i].Bytes {
			return fmt.Errorf("gpu: NodeComm.SendRecv: send %d to this rank itself has %d bytes, its receive %d", i, t.Bytes, g.self[1][i].Bytes)
		}
	}
	if len(g.remote[0])+len(g.remote[1]) > 0 && c.inner == nil {
		return errors.New("gpu: NodeComm.SendRecv: a transfer to another node, and no communicator for them")
	}
	c.pending.Store(true)
	c.done = make(chan struct{})
	go c.run(s, &g)
	return nil
}

// nodeGroup is one group's transfers, [sends, receives] each: to this
// rank, to node peers, to other nodes.
type nodeGroup struct{ self, node, remote [2][]Transfer }

// run carries out a group; its failure goes to AsyncError.
func (c *NodeComm) run(s Stream, g *nodeGroup) {
	defer func() {
		close(c.done)
		c.pending.Store(false)
	}()
	if err := c.runGroup(s, g); err != nil {
		c.fail(err)
	}
}

var errStopped = errors.New("gpu: the node communicator was aborted")

func (c *NodeComm) runGroup(s Stream, g *nodeGroup) error {
	for i, t := range g.self[0] {
		if err := s.MemcpyDtoDAsync(g.self[1][i].Ptr, t.Ptr, t.Bytes); err != nil {
			return err
		}
	}
	node := len(g.node[0])+len(g.node[1]) > 0
	if node {
		// The point of s before this group: the sources are ready, and
		// the receive buffers free, once the stream gets there.
		if err := s.Record(c.ready); err != nil {
			return err
		}
	}
	// The other nodes' transfers first, so that a rank held up inside its
	// node has still posted them: its peers elsewhere then wait for the
	// rank that holds it up, and name that one.
	if len(g.remote[0])+len(g.remote[1]) > 0 {
		if err := c.inner.SendRecv(s, g.remote[0], g.remote[1]); err != nil {
			return err
		}
		if err := c.await(func() bool { return !errors.Is(c.inner.AsyncError(), ErrInProgress) }); err != nil {
			return err
		}
	}
	if !node {
		return nil
	}
	if len(g.node[0]) > 0 {
		if err := c.awaitEvent(c.ready); err != nil {
			return err
		}
		for _, t := range g.node[0] {
			if err := c.publish(t); err != nil {
				return err
			}
		}
	}
	// Receives, on the communicator's own stream (not behind the other
	// nodes' group), after the point of s before the group: each copy
	// queued once its descriptor is there; the copies queued so far are
	// completed and counted consumed before waiting for a descriptor, so
	// that a peer whose next group depends on them (a group it split in
	// two where this rank posted one) is not held up.
	if len(g.node[1]) > 0 {
		if err := c.cp.WaitEvent(c.ready); err != nil {
			return err
		}
	}
	var queued []Transfer
	for _, t := range g.node[1] {
		if len(queued) > 0 && !c.published(t) {
			if err := c.consume(queued); err != nil {
				return err
			}
			queued = queued[:0]
		}
		if err := c.pull(c.cp, t); err != nil {
			return err
		}
		queued = append(queued, t)
	}
	if len(queued) > 0 {
		if err := c.consume(queued); err != nil {
			return err
		}
	}
	if len(g.node[1]) > 0 {
		if err := s.WaitEvent(c.pulled); err != nil { // what follows on s reads the copies
			return err
		}
	}
	for _, t := range g.node[0] {
		p := c.local[t.Peer]
		w, err := c.word(c.local[c.rank], c.lay.consumed(p))
		if err != nil {
			return err
		}
		want := c.sent[p]
		if err := c.awaitPeer(t.Peer, func() bool { return atomic.LoadUint64(w) >= want }); err != nil {
			return err
		}
	}
	return nil
}

// published reports whether the descriptor of receive t is there.
func (c *NodeComm) published(t Transfer) bool {
	p, me := c.local[t.Peer], c.local[c.rank]
	w, err := c.word(me, c.lay.published(p))
	return err == nil && atomic.LoadUint64(w) > c.taken[p]
}

// consume waits for the copies queued for ts and counts them consumed in
// their senders' part of the window.
func (c *NodeComm) consume(ts []Transfer) error {
	if err := c.cp.Record(c.pulled); err != nil {
		return err
	}
	if err := c.awaitEvent(c.pulled); err != nil {
		return err
	}
	for _, t := range ts {
		p := c.local[t.Peer]
		w, err := c.word(p, c.lay.consumed(c.local[c.rank]))
		if err != nil {
			return err
		}
		atomic.StoreUint64(w, c.taken[p])
	}
	return nil
}

// WaitingFor is the rank the group in progress waits for (to publish a
// transfer, to consume one, or the inner communicator's), or -1: what a
// caller that gives up names.
func (c *NodeComm) WaitingFor() int { return int(c.waiting.Load()) }

// awaitPeer polls cond, which waits for rank peer, until it holds or the
// group is aborted.
func (c *NodeComm) awaitPeer(peer int, cond func() bool) error {
	c.waiting.Store(int64(peer))
	defer c.waiting.Store(-1)
	return c.await(cond)
}

// await polls cond until it holds or the group is aborted.
func (c *NodeComm) await(cond func() bool) error {
	start := time.Now()
	for !cond() {
		if c.stop.Load() {
			return errStopped
		}
		Backoff(time.Since(start))
	}
	return nil
}

// awaitEvent waits until ev's mark is reached.
func (c *NodeComm) awaitEvent(ev Event) error {
	var err error
	werr := c.await(func() bool {
		var done bool
		done, err = ev.Done()
		return done || err != nil
	})
	if werr != nil {
		return werr
	}
	return err
}

// publish writes t's descriptor into its receiver's ring and counts it
// published, once the ring has room.
func (c *NodeComm) publish(t Transfer) error {
	p, me := c.local[t.Peer], c.local[c.rank]
	k := c.sent[p]
	consumed, err := c.word(me, c.lay.consumed(p))
	if err != nil {
		return err
	}
	if err := c.awaitPeer(t.Peer, func() bool { return k-atomic.LoadUint64(consumed) < ringSlots }); err != nil {
		return err
	}
	var h IPCHandle
	off := 0
	if t.Bytes > 0 {
		if h, off, err = c.dev.IPCExport(t.Ptr); err != nil {
			return err
		}
	}
	seg, err := c.win.Peer(p)
	if err != nil {
		return err
	}
	used := t.carried()
	d := seg[c.lay.slot(me, int(k)):]
	copy(d[:64], h[:])
	binary.LittleEndian.PutUint64(d[64:], uint64(off))
	binary.LittleEndian.PutUint64(d[72:], uint64(t.Bytes))
	binary.LittleEndian.PutUint64(d[80:], uint64(used))
	c.sent[p] = k + 1
	w, err := c.word(p, c.lay.published(me))
	if err != nil {
		return err
	}
	atomic.StoreUint64(w, k+1) // after the descriptor: the receiver reads it only then
	return nil
}

// pull waits for the next descriptor from t's sender and queues the copy of
// its used bytes into t on s.
func (c *NodeComm) pull(s Stream, t Transfer) error {
	p, me := c.local[t.Peer], c.local[c.rank]
	k := c.taken[p]
	published, err := c.word(me, c.lay.published(p))
	if err != nil {
		return err
	}
	if err := c.awaitPeer(t.Peer, func() bool { return atomic.LoadUint64(published) > k }); err != nil {
		return err
	}
	seg, err := c.win.Peer(me)
	if err != nil {
		return err
	}
	d := seg[c.lay.slot(p, int(k)):]
	var h IPCHandle
	copy(h[:], d[:64])
	off, bytes, used := int(binary.LittleEndian.Uint64(d[64:])), int(binary.LittleEndian.Uint64(d[72:])), int(binary.LittleEndian.Uint64(d[80:]))
	if bytes != t.Bytes {
		return fmt.Errorf("gpu: NodeComm: transfer %d from rank %d has %d bytes, its receive here %d: the two sides disagree", k, t.Peer, bytes, t.Bytes)
	}
	c.taken[p] = k + 1
	c.full.Add(int64(bytes))
	if used == 0 {
		return nil
	}
	base, ok := c.opened[h]
	if !ok {
		if base, err = c.dev.IPCOpen(h); err != nil {
			return fmt.Errorf("gpu: NodeComm: mapping rank %d's memory: %w", t.Peer, err)
		}
		c.opened[h] = base
	}
	c.moved.Add(int64(used))
	return s.MemcpyDtoDAsync(t.Ptr, base+DevicePtr(off), used)
}

// AsyncError is nil when the last group is done and nothing failed,
// ErrInProgress while it runs, or its failure (or the inner
// communicator's).
func (c *NodeComm) AsyncError() error {
	if c.pending.Load() {
		return ErrInProgress
	}
	if err := c.usable("AsyncError"); err != nil {
		return err
	}
	if c.inner != nil {
		return c.inner.AsyncError()
	}
	return nil
}

// Abort stops the group in progress, aborts the inner communicator, and
// makes every later call fail. The streams go on: the copies already queued
// complete by themselves.
func (c *NodeComm) Abort() error {
	c.mu.Lock()
	if c.aborted {
		c.mu.Unlock()
		return nil
	}
	c.aborted = true
	c.mu.Unlock()
	c.stop.Store(true)
	if c.done != nil {
		<-c.done
	}
	if c.inner != nil {
		return c.inner.Abort()
	}
	return nil
}

// Close unmaps the node peers' memory once every node peer has come to
// Close (so that none frees memory another still maps), frees the window,
// and closes the inner communicator. It is collective, after Abort too; a
// node peer that does not come within the timeout leaves the window
// allocated and makes it return an error.
func (c *NodeComm) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	c.mu.Unlock()
	var errs []error
	if c.pending.Load() {
		errs = append(errs, errors.New("gpu: NodeComm.Close: a group is still in progress: poll AsyncError until it is no longer ErrInProgress first"))
		c.stop.Store(true)
		<-c.done
	}
	for _, p := range c.opened {
		errs = append(errs, c.dev.IPCClose(p))
	}
	c.opened = nil
	errs = append(errs, c.cp.Close(), c.ready.Close(), c.pulled.Close())
	if c.inner != nil {
		errs = append(errs, c.inner.Close())
	}
	if err := c.nodeComm.Arrive("NodeComm.Close", c.timeout); err != nil {
		return errors.Join(append(errs, err)...)
	}
	errs = append(errs, c.win.Free(), c.nodeComm.Free())
	return errors.Join(errs...)
}
