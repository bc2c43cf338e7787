//go:build mpi

package main

/*
#include "capi_internal.h"
*/
import "C"

import (
	"sync"
	"unsafe"
)

// The registry maps the numbers handed out as goepEpGroup_t and
// goepEpHandle_t to the objects behind them, so that C never holds a Go
// pointer and a destroyed or made-up handle is an error, not a crash. Numbers
// are never reused. A number travels as the pointer value of its C type,
// converted here in Go (idOf, putID) rather than through a C call, since each
// step's calls look one up.
var reg = struct {
	sync.Mutex
	next    uint64
	groups  map[uint64]group
	handles map[uint64]handle // the live handles; each knows its group (groupID)
	// destroyed keeps the most recently destroyed handles, as many as
	// destroyedKept, so that a call on one still takes part in its group's
	// call as a refusal: a ring whose next slot is destroyedAt. It is
	// searched only for a number that is not a live handle's (a call on a
	// destroyed or made-up handle), so destroying one costs no map
	// operation beyond the live handles' own.
	destroyed   []destroyedHandle
	destroyedAt int
}{next: 0x6e0, groups: map[uint64]group{}, handles: map[uint64]handle{}}

// destroyedHandle is a destroyed handle and its number.
type destroyedHandle struct {
	id uint64
	h  handle
}

// destroyedKept bounds the destroyed handles the registry remembers.
const destroyedKept = 4096

// idOf is the number an opaque C handle (goepEpGroup_t, goepEpHandle_t)
// carries as its pointer value; it is never dereferenced.
func idOf[P C.goepEpGroup_t | C.goepEpHandle_t](p P) uint64 {
	return uint64(uintptr(unsafe.Pointer(p)))
}

// putID stores number id as the opaque handle *out points at: the C side
// alone sees it as a pointer.
func putID[P C.goepEpGroup_t | C.goepEpHandle_t](out *P, id uint64) {
	*(*uintptr)(unsafe.Pointer(out)) = uintptr(id)
}

// group is a group of either element type, as the exported functions use it.
type group interface {
	createHandle(layout C.goepEpLayout_t, topk *C.goepEpTensor_t, info *C.goepEpLayoutInfo_t, cfg *C.goepEpHandleConfig_t) (handle, error)
	initHandle(layout C.goepEpLayout_t, cfg *C.goepEpHandleConfig_t, numTopK int, mem *C.goepEpTensor_t) (handle, error)
	handleMemSize(layout C.goepEpLayout_t, cfg *C.goepEpHandleConfig_t, topk int) (int, error)
	destroy() error
	bufferBytes() (int, error)
	maskQuery(status []C.int) error
	maskUpdate(mask []C.int) error
	maskClean() error
	asyncError() (bool, error)
	errorClear() error
	size() int
	// refuse is goepEpRefuse of a goepEpCreateHandle on the group.
	refuse(reason string) error
	bench(x, topk, weights unsafe.Pointer, tokens int, roundUS []float64, copied bool) error
}

// handle is a handle of either element type.
type handle interface {
	// update gives the handle a step's routing (goepEpUpdateHandle).
	update(topk *C.goepEpTensor_t, info *C.goepEpLayoutInfo_t) error
	dispatch(in *C.goepEpDispatchInputs_t, out *C.goepEpDispatchOutputs_t, info *C.goepEpLayoutInfo_t, cfg *C.goepEpDispatchConfig_t) error
	combine(in *C.goepEpCombineInputs_t, out *C.goepEpCombineOutputs_t, cfg *C.goepEpCombineConfig_t) error
	complete(cfg *C.goepEpCompleteConfig_t) error
	recvTokens(v *C.goepEpTensor_t) error
	// destroy ends the handle (goepEpHandleDestroy): what it holds given
	// back, and calls on it refused from then on.
	destroy() error
	// refuse takes part in the handle's dispatch or combine as a refusal
	// with reason (goepEpRefuse; a destroyed handle's calls).
	refuse(call C.goepEpCall_t, reason string) error
	// setID gives the handle its number and its group's; groupID is the
	// latter.
	setID(id, gid uint64)
	groupID() uint64
}

