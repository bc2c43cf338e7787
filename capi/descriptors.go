//go:build mpi

package main

/*
#include <stdlib.h>
#include <string.h>
#include "capi_internal.h"
*/
import "C"

import (
	"unsafe"

	"github.com/goep/goep/ep"
)

// Descriptors in C memory, as a C caller passes them: the fuzz targets of
// the checks (descriptors_test.go) fill them from their inputs (a test file
// cannot use cgo). The raw bytes become the struct's scalar fields; its
// pointer fields are set here, to memory of this file's or NULL, since a
// caller that passes a wild pointer is outside what any check can catch.

// cMemory is C memory of n bytes holding raw (zero past it), freed by free.
type cMemory struct {
	p unsafe.Pointer
	n int
}

func newCMemory(raw []byte, n int) *cMemory {
	m := &cMemory{p: C.calloc(C.size_t(max(n, 1)), 1), n: n}
	if len(raw) > 0 {
		C.memcpy(m.p, unsafe.Pointer(&raw[0]), C.size_t(min(len(raw), n)))
	}
	return m
}

func (m *cMemory) free() { C.free(m.p) }

// descTensor is a goepEpTensor_t of raw bytes (win_hdl NULL) whose sizes point at dims
// (NULL when dims is nil) and whose data at a zeroed buffer of dataBytes
// (NULL when 0): a descriptor can claim more than the buffer holds, and the
// checks cannot know; the fuzz target reads nothing through it.
type descTensor struct {
	t           *C.goepEpTensor_t
	mem, s, buf *cMemory
}

func newDescTensor(raw []byte, dims []uint64, dataBytes int) *descTensor {
	d := &descTensor{mem: newCMemory(raw, int(C.sizeof_goepEpTensor_t))}
	d.t = (*C.goepEpTensor_t)(d.mem.p)
	d.t.sizes, d.t.data, d.t.win_hdl = nil, nil, nil
	if dims != nil {
		d.s = newCMemory(nil, 8*len(dims))
		copy(unsafe.Slice((*uint64)(d.s.p), len(dims)), dims)
		d.t.sizes = (*C.size_t)(d.s.p)
	}
	if dataBytes > 0 {
		d.buf = newCMemory(nil, dataBytes)
		d.t.data = d.buf.p
	}
	return d
}

// fix gives the descriptor the right size and magic (so that the checks go
// past them) and sets ndim and the element type.
func (d *descTensor) fix(ndim uint32, dtype int32) {
	d.t.size, d.t.magic = C.GOEP_EP_TENSOR_V1_SIZE, C.GOEP_EP_TENSOR_MAGIC
	d.t.ndim, d.t.datatype = C.uint(ndim), C.goepEpDataType_t(dtype)
}

func (d *descTensor) free() {
	for _, m := range []*cMemory{d.mem, d.s, d.buf} {
		if m != nil {
			m.free()
		}
	}
}

// descStruct is one of the versioned structs without pointers (the group,
// handle, dispatch, combine and complete configs, and goepEpMemInfo_t), or
// the group options with their backend NULL, of raw bytes; with fixHeader
// its size and magic are right.
type descStruct struct{ mem *cMemory }

// Kinds of descStruct.
const (
	descGroupConfig = iota
	descHandleConfig
	descDispatchConfig
	descCombineConfig
	descCompleteConfig
	descGroupOptions
	numDescStructs
)

func newDescStruct(kind int, raw []byte, fixHeader bool) *descStruct {
	size := []C.size_t{C.sizeof_goepEpGroupConfig_t, C.sizeof_goepEpHandleConfig_t, C.sizeof_goepEpDispatchConfig_t,
		C.sizeof_goepEpCombineConfig_t, C.sizeof_goepEpCompleteConfig_t, C.sizeof_goepEpGroupOptions_t}[kind]
	d := &descStruct{mem: newCMemory(raw, int(size))}
	if fixHeader {
		hdr := (*[2]C.uint)(d.mem.p)
		hdr[0], hdr[1] = C.uint(size), C.GOEP_EP_MAGIC
	}
	if kind == descGroupOptions {
		(*C.goepEpGroupOptions_t)(d.mem.p).backend = nil
	}
	return d
}

