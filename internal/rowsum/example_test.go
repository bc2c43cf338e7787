package rowsum_test

import (
	"fmt"
	"math"
	"unsafe"

	"github.com/goep/goep/internal/rowsum"
)

// bf16 is f as bfloat16 bits (f must be exact in bfloat16).
func bf16(f float32) uint16 { return uint16(math.Float32bits(f) >> 16) }

// A token's two expert outputs, weighted by its gate, summed into its
// combined row.
func ExampleBF16() {
	expert0 := []uint16{bf16(1), bf16(2), bf16(3), bf16(4)}
	expert1 := []uint16{bf16(0.5), bf16(0.5), bf16(0.5), bf16(-0.5)}
	combined := make([]uint16, 4)
	rowsum.BF16(combined, []unsafe.Pointer{unsafe.Pointer(&expert0[0]), unsafe.Pointer(&expert1[0])}, []float32{0.5, 2})
	for _, b := range combined {
		fmt.Print(math.Float32frombits(uint32(b)<<16), " ")
	}
	fmt.Println()
	// Output: 1.5 2 2.5 1
}