func newID() uint64 {
	reg.next++
	return reg.next
}

func addGroup(g group) uint64 {
	reg.Lock()
	defer reg.Unlock()
	id := newID()
	reg.groups[id] = g
	return id
}

// addHandle registers h, a handle of group groupID, and gives it its number.
func addHandle(h handle, groupID uint64) uint64 {
	reg.Lock()
	defer reg.Unlock()
	id := newID()
	h.setID(id, groupID)
	reg.handles[id] = h
	return id
}

func lookupGroup(g C.goepEpGroup_t) (group, uint64, error) {
	id := idOf(g)
	reg.Lock()
	gr, ok := reg.groups[id]
	reg.Unlock()
	if ok {
		return gr, id, nil
	}
	if g == nil {
		return nil, 0, invalidArgf("the group is NULL")
	}
	return nil, 0, invalidArgf("group %#x is not a live group (destroyed, or never created by goepEpCreateGroup)", id)
}

// lookupHandle is the handle h, live or destroyed (whose calls are refused).
func lookupHandle(h C.goepEpHandle_t) (handle, error) {
	id := idOf(h)
	reg.Lock()
	hd, ok := reg.handles[id]
	if !ok {
		hd, ok = findDestroyed(id)
	}
	reg.Unlock()
	if ok {
		return hd, nil
	}
	if h == nil {
		return nil, invalidArgf("the handle is NULL")
	}
	return nil, invalidArgf("handle %#x is not a live handle (destroyed, its group destroyed, or never created by goepEpCreateHandle)", id)
}

func removeGroup(id uint64) {
	reg.Lock()
	defer reg.Unlock()
	delete(reg.groups, id)
	for h, hd := range reg.handles {
		if hd.groupID() == id {
			delete(reg.handles, h)
		}
	}
	for i, d := range reg.destroyed { // their group is gone: calls on them are refused here alone
		if d.h != nil && d.h.groupID() == id {
			reg.destroyed[i] = destroyedHandle{}
		}
	}
}

// liveHandle is handle h if it is live (not destroyed).
func liveHandle(h C.goepEpHandle_t) (handle, uint64, error) {
	id := idOf(h)
	reg.Lock()
	hd, ok := reg.handles[id]
	reg.Unlock()
	if ok {
		return hd, id, nil
	}
	if h == nil {
		return nil, 0, invalidArgf("the handle is NULL")
	}
	return nil, 0, invalidArgf("handle %#x is not a live handle (destroyed, its group destroyed, or never created by goepEpCreateHandle)", id)
}

// removeHandle moves handle id from the live handles to the destroyed
// ones, in the place of the one destroyed longest ago, which is forgotten.
func removeHandle(id uint64) {
	reg.Lock()
	defer reg.Unlock()
	hd, ok := reg.handles[id]
	if !ok {
		return
	}
	delete(reg.handles, id)
	if len(reg.destroyed) < destroyedKept {
		reg.destroyed = append(reg.destroyed, destroyedHandle{id, hd})
		return
	}
	reg.destroyed[reg.destroyedAt] = destroyedHandle{id, hd}
	reg.destroyedAt = (reg.destroyedAt + 1) % destroyedKept
}

// findDestroyed is destroyed handle id, if the registry still keeps it. The
// caller holds reg.
func findDestroyed(id uint64) (handle, bool) {
	for _, d := range reg.destroyed {
		if d.id == id && d.h != nil {
			return d.h, true
		}
	}
	return nil, false
}

// liveHandles are the live handles of group g, by id.
func liveHandles(g group) map[uint64]handle {
	reg.Lock()
	defer reg.Unlock()
	out := map[uint64]handle{}
	for id, hd := range reg.handles {
		if gr, ok := reg.groups[hd.groupID()]; ok && gr == g {
			out[id] = hd
		}
	}
	return out
}