func (d *descStruct) free() { d.mem.free() }

// readQuant reads the combine and dispatch recipes of a descGroupOptions
// into gc, as readGroupOptions does once it has gc's backend.
func (d *descStruct) readQuant(gc *groupConfig) error {
	o := (*C.goepEpGroupOptions_t)(d.mem.p)
	if err := readCombineQuant(o, gc); err != nil {
		return err
	}
	return readDispatchQuant(o, gc)
}

// check runs the check of the library for a struct of its kind, and for a
// group config also goepEpBufferPlan over nranks and nnodes (the whole entry
// point: a panic there is goepEpInternalError). It returns the result code
// where it ran an entry point, or the check's error.
func (d *descStruct) check(kind, nranks, nnodes int) (C.goepEpResult_t, error) {
	switch kind {
	case descGroupConfig:
		cfg := (*C.goepEpGroupConfig_t)(d.mem.p)
		if _, err := readGroupConfig(cfg, nil); err != nil {
			return 0, err
		}
		info := (*C.goepEpMemInfo_t)(C.calloc(1, C.sizeof_goepEpMemInfo_t))
		defer C.free(unsafe.Pointer(info))
		info.size, info.magic = C.sizeof_goepEpMemInfo_t, C.GOEP_EP_MAGIC
		return goepEpBufferPlan(cfg, C.int(nranks), C.int(nnodes), info), nil
	case descGroupOptions:
		// The options of a valid LL group config: 4 experts, 8 tokens, rows
		// of 32 bytes, top-2.
		cfg := (*C.goepEpGroupConfig_t)(C.calloc(1, C.sizeof_goepEpGroupConfig_t))
		defer C.free(unsafe.Pointer(cfg))
		cfg.size, cfg.magic, cfg.version = C.sizeof_goepEpGroupConfig_t, C.GOEP_EP_MAGIC, C.GOEP_EP_API_VERSION
		cfg.num_experts, cfg.max_dispatch_tokens_per_rank, cfg.max_token_bytes, cfg.num_topk = 4, 8, 32, 2
		opts := (*C.goepEpGroupOptions_t)(d.mem.p)
		if _, err := readGroupConfig(cfg, opts); err != nil {
			return 0, err
		}
		info := (*C.goepEpMemInfo_t)(C.calloc(1, C.sizeof_goepEpMemInfo_t))
		defer C.free(unsafe.Pointer(info))
		info.size, info.magic = C.sizeof_goepEpMemInfo_t, C.GOEP_EP_MAGIC
		return goepEpBufferPlanWithOptions(cfg, opts, C.int(nranks), C.int(nnodes), info), nil
	case descHandleConfig:
		_, err := readHandleConfig((*C.goepEpHandleConfig_t)(d.mem.p), ep.HighThroughput, C.GOEP_EP_LAYOUT_EXPERT_MAJOR)
		return 0, err
	case descDispatchConfig:
		_, err := readDispatchConfig((*C.goepEpDispatchConfig_t)(d.mem.p))
		return 0, err
	case descCombineConfig:
		_, err := readCombineConfig((*C.goepEpCombineConfig_t)(d.mem.p))
		return 0, err
	}
	c := (*C.goepEpCompleteConfig_t)(d.mem.p)
	return 0, checkHeader("config", "goepEpCompleteConfig_t", uint32(c.size), uint32(c.magic), C.GOEP_EP_COMPLETE_CONFIG_V1_SIZE,
		C.GOEP_EP_MAGIC, "GOEP_EP_COMPLETE_CONFIG_INIT")
}
