//go:build mpi

package main

/*
#include "capi_internal.h"
*/
import "C"

import "fmt"

// The C names of the enums' values that messages name.
var (
	layoutNames = map[C.goepEpLayout_t]string{
		C.GOEP_EP_LAYOUT_EXPERT_MAJOR: "GOEP_EP_LAYOUT_EXPERT_MAJOR",
		C.GOEP_EP_LAYOUT_RANK_MAJOR:   "GOEP_EP_LAYOUT_RANK_MAJOR",
		C.GOEP_EP_LAYOUT_FLAT:         "GOEP_EP_LAYOUT_FLAT",
	}
	dispQuantNames = map[C.goepEpDispQuant_t]string{
		C.GOEP_EP_DISP_QUANT_NONE:       "GOEP_EP_DISP_QUANT_NONE",
		C.GOEP_EP_DISP_QUANT_FWD:        "GOEP_EP_DISP_QUANT_FWD",
		C.GOEP_EP_DISP_QUANT_DS_FP8E3M4: "GOEP_EP_DISP_QUANT_DS_FP8E3M4",
		C.GOEP_EP_DISP_QUANT_FWD_NVFP4:  "GOEP_EP_DISP_QUANT_FWD_NVFP4",
	}
	combQuantNames = map[C.goepEpCombQuant_t]string{
		C.GOEP_EP_COMB_QUANT_NONE:      "GOEP_EP_COMB_QUANT_NONE",
		C.GOEP_EP_COMB_QUANT_NVFP4:     "GOEP_EP_COMB_QUANT_NVFP4",
		C.GOEP_EP_COMB_QUANT_FP8:       "GOEP_EP_COMB_QUANT_FP8",
		C.GOEP_EP_COMB_QUANT_FP8_UE8M0: "GOEP_EP_COMB_QUANT_FP8_UE8M0",
	}
)

// enumName is v's name in names, or its C type with its number, formatted
// by verb, for a value the enum does not have.
func enumName[T ~int32 | ~uint32](names map[T]string, typ, verb string, v T) string {
	if n, ok := names[v]; ok {
		return n
	}
	return fmt.Sprintf("%s("+verb+")", typ, int64(v))
}

func layoutName(l C.goepEpLayout_t) string {
	return enumName(layoutNames, "goepEpLayout_t", "%d", l)
}

func dispQuantName(q C.goepEpDispQuant_t) string {
	return enumName(dispQuantNames, "goepEpDispQuant_t", "%d", q)
}

func combQuantName(q C.goepEpCombQuant_t) string {
	return enumName(combQuantNames, "goepEpCombQuant_t", "%#x", q)
}
