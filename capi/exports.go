//go:build mpi

package main

/*
#include "capi_internal.h"
*/
import "C"

import (
	"unsafe"

	"github.com/goep/goep/ep"
)

// The functions of goep_ep.h. Each recovers a panic into
// goepEpInternalError and leaves its error's message, named after it, as the
// calling thread's last error.

//export goepEpGetVersion
func goepEpGetVersion(version *C.int) (rc C.goepEpResult_t) {
	defer recoverPanic("goepEpGetVersion", &rc)
	if version == nil {
		return finish("goepEpGetVersion", invalidArgf("version is NULL"))
	}
	*version = C.GOEP_EP_VERSION_CODE
	return C.goepEpSuccess
}

//export goepEpBufferPlan
func goepEpBufferPlan(config *C.goepEpGroupConfig_t, nranks, nnodes C.int, info *C.goepEpMemInfo_t) (rc C.goepEpResult_t) {
	const fn = "goepEpBufferPlan"
	defer recoverPanic(fn, &rc)
	return finish(fn, bufferPlan(config, int(nranks), int(nnodes), info))
}

func bufferPlan(config *C.goepEpGroupConfig_t, nranks, nnodes int, info *C.goepEpMemInfo_t) error {
	if info == nil {
		return invalidArgf("info is NULL")
	}
	if err := checkHeader("info", "goepEpMemInfo_t", uint32(info.size), uint32(info.magic), C.GOEP_EP_MEM_INFO_V1_SIZE,
		C.GOEP_EP_MAGIC, "GOEP_EP_MEM_INFO_INIT"); err != nil {
		return err
	}
	gc, err := readGroupConfig(config)
	if err != nil {
		return err
	}
	if nranks < 1 {
		return invalidArgf("nranks = %d, want at least 1", nranks)
	}
	elem := ep.BFloat16
	if gc.elem == dtFloat32 {
		elem = ep.Float32
	}
	f, err := ep.BufferPlan(gc.cfg, elem, nranks, nnodes)
	if err != nil {
		return withCode(C.goepEpInvalidArgument, err)
	}
	info.shared_per_rank = C.uint64_t(f.SharedPerRank)
	info.window_per_rank = C.uint64_t(f.WindowPerRank)
	info.copies_per_rank = C.uint64_t(f.CopiesPerRank)
	info.per_node = C.uint64_t(f.PerNode)
	info.ranks_per_node = C.uint(f.RanksPerNode)
	return nil
}

//export goepEpCreateGroup
func goepEpCreateGroup(group *C.goepEpGroup_t, comm C.MPI_Comm, config *C.goepEpGroupConfig_t) (rc C.goepEpResult_t) {
	const fn = "goepEpCreateGroup"
	defer recoverPanic(fn, &rc)
	if group == nil {
		return finish(fn, invalidArgf("group is NULL"))
	}
	g, err := newGroup(comm, config)
	if err != nil {
		return finish(fn, err)
	}
	*group = C.goep_ep_group_of(C.uint64_t(addGroup(g)))
	return C.goepEpSuccess
}

//export goepEpGroupDestroy
func goepEpGroupDestroy(group C.goepEpGroup_t) (rc C.goepEpResult_t) {
	const fn = "goepEpGroupDestroy"
	defer recoverPanic(fn, &rc)
	g, id, err := lookupGroup(group)
	if err == nil {
		if err = g.destroy(); err == nil || resultOf(err) != C.goepEpTimeout {
			removeGroup(id) // kept only when a rank did not come: the caller may call again
		}
	}
	return finish(fn, err)
}

//export goepEpGroupBufferBytes
func goepEpGroupBufferBytes(group C.goepEpGroup_t, bytes *C.size_t) (rc C.goepEpResult_t) {
	const fn = "goepEpGroupBufferBytes"
	defer recoverPanic(fn, &rc)
	if bytes == nil {
		return finish(fn, invalidArgf("bytes is NULL"))
	}
	g, _, err := lookupGroup(group)
	if err == nil {
		var n int
		if n, err = g.bufferBytes(); err == nil {
			*bytes = C.size_t(n)
		}
	}
	return finish(fn, err)
}

//export goepEpHandleMemSize
func goepEpHandleMemSize(group C.goepEpGroup_t, layout C.goepEpLayout_t, config *C.goepEpHandleConfig_t, sizeOut *C.size_t,
	numTopK C.int) (rc C.goepEpResult_t) {
	const fn = "goepEpHandleMemSize"
	defer recoverPanic(fn, &rc)
	if sizeOut == nil {
		return finish(fn, invalidArgf("size_out is NULL"))
	}
	g, _, err := lookupGroup(group)
	if err == nil {
		var n int
		if n, err = g.handleMemSize(layout, config, int(numTopK)); err == nil {
			*sizeOut = C.size_t(n)
		}
	}
	return finish(fn, err)
}

