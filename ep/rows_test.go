package ep

import (
	"fmt"
	"math/rand/v2"
	"syscall"
	"testing"
	"unsafe"

	"github.com/goep/goep/internal/rowsum"
	"github.com/stretchr/testify/require"
)

// TestSmallReduceMatchesKernel checks that a decode-sized reduction over
// reduceTables (summed by package rowsum where the CPU allows) gives the C
// kernel's ep_reduce_rows result bit for bit: rows of 0 to 9 sources, some
// of weight 1, of random bfloat16 with special values among them, read
// from memory outside Go's heap as a peer's segment is.
func TestSmallReduceMatchesKernel(t *testing.T) {
	if !rowsum.Assembly {
		t.Skip("rowsum has no assembly on this CPU or build: the reduction is the C kernel's own")
	}
	rng := rand.New(rand.NewPCG(5, 6))
	specials := []uint16{0x0000, 0x8000, 0x7f80, 0xff80, 0x7fc0, 0x7f81, 0x0001, 0x7f7f, 0x3f80}
	for _, hidden := range []int{16, 100, 128, 130} {
		for _, n := range []int{1, 3, 8} {
			t.Run(fmt.Sprintf("hidden=%d/rows=%d", hidden, n), func(t *testing.T) {
				const pairs = 9 * 8
				seg, err := syscall.Mmap(-1, 0, pairs*hidden*2, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
				require.NoError(t, err)
				defer syscall.Munmap(seg)
				x := unsafe.Slice((*uint16)(unsafe.Pointer(&seg[0])), pairs*hidden)
				for i := range x {
					if rng.IntN(8) == 0 {
						x[i] = specials[rng.IntN(len(specials))]
					} else {
						x[i] = uint16(BF16From(float32(rng.NormFloat64())))
					}
				}
				tab, err := newReduceTables(pairs, n)
				require.NoError(t, err)
				defer tab.free()
				var src addrTable
				j := 0
				for i := range n {
					tab.start[i] = int32(j)
					for range rng.IntN(10) {
						tab.src[j] = unsafe.Pointer(&x[rng.IntN(pairs)*hidden])
						tab.w[j] = rng.Float32()
						if rng.IntN(3) == 0 {
							tab.w[j] = 1
						}
						src.add(tab.src[j])
						j++
					}
				}
				tab.start[n] = int32(j)
				got, want := make([]uint16, n*hidden), make([]uint16, n*hidden)
				tab.reduce(unsafe.Pointer(&got[0]), BFloat16, n, hidden, BFloat16)
				reduceRows(unsafe.Pointer(&want[0]), BFloat16, &src, tab.w[:j], tab.start, n, hidden, BFloat16)
				for e := range want {
					nan := func(v uint16) bool { return v&0x7fff > 0x7f80 } // two NaN sources: either payload
					if got[e] != want[e] && !(nan(got[e]) && nan(want[e])) {
						t.Fatalf("row %d element %d: %#04x, the C kernel gives %#04x", e/hidden, e%hidden, got[e], want[e])
					}
				}
			})
		}
	}
}
