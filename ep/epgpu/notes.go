package epgpu

import (
	"bytes"
	"errors"
	"fmt"
	"time"

	"github.com/goep/goep/ep/driver"
	"github.com/goep/goep/gpu"
	"github.com/goep/goep/mpi"
)

// noteLen is the room for a refusing rank's reason (longer ones are cut).
const noteLen = 512

// notes carry the reasons of refused calls. A refused call is marked in
// the headers of its own transfer groups, at no cost to the calls that are
// not refused; the reason, up to noteLen bytes, goes by MPI on a
// communicator of the engine's own: the refusing rank sends it to every
// other rank before it takes part in the call's transfers, and every rank
// that reads a refusing header receives it from that rank. Every rank
// receives exactly one note from each rank that refused a call (every rank
// reads every peer's header of every call), so that the notes of later
// calls match in order.
type notes struct {
	comm    *mpi.Comm
	me      int
	timeout time.Duration
	in      *mpi.Buffer // noteLen per rank
	sent    []sentNote  // sends not yet known to be complete
}

// sentNote is a note on its way: MPI holds its buffer until it completes.
type sentNote struct {
	x   *mpi.Exchange
	buf *mpi.Buffer
}

// newNotes splits a communicator for the notes off c. It is collective.
func newNotes(c *mpi.Comm, timeout time.Duration) (*notes, error) {
	nc, err := c.Split(0, c.Rank(), "epgpu refusals")
	if err != nil {
		return nil, err
	}
	in, err := mpi.NewBuffer(noteLen * nc.Size())
	if err != nil {
		return nil, errors.Join(err, nc.Free())
	}
	return &notes{comm: nc, me: nc.Rank(), timeout: timeout, in: in}, nil
}

// send starts sending reason to every other rank. It does not wait for
// the receivers, which receive it when they read this rank's refusing
// header, possibly only in the Wait half of the call.
func (n *notes) send(reason string) error {
	n.reap()
	if n.comm.Size() == 1 {
		return nil
	}
	buf, err := mpi.NewBuffer(noteLen) // a refused call is no hot path
	if err != nil {
		return err
	}
	copy(buf.Bytes()[:noteLen-1], reason)
	var msgs []mpi.Message
	for p := 0; p < n.comm.Size(); p++ {
		if p != n.me {
			msgs = append(msgs, mpi.Message{Peer: p, Addr: buf.Addr(0), Bytes: noteLen})
		}
	}
	x, err := n.comm.Exchange(msgs, nil)
	if err != nil {
		return errors.Join(err, buf.Free())
	}
	n.sent = append(n.sent, sentNote{x: x, buf: buf})
	return nil
}

// reap frees the buffers of the notes that have arrived.
func (n *notes) reap() {
	kept := n.sent[:0]
	for _, s := range n.sent {
		if done, err := s.x.Test(); done && err == nil {
			_ = s.buf.Free()
			continue
		}
		kept = append(kept, s)
	}
	clear(n.sent[len(kept):])
	n.sent = kept
}

// recv receives the note of every rank in from (the ranks that refused
// call op), within the timeout.
func (n *notes) recv(op string, from []int) ([]string, error) {
	msgs := make([]mpi.Message, len(from))
	for i, p := range from {
		msgs[i] = mpi.Message{Peer: p, Addr: n.in.Addr(i * noteLen), Bytes: noteLen}
	}
	x, err := n.comm.Exchange(nil, msgs)
	if err != nil {
		return nil, fmt.Errorf("epgpu: %s: receiving the reason of a refusal: %w", op, err)
	}
	start := time.Now()
	deadline := start.Add(n.timeout)
	for {
		done, err := x.Test()
		if err != nil {
			x.Cancel()
			return nil, fmt.Errorf("epgpu: %s: receiving the reason of a refusal: %w", op, err)
		}
		if done {
			break
		}
		if time.Now().After(deadline) {
			peer := -1
			if p := x.Pending(); len(p) > 0 {
				peer = p[0]
			}
			x.Cancel()
			return nil, &driver.TimeoutError{Op: op, Peer: peer, What: "the reason it refused the call", After: n.timeout}
		}
		gpu.Backoff(time.Since(start))
	}
	out := make([]string, len(from))
	for i := range from {
		b := n.in.Bytes()[i*noteLen : (i+1)*noteLen]
		if j := bytes.IndexByte(b, 0); j >= 0 {
			b = b[:j]
		}
		out[i] = string(b)
	}
	return out, nil
}

// drainNotesLimit bounds the wait for the notes still on their way at
// Close (the receivers have read them before they could call Close).
const drainNotesLimit = 5 * time.Second

// close waits a little for the notes still on their way, then frees the
// communicator. It is collective. A note that did not complete is
// abandoned, its buffer left to MPI.
func (n *notes) close() error {
	start := time.Now()
	for len(n.sent) > 0 && time.Since(start) < drainNotesLimit {
		n.reap()
		gpu.Backoff(time.Since(start))
	}
	for _, s := range n.sent {
		if !s.x.Cancel() {
			_ = s.buf.Free()
		}
	}
	n.sent = nil
	return errors.Join(n.in.Free(), n.comm.Free())
}

// Flags in word 1 of a group's header.
const (
	flagValues  = 1 << 0 // a combine's RowValues were given
	flagRefused = 1 << 1 // the sender refused the call: its data is not to be used
)
