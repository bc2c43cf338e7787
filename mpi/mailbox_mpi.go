//go:build mpi

package mpi

/*
#include "shim_mpi.h"
*/
import "C"

import (
	"fmt"
	"time"
	"unsafe"
)

type mboxHandle = *mboxState

type mboxState struct{ m *C.goep_mbox }

func newMailbox(c *Comm, size int, attached []byte) (mboxHandle, []byte, error) {
	m := C.goep_mbox_new(c.h.c, C.int64_t(size), C.int(mailboxTag))
	if m == nil {
		return nil, nil, fmt.Errorf("out of memory")
	}
	if len(attached) > 0 {
		C.goep_mbox_attach(m, (*C.char)(unsafe.Pointer(&attached[0])), C.int64_t(len(attached)))
	}
	local := []byte{}
	if size > 0 {
		local = unsafe.Slice((*byte)(unsafe.Pointer(C.goep_mbox_mem(m))), size)
	}
	return &mboxState{m: m}, local, nil
}

func (h *mboxState) put(origin []byte, blocks []Block, direct bool) error {
	if len(blocks) == 0 {
		return nil
	}
	var o unsafe.Pointer
	if len(origin) > 0 {
		o = unsafe.Pointer(&origin[0])
	}
	d := C.int(0)
	if direct {
		d = 1
	}
	rc := int64(C.goep_mbox_put(h.m, o, (*C.goep_block)(unsafe.Pointer(&blocks[0])), C.int(len(blocks)), d))
	if rc == 0 {
		return nil
	}
	err := mpiError("MPI_Isend", C.int(int32(rc)))
	if t := rc >> 32; t > 0 {
		return fmt.Errorf("mpi: Mailbox.PutBlocks: the message to rank %d: %w", t-1, err)
	}
	return fmt.Errorf("mpi: Mailbox.PutBlocks: %w", err)
}

func (h *mboxState) progress() error {
	switch rc := C.goep_mbox_progress(h.m); rc {
	case C.MPI_SUCCESS:
		return nil
	case C.GOEP_ERR_RANGE:
		return fmt.Errorf("mpi: Mailbox.Progress: a message from rank %d writes outside this rank's mailbox", int(C.goep_mbox_bad(h.m)))
	default:
		return mpiError("MPI_Improbe/MPI_Test", rc)
	}
}

func (h *mboxState) free(wait time.Duration) int {
	return int(C.goep_mbox_free(h.m, C.int64_t(wait.Nanoseconds())))
}

func (h *mboxState) applied() int64 { return int64(C.goep_mbox_applied(h.m)) }

func (h *mboxState) puts() uint64 { return uint64(C.goep_mbox_puts(h.m)) }

func (h *mboxState) directPending(put uint64) int {
	return int(C.goep_mbox_direct_pending(h.m, C.uint64_t(put)))
}

// DirectMin is the least length of a block that PutBlocksInPlace sends
// straight from its origin.
const DirectMin = C.GOEP_MBOX_DIRECT_MIN
