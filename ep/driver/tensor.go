package driver

import (
	"fmt"
	"unsafe"

	"github.com/goep/goep/internal/dtype"
)

// Scalar is the element types a Tensor holds: fixed-size numbers, never
// anything with a Go pointer inside.
type Scalar = dtype.Number

// Memory is where tensors live: the host's memory, or one device's. A
// Backend says which memory its tensors are in (Group.Memory); the caller's
// tensors must be in the same one. The methods let code that does not know
// the memory (tests, benchmarks, the moe layer) allocate tensors and move
// data in and out. Implementations must be comparable (a pointer, say):
// tensors compare their memories with ==.
type Memory interface {
	// String names the memory in messages: "host", "cuda:0", "emulated:1".
	String() string
	// Alloc returns n zeroed bytes of this memory.
	Alloc(n int) (Tensor[byte], error)
	// Free releases memory that Alloc returned.
	Free(t Tensor[byte]) error
	// Upload copies src from the host into dst (len(src) == dst.Len()),
	// and Download copies src into dst on the host. Both are complete when
	// they return: they wait for work queued on the tensor's memory first.
	Upload(dst Tensor[byte], src []byte) error
	Download(dst []byte, src Tensor[byte]) error
}

// HostMemory is the host's memory: Go slices, and C or MPI window memory
// viewed as slices.
var HostMemory Memory = hostMemory{}

type hostMemory struct{}

func (hostMemory) String() string { return "host" }

func (hostMemory) Alloc(n int) (Tensor[byte], error) {
	if n < 0 {
		return Tensor[byte]{}, fmt.Errorf("ep: HostMemory.Alloc: %d bytes", n)
	}
	return Host(make([]byte, n)), nil
}

func (hostMemory) Free(Tensor[byte]) error { return nil }

func (hostMemory) Upload(dst Tensor[byte], src []byte) error {
	if dst.mem != nil || dst.Len() != len(src) {
		return fmt.Errorf("ep: HostMemory.Upload: %d bytes into %v", len(src), dst)
	}
	copy(dst.host, src)
	return nil
}

func (hostMemory) Download(dst []byte, src Tensor[byte]) error {
	if src.mem != nil || src.Len() != len(dst) {
		return fmt.Errorf("ep: HostMemory.Download: %v into %d bytes", src, len(dst))
	}
	copy(dst, src.host)
	return nil
}

// Tensor is a flat array of n elements of T in some Memory: a host slice, or
// a range of device addresses. Its shape is given by the call it is passed
// to (rows of Hidden elements, [tokens][TopK], ...). The zero Tensor is "no
// tensor": IsZero reports it, and options take it to mean "not set".
//
// A Tensor does not own its memory: a view into a Group's buffers stays valid
// as long as the doc of the call that returned it says, and a Tensor made by
// Host or OnDevice as long as the caller keeps the memory.
type Tensor[T Scalar] struct {
	host []T
	mem  Memory // nil for host memory
	addr uint64 // device address of element 0, when mem != nil
	n    int
	set  bool
}

// Host is s as a Tensor in host memory (no copy). Host(nil) is an empty
// tensor, not the zero Tensor.
func Host[T Scalar](s []T) Tensor[T] { return Tensor[T]{host: s, n: len(s), set: true} }

// OnDevice is the n elements of T at device address addr of memory m.
func OnDevice[T Scalar](m Memory, addr uint64, n int) Tensor[T] {
	if m == HostMemory || m == nil {
		panic("ep: OnDevice: host memory is described by Host, not by an address")
	}
	return Tensor[T]{mem: m, addr: addr, n: n, set: true}
}

// Len is the number of elements.
func (t Tensor[T]) Len() int { return t.n }

// IsZero reports the zero Tensor: no tensor at all.
func (t Tensor[T]) IsZero() bool { return !t.set }

// Memory is where the elements are.
func (t Tensor[T]) Memory() Memory {
	if t.mem == nil {
		return HostMemory
	}
	return t.mem
}

// Host is the elements as a slice when they are in host memory, else nil.
func (t Tensor[T]) Host() []T {
	if t.mem != nil {
		return nil
	}
	return t.host
}

// Addr is the device address of the first element (0 for host memory).
func (t Tensor[T]) Addr() uint64 { return t.addr }

