//go:build mpi

package main

/*
#include "capi_internal.h"
*/
import "C"

import (
	"unsafe"

	"github.com/goep/goep/ep"
	"github.com/goep/goep/ep/driver"
)

// The functions of goep_ep.h. Each runs its body under guard, which
// recovers a panic into goepEpInternalError and leaves the error's message,
// named after the function, as the calling thread's last error. Their
// stream parameters are never read: every call is finished when it returns.

//export goepEpGetVersion
func goepEpGetVersion(version *C.int) C.goepEpResult_t {
	return guard("goepEpGetVersion", func() error {
		if version == nil {
			return invalidArgf("version is NULL")
		}
		*version = C.GOEP_EP_VERSION_CODE
		return nil
	})
}

//export goepEpBufferPlan
func goepEpBufferPlan(config *C.goepEpGroupConfig_t, nranks, nnodes C.int, info *C.goepEpMemInfo_t) C.goepEpResult_t {
	return guard("goepEpBufferPlan", func() error {
		return bufferPlan(config, nil, int(nranks), int(nnodes), info)
	})
}

//export goepEpBufferPlanWithOptions
func goepEpBufferPlanWithOptions(config *C.goepEpGroupConfig_t, options *C.goepEpGroupOptions_t, nranks, nnodes C.int,
	info *C.goepEpMemInfo_t) C.goepEpResult_t {
	return guard("goepEpBufferPlanWithOptions", func() error {
		return bufferPlan(config, options, int(nranks), int(nnodes), info)
	})
}

