package hostrows

/*
#cgo CFLAGS: -O3 -std=gnu11 -I${SRCDIR}/../../../internal/dtype
#include "kernels.h"
*/
import "C"

import (
	"unsafe"

	"github.com/goep/goep/ep/driver"
)

// F32ToBF16 rounds n float32s at src to bfloat16s at dst, in one C call.
func F32ToBF16(dst, src unsafe.Pointer, n int) {
	if n > 0 {
		C.ep_f32_to_bf16((*C.uint16_t)(dst), (*C.float)(src), C.int64_t(n))
	}
}

// BF16ToF32 widens n bfloat16s at src to float32s at dst, in one C call.
func BF16ToF32(dst, src unsafe.Pointer, n int) {
	if n > 0 {
		C.ep_bf16_to_f32((*C.float)(dst), (*C.uint16_t)(src), C.int64_t(n))
	}
}

// QuantizeAt casts rows rows of elem (row r at src+off[r]) to e4m3 codes at
// the addresses dst[r] and their scales at dsc[r], as wire format w's
// dispatch does, in one C call (ep.Quantize).
func QuantizeAt(dst, dsc []uintptr, src unsafe.Pointer, off []int64, hidden int, elem driver.DType, w driver.WireFormat, impl CastImpl) {
	if len(dst) == 0 {
		return
	}
	C.ep_quant_rows((*C.uintptr_t)(unsafe.Pointer(&dst[0])), (*C.uintptr_t)(unsafe.Pointer(&dsc[0])),
		(*C.char)(src), (*C.int64_t)(unsafe.Pointer(&off[0])), C.int64_t(len(dst)),
		C.int64_t(hidden), C.int(elem), scaleMode(w), C.int(impl))
}

// DequantizeRows widens rows rows of e4m3 codes at q and their scales into
// elements of elem at dst, in one C call (ep.Dequantize).
func DequantizeRows(dst unsafe.Pointer, elem driver.DType, q unsafe.Pointer, scales []float32, rows, hidden int) {
	if rows == 0 {
		return
	}
	C.ep_dequant_rows(dst, C.int(elem), (*C.uint8_t)(q), f32p(scales), C.int64_t(rows), C.int64_t(hidden))
}

// scaleMode is w's ep_scale.
func scaleMode(w driver.WireFormat) C.int {
	if w == driver.WireFP8UE8M0 {
		return C.EP_SCALE_UE8M0
	}
	return C.EP_SCALE_F32
}

// RouteTokens is the layout kernel (ep_layout) over the T tokens of topk
// ([T][K] ids of E experts, L per rank on R ranks, nodeOf[r] of nodes
// nodes): it fills the counts and places (each sized by the caller) and
// returns -1, or the code of the first bad id: 4*(t*K+k) + 1 for an id out
// of range, + 2 for a repeated one.
func RouteTokens(topk []int32, T, K, E, L, R int, nodeOf []int32, nodes int, perExpert, perRank, perNode, pairOrd, tokRankOrd, tokNodeOrd []int32) int64 {
	return int64(C.ep_layout(i32p(topk), C.int64_t(T), C.int(K), C.int(E), C.int(L), C.int(R),
		i32p(nodeOf), C.int(nodes), i32p(perExpert), i32p(perRank), i32p(perNode),
		i32p(pairOrd), i32p(tokRankOrd), i32p(tokNodeOrd)))
}

func i32p(s []int32) *C.int32_t {
	if len(s) == 0 {
		return nil
	}
	return (*C.int32_t)(unsafe.Pointer(&s[0]))
}

func f32p(s []float32) *C.float {
	if len(s) == 0 {
		return nil
	}
	return (*C.float)(unsafe.Pointer(&s[0]))
}
