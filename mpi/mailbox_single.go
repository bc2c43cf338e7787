//go:build !mpi

package mpi

import (
	"syscall"
	"time"
)

// mboxHandle of the single-rank build: writes to this rank wait, copied,
// until Progress applies them, as a message would.
type mboxHandle = *mboxState

type mboxState struct {
	mem     []byte
	ext     []byte
	pending []pendingWrite
	count   int64
	nputs   uint64
}

type pendingWrite struct {
	off  int
	data []byte
}

func newMailbox(c *Comm, size int, attached []byte) (mboxHandle, []byte, error) {
	w, err := mapMemory(size)
	if err != nil {
		return nil, nil, err
	}
	return &mboxState{mem: w.mem, ext: attached}, w.mem, nil
}

func (h *mboxState) put(origin []byte, blocks []Block, _ bool) error {
	for _, b := range blocks {
		h.pending = append(h.pending, pendingWrite{off: b.DstOffset, data: append([]byte(nil), origin[b.SrcOffset:b.SrcOffset+b.Len]...)})
	}
	return nil
}

func (h *mboxState) progress() error {
	for _, w := range h.pending {
		if w.off < len(h.mem) {
			copy(h.mem[w.off:], w.data)
		} else {
			copy(h.ext[w.off-len(h.mem):], w.data)
		}
	}
	h.count += int64(len(h.pending))
	h.pending = h.pending[:0]
	return nil
}

func (h *mboxState) applied() int64 { return h.count }

// puts and directPending: a single-rank build copies every block, so none
// is ever in flight.
func (h *mboxState) puts() uint64 {
	h.nputs++
	return h.nputs
}

func (h *mboxState) directPending(uint64) int { return -1 }

// DirectMin is the least length of a block that PutBlocksInPlace sends
// straight from its origin (in an MPI build; a single-rank build copies).
const DirectMin = 64 << 10

func (h *mboxState) free(time.Duration) int {
	if len(h.mem) > 0 {
		_ = syscall.Munmap(h.mem)
	}
	return 0
}
