package mpi

import (
	"errors"
	"syscall"
	"unsafe"
)

// ErrMessageSize is matched (errors.Is) by Exchange.Test's error for a
// message received with another size than its receive was posted with.
var ErrMessageSize = errors.New("mpi: Exchange: a message's size differs from its receive's")

// Message is one point-to-point message of an Exchange: Bytes bytes at
// address Addr, to or from rank Peer of the communicator (another rank than
// this one). The memory must be outside the Go heap (C memory, a Buffer,
// device memory of an emulated device): MPI keeps its address until the
// message completes, which Go memory does not allow.
type Message struct {
	Peer  int
	Addr  uintptr
	Bytes int
}

// checkMessages validates the messages of an Exchange.
func (c *Comm) checkMessages(call string, sends, recvs []Message) error {
	for k, list := range [][]Message{sends, recvs} {
		side := [2]string{"send", "receive"}[k]
		for i, m := range list {
			switch {
			case m.Peer < 0 || m.Peer >= c.size:
				return argErrorf(call, "%s %d: peer %d out of range [0, %d) of communicator %q", side, i, m.Peer, c.size, c.name)
			case m.Peer == c.rank:
				return argErrorf(call, "%s %d: peer %d is this rank: copy to yourself instead", side, i, m.Peer)
			case m.Bytes < 0 || m.Bytes > maxCount:
				return argErrorf(call, "%s %d: %d bytes: want 0 to %d", side, i, m.Bytes, maxCount)
			case m.Bytes > 0 && m.Addr == 0:
				return argErrorf(call, "%s %d: %d bytes at address 0", side, i, m.Bytes)
			}
		}
	}
	return nil
}

// Buffer is memory outside the Go heap (an anonymous mapping), for the
// messages of an Exchange.
type Buffer struct{ mem []byte }

// NewBuffer maps n zeroed bytes.
func NewBuffer(n int) (*Buffer, error) {
	if n <= 0 {
		return &Buffer{}, nil
	}
	mem, err := syscall.Mmap(-1, 0, n, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
	if err != nil {
		return nil, &Error{Call: "mmap", Code: -1, Msg: err.Error()}
	}
	return &Buffer{mem: mem}, nil
}

// Bytes views the buffer (nil after Free).
func (b *Buffer) Bytes() []byte { return b.mem }

// Addr is the address of byte off, for a Message.
func (b *Buffer) Addr(off int) uintptr {
	if off < 0 || off >= len(b.mem) {
		return 0
	}
	return uintptr(unsafe.Pointer(&b.mem[off]))
}

// Free unmaps the buffer; no message may be using it.
func (b *Buffer) Free() error {
	if b.mem == nil {
		return nil
	}
	err := syscall.Munmap(b.mem)
	b.mem = nil
	return err
}
