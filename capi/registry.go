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
// are never reused.
var reg = struct {
	sync.Mutex
	next    uint64
	groups  map[uint64]group
	handles map[uint64]handle
	// handleGroup is the group of each live handle, so that destroying a
	// group ends its handles.
	handleGroup map[uint64]uint64
	// destroyed keeps the most recently destroyed handles (as many as
	// destroyedKept, in order in destroyedIDs), so that a call on one
	// still takes part in its group's call as a refusal.
	destroyed    map[uint64]handle
	destroyedIDs []uint64
}{next: 0x6e0, groups: map[uint64]group{}, handles: map[uint64]handle{}, handleGroup: map[uint64]uint64{},
	destroyed: map[uint64]handle{}}

// destroyedKept bounds the destroyed handles the registry remembers.
const destroyedKept = 4096

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

func addHandle(h handle, groupID uint64) uint64 {
	reg.Lock()
	defer reg.Unlock()
	id := newID()
	reg.handles[id] = h
	reg.handleGroup[id] = groupID
	return id
}

func lookupGroup(g C.goepEpGroup_t) (group, uint64, error) {
	id := uint64(C.goep_ep_group_id(g))
	reg.Lock()
	defer reg.Unlock()
	if gr, ok := reg.groups[id]; ok {
		return gr, id, nil
	}
	if g == nil {
		return nil, 0, invalidArgf("the group is NULL")
	}
	return nil, 0, invalidArgf("group %#x is not a live group (destroyed, or never created by goepEpCreateGroup)", id)
}

// lookupHandle is the handle h, live or destroyed (whose calls are refused).
func lookupHandle(h C.goepEpHandle_t) (handle, error) {
	id := uint64(C.goep_ep_handle_id(h))
	reg.Lock()
	defer reg.Unlock()
	if hd, ok := reg.handles[id]; ok {
		return hd, nil
	}
	if hd, ok := reg.destroyed[id]; ok {
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
	for h, g := range reg.handleGroup {
		if g == id {
			delete(reg.handles, h)
			delete(reg.handleGroup, h)
		}
	}
	for h, hd := range reg.destroyed { // their group is gone: calls on them are refused here alone
		if hd.groupID() == id {
			delete(reg.destroyed, h)
		}
	}
}

// liveHandle is handle h if it is live (not destroyed).
func liveHandle(h C.goepEpHandle_t) (handle, uint64, error) {
	id := uint64(C.goep_ep_handle_id(h))
	reg.Lock()
	defer reg.Unlock()
	if hd, ok := reg.handles[id]; ok {
		return hd, id, nil
	}
	if h == nil {
		return nil, 0, invalidArgf("the handle is NULL")
	}
	return nil, 0, invalidArgf("handle %#x is not a live handle (destroyed, its group destroyed, or never created by goepEpCreateHandle)", id)
}

// removeHandle moves handle id from the live handles to the destroyed
// ones.
func removeHandle(id uint64) {
	reg.Lock()
	defer reg.Unlock()
	hd, ok := reg.handles[id]
	if !ok {
		return
	}
	delete(reg.handles, id)
	delete(reg.handleGroup, id)
	reg.destroyed[id] = hd
	reg.destroyedIDs = append(reg.destroyedIDs, id)
	if len(reg.destroyedIDs) > destroyedKept {
		delete(reg.destroyed, reg.destroyedIDs[0])
		reg.destroyedIDs = reg.destroyedIDs[1:]
	}
}

// liveHandles are the live handles of group g, by id.
func liveHandles(g group) map[uint64]handle {
	reg.Lock()
	defer reg.Unlock()
	out := map[uint64]handle{}
	for id, hd := range reg.handles {
		if gr, ok := reg.groups[reg.handleGroup[id]]; ok && gr == g {
			out[id] = hd
		}
	}
	return out
}
