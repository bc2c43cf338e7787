package h5

// This file is the only one that calls C. Every function here must be called
// with the package lock held (see lock), takes and returns Go types only, and
// passes Go memory to C only for the duration of the call.

/*
#cgo pkg-config: hdf5
#include <stdlib.h>
#include "shim.h"
*/
import "C"

import (
	"bytes"
	"runtime"
	"sync"
	"unsafe"
)

// hid is an HDF5 identifier (hid_t, a 64-bit integer in HDF5 >= 1.10).
type hid int64

// maxRank is HDF5's H5S_MAX_RANK.
const maxRank = int(C.H5S_MAX_RANK)

// unlimited is H5S_UNLIMITED, the maximum size of an extendible dimension.
const unlimited = ^uint64(0)

// mu serialises every call into HDF5: the serial library is not safe to call
// from two threads at once.
var mu sync.Mutex

// lock takes the package lock and pins the goroutine to its OS thread until
// unlock, so that the error stack read after a failed call is the one that
// call wrote (it is per thread in a thread-safe HDF5 build). It also turns off
// HDF5's automatic error printing for that thread, which a new thread has on.
func lock() {
	mu.Lock()
	runtime.LockOSThread()
	C.goep_begin()
}

func unlock() {
	runtime.UnlockOSThread()
	mu.Unlock()
}

// lastError returns the most specific message on the HDF5 error stack and
// clears it.
func lastError() string {
	var buf [768]C.char
	C.goep_errmsg(&buf[0], C.size_t(len(buf)))
	return C.GoString(&buf[0])
}

// withCString calls fn with a C copy of s, freed afterwards.
func withCString[T any](s string, fn func(*C.char) T) T {
	cs := C.CString(s)
	defer C.free(unsafe.Pointer(cs))
	return fn(cs)
}

// rel turns a cleaned absolute object path into what the shim takes: no
// leading slash, "." for the root.
func rel(path string) string {
	if path == "/" {
		return "."
	}
	return path[1:]
}

func cFileCreate(path string) hid {
	return withCString(path, func(p *C.char) hid { return hid(C.goep_fcreate(p)) })
}

func cFileOpen(path string, rw bool) hid {
	w := C.int(0)
	if rw {
		w = 1
	}
	return withCString(path, func(p *C.char) hid { return hid(C.goep_fopen(p, w)) })
}

// cIsHDF5 reports whether path carries the HDF5 signature: 1 yes, 0 no,
// negative if it could not tell.
func cIsHDF5(path string) int {
	return withCString(path, func(p *C.char) int { return int(C.goep_is_hdf5(p)) })
}

func cFlush(f hid) bool { return C.goep_fflush(C.hid_t(f)) >= 0 }

func cClose(id hid) bool { return C.goep_close(C.hid_t(id)) >= 0 }

// cExists: 1 yes, 0 no, negative on error.
func cExists(loc hid, path string) int {
	if path == "/" {
		return 1
	}
	return withCString(path[1:], func(p *C.char) int { return int(C.goep_exists(C.hid_t(loc), p)) })
}

type objKind int

const (
	kindOther   objKind = C.GOEP_OBJ_OTHER
	kindGroup   objKind = C.GOEP_OBJ_GROUP
	kindDataset objKind = C.GOEP_OBJ_DATASET
	kindError   objKind = -1
)

func cObjKind(loc hid, path string) objKind {
	return withCString(rel(path), func(p *C.char) objKind { return objKind(C.goep_obj_kind(C.hid_t(loc), p)) })
}

func cObjOpen(loc hid, path string) hid {
	return withCString(rel(path), func(p *C.char) hid { return hid(C.goep_oopen(C.hid_t(loc), p)) })
}

func cGroupCreate(loc hid, path string) hid {
	return withCString(rel(path), func(p *C.char) hid { return hid(C.goep_gcreate(C.hid_t(loc), p)) })
}

