package epcpu

import (
	"errors"
	"fmt"

	"github.com/goep/goep/mpi"
)

// network carries this rank's writes into the staging memory of the ranks
// of other nodes: PutBlocks writes, and the writes bound for this rank land
// in its Local memory by the time Progress returns, or later; data put
// before a flag to the same rank lands no later than the flag.
type network interface {
	Local() []byte
	PutBlocks(origin []byte, blocks []mpi.Block) error
	// PutBlocksInPlace is PutBlocks where large blocks may go straight
	// from origin (engine memory outside the Go heap) into the targets'
	// memories: origin must stay as it is until InPlaceSent(put).
	PutBlocksInPlace(origin []byte, blocks []mpi.Block) (put uint64, err error)
	// InPlaceSent says whether the sends of the puts numbered put or less
	// have left their origins; where not, to a rank one is still for.
	InPlaceSent(put uint64) (bool, int)
	Progress() error
	// Drain is Progress until what was sent to this rank a while ago has
	// landed.
	Drain() error
	Free() error
}

// networkKind is a way across nodes for the CPU engine: what its networks
// can do, known before one is opened (the group's footprint is checked
// first), and how to open one. The modes ask the transport for what a
// network can do (transport.inPlace, transport.landsFinal), never which
// kind it is.
type networkKind interface {
	// suffix follows "cpu" in the backend's name.
	suffix() string
	caps() networkCaps
	// open gives every rank of comm size bytes of staging memory that the
	// ranks of other nodes write into; seg is the rank's segment, which a
	// network that lands in place reaches too (at offsets from size). It
	// is collective.
	open(comm *mpi.Comm, size int, seg []byte) (network, error)
}

// networkCaps is what a kind of network can do.
type networkCaps struct {
	// sendsInPlace: PutBlocksInPlace sends large blocks straight from the
	// segment, which must stay as it is until InPlaceSent.
	sendsInPlace bool
	// landsInPlace: a write may target the receiver's segment, past its
	// staging memory, so that rows land in their final place.
	landsInPlace bool
	// copies bounds the messages a rank holds at once, in sizes of its
	// staging memory (Footprint.CopiesPerRank).
	copies int
}

// mailboxNet is messages (mpi.Mailbox), the CPU engine's default: they
// complete through point-to-point progress, which every MPI transport gives.
type mailboxNet struct{}

func (mailboxNet) suffix() string { return "" }

// caps: large blocks go and land in place; the packed copies of what a
// rank sends and the message it receives are each at most its staging.
func (mailboxNet) caps() networkCaps {
	return networkCaps{sendsInPlace: true, landsInPlace: true, copies: 2}
}

func (mailboxNet) open(comm *mpi.Comm, size int, seg []byte) (network, error) {
	m, err := comm.NewMailboxAttached(size, seg)
	if err != nil {
		return nil, err
	}
	return m, nil
}

// oneSidedNet is one-sided MPI: puts into a staging window, each flushed
// before PutBlocks returns.
type oneSidedNet struct{}

func (oneSidedNet) suffix() string { return "-onesided" }

// caps: a put is complete when it returns, so nothing is sent in place or
// held; it reaches the staging window only.
func (oneSidedNet) caps() networkCaps { return networkCaps{} }

func (oneSidedNet) open(comm *mpi.Comm, size int, _ []byte) (network, error) {
	w, err := comm.AllocateWindow(size)
	if err != nil {
		return nil, fmt.Errorf("%w (one-sided MPI across hosts needs a component that works there with "+
			"MPI_THREAD_MULTIPLE, as Open MPI's osc=sm,ucx)", err)
	}
	if err := w.LockAll(); err != nil {
		return nil, errors.Join(err, w.Free())
	}
	return oneSided{w}, nil
}

// oneSided is the network of one-sided MPI: puts complete (flushed) when
// PutBlocks returns; Progress lets MPI serve the peers' puts into this
// rank (over TCP, osc/ucx completes them only while the target calls MPI)
// and makes them visible (MPI_Win_sync).
type oneSided struct{ *mpi.Window }

func (o oneSided) Progress() error { return errors.Join(o.Window.Progress(), o.Window.Sync()) }

// Drain is Progress: a put that completed at its origin is in place.
func (o oneSided) Drain() error { return o.Progress() }

// PutBlocksInPlace is PutBlocks: a put is flushed, so its origin is free,
// when it returns.
func (o oneSided) PutBlocksInPlace(origin []byte, blocks []mpi.Block) (uint64, error) {
	return 0, o.PutBlocks(origin, blocks)
}

// InPlaceSent: every put has left its origin when it returned.
func (o oneSided) InPlaceSent(uint64) (bool, int) { return true, -1 }