// Slice is elements [i, j).
func (t Tensor[T]) Slice(i, j int) Tensor[T] {
	if i < 0 || j < i || j > t.n {
		panic(fmt.Sprintf("ep: Tensor.Slice(%d, %d) of %d elements", i, j, t.n))
	}
	if t.mem == nil {
		return Host(t.host[i:j])
	}
	return Tensor[T]{mem: t.mem, addr: t.addr + uint64(i*dtype.SizeOf[T]()), n: j - i, set: true}
}

func (t Tensor[T]) String() string {
	if !t.set {
		return "ep.Tensor(none)"
	}
	return fmt.Sprintf("ep.Tensor(%d x %d bytes in %v)", t.n, dtype.SizeOf[T](), t.Memory())
}

// AsBytes is t viewed as bytes (no copy).
func AsBytes[T Scalar](t Tensor[T]) Tensor[byte] {
	var z T
	size := int(unsafe.Sizeof(z)) // not dtype's generic helpers: a call through a dictionary, on every ep call
	if t.mem != nil || !t.set {
		return Tensor[byte]{mem: t.mem, addr: t.addr, n: t.n * size, set: t.set}
	}
	n := len(t.host) * size
	if n == 0 {
		return Host([]byte{})
	}
	return Tensor[byte]{host: unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(t.host))), n), n: n, set: true}
}

// FromBytes is b viewed as elements of T; b's length must be a multiple of
// T's size.
func FromBytes[T Scalar](b Tensor[byte]) (Tensor[T], error) {
	var z T
	size := int(unsafe.Sizeof(z))
	if b.n%size != 0 {
		return Tensor[T]{}, fmt.Errorf("ep: FromBytes: %d bytes is not a whole number of %d-byte elements", b.n, size)
	}
	if !b.set {
		return Tensor[T]{}, nil
	}
	if b.mem == nil {
		if b.n == 0 {
			return Host([]T{}), nil
		}
		return Host(unsafe.Slice((*T)(unsafe.Pointer(unsafe.SliceData(b.host))), b.n/size)), nil
	}
	return Tensor[T]{mem: b.mem, addr: b.addr, n: b.n / size, set: true}, nil
}

// mustFromBytes is FromBytes for views the package made itself, whose sizes
// are right by construction.
func MustFromBytes[T Scalar](b Tensor[byte]) Tensor[T] {
	t, err := FromBytes[T](b)
	if err != nil {
		panic(err)
	}
	return t
}

// Alloc returns a zeroed tensor of n elements of T in memory m.
func Alloc[T Scalar](m Memory, n int) (Tensor[T], error) {
	if n < 0 {
		return Tensor[T]{}, fmt.Errorf("ep: Alloc: %d elements", n)
	}
	if m == HostMemory || m == nil {
		return Host(make([]T, n)), nil
	}
	b, err := m.Alloc(n * dtype.SizeOf[T]())
	if err != nil {
		return Tensor[T]{}, err
	}
	return FromBytes[T](b)
}

// Free releases a tensor that Alloc returned (nothing for host memory).
func Free[T Scalar](t Tensor[T]) error {
	if !t.set || t.mem == nil {
		return nil
	}
	return t.mem.Free(AsBytes(t))
}

// Upload copies src from the host into dst (same length).
func Upload[T Scalar](dst Tensor[T], src []T) error {
	if dst.n != len(src) {
		return fmt.Errorf("ep: Upload: %d elements into a tensor of %d", len(src), dst.n)
	}
	if dst.mem == nil {
		copy(dst.host, src)
		return nil
	}
	return dst.mem.Upload(AsBytes(dst), dtype.Bytes(src))
}

// Download copies src into dst on the host (same length).
func Download[T Scalar](dst []T, src Tensor[T]) error {
	if src.n != len(dst) {
		return fmt.Errorf("ep: Download: a tensor of %d elements into %d", src.n, len(dst))
	}
	if src.mem == nil {
		copy(dst, src.host)
		return nil
	}
	return src.mem.Download(dtype.Bytes(dst), AsBytes(src))
}

// ToHost returns t's elements on the host: t.Host() itself for host memory,
// else a copy.
func ToHost[T Scalar](t Tensor[T]) ([]T, error) {
	if t.mem == nil {
		return t.host, nil
	}
	out := make([]T, t.n)
	return out, Download(out, t)
}

// sameTensor reports whether a and b are the same elements of the same
// memory.
func SameTensor[T Scalar](a, b Tensor[T]) bool {
	if !a.set || !b.set || a.n != b.n || a.n == 0 || a.mem != b.mem {
		return false
	}
	if a.mem == nil {
		return unsafe.SliceData(a.host) == unsafe.SliceData(b.host)
	}
	return a.addr == b.addr
}