// splitNames copies a NUL-separated C buffer of count names and frees it.
func splitNames(buf *C.char, n C.size_t, count C.size_t) []string {
	defer C.free(unsafe.Pointer(buf))
	names := make([]string, 0, int(count))
	b := C.GoBytes(unsafe.Pointer(buf), C.int(n))
	for len(b) > 0 {
		i := bytes.IndexByte(b, 0)
		names = append(names, string(b[:i]))
		b = b[i+1:]
	}
	return names
}

// cLinkNames lists group path; ok is false on error.
func cLinkNames(loc hid, path string) (names []string, ok bool) {
	var n, count C.size_t
	buf := withCString(rel(path), func(p *C.char) *C.char { return C.goep_link_names(C.hid_t(loc), p, &n, &count) })
	if buf == nil {
		return nil, false
	}
	return splitNames(buf, n, count), true
}

func cAttrNames(obj hid) (names []string, ok bool) {
	var n, count C.size_t
	buf := C.goep_attr_names(C.hid_t(obj), &n, &count)
	if buf == nil {
		return nil, false
	}
	return splitNames(buf, n, count), true
}

// cDatasetCreate creates a dataset of dtype with the given extent; maxdims
// nil means fixed; chunk nil means contiguous. len(dims) 0 makes a scalar.
func cDatasetCreate(loc hid, path string, dtype DType, dims, maxdims, chunk []uint64) hid {
	var pd, pm, pc *C.hsize_t
	if len(dims) > 0 {
		pd = (*C.hsize_t)(unsafe.Pointer(&dims[0]))
	}
	if maxdims != nil {
		pm = (*C.hsize_t)(unsafe.Pointer(&maxdims[0]))
	}
	if chunk != nil {
		pc = (*C.hsize_t)(unsafe.Pointer(&chunk[0]))
	}
	return withCString(rel(path), func(p *C.char) hid {
		return hid(C.goep_dcreate(C.hid_t(loc), p, C.int(dtype), C.int(len(dims)), pd, pm, pc))
	})
}

func cDatasetOpen(loc hid, path string) hid {
	return withCString(rel(path), func(p *C.char) hid { return hid(C.goep_dopen(C.hid_t(loc), p)) })
}

// dsetInfo describes an open dataset. dtype is 0 for a stored type this
// package does not read.
type dsetInfo struct {
	dtype   DType
	dims    []uint64
	maxdims []uint64
	chunked bool
}

func cDatasetInfo(d hid) (dsetInfo, bool) {
	var code, rank, chunked C.int
	var dims, maxdims [maxRank]uint64
	if C.goep_dinfo(C.hid_t(d), &code, &rank,
		(*C.hsize_t)(unsafe.Pointer(&dims[0])), (*C.hsize_t)(unsafe.Pointer(&maxdims[0])),
		C.int(maxRank), &chunked) < 0 {
		return dsetInfo{}, false
	}
	r := int(rank)
	return dsetInfo{
		dtype:   DType(code),
		dims:    append([]uint64(nil), dims[:r]...),
		maxdims: append([]uint64(nil), maxdims[:r]...),
		chunked: chunked != 0,
	}, true
}

// cDatasetWrite writes all of d from buf (nil only for an empty dataset).
func cDatasetWrite(d hid, dtype DType, buf unsafe.Pointer) bool {
	return C.goep_dwrite_all(C.hid_t(d), C.int(dtype), buf) >= 0
}

func cDatasetRead(d hid, dtype DType, buf unsafe.Pointer) bool {
	return C.goep_dread_all(C.hid_t(d), C.int(dtype), buf) >= 0
}

// cAppend grows d's first dimension from dims[0] by nrows and writes buf
// into the new rows.
func cAppend(d hid, dtype DType, dims []uint64, nrows uint64, buf unsafe.Pointer) bool {
	return C.goep_append(C.hid_t(d), C.int(dtype), C.int(len(dims)),
		(*C.hsize_t)(unsafe.Pointer(&dims[0])), C.hsize_t(nrows), buf) >= 0
}

