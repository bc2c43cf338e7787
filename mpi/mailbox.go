package mpi

import (
	"fmt"
	"time"
)

// Mailbox is memory of this rank that the other ranks write into by
// message: PutBlocks packs the blocks bound for each rank into one message
// and posts it without waiting, and a rank's writes land in its memory when
// it calls Progress, which applies the messages that arrived, each whole and
// those of one sender in the order sent. It does what a Window does for a
// protocol that raises a flag after its data (the flag in the same or a
// later PutBlocks to the same rank), without one-sided MPI: its messages
// complete through ordinary point-to-point progress, which every MPI
// transport gives, where Open MPI's one-sided component over TCP completes a
// put only while the target calls MPI, and lets a flush wait for a target
// with no deadline. A receiver that waits for a flag calls Progress while it
// waits; a sender never waits for a receiver.
//
// The memory starts zeroed. Only this rank reads and writes its Local
// memory (Progress writes it), so its Progress and its reads must not run
// at once.
type Mailbox struct {
	comm  *Comm // a communicator of its own, so its messages match nothing else
	h     mboxHandle
	local []byte
	sizes []int
	freed bool
}

// mailboxTag is the tag of every mailbox message (on the mailbox's own
// communicator).
const mailboxTag = 32013

// NewMailbox gives every rank of c size bytes (ranks may pass different
// sizes) that the others can write into with PutBlocks. It is collective.
func (c *Comm) NewMailbox(size int) (*Mailbox, error) {
	return c.NewMailboxAttached(size, nil)
}

// NewMailboxAttached is NewMailbox where the other ranks may also write
// into attached, memory of this rank's outside the Go heap (a shared
// window, say) that outlives the mailbox: its bytes are at offsets [size,
// size+len(attached)) of the rank's mailbox, past its own memory. Such
// writes land there when this rank calls Progress, in the order of all the
// others. It is collective.
func (c *Comm) NewMailboxAttached(size int, attached []byte) (*Mailbox, error) {
	if err := c.checkUsable("NewMailbox"); err != nil {
		return nil, err
	}
	if size < 0 {
		return nil, argErrorf("NewMailbox", "size %d is negative", size)
	}
	sizes := make([]int64, c.size)
	if err := AllgatherSlice(c, []int64{int64(size + len(attached))}, sizes); err != nil {
		return nil, err
	}
	own, err := c.Split(0, c.rank, c.name+"/mailbox")
	if err != nil {
		return nil, err
	}
	h, local, err := newMailbox(own, size, attached)
	if err != nil {
		return nil, fmt.Errorf("mpi: NewMailbox of %d bytes: %w", size, err)
	}
	m := &Mailbox{comm: own, h: h, local: local, sizes: make([]int, c.size)}
	for r, n := range sizes {
		m.sizes[r] = int(n)
	}
	return m, nil
}

// Local is this rank's memory.
func (m *Mailbox) Local() []byte { return m.local }

// PutBlocks sends every block from origin to its target: one message per
// target, in which the blocks keep their order. It returns at once, with
// origin free to reuse; a block lands when its target next calls Progress.
func (m *Mailbox) PutBlocks(origin []byte, blocks []Block) error {
	return m.put("Mailbox.PutBlocks", origin, blocks, false)
}

// PutBlocksInPlace is PutBlocks without copies of large blocks: a block of
// at least DirectMin bytes is sent straight from origin, as a message of its
// own, and received straight into its place in the target's memory (the
// smaller ones are packed as PutBlocks packs them). The order of writes is
// PutBlocks's. origin must be memory outside the Go heap (a window, a
// Buffer) and must stay as it is until InPlaceSent(put) is true; put
// numbers the calls, from 1.
func (m *Mailbox) PutBlocksInPlace(origin []byte, blocks []Block) (put uint64, err error) {
	if err := m.put("Mailbox.PutBlocksInPlace", origin, blocks, true); err != nil {
		return 0, err
	}
	return m.h.puts(), nil
}

// InPlaceSent says whether every send of the PutBlocksInPlace calls
// numbered put or less has left its origin (Progress retires them); where
// not, to a rank one of them is still for.
func (m *Mailbox) InPlaceSent(put uint64) (bool, int) {
	if m.freed {
		return true, -1
	}
	r := m.h.directPending(put)
	return r < 0, r
}

func (m *Mailbox) put(call string, origin []byte, blocks []Block, direct bool) error {
	if m.freed {
		return argErrorf(call, "mailbox has been freed")
	}
	for i, b := range blocks {
		if err := m.comm.checkRank(call, "target", b.Target); err != nil {
			return fmt.Errorf("block %d: %w", i, err)
		}
		switch {
		case b.DstOffset < 0 || b.Len < 0:
			return argErrorf(call, "block %d: offset %d and length %d must not be negative", i, b.DstOffset, b.Len)
		case b.DstOffset+b.Len > m.sizes[b.Target]:
			return argErrorf(call, "block %d: bytes [%d, %d) lie beyond rank %d's mailbox of %d bytes", i, b.DstOffset, b.DstOffset+b.Len, b.Target, m.sizes[b.Target])
		case b.SrcOffset < 0 || b.SrcOffset+b.Len > len(origin):
			return argErrorf(call, "block %d reads origin[%d:%d] beyond len(origin) = %d", i, b.SrcOffset, b.SrcOffset+b.Len, len(origin))
		}
	}
	return m.h.put(origin, blocks, direct)
}

// Progress applies the messages that have arrived to this rank's memory and
// lets MPI move the ones in flight, both ways. It does not block.
func (m *Mailbox) Progress() error {
	if m.freed {
		return argErrorf("Mailbox.Progress", "mailbox has been freed")
	}
	return m.h.progress()
}

// Applied is how many messages Progress has applied to this rank's memory
// so far (a single-rank build counts each block as one).
func (m *Mailbox) Applied() int64 {
	if m.freed {
		return 0
	}
	return m.h.applied()
}

// Drain calls Progress until a few calls in a row apply nothing: what the
// others sent a while ago has then landed, though MPI moves the bytes only
// while this rank calls it.
func (m *Mailbox) Drain() error {
	for quiet := 0; quiet < drainQuiet; {
		before := m.Applied()
		if err := m.Progress(); err != nil {
			return err
		}
		if m.Applied() == before {
			quiet++
		} else {
			quiet = 0
		}
	}
	return nil
}

// drainQuiet is how many calls in a row of Progress that apply nothing end
// a Drain.
const drainQuiet = 16

// Free releases the mailbox. It waits up to the communicator's timeout (or
// a minute) for its messages in flight, applying what arrives meanwhile,
// and leaves what is still in flight to MPI. It is collective (it frees the
// mailbox's communicator): call it once no more writes are bound for any
// rank.
func (m *Mailbox) Free() error {
	if m.freed {
		return nil
	}
	m.freed = true
	wait := m.comm.timeout
	if wait <= 0 {
		wait = time.Minute
	}
	left := m.h.free(wait)
	m.local = nil
	err := m.comm.Free()
	if left > 0 {
		return fmt.Errorf("mpi: Mailbox.Free: %d message(s) still in flight after %v, left to MPI", left, wait)
	}
	return err
}
