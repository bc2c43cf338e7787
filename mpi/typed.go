package mpi

import (
	"reflect"
	"unsafe"
)

// Number is the element types the typed collectives accept.
type Number interface {
	~int8 | ~uint8 | ~int16 | ~uint16 | ~int32 | ~uint32 | ~int64 | ~uint64 | ~int | ~float32 | ~float64
}

// asBytes views a slice of numbers as its bytes.
func asBytes[T Number](s []T) []byte {
	if len(s) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(s))), len(s)*int(unsafe.Sizeof(s[0])))
}

func sizeOf[T Number]() int {
	var z T
	return int(unsafe.Sizeof(z))
}

func scale(v []int, by int) []int {
	out := make([]int, len(v))
	for i, x := range v {
		out[i] = x * by
	}
	return out
}

// BcastSlice is Comm.Bcast for a slice of numbers.
func BcastSlice[T Number](c *Comm, buf []T, root int) error {
	return c.Bcast(asBytes(buf), root)
}

// AllgatherSlice is Comm.Allgather for slices of numbers: rank r's send lands
// at recv[r*len(send):].
func AllgatherSlice[T Number](c *Comm, send, recv []T) error {
	if c != nil && len(recv) != c.size*len(send) {
		return argErrorf("AllgatherSlice", "len(recv) = %d, want Size()*len(send) = %d*%d", len(recv), c.size, len(send))
	}
	return c.Allgather(asBytes(send), asBytes(recv))
}

// AlltoallSlice is Comm.Alltoall for slices of numbers.
func AlltoallSlice[T Number](c *Comm, send, recv []T) error {
	if c != nil && (len(send) != len(recv) || len(send)%c.size != 0) {
		return argErrorf("AlltoallSlice", "len(send) = %d and len(recv) = %d must be equal multiples of the communicator size %d", len(send), len(recv), c.size)
	}
	return c.Alltoall(asBytes(send), asBytes(recv))
}

// AlltoallvSlice is Comm.Alltoallv for slices of numbers; counts and
// displacements are in elements.
func AlltoallvSlice[T Number](c *Comm, send []T, sendCounts, sendDispls []int, recv []T, recvCounts, recvDispls []int) error {
	if c == nil {
		return argErrorf("AlltoallvSlice", "nil communicator")
	}
	if _, _, err := c.checkVector("AlltoallvSlice", "send", len(send), sendCounts, sendDispls); err != nil {
		return err
	}
	if _, _, err := c.checkVector("AlltoallvSlice", "recv", len(recv), recvCounts, recvDispls); err != nil {
		return err
	}
	n := sizeOf[T]()
	return c.Alltoallv(asBytes(send), scale(sendCounts, n), scale(sendDispls, n),
		asBytes(recv), scale(recvCounts, n), scale(recvDispls, n))
}

// Allreduce combines send from every rank element-wise with op into recv on
// every rank. send and recv must have the same length and not overlap.
func Allreduce[T Number](c *Comm, op Op, send, recv []T) error {
	if err := c.checkUsable("Allreduce"); err != nil {
		return err
	}
	if len(send) != len(recv) {
		return argErrorf("Allreduce", "len(send) = %d != len(recv) = %d", len(send), len(recv))
	}
	if op != OpSum && op != OpMax && op != OpMin {
		return argErrorf("Allreduce", "unknown operation %v", op)
	}
	if err := checkCount("Allreduce", "len(send)", len(send)); err != nil {
		return err
	}
	kind := reflect.TypeFor[T]().Kind()
	if kind == reflect.Int {
		kind = reflect.Int64
		if sizeOf[T]() == 4 {
			kind = reflect.Int32
		}
	}
	return c.allreduce(asBytes(send), asBytes(recv), len(send), kind, op)
}
