//go:build amd64 && !purego

#include "textflag.h"

// Neither kernel touches X15 or R14, which Go's internal ABI keeps as zero
// and the goroutine pointer.

// func sumBF16AVX2(dst *uint16, n int, src *unsafe.Pointer, w *float32, k int)
//
// 16 elements at a time: each source's 16 bfloat16 become two vectors of 8
// float32 (zero-extend, shift left 16), are multiplied by the source's
// weight and added to the sum (VMULPS then VADDPS: never fused); the sum is
// rounded to bfloat16 as ep_bf16_bits does (NaN quietened), packed and
// stored.
TEXT ·sumBF16AVX2(SB), NOSPLIT, $0-40
	MOVQ dst+0(FP), DI
	MOVQ n+8(FP), BX
	SHLQ $1, BX                // bytes
	MOVQ src+16(FP), SI
	MOVQ w+24(FP), DX
	MOVQ k+32(FP), R8

	VPCMPEQD  Y8, Y8, Y8       // 0xffffffff
	VPSRLD    $1, Y8, Y14      // 0x7fffffff: |u|
	VPSRLD    $17, Y8, Y13     // 0x00007fff
	VPSRLD    $31, Y8, Y12     // 1
	VPSLLD    $6, Y12, Y11     // 0x40: the quiet bit of a bfloat16 NaN
	VPSRLD    $24, Y8, Y10
	VPSLLD    $23, Y10, Y10    // 0x7f800000: infinity
	VPSRLD    $25, Y8, Y9
	VPSLLD    $23, Y9, Y9      // 1.0f, the weight when w is nil

	XORQ AX, AX                // byte offset of the block

block:
	MOVQ      (SI), R9
	VPMOVZXWD (R9)(AX*1), Y0
	VPMOVZXWD 16(R9)(AX*1), Y1
	VPSLLD    $16, Y0, Y0
	VPSLLD    $16, Y1, Y1
	VMOVAPS   Y9, Y2
	TESTQ     DX, DX
	JZ        first
	VBROADCASTSS (DX), Y2

first:
	VMULPS Y2, Y0, Y0
	VMULPS Y2, Y1, Y1
	MOVQ   $1, R10

source:
	CMPQ      R10, R8
	JGE       round
	MOVQ      (SI)(R10*8), R9
	VPMOVZXWD (R9)(AX*1), Y3
	VPMOVZXWD 16(R9)(AX*1), Y4
	VPSLLD    $16, Y3, Y3
	VPSLLD    $16, Y4, Y4
	VMOVAPS   Y9, Y2
	TESTQ     DX, DX
	JZ        add
	VBROADCASTSS (DX)(R10*4), Y2

add:
	VMULPS Y2, Y3, Y3
	VMULPS Y2, Y4, Y4
	VADDPS Y3, Y0, Y0
	VADDPS Y4, Y1, Y1
	INCQ   R10
	JMP    source

round:
	// Y0 -> Y5: (u + 0x7fff + ((u >> 16) & 1)) >> 16, or (u >> 16) | 0x40 for NaN
	VPSRLD    $16, Y0, Y5
	VPAND     Y12, Y5, Y6
	VPADDD    Y13, Y6, Y6
	VPADDD    Y0, Y6, Y6
	VPSRLD    $16, Y6, Y6
	VPOR      Y11, Y5, Y5
	VPAND     Y14, Y0, Y7
	VPCMPGTD  Y10, Y7, Y7
	VPBLENDVB Y7, Y5, Y6, Y5

	// Y1 -> Y3, the same
	VPSRLD    $16, Y1, Y3
	VPAND     Y12, Y3, Y4
	VPADDD    Y13, Y4, Y4
	VPADDD    Y1, Y4, Y4
	VPSRLD    $16, Y4, Y4
	VPOR      Y11, Y3, Y3
	VPAND     Y14, Y1, Y7
	VPCMPGTD  Y10, Y7, Y7
	VPBLENDVB Y7, Y3, Y4, Y3

	// 16 words: the pack interleaves the 128-bit lanes, the permute restores the order
	VPACKUSDW Y3, Y5, Y5
	VPERMQ    $0xD8, Y5, Y5
	VMOVDQU   Y5, (DI)(AX*1)

	ADDQ $32, AX
	CMPQ AX, BX
	JLT  block
	VZEROUPPER
	RET

// func sumF32AVX2(dst *float32, n int, src *unsafe.Pointer, w *float32, k int)
//
// 8 elements at a time: each source's 8 float32 are multiplied by its
// weight and added to the sum (VMULPS then VADDPS: never fused).
TEXT ·sumF32AVX2(SB), NOSPLIT, $0-40
	MOVQ dst+0(FP), DI
	MOVQ n+8(FP), BX
	SHLQ $2, BX                // bytes
	MOVQ src+16(FP), SI
	MOVQ w+24(FP), DX
	MOVQ k+32(FP), R8

	VPCMPEQD Y8, Y8, Y8
	VPSRLD   $25, Y8, Y9
	VPSLLD   $23, Y9, Y9       // 1.0f, the weight when w is nil

	XORQ AX, AX                // byte offset of the block

f32block:
	MOVQ    (SI), R9
	VMOVUPS (R9)(AX*1), Y0
	VMOVAPS Y9, Y2
	TESTQ   DX, DX
	JZ      f32first
	VBROADCASTSS (DX), Y2

f32first:
	VMULPS Y2, Y0, Y0
	MOVQ   $1, R10

f32source:
	CMPQ    R10, R8
	JGE     f32store
	MOVQ    (SI)(R10*8), R9
	VMOVUPS (R9)(AX*1), Y3
	VMOVAPS Y9, Y2
	TESTQ   DX, DX
	JZ      f32add
	VBROADCASTSS (DX)(R10*4), Y2

f32add:
	VMULPS Y2, Y3, Y3
	VADDPS Y3, Y0, Y0
	INCQ   R10
	JMP    f32source

f32store:
	VMOVUPS Y0, (DI)(AX*1)
	ADDQ    $32, AX
	CMPQ    AX, BX
	JLT     f32block
	VZEROUPPER
	RET
