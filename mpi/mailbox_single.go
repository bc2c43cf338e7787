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
	pending []pendingWrite
	count   int64
}

type pendingWrite struct {
	off  int
	data []byte
}

func newMailbox(c *Comm, size int) (mboxHandle, []byte, error) {
	w, err := mapMemory(size)
	if err != nil {
		return nil, nil, err
	}
	return &mboxState{mem: w.mem}, w.mem, nil
}

func (h *mboxState) put(origin []byte, blocks []Block) error {
	for _, b := range blocks {
		h.pending = append(h.pending, pendingWrite{off: b.DstOffset, data: append([]byte(nil), origin[b.SrcOffset:b.SrcOffset+b.Len]...)})
	}
	return nil
}

func (h *mboxState) progress() error {
	for _, w := range h.pending {
		copy(h.mem[w.off:], w.data)
	}
	h.count += int64(len(h.pending))
	h.pending = h.pending[:0]
	return nil
}

func (h *mboxState) applied() int64 { return h.count }

func (h *mboxState) free(time.Duration) int {
	if len(h.mem) > 0 {
		_ = syscall.Munmap(h.mem)
	}
	return 0
}
