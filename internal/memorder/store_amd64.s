#include "textflag.h"

// func StoreRelease(p *uint64, v uint64)
//
// A plain store: on amd64 (TSO) every store is a release. Being a call
// into assembly, it is also a compiler barrier: the Go compiler moves no
// memory access across it.
TEXT ·StoreRelease(SB), NOSPLIT, $0-16
	MOVQ p+0(FP), AX
	MOVQ v+8(FP), BX
	MOVQ BX, (AX)
	RET
