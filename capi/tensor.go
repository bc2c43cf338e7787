//go:build mpi

package main

/*
#include <stdlib.h>
#include "capi_internal.h"
*/
import "C"

import (
	"fmt"
	"strings"
	"sync"
	"unsafe"
)

// dataType is a goepEpDataType_t.
type dataType int

const (
	dtInt8     dataType = C.goepEpInt8
	dtUint8    dataType = C.goepEpUint8
	dtInt32    dataType = C.goepEpInt32
	dtUint32   dataType = C.goepEpUint32
	dtInt64    dataType = C.goepEpInt64
	dtUint64   dataType = C.goepEpUint64
	dtFloat16  dataType = C.goepEpFloat16
	dtFloat32  dataType = C.goepEpFloat32
	dtFloat64  dataType = C.goepEpFloat64
	dtBfloat16 dataType = C.goepEpBfloat16
	dtFloat8e4 dataType = C.goepEpFloat8e4m3
	dtFloat8e5 dataType = C.goepEpFloat8e5m2
	dtFloat4x2 dataType = C.goepEpFloat4x2
)

// dataTypes are the element types' names and sizes, by goepEpDataType_t
// (an array: the checks of every call read it).
var dataTypes = [...]struct {
	name string
	size int
}{
	dtInt8: {"int8", 1}, dtUint8: {"uint8", 1}, dtInt32: {"int32", 4}, dtUint32: {"uint32", 4},
	dtInt64: {"int64", 8}, dtUint64: {"uint64", 8}, dtFloat16: {"float16", 2}, dtFloat32: {"float32", 4},
	dtFloat64: {"float64", 8}, dtBfloat16: {"bfloat16", 2}, dtFloat8e4: {"float8e4m3", 1}, dtFloat8e5: {"float8e5m2", 1},
	dtFloat4x2: {"float4x2", 1},
}

func (d dataType) String() string {
	if d >= 0 && int(d) < len(dataTypes) && dataTypes[d].size > 0 {
		return dataTypes[d].name
	}
	return fmt.Sprintf("goepEpDataType_t(%d)", int(d))
}

// size is the element size in bytes (0 for an unknown type).
func (d dataType) size() int {
	if d < 0 || int(d) >= len(dataTypes) {
		return 0
	}
	return dataTypes[d].size
}

// maxDims bounds a tensor's ndim; maxBytes its size (far beyond any host).
const (
	maxDims  = 8
	maxBytes = 1 << 48
)

// tensor is a checked goepEpTensor_t: the caller's memory, never copied. It
// is a value, its extents held in place, so that checking a call's
// descriptors allocates nothing; the zero tensor is one not given (NULL).
type tensor struct {
	name  string // where it was passed, e.g. "inputs->tokens"
	dtype dataType
	nd    int // the number of extents in dims; 0: not given
	dims  [maxDims]int
	data  unsafe.Pointer
	elems int
}

// given reports whether the descriptor was passed (not NULL).
func (t *tensor) given() bool { return t.nd > 0 }

// shape is the tensor's extents, outermost first.
func (t *tensor) shape() []int { return t.dims[:t.nd] }

