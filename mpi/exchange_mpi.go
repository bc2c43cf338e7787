//go:build mpi

package mpi

/*
#include "shim_mpi.h"
*/
import "C"

import "fmt"

// exchangeTag is the MPI tag of every Exchange message: messages between two
// ranks match in the order they were posted, as NCCL's do.
const exchangeTag = 0x6570

// Exchange is a set of non-blocking sends and receives in flight
// (MPI_Isend, MPI_Irecv): the point-to-point transport of an emulated GPU,
// where NCCL's grouped ncclSend/ncclRecv would be. Test polls it; Cancel
// abandons it. An Exchange is for one goroutine at a time (any goroutine:
// MPI_THREAD_MULTIPLE).
type Exchange struct {
	c     *Comm
	msgs  []Message
	recv  []C.int // per message: 1 for a receive
	reqs  []C.MPI_Request
	done  []C.int
	got   []C.int64_t // bytes received, per message
	left  int
	freed bool
}

// Exchange posts every send and receive and returns at once; messages
// between two ranks match in posting order, and a receive must be matched
// by a send of exactly its size (a shorter or longer one is an error of
// Test). It is not collective: each rank posts its side.
func (c *Comm) Exchange(sends, recvs []Message) (*Exchange, error) {
	if err := c.checkUsable("Exchange"); err != nil {
		return nil, err
	}
	if err := c.checkMessages("Exchange", sends, recvs); err != nil {
		return nil, err
	}
	n := len(sends) + len(recvs)
	x := &Exchange{c: c, msgs: make([]Message, 0, n), recv: make([]C.int, n), reqs: make([]C.MPI_Request, n),
		done: make([]C.int, n), got: make([]C.int64_t, n), left: n}
	x.msgs = append(append(x.msgs, sends...), recvs...)
	if n == 0 {
		return x, nil
	}
	peer, bytes, addr := make([]C.int, n), make([]C.int, n), make([]C.uint64_t, n)
	for i, m := range x.msgs {
		if i >= len(sends) {
			x.recv[i] = 1
		}
		peer[i], bytes[i], addr[i] = C.int(m.Peer), C.int(m.Bytes), C.uint64_t(m.Addr)
	}
	rc := int64(C.goep_p2p_start(c.h.c, C.int(n), &x.recv[0], &peer[0], &addr[0], &bytes[0], C.int(exchangeTag), &x.reqs[0]))
	if rc != 0 {
		code, i := C.int(rc&0xffffffff), int(rc>>32)-1
		_ = x.Cancel() // the messages posted before the failure
		side := "MPI_Isend"
		if x.recv[i] != 0 {
			side = "MPI_Irecv"
		}
		return nil, fmt.Errorf("%w (message %d of %d, peer %d)", mpiError(side, code), i, n, x.msgs[i].Peer)
	}
	return x, nil
}

// Test reports whether every message has completed, without waiting. A
// received message of another size than posted is an error naming it.
func (x *Exchange) Test() (bool, error) {
	if x.freed {
		return false, argErrorf("Exchange.Test", "the exchange was cancelled")
	}
	if x.left == 0 {
		return true, nil
	}
	n := len(x.msgs)
	if rc := C.goep_p2p_test(C.int(n), &x.reqs[0], &x.recv[0], &x.done[0], &x.got[0]); rc != C.MPI_SUCCESS {
		if C.goep_is_truncate(rc) != 0 {
			return false, fmt.Errorf("%w: a message was longer than its receive (%w)", ErrMessageSize, mpiError("MPI_Test", rc))
		}
		return false, mpiError("MPI_Test", rc)
	}
	x.left = 0
	for i := range x.msgs {
		if x.done[i] == 0 {
			x.left++
			continue
		}
		if x.recv[i] != 0 && int(x.got[i]) != x.msgs[i].Bytes {
			return false, fmt.Errorf("%w: the message from rank %d has %d bytes, %d were posted for it: the peers disagree on its size",
				ErrMessageSize, x.msgs[i].Peer, int64(x.got[i]), x.msgs[i].Bytes)
		}
	}
	return x.left == 0, nil
}

// Pending lists the peers of the messages not yet complete, receives first
// (a receive that has not completed names a peer that has not sent).
func (x *Exchange) Pending() []int {
	var out []int
	for _, want := range []C.int{1, 0} {
		for i, m := range x.msgs {
			if x.done[i] == 0 && x.recv[i] == want {
				out = append(out, m.Peer)
			}
		}
	}
	return out
}

// Cancel abandons the messages not yet complete: receives are cancelled,
// sends left to MPI (MPI cannot take a send back: its memory must stay
// valid until the communicator is freed). It reports whether some send was
// left so. Cancelling twice does nothing.
func (x *Exchange) Cancel() (sendsLeft bool) {
	if x.freed || len(x.msgs) == 0 {
		x.freed = true
		return false
	}
	x.freed = true
	return C.goep_p2p_cancel(C.int(len(x.msgs)), &x.reqs[0], &x.recv[0], &x.done[0]) != 0
}