//export goepEpCreateHandle
func goepEpCreateHandle(handle *C.goepEpHandle_t, group C.goepEpGroup_t, layout C.goepEpLayout_t, topk *C.goepEpTensor_t,
	info *C.goepEpLayoutInfo_t, config *C.goepEpHandleConfig_t) (rc C.goepEpResult_t) {
	const fn = "goepEpCreateHandle"
	defer recoverPanic(fn, &rc)
	if handle == nil {
		return finish(fn, invalidArgf("handle is NULL"))
	}
	g, gid, err := lookupGroup(group)
	if err != nil {
		return finish(fn, err)
	}
	h, err := g.createHandle(layout, topk, info, config)
	if err != nil {
		return finish(fn, err)
	}
	*handle = C.goep_ep_handle_of(C.uint64_t(addHandle(h, gid)))
	return C.goepEpSuccess
}

//export goepEpHandleDestroy
func goepEpHandleDestroy(handle C.goepEpHandle_t) (rc C.goepEpResult_t) {
	const fn = "goepEpHandleDestroy"
	defer recoverPanic(fn, &rc)
	return finish(fn, removeHandle(handle))
}

//export goepEpDispatch
func goepEpDispatch(handle C.goepEpHandle_t, inputs *C.goepEpDispatchInputs_t, outputs *C.goepEpDispatchOutputs_t,
	info *C.goepEpLayoutInfo_t, config *C.goepEpDispatchConfig_t) (rc C.goepEpResult_t) {
	const fn = "goepEpDispatch"
	defer recoverPanic(fn, &rc)
	h, err := lookupHandle(handle)
	if err == nil {
		err = h.dispatch(inputs, outputs, info, config)
	}
	return finish(fn, err)
}

//export goepEpCombine
func goepEpCombine(handle C.goepEpHandle_t, inputs *C.goepEpCombineInputs_t, outputs *C.goepEpCombineOutputs_t,
	config *C.goepEpCombineConfig_t) (rc C.goepEpResult_t) {
	const fn = "goepEpCombine"
	defer recoverPanic(fn, &rc)
	h, err := lookupHandle(handle)
	if err == nil {
		err = h.combine(inputs, outputs, config)
	}
	return finish(fn, err)
}

//export goepEpComplete
func goepEpComplete(handle C.goepEpHandle_t, config *C.goepEpCompleteConfig_t) (rc C.goepEpResult_t) {
	const fn = "goepEpComplete"
	defer recoverPanic(fn, &rc)
	h, err := lookupHandle(handle)
	if err == nil {
		err = h.complete(config)
	}
	return finish(fn, err)
}

//export goepEpHandleRecvTokens
func goepEpHandleRecvTokens(handle C.goepEpHandle_t, tokens *C.goepEpTensor_t) (rc C.goepEpResult_t) {
	const fn = "goepEpHandleRecvTokens"
	defer recoverPanic(fn, &rc)
	h, err := lookupHandle(handle)
	if err == nil {
		err = h.recvTokens(tokens)
	}
	return finish(fn, err)
}

// maskOf is the caller's int[nranks] of a mask call.
func maskOf(group C.goepEpGroup_t, p *C.int, what string) (group, []C.int, error) {
	g, _, err := lookupGroup(group)
	if err != nil {
		return nil, nil, err
	}
	if p == nil {
		return nil, nil, invalidArgf("%s is NULL (want int[nranks])", what)
	}
	return g, unsafe.Slice(p, g.size()), nil
}

//export goepEpMaskQuery
func goepEpMaskQuery(group C.goepEpGroup_t, status *C.int) (rc C.goepEpResult_t) {
	const fn = "goepEpMaskQuery"
	defer recoverPanic(fn, &rc)
	g, s, err := maskOf(group, status, "mask_status")
	if err == nil {
		err = g.maskQuery(s)
	}
	return finish(fn, err)
}

//export goepEpMaskUpdate
func goepEpMaskUpdate(group C.goepEpGroup_t, mask *C.int) (rc C.goepEpResult_t) {
	const fn = "goepEpMaskUpdate"
	defer recoverPanic(fn, &rc)
	g, m, err := maskOf(group, mask, "mask")
	if err == nil {
		err = g.maskUpdate(m)
	}
	return finish(fn, err)
}

//export goepEpMaskClean
func goepEpMaskClean(group C.goepEpGroup_t) (rc C.goepEpResult_t) {
	const fn = "goepEpMaskClean"
	defer recoverPanic(fn, &rc)
	g, _, err := lookupGroup(group)
	if err == nil {
		err = g.maskClean()
	}
	return finish(fn, err)
}

//export goepEpGetAsyncError
func goepEpGetAsyncError(group C.goepEpGroup_t, errorOut *C.int) (rc C.goepEpResult_t) {
	const fn = "goepEpGetAsyncError"
	defer recoverPanic(fn, &rc)
	if errorOut == nil {
		return finish(fn, invalidArgf("error_out is NULL"))
	}
	g, _, err := lookupGroup(group)
	if err == nil {
		var set bool
		if set, err = g.asyncError(); err == nil {
			*errorOut = 0
			if set {
				*errorOut = 1
			}
		}
	}
	return finish(fn, err)
}

//export goepEpErrorClear
func goepEpErrorClear(group C.goepEpGroup_t) (rc C.goepEpResult_t) {
	const fn = "goepEpErrorClear"
	defer recoverPanic(fn, &rc)
	g, _, err := lookupGroup(group)
	if err == nil {
		err = g.errorClear()
	}
	return finish(fn, err)
}
