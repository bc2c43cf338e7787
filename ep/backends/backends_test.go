package backends_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goep/goep/ep"
	_ "github.com/goep/goep/ep/backends"
)

// Every backend is reachable by its name, its aliases and its options;
// what is not registered, or not an option of the backend, is refused by
// name.
func TestOpenBackend(t *testing.T) {
	tests := []struct {
		spec, name, err string
	}{
		{spec: "cpu", name: "cpu"},
		{spec: " cpu ", name: "cpu"},
		{spec: "cpu-onesided", name: "cpu-onesided"},
		{spec: "alltoallv", name: "alltoallv"},
		{spec: "alltoallv-blocking", name: "alltoallv-blocking"},
		{spec: "gpu:cuda", name: "gpu:cuda"},
		{spec: "cuda", name: "gpu:cuda"},
		{spec: "cuda,device=1", name: "gpu:cuda"},
		{spec: "gpu:cuda+ipc,device=0", name: "gpu:cuda+ipc"},
		{spec: "cuda-ipc", name: "gpu:cuda+ipc"},
		{spec: "emulate", name: "gpu:emulated"},
		{spec: "gpu:emulated,jitter=2ms", name: "gpu:emulated"},
		{spec: "emulate-ipc", name: "gpu:emulated+ipc"},
		{spec: "", err: `backend "" is not registered: want one of alltoallv, alltoallv-blocking, cpu, cpu-onesided,`},
		{spec: "", err: `gpu:cuda, gpu:cuda+ipc, gpu:emulated, gpu:emulated+ipc`},
		{spec: "gpu", err: `backend "gpu" is not registered`},
		{spec: "cpu,slotmax=4", err: "cpu does not take option(s) slotmax: it takes no options"},
		{spec: "cuda,device=1,ipc=true", err: "gpu:cuda does not take option(s) ipc: it takes only device"},
		{spec: "cuda,device=one", err: `option device="one" is not an integer`},
		{spec: "cuda,device", err: `option "device" is not key=value`},
		{spec: "cuda,device=0,device=1", err: `option "device" given twice`},
		{spec: "emulate,jitter=2", err: `option jitter="2" is not a duration`},
	}
	for _, tc := range tests {
		b, err := ep.OpenBackend(tc.spec)
		if tc.err != "" {
			assert.ErrorContains(t, err, tc.err, "%q", tc.spec)
			assert.Nil(t, b, "%q", tc.spec)
			continue
		}
		if assert.NoError(t, err, "%q", tc.spec) {
			assert.Equal(t, tc.name, b.Name(), "%q", tc.spec)
		}
	}
}

// Backends lists every registered backend once, by name, with the features
// it declares: the CPU engine's FP8 dispatch and masking, the GPU engine's
// refusals and named timeouts and neither of those.
func TestBackendsListsTheirFeatures(t *testing.T) {
	byName := map[string]ep.BackendInfo{}
	var names []string
	for _, b := range ep.Backends() {
		if strings.HasPrefix(b.Name, "ep-test:") { // TestRegisterBackendRefusesClashes's
			continue
		}
		names = append(names, b.Name)
		byName[b.Name] = b
	}
	assert.Equal(t, []string{"alltoallv", "alltoallv-blocking", "cpu", "cpu-onesided", "gpu:cuda", "gpu:cuda+ipc", "gpu:emulated", "gpu:emulated+ipc"}, names)
	assert.Equal(t, []string{"cuda"}, byName["gpu:cuda"].Aliases)
	for _, f := range []ep.Feature{ep.FeatureFP8Wire, ep.FeatureMaskStalledRanks, ep.FeatureRefusals} {
		assert.True(t, slices.Contains(byName["cpu"].Features, f), "cpu declares %v", f)
	}
	for _, f := range []ep.Feature{ep.FeatureRefusals, ep.FeatureNamedTimeouts} {
		assert.True(t, slices.Contains(byName["gpu:cuda"].Features, f), "gpu:cuda declares %v", f)
	}
	for _, f := range []ep.Feature{ep.FeatureFP8Wire, ep.FeatureMaskStalledRanks} {
		assert.False(t, slices.Contains(byName["gpu:emulated"].Features, f), "gpu:emulated does not declare %v", f)
	}
	for _, b := range ep.Backends() {
		assert.NotEmpty(t, b.Doc, b.Name)
	}
}

// A name taken twice, or one with a comma, is a programming error.
func TestRegisterBackendRefusesClashes(t *testing.T) {
	open := func(ep.BackendOptions) (ep.Backend, error) { return ep.CPU, nil }
	require.NotPanics(t, func() { ep.RegisterBackend(ep.Registration{Name: "ep-test:registered-once", Open: open}) })
	assert.PanicsWithValue(t, `ep: Register: "ep-test:registered-once" is registered twice`, func() {
		ep.RegisterBackend(ep.Registration{Name: "ep-test:registered-once", Open: open})
	})
	assert.PanicsWithValue(t, `ep: Register: "cuda" is registered twice`, func() {
		ep.RegisterBackend(ep.Registration{Name: "ep-test:other", Aliases: []string{"cuda"}, Open: open})
	})
	assert.Panics(t, func() { ep.RegisterBackend(ep.Registration{Name: "a,b", Open: open}) })
	assert.Panics(t, func() { ep.RegisterBackend(ep.Registration{Name: "ep-test:no-open"}) })
}

// A program links every backend (this package) and picks one by name, with
// options, as ep-bench's and moe-train's -device do.
func Example() {
	b, err := ep.OpenBackend("gpu:emulated,jitter=1ms")
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(b.Name())
	_, err = ep.OpenBackend("cpu,threads=4")
	fmt.Println(err)
	// Output:
	// gpu:emulated
	// ep: backend "cpu,threads=4": cpu does not take option(s) threads: it takes no options
}
