package ep

import (
	"fmt"
	"math/rand/v2"
	"syscall"
	"testing"
	"unsafe"

	"github.com/goep/goep/ep/internal/hostrows"
	"github.com/goep/goep/internal/rowsum"
	"github.com/stretchr/testify/require"
)

// TestSmallReduceMatchesKernel checks that a decode-sized reduction over
// ReduceTables (summed by package rowsum where the CPU allows) gives the C
// kernel's ep_reduce_rows result bit for bit, in bfloat16 and float32: rows
// of 0 to 9 sources, some of weight 1, of random values with special ones
// among them (zeros, infinities, NaNs, subnormals, the largest finite),
// read from memory outside Go's heap as a peer's segment is.
func TestSmallReduceMatchesKernel(t *testing.T) {
	if !rowsum.Assembly {
		t.Skip("rowsum has no assembly on this CPU or build: the reduction is the C kernel's own")
	}
	specials := []uint16{0x0000, 0x8000, 0x7f80, 0xff80, 0x7fc0, 0x7f81, 0x0001, 0x7f7f, 0x3f80}
	for _, dt := range []DType{BFloat16, Float32} {
		for _, hidden := range []int{16, 100, 128, 130} {
			for _, n := range []int{1, 3, 8} {
				t.Run(fmt.Sprintf("%v/hidden=%d/rows=%d", dt, hidden, n), func(t *testing.T) {
					rng := rand.New(rand.NewPCG(uint64(hidden), uint64(n)))
					const pairs = 9 * 8
					es := dt.Size()
					seg, err := syscall.Mmap(-1, 0, pairs*hidden*es, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
					require.NoError(t, err)
					defer syscall.Munmap(seg)
					for i := 0; i < pairs*hidden; i++ {
						bits := uint32(BF16From(float32(rng.NormFloat64()))) << 16
						if rng.IntN(8) == 0 {
							bits = uint32(specials[rng.IntN(len(specials))]) << 16
						}
						if dt == Float32 {
							*(*uint32)(unsafe.Pointer(&seg[4*i])) = bits | rng.Uint32()&0xffff
						} else {
							*(*uint16)(unsafe.Pointer(&seg[2*i])) = uint16(bits >> 16)
						}
					}
					tab, err := hostrows.NewReduceTables(pairs, n, false)
					require.NoError(t, err)
					defer tab.Free()
					var src hostrows.AddrTable
					j := 0
					for i := range n {
						tab.Start[i] = int32(j)
						for range rng.IntN(10) {
							tab.Src[j] = unsafe.Pointer(&seg[rng.IntN(pairs)*hidden*es])
							tab.W[j] = rng.Float32()
							if rng.IntN(3) == 0 {
								tab.W[j] = 1
							}
							src.Add(tab.Src[j])
							j++
						}
					}
					tab.Start[n] = int32(j)
					got, want := make([]byte, n*hidden*es), make([]byte, n*hidden*es)
					tab.Reduce(unsafe.Pointer(&got[0]), dt, n, hidden, dt)
					hostrows.ReduceRows(unsafe.Pointer(&want[0]), dt, &src, tab.W[:j], tab.Start, n, hidden, dt)
					for e := 0; e < n*hidden; e++ {
						g, w, nan := elementBits(got, want, dt, e)
						if g != w && !nan {
							t.Fatalf("row %d element %d: %#x, the C kernel gives %#x", e/hidden, e%hidden, g, w)
						}
					}
				})
			}
		}
	}
}

// elementBits are element e of two rows of type dt (got and want) as
// bits, and whether both are NaN (two NaN sources give either's payload).
func elementBits(got, want []byte, dt DType, e int) (g, w uint32, bothNaN bool) {
	if dt == Float32 {
		g, w = *(*uint32)(unsafe.Pointer(&got[4*e])), *(*uint32)(unsafe.Pointer(&want[4*e]))
		return g, w, g&0x7fffffff > 0x7f800000 && w&0x7fffffff > 0x7f800000
	}
	g, w = uint32(*(*uint16)(unsafe.Pointer(&got[2*e]))), uint32(*(*uint16)(unsafe.Pointer(&want[2*e])))
	return g, w, g&0x7fff > 0x7f80 && w&0x7fff > 0x7f80
}
