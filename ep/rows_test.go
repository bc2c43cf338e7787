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

// TestStreamingCopiesMatch checks the row kernels' streaming stores
// (hostrows.Streams): a scatter of rows of every length around the
// streaming threshold and its 64- and 16-byte steps, to destinations at
// every alignment, gives Go's copy byte for byte and touches nothing
// around each row; a reduction in chunks with streaming stores gives the
// whole reduction's result bit for bit.
func TestStreamingCopiesMatch(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 11))
	for _, rowBytes := range []int{100, 4095, 4096, 4097, 4112, 4160, 14336, 14350} {
		for _, misalign := range []int{0, 1, 8, 16, 48} {
			t.Run(fmt.Sprintf("row=%d/misalign=%d", rowBytes, misalign), func(t *testing.T) {
				const rows, gap = 12, 64
				stride := rowBytes + gap
				origin := make([]byte, rows*rowBytes)
				for i := range origin {
					origin[i] = byte(rng.Uint32())
				}
				mem, err := syscall.Mmap(-1, 0, rows*stride+2*gap, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
				require.NoError(t, err)
				defer syscall.Munmap(mem)
				for i := range mem {
					mem[i] = 0xa5
				}
				want := append([]byte(nil), mem...)
				var dst hostrows.AddrTable
				off := make([]int64, rows)
				for i := 0; i < rows; i++ {
					src := (rows - 1 - i) * rowBytes // rows land in reverse order
					at := gap + misalign + i*stride
					dst.Add(unsafe.Pointer(&mem[at]))
					off[i] = int64(src)
					copy(want[at:at+rowBytes], origin[src:src+rowBytes])
				}
				hostrows.ScatterRows(&dst, origin, off, rowBytes, true)
				require.Equal(t, want, mem, "ScatterRows with streaming stores")
				for i := range mem {
					mem[i] = 0xa5
				}
				hostrows.ScatterBlocks(&dst, origin, off, lensOf(rows, rowBytes), true)
				require.Equal(t, want, mem, "ScatterBlocks with streaming stores")
			})
		}
	}
	for _, dt := range []DType{BFloat16, Float32} {
		t.Run(fmt.Sprintf("reduce/%v", dt), func(t *testing.T) {
			const n, hidden, pairs = 40, 7168, 64
			es := dt.Size()
			seg, err := syscall.Mmap(-1, 0, pairs*hidden*es, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
			require.NoError(t, err)
			defer syscall.Munmap(seg)
			for i := 0; i < pairs*hidden; i++ {
				v := BF16From(float32(rng.NormFloat64()))
				if dt == Float32 {
					*(*float32)(unsafe.Pointer(&seg[4*i])) = float32(rng.NormFloat64())
				} else {
					*(*uint16)(unsafe.Pointer(&seg[2*i])) = uint16(v)
				}
			}
			var src hostrows.AddrTable
			start := make([]int32, n+1)
			for i := 0; i < n; i++ {
				start[i] = int32(src.Len())
				for range rng.IntN(4) {
					src.Add(unsafe.Pointer(&seg[rng.IntN(pairs)*hidden*es]))
				}
			}
			start[n] = int32(src.Len())
			got, err := syscall.Mmap(-1, 0, n*hidden*es, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
			require.NoError(t, err)
			defer syscall.Munmap(got)
			want := make([]byte, n*hidden*es)
			hostrows.ReduceRows(unsafe.Pointer(&want[0]), dt, &src, nil, start, n, hidden, dt)
			tab := src.Frozen()
			for lo := 0; lo < n; lo += 7 {
				hi := min(lo+7, n)
				hostrows.ReduceRowsFrom(unsafe.Pointer(&got[lo*hidden*es]), dt, tab, start[lo:hi+1], hi-lo, hidden, dt, true)
			}
			require.Equal(t, want, []byte(got))
		})
	}
}