// readTensor checks the descriptor p ("name" in messages): size and magic,
// element type, extents and data pointer. A nil p is the zero tensor (not
// given) and no error.
func readTensor(name string, p *C.goepEpTensor_t) (tensor, error) {
	var t tensor
	if p == nil {
		return t, nil
	}
	magic := uint32(p.magic)
	if magic == C.GOEP_EP_TENSOR_MAGIC_ALLOC { // made by goepEpTensorAlloc
		magic = C.GOEP_EP_TENSOR_MAGIC
	}
	if err := checkHeader(name, "goepEpTensor_t", uint32(p.size), magic, C.GOEP_EP_TENSOR_V1_SIZE,
		C.GOEP_EP_TENSOR_MAGIC, "GOEP_EP_TENSOR_INIT"); err != nil {
		return t, err
	}
	if p.win_hdl != nil {
		return t, invalidUsagef("%s has a win_hdl: goep's tensors are host memory and it has no windows (want NULL)", name)
	}
	if p.win_offset != 0 {
		return t, invalidArgf("%s has win_offset = %d without a window (want 0)", name, uint64(p.win_offset))
	}
	dtype := dataType(p.datatype)
	if dtype.size() == 0 {
		return t, invalidArgf("%s has datatype %d, which is not a goepEpDataType_t", name, int(p.datatype))
	}
	nd := int(p.ndim)
	if nd < 1 || nd > maxDims {
		return t, invalidArgf("%s has ndim = %d, want 1 to %d", name, nd, maxDims)
	}
	if p.sizes == nil {
		return t, invalidArgf("%s has ndim = %d but sizes is NULL", name, nd)
	}
	var dims [maxDims]int
	elems := 1
	for i, s := range unsafe.Slice(p.sizes, nd) {
		if uint64(s) > maxBytes {
			return t, invalidArgf("%s has sizes[%d] = %d: too large", name, i, uint64(s))
		}
		dims[i] = int(s)
		// Each extent is below 2^48, but their product may not be: compare
		// before multiplying, so that it never overflows.
		if s > 0 && elems > maxBytes/dtype.size()/int(s) {
			return t, invalidArgf("%s has shape %s: too large", name, shapeString(dims[:i+1]))
		}
		elems *= int(s)
	}
	if p.data == nil && elems > 0 {
		return t, invalidArgf("%s has shape %s but data is NULL", name, shapeString(dims[:nd]))
	}
	return tensor{name: name, dtype: dtype, nd: nd, dims: dims, data: p.data, elems: elems}, nil
}

// need is a required tensor: nil is an error.
func need(name string, p *C.goepEpTensor_t) (tensor, error) {
	if p == nil {
		return tensor{}, invalidArgf("%s is required (it is NULL)", name)
	}
	return readTensor(name, p)
}

// want checks the element type (one of types), the data's alignment to it,
// and the shape: dims[i] < 0
// accepts any extent; what names the dimensions, e.g. "[num_tokens, hidden]".
func (t *tensor) want(what string, types []dataType, dims ...int) error {
	return t.wantNamed(what, "", types, dims)
}

// wantNamed is want with the dimensions' names in two parts, what then
// (where not "") tail, joined with a comma only for a refusal's message.
func (t *tensor) wantNamed(what, tail string, types []dataType, dims []int) error {
	ok := false
	for _, d := range types {
		ok = ok || t.dtype == d
	}
	if !ok {
		names := make([]string, len(types))
		for i, d := range types {
			names[i] = d.String()
		}
		return invalidArgf("%s has datatype %s, want %s", t.name, t.dtype, strings.Join(names, " or "))
	}
	if uintptr(t.data)%uintptr(t.dtype.size()) != 0 {
		return invalidArgf("%s: data %p is not aligned to its %d-byte %s elements", t.name, t.data, t.dtype.size(), t.dtype)
	}
	match := t.nd == len(dims)
	for i := 0; match && i < len(dims); i++ {
		match = dims[i] < 0 || dims[i] == t.dims[i]
	}
	if !match {
		if tail != "" {
			what += ", " + tail
		}
		return invalidArgf("%s has shape %s, want %s = %s", t.name, shapeString(t.shape()), what, wantString(dims))
	}
	return nil
}

// atLeastRows checks that a [rows, ...] tensor has at least n rows.
func (t *tensor) atLeastRows(n int, why string) error {
	if t.dims[0] < n {
		return invalidArgf("%s has %d rows (shape %s) but %s", t.name, t.dims[0], shapeString(t.shape()), why)
	}
	return nil
}

// atLeastReceived checks that a [rows, ...] tensor holds the n rows this
// rank received; tail ends the refusal's message.
func (t *tensor) atLeastReceived(n int, tail string) error {
	if t.dims[0] < n {
		return invalidArgf("%s has %d rows (shape %s) but this rank received %d rows%s", t.name, t.dims[0], shapeString(t.shape()), n, tail)
	}
	return nil
}

func shapeString(s []int) string {
	parts := make([]string, len(s))
	for i, n := range s {
		parts[i] = fmt.Sprint(n)
	}
	return "[" + strings.Join(parts, ", ") + "]"
}

func wantString(dims []int) string {
	parts := make([]string, len(dims))
	for i, n := range dims {
		if n < 0 {
			parts[i] = "any"
		} else {
			parts[i] = fmt.Sprint(n)
		}
	}
	return "[" + strings.Join(parts, ", ") + "]"
}