func bufferPlan(config *C.goepEpGroupConfig_t, options *C.goepEpGroupOptions_t, nranks, nnodes int, info *C.goepEpMemInfo_t) error {
	if info == nil {
		return invalidArgf("info is NULL")
	}
	if err := checkHeader("info", "goepEpMemInfo_t", uint32(info.size), uint32(info.magic), C.GOEP_EP_MEM_INFO_V1_SIZE,
		C.GOEP_EP_MAGIC, "GOEP_EP_MEM_INFO_INIT"); err != nil {
		return err
	}
	gc, err := readGroupConfig(config, options)
	if err != nil {
		return err
	}
	if nranks < 1 {
		return invalidArgf("nranks = %d, want at least 1", nranks)
	}
	if gc.cfg.TopK == 0 {
		// num_topk 0: each handle's, at most this bound; buffers grow with
		// the top-k, so the plan is for the largest one can be
		gc.cfg.TopK = min(gc.cfg.NumExperts, driver.MaxTopK)
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
func goepEpCreateGroup(group *C.goepEpGroup_t, comm C.MPI_Comm, config *C.goepEpGroupConfig_t) C.goepEpResult_t {
	return guard("goepEpCreateGroup", func() error { return createGroup(group, comm, config, nil) })
}

//export goepEpCreateGroupWithOptions
func goepEpCreateGroupWithOptions(group *C.goepEpGroup_t, comm C.MPI_Comm, config *C.goepEpGroupConfig_t,
	options *C.goepEpGroupOptions_t) C.goepEpResult_t {
	return guard("goepEpCreateGroupWithOptions", func() error { return createGroup(group, comm, config, options) })
}

func createGroup(group *C.goepEpGroup_t, comm C.MPI_Comm, config *C.goepEpGroupConfig_t, options *C.goepEpGroupOptions_t) error {
	if group == nil {
		return invalidArgf("group is NULL")
	}
	g, err := newGroup(comm, config, options)
	if err != nil {
		return err
	}
	putID(group, addGroup(g))
	return nil
}

//export goepEpGroupDestroy
func goepEpGroupDestroy(group C.goepEpGroup_t) C.goepEpResult_t {
	return guard("goepEpGroupDestroy", func() error {
		g, id, err := lookupGroup(group)
		if err == nil {
			if err = g.destroy(); err == nil || resultOf(err) != C.goepEpTimeout {
				removeGroup(id) // kept only when a rank did not come: the caller may call again
			}
		}
		return err
	})
}

//export goepEpGroupBufferBytes
func goepEpGroupBufferBytes(group C.goepEpGroup_t, bytes *C.size_t) C.goepEpResult_t {
	return guard("goepEpGroupBufferBytes", func() error {
		if bytes == nil {
			return invalidArgf("bytes is NULL")
		}
		g, _, err := lookupGroup(group)
		if err == nil {
			var n int
			if n, err = g.bufferBytes(); err == nil {
				*bytes = C.size_t(n)
			}
		}
		return err
	})
}

//export goepEpHandleMemSize
func goepEpHandleMemSize(group C.goepEpGroup_t, layout C.goepEpLayout_t, config *C.goepEpHandleConfig_t, sizeOut *C.size_t,
	numTopK C.int) C.goepEpResult_t {
	return guard("goepEpHandleMemSize", func() error {
		if sizeOut == nil {
			return invalidArgf("size_out is NULL")
		}
		g, _, err := lookupGroup(group)
		if err == nil {
			var n int
			if n, err = g.handleMemSize(layout, config, int(numTopK)); err == nil {
				*sizeOut = C.size_t(n)
			}
		}
		return err
	})
}

//export goepEpTensorAlloc
func goepEpTensorAlloc(tensor **C.goepEpTensor_t, ndim C.uint, datatype C.goepEpDataType_t, sizes *C.size_t,
	config *C.goepEpTensorAllocConfig_t) C.goepEpResult_t {
	return guard("goepEpTensorAlloc", func() error { return tensorAlloc(tensor, ndim, datatype, sizes, config) })
}

//export goepEpTensorDestroy
func goepEpTensorDestroy(tensor *C.goepEpTensor_t) C.goepEpResult_t {
	return guard("goepEpTensorDestroy", func() error { return tensorDestroy(tensor) })
}

//export goepEpCreateHandle
func goepEpCreateHandle(out *C.goepEpHandle_t, grp C.goepEpGroup_t, layout C.goepEpLayout_t, topk *C.goepEpTensor_t,
	info *C.goepEpLayoutInfo_t, config *C.goepEpHandleConfig_t, stream C.goepEpStream_t) C.goepEpResult_t {
	return guard("goepEpCreateHandle", func() error {
		return newHandleID(out, grp, func(g group) (handle, error) { return g.createHandle(layout, topk, info, config) })
	})
}

//export goepEpInitHandle
func goepEpInitHandle(out *C.goepEpHandle_t, grp C.goepEpGroup_t, layout C.goepEpLayout_t, config *C.goepEpHandleConfig_t,
	numTopK C.int, handleMem *C.goepEpTensor_t) C.goepEpResult_t {
	return guard("goepEpInitHandle", func() error {
		return newHandleID(out, grp, func(g group) (handle, error) { return g.initHandle(layout, config, int(numTopK), handleMem) })
	})
}

// newHandleID registers the handle that mk makes on group gr as *out.
func newHandleID(out *C.goepEpHandle_t, gr C.goepEpGroup_t, mk func(group) (handle, error)) error {
	if out == nil {
		return invalidArgf("handle is NULL")
	}
	g, gid, err := lookupGroup(gr)
	if err != nil {
		return err
	}
	h, err := mk(g)
	if err != nil {
		return err
	}
	putID(out, addHandle(h, gid))
	return nil
}

//export goepEpUpdateHandle
func goepEpUpdateHandle(handle C.goepEpHandle_t, topk *C.goepEpTensor_t, info *C.goepEpLayoutInfo_t, stream C.goepEpStream_t) C.goepEpResult_t {
	return guard("goepEpUpdateHandle", func() error {
		h, err := lookupHandle(handle)
		if err == nil {
			err = h.update(topk, info)
		}
		return err
	})
}

//export goepEpHandleDestroy
func goepEpHandleDestroy(handle C.goepEpHandle_t) C.goepEpResult_t {
	return guard("goepEpHandleDestroy", func() error {
		h, id, err := liveHandle(handle)
		if err != nil {
			return err
		}
		defer removeHandle(id) // destroyed whatever the outcome
		return h.destroy()
	})
}

//export goepEpRefuse
func goepEpRefuse(group C.goepEpGroup_t, handle C.goepEpHandle_t, call C.goepEpCall_t, reason *C.char) C.goepEpResult_t {
	return guard("goepEpRefuse", func() error {
		if reason == nil {
			return invalidArgf("reason is NULL: say why the call is refused")
		}
		why := C.GoString(reason)
		if why == "" {
			return invalidArgf("reason is empty: say why the call is refused")
		}
		if call == C.GOEP_EP_CALL_CREATE_HANDLE {
			g, _, err := lookupGroup(group)
			if err != nil {
				return err
			}
			return g.refuse(why)
		}
		h, err := lookupHandle(handle)
		if err != nil {
			return err
		}
		return h.refuse(call, why)
	})
}

//export goepEpDispatch
func goepEpDispatch(handle C.goepEpHandle_t, inputs *C.goepEpDispatchInputs_t, outputs *C.goepEpDispatchOutputs_t,
	info *C.goepEpLayoutInfo_t, config *C.goepEpDispatchConfig_t, stream C.goepEpStream_t) C.goepEpResult_t {
	return guard("goepEpDispatch", func() error {
		h, err := lookupHandle(handle)
		if err == nil {
			err = h.dispatch(inputs, outputs, info, config)
		}
		return err
	})
}

//export goepEpCombine
func goepEpCombine(handle C.goepEpHandle_t, inputs *C.goepEpCombineInputs_t, outputs *C.goepEpCombineOutputs_t,
	config *C.goepEpCombineConfig_t, stream C.goepEpStream_t) C.goepEpResult_t {
	return guard("goepEpCombine", func() error {
		h, err := lookupHandle(handle)
		if err == nil {
			err = h.combine(inputs, outputs, config)
		}
		return err
	})
}

//export goepEpComplete
func goepEpComplete(handle C.goepEpHandle_t, config *C.goepEpCompleteConfig_t, stream C.goepEpStream_t) C.goepEpResult_t {
	return guard("goepEpComplete", func() error {
		h, err := lookupHandle(handle)
		if err == nil {
			err = h.complete(config)
		}
		return err
	})
}

//export goepEpHandleRecvTokens
func goepEpHandleRecvTokens(handle C.goepEpHandle_t, tokens *C.goepEpTensor_t) C.goepEpResult_t {
	return guard("goepEpHandleRecvTokens", func() error {
		h, err := lookupHandle(handle)
		if err == nil {
			err = h.recvTokens(tokens)
		}
		return err
	})
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
func goepEpMaskQuery(group C.goepEpGroup_t, status *C.int, stream C.goepEpStream_t) C.goepEpResult_t {
	return guard("goepEpMaskQuery", func() error {
		g, s, err := maskOf(group, status, "mask_status")
		if err == nil {
			err = g.maskQuery(s)
		}
		return err
	})
}

//export goepEpMaskUpdate
func goepEpMaskUpdate(group C.goepEpGroup_t, mask *C.int, stream C.goepEpStream_t) C.goepEpResult_t {
	return guard("goepEpMaskUpdate", func() error {
		g, m, err := maskOf(group, mask, "mask")
		if err == nil {
			err = g.maskUpdate(m)
		}
		return err
	})
}

//export goepEpMaskClean
func goepEpMaskClean(group C.goepEpGroup_t, stream C.goepEpStream_t) C.goepEpResult_t {
	return guard("goepEpMaskClean", func() error {
		g, _, err := lookupGroup(group)
		if err == nil {
			err = g.maskClean()
		}
		return err
	})
}

//export goepEpGetAsyncError
func goepEpGetAsyncError(group C.goepEpGroup_t, errorOut *C.int) C.goepEpResult_t {
	return guard("goepEpGetAsyncError", func() error {
		if errorOut == nil {
			return invalidArgf("error_out is NULL")
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
		return err
	})
}

//export goepEpErrorClear
func goepEpErrorClear(group C.goepEpGroup_t) C.goepEpResult_t {
	return guard("goepEpErrorClear", func() error {
		g, _, err := lookupGroup(group)
		if err == nil {
			err = g.errorClear()
		}
		return err
	})
}
