//go:build mpi

package main

/*
#include "capi_internal.h"
*/
import "C"

import (
	"slices"
	"strings"
	"unsafe"

	"github.com/goep/goep/ep"
)

// features maps goep_ep.h's goepEpFeature_t to ep.Feature, with both names,
// so that a test can check the enum against Go's (features_test.go).
var features = []featureEntry{
	{C.GOEP_EP_FEATURE_FP8_WIRE, "GOEP_EP_FEATURE_FP8_WIRE", ep.FeatureFP8Wire, "FeatureFP8Wire"},
	{C.GOEP_EP_FEATURE_MASK_STALLED_RANKS, "GOEP_EP_FEATURE_MASK_STALLED_RANKS", ep.FeatureMaskStalledRanks, "FeatureMaskStalledRanks"},
	{C.GOEP_EP_FEATURE_FP8_FORWARD, "GOEP_EP_FEATURE_FP8_FORWARD", ep.FeatureFP8Forward, "FeatureFP8Forward"},
	{C.GOEP_EP_FEATURE_FP8_COMBINE, "GOEP_EP_FEATURE_FP8_COMBINE", ep.FeatureFP8Combine, "FeatureFP8Combine"},
	{C.GOEP_EP_FEATURE_OVERFLOW_DROP, "GOEP_EP_FEATURE_OVERFLOW_DROP", ep.FeatureOverflowDrop, "FeatureOverflowDrop"},
	{C.GOEP_EP_FEATURE_REFUSALS, "GOEP_EP_FEATURE_REFUSALS", ep.FeatureRefusals, "FeatureRefusals"},
	{C.GOEP_EP_FEATURE_METER, "GOEP_EP_FEATURE_METER", ep.FeatureMeter, "FeatureMeter"},
	{C.GOEP_EP_FEATURE_NAMED_TIMEOUTS, "GOEP_EP_FEATURE_NAMED_TIMEOUTS", ep.FeatureNamedTimeouts, "FeatureNamedTimeouts"},
	{C.GOEP_EP_FEATURE_ZERO_ALLOCS, "GOEP_EP_FEATURE_ZERO_ALLOCS", ep.FeatureZeroAllocs, "FeatureZeroAllocs"},
	{C.GOEP_EP_FEATURE_HT_EXPERT_MAJOR, "GOEP_EP_FEATURE_HT_EXPERT_MAJOR", ep.FeatureHTExpertMajor, "FeatureHTExpertMajor"},
	{C.GOEP_EP_FEATURE_LL_RANK_MAJOR, "GOEP_EP_FEATURE_LL_RANK_MAJOR", ep.FeatureLLRankMajor, "FeatureLLRankMajor"},
	{C.GOEP_EP_FEATURE_GLOBAL_EXPERT_IDS, "GOEP_EP_FEATURE_GLOBAL_EXPERT_IDS", ep.FeatureGlobalExpertIDs, "FeatureGlobalExpertIDs"},
	{C.GOEP_EP_FEATURE_CALL_SEQUENCE, "GOEP_EP_FEATURE_CALL_SEQUENCE", ep.FeatureCallSequence, "FeatureCallSequence"},
	{C.GOEP_EP_FEATURE_NVFP4_FORWARD, "GOEP_EP_FEATURE_NVFP4_FORWARD", ep.FeatureNVFP4Forward, "FeatureNVFP4Forward"},
	{C.GOEP_EP_FEATURE_NVFP4_COMBINE, "GOEP_EP_FEATURE_NVFP4_COMBINE", ep.FeatureNVFP4Combine, "FeatureNVFP4Combine"},
}

type featureEntry struct {
	c      C.goepEpFeature_t
	cName  string
	f      ep.Feature
	goName string
}

// backendNames are the registered backends' names, as ep.Backends lists them.
func backendNames() []string {
	var names []string
	for _, b := range ep.Backends() {
		names = append(names, b.Name)
	}
	return names
}

//export goepEpBackendCount
func goepEpBackendCount(count *C.int) C.goepEpResult_t {
	return guard("goepEpBackendCount", func() error {
		if count == nil {
			return invalidArgf("count is NULL")
		}
		*count = C.int(len(ep.Backends()))
		return nil
	})
}

//export goepEpBackendName
func goepEpBackendName(i C.int, buf *C.char, n C.size_t) C.goepEpResult_t {
	return guard("goepEpBackendName", func() error {
		names := backendNames()
		if i < 0 || int(i) >= len(names) {
			return invalidArgf("i = %d: there are %d backends (goepEpBackendCount), 0 to %d", int(i), len(names), len(names)-1)
		}
		if buf == nil {
			return invalidArgf("buf is NULL")
		}
		name := names[i]
		if int(n) < len(name)+1 {
			return invalidArgf("len = %d: backend %d's name %q needs %d bytes with its NUL", int(n), int(i), name, len(name)+1)
		}
		dst := unsafe.Slice((*byte)(unsafe.Pointer(buf)), len(name)+1)
		copy(dst, name)
		dst[len(name)] = 0
		return nil
	})
}

//export goepEpBackendSupports
func goepEpBackendSupports(backend *C.char, feature C.goepEpFeature_t, supported *C.int) C.goepEpResult_t {
	return guard("goepEpBackendSupports", func() error {
		if backend == nil {
			return invalidArgf("backend is NULL: name one of %s", strings.Join(backendNames(), ", "))
		}
		if supported == nil {
			return invalidArgf("supported is NULL")
		}
		ok, err := backendSupports(C.GoString(backend), feature)
		if err != nil {
			return err
		}
		*supported = 0
		if ok {
			*supported = 1
		}
		return nil
	})
}

// backendSupports reports whether the backend registered as name (or an
// alias) declares feature.
func backendSupports(name string, feature C.goepEpFeature_t) (bool, error) {
	i := slices.IndexFunc(features, func(e featureEntry) bool { return e.c == feature })
	if i < 0 {
		return false, invalidArgf("feature = %d is not a goepEpFeature_t (%d to %d)", int(feature),
			int(features[0].c), int(features[len(features)-1].c))
	}
	for _, b := range ep.Backends() {
		if b.Name == name || slices.Contains(b.Aliases, name) {
			return slices.Contains(b.Features, features[i].f), nil
		}
	}
	return false, invalidArgf("backend %q is not registered: want one of %s", name, strings.Join(backendNames(), ", "))
}