// view is the first n elements of t's memory as a Go slice (no copy).
func view[T any](t *tensor, n int) []T {
	if n == 0 {
		return []T{}
	}
	return unsafe.Slice((*T)(t.data), n)
}

// checkHeader checks a versioned struct's size and magic. min is the size of
// its first version: a smaller one is not this struct; a larger one is a
// newer caller's, whose tail is ignored. A field past min is read only
// where the size covers it (covers).
func checkHeader(name, typ string, size, magic, min, wantMagic uint32, init string) error {
	if magic != wantMagic {
		return invalidArgf("%s (%s) has magic 0x%08x, want 0x%08x: initialise it with %s", name, typ, magic, wantMagic, init)
	}
	if size < min {
		return invalidArgf("%s (%s) has size %d, want at least %d (sizeof(%s) in its first version): initialise it with %s",
			name, typ, size, min, typ, init)
	}
	return nil
}

// covers reports whether a struct of size bytes holds the field at offset
// off of fsize bytes (GOEP_EP_HAS_FIELD): a field of a later version than
// the caller's reads as zero.
func covers(size C.uint, off, fsize uintptr) bool { return uintptr(size) >= off+fsize }

// allocated are the descriptors goepEpTensorAlloc made and goepEpTensorDestroy
// has not freed, by address: goepEpTensorDestroy frees those alone, and
// never reads any other pointer.
var allocated = struct {
	sync.Mutex
	m map[uintptr]bool
}{m: map[uintptr]bool{}}

// tensorAlloc is goepEpTensorAlloc: one C allocation holding the descriptor
// and, after it, its ndim extents.
func tensorAlloc(out **C.goepEpTensor_t, ndim C.uint, dtype C.goepEpDataType_t, sizes *C.size_t, cfg *C.goepEpTensorAllocConfig_t) error {
	if out == nil {
		return invalidArgf("tensor is NULL")
	}
	if cfg != nil {
		if err := checkHeader("config", "goepEpTensorAllocConfig_t", uint32(cfg.size), uint32(cfg.magic),
			C.GOEP_EP_TENSOR_ALLOC_CONFIG_V1_SIZE, C.GOEP_EP_MAGIC, "GOEP_EP_TENSOR_ALLOC_CONFIG_INIT"); err != nil {
			return err
		}
	}
	nd := int(ndim)
	if nd < 1 || nd > maxDims {
		return invalidArgf("ndim = %d, want 1 to %d", nd, maxDims)
	}
	if dataType(dtype).size() == 0 {
		return invalidArgf("datatype = %d is not a goepEpDataType_t", int(dtype))
	}
	if sizes == nil {
		return invalidArgf("sizes is NULL (want ndim = %d extents)", nd)
	}
	dims := unsafe.Slice(sizes, nd)
	for i, d := range dims {
		if uint64(d) > maxBytes {
			return invalidArgf("sizes[%d] = %d: too large", i, uint64(d))
		}
	}
	head := C.size_t(C.sizeof_goepEpTensor_t)
	p := C.calloc(1, head+C.size_t(nd)*C.size_t(C.sizeof_size_t))
	if p == nil {
		return &apiError{code: C.goepEpSystemError, msg: "out of memory for a tensor descriptor"}
	}
	t := (*C.goepEpTensor_t)(p)
	t.size, t.magic, t.ndim, t.datatype = C.uint(head), C.GOEP_EP_TENSOR_MAGIC_ALLOC, ndim, dtype
	t.sizes = (*C.size_t)(unsafe.Add(p, head))
	copy(unsafe.Slice(t.sizes, nd), dims)
	allocated.Lock()
	allocated.m[uintptr(p)] = true
	allocated.Unlock()
	*out = t
	return nil
}

// tensorDestroy is goepEpTensorDestroy.
func tensorDestroy(t *C.goepEpTensor_t) error {
	if t == nil {
		return nil
	}
	addr := uintptr(unsafe.Pointer(t))
	allocated.Lock()
	ok := allocated.m[addr]
	delete(allocated.m, addr)
	allocated.Unlock()
	if !ok {
		return invalidArgf("tensor %#x was not made by goepEpTensorAlloc, or was destroyed already: goepEpTensorDestroy frees only "+
			"the descriptors goepEpTensorAlloc makes (the caller's own need no call)", addr)
	}
	C.free(unsafe.Pointer(t))
	return nil
}