// cAttrSet writes a numeric attribute: scalar (n == 1, array false) or a 1-D
// array of n elements.
func cAttrSet(obj hid, name string, dtype DType, array bool, n int, buf unsafe.Pointer) bool {
	rank := C.int(0)
	if array {
		rank = 1
	}
	return withCString(name, func(p *C.char) bool {
		return C.goep_aset(C.hid_t(obj), p, C.int(dtype), rank, C.hsize_t(n), buf) >= 0
	})
}

// cAttrSetStrings writes fixed-length strings packed in buf, strsize bytes each.
func cAttrSetStrings(obj hid, name string, array bool, n int, strsize int, buf []byte) bool {
	rank := C.int(0)
	if array {
		rank = 1
	}
	return withCString(name, func(p *C.char) bool {
		return C.goep_aset_str(C.hid_t(obj), p, rank, C.hsize_t(n), C.size_t(strsize),
			(*C.char)(unsafe.Pointer(&buf[0]))) >= 0
	})
}

// attrKind is what an attribute holds, as far as reading it goes.
type attrKind int

const (
	attrOther  attrKind = 0
	attrFloat  attrKind = C.GOEP_F64 // any float: read as float64
	attrInt    attrKind = C.GOEP_I64 // any integer int64 holds exactly
	attrString attrKind = C.GOEP_STR
)

type attrInfo struct {
	kind  attrKind
	array bool // rank 1 (or more), not a scalar
	n     int  // number of elements
	size  int  // element size in bytes (fixed-length strings: the length)
	vlen  bool // variable-length strings
}

func cAttrInfo(obj hid, name string) (attrInfo, bool) {
	var code, rank, vlen C.int
	var n C.hsize_t
	var size C.size_t
	ok := withCString(name, func(p *C.char) bool {
		return C.goep_ainfo(C.hid_t(obj), p, &code, &rank, &n, &size, &vlen) >= 0
	})
	return attrInfo{kind: attrKind(code), array: rank > 0, n: int(n), size: int(size), vlen: vlen != 0}, ok
}

// cAttrRead reads a numeric attribute converted to dtype (Float64 or Int64).
func cAttrRead(obj hid, name string, dtype DType, buf unsafe.Pointer) bool {
	return withCString(name, func(p *C.char) bool {
		return C.goep_aread(C.hid_t(obj), p, C.int(dtype), buf) >= 0
	})
}

// cAttrReadStrings reads n strings of a string attribute described by info.
func cAttrReadStrings(obj hid, name string, info attrInfo) ([]string, bool) {
	cname := C.CString(name)
	defer C.free(unsafe.Pointer(cname))
	out := make([]string, info.n)
	if info.n == 0 {
		return out, true
	}
	if info.vlen {
		arr := C.goep_aread_vlstr(C.hid_t(obj), cname, C.hsize_t(info.n))
		if arr == nil {
			return nil, false
		}
		defer C.goep_free_vlstr(arr, C.hsize_t(info.n))
		for i, s := range unsafe.Slice(arr, info.n) {
			if s != nil {
				out[i] = C.GoString(s)
			}
		}
		return out, true
	}
	buf := make([]byte, info.n*info.size)
	if len(buf) == 0 {
		return out, true
	}
	if C.goep_aread_fixstr(C.hid_t(obj), cname, unsafe.Pointer(&buf[0])) < 0 {
		return nil, false
	}
	for i := range out {
		s := buf[i*info.size : (i+1)*info.size]
		if j := bytes.IndexByte(s, 0); j >= 0 {
			s = s[:j]
		}
		out[i] = string(s)
	}
	return out, true
}

// cAttrExists: 1 yes, 0 no, negative on error.
func cAttrExists(obj hid, name string) int {
	return withCString(name, func(p *C.char) int { return int(C.goep_aexists(C.hid_t(obj), p)) })
}
