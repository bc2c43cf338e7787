//go:build !mpi

package gpu

import (
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goep/goep/gpu/internal/kernels"
)

// ptxEntries parses the PTX's kernel entry points: name -> the PTX types of
// their parameters in order.
func ptxEntries(ptx string) map[string][]string {
	out := map[string][]string{}
	entry := regexp.MustCompile(`(?s)\.visible \.entry (\w+)\(\s*(.*?)\)`)
	param := regexp.MustCompile(`\.param \.(\w+) `)
	for _, m := range entry.FindAllStringSubmatch(ptx, -1) {
		var types []string
		for _, p := range param.FindAllStringSubmatch(m[2], -1) {
			types = append(types, p[1])
		}
		out[m[1]] = types
	}
	return out
}

// ptxType is the PTX parameter type of one letter of kernels.Kernel.Params.
var ptxType = map[rune]string{'p': "u64", 'l': "u64", 'i': "u32"}

// TestKernelPTX compiles every kernel with NVRTC for compute_80 and
// compute_90, with no GPU, and checks that the PTX targets the architecture,
// names every entry point, and gives each the parameters the launch table
// (kernels.List, which the Go side fills) says it has. It never skips under
// make test or CI (requireNVRTC).
func TestKernelPTX(t *testing.T) {
	requireNVRTC(t)
	major, minor, err := NVRTCVersion()
	require.NoError(t, err)
	archs, err := NVRTCSupportedArchs()
	require.NoError(t, err)
	t.Logf("NVRTC %d.%d from %s; architectures %v", major, minor, nvrtcLib.loaded(), archs)
	for _, arch := range []int{80, 90} {
		ptx, log, err := CompilePTX(KernelSource(), "goep_kernels.cu", kernelOptions(arch))
		require.NoError(t, err, "compute_%d", arch)
		assert.Empty(t, strings.TrimSpace(log), "compute_%d: NVRTC warnings", arch)
		assert.Regexp(t, `(?m)^\.target sm_`+strconv.Itoa(arch)+`\b`, ptx, "compute_%d", arch)
		entries := ptxEntries(ptx)
		assert.Len(t, entries, len(kernels.List), "compute_%d: entry points %v", arch, keys(entries))
		for _, k := range kernels.List {
			types, ok := entries[k.Name]
			if !assert.True(t, ok, "compute_%d: no .entry %s in the PTX", arch, k.Name) {
				continue
			}
			want := make([]string, 0, len(k.Params))
			for _, c := range k.Params {
				want = append(want, ptxType[c])
			}
			assert.Equal(t, want, types, "compute_%d: parameters of %s (table %q)", arch, k.Name, k.Params)
			// A register array indexed at run time goes to local memory
			// (a stack frame in device memory): on the device, ReduceRows
			// ran at 40% of a copy's speed that way.
			assert.NotContains(t, ptxBody(ptx, k.Name), ".local", "compute_%d: %s keeps an array in local memory", arch, k.Name)
		}
		t.Logf("compute_%d: %d bytes of PTX, entry points %v", arch, len(ptx), keys(entries))
	}
}

// ptxBody is the PTX of entry point name, from its .entry line to the end
// of its body.
func ptxBody(ptx, name string) string {
	i := strings.Index(ptx, ".entry "+name+"(")
	if i < 0 {
		return ""
	}
	j := strings.Index(ptx[i:], "\n}\n")
	if j < 0 {
		return ptx[i:]
	}
	return ptx[i : i+j]
}

func keys(m map[string][]string) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// TestCompileErrorCarriesLog checks that a compilation error names the call
// and carries NVRTC's log.
func TestCompileErrorCarriesLog(t *testing.T) {
	requireNVRTC(t)
	_, _, err := CompilePTX("extern \"C\" __global__ void broken() { undeclared_thing(); }", "broken.cu",
		kernelOptions(80))
	require.Error(t, err)
	var nerr *NVRTCError
	require.ErrorAs(t, err, &nerr)
	assert.Equal(t, "nvrtcCompileProgram", nerr.Call)
	assert.Contains(t, nerr.Log, "undeclared_thing")
	assert.Contains(t, err.Error(), "broken.cu")

	_, _, err = CompilePTX("", "x.cu", []string{"bad\noption"})
	assert.ErrorContains(t, err, "newline")
}

// TestPTXCache checks the on-disk cache: a miss compiles and stores, a hit
// reads back the same PTX, a file cut short is compiled again, and other
// options are another entry.
func TestPTXCache(t *testing.T) {
	requireNVRTC(t)
	dir := t.TempDir()
	src := "extern \"C\" __global__ void k(int *p) { p[threadIdx.x] = 1; }"
	ptx, hit, err := cachedPTX(dir, src, "k.cu", kernelOptions(80))
	require.NoError(t, err)
	assert.False(t, hit)
	files, _ := filepath.Glob(filepath.Join(dir, "*.ptx"))
	require.Len(t, files, 1)

	again, hit, err := cachedPTX(dir, src, "k.cu", kernelOptions(80))
	require.NoError(t, err)
	assert.True(t, hit)
	assert.Equal(t, ptx, again)

	b, err := os.ReadFile(files[0])
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(files[0], b[:len(b)/2], 0o644))
	again, hit, err = cachedPTX(dir, src, "k.cu", kernelOptions(80))
	require.NoError(t, err)
	assert.False(t, hit, "a truncated cache file is not used")
	assert.Equal(t, ptx, again)

	_, hit, err = cachedPTX(dir, src, "k.cu", kernelOptions(90))
	require.NoError(t, err)
	assert.False(t, hit, "other options, other entry")
	files, _ = filepath.Glob(filepath.Join(dir, "*.ptx"))
	assert.Len(t, files, 2)

	// No cache directory: compiled every time, nothing written.
	_, hit, err = cachedPTX("", src, "k.cu", kernelOptions(80))
	require.NoError(t, err)
	assert.False(t, hit)

	// KernelPTX goes through GOEP_PTX_CACHE.
	t.Setenv("GOEP_PTX_CACHE", filepath.Join(dir, "kernels"))
	k1, err := KernelPTX(90)
	require.NoError(t, err)
	files, _ = filepath.Glob(filepath.Join(dir, "kernels", "*.ptx"))
	assert.Len(t, files, 1)
	k2, err := KernelPTX(90)
	require.NoError(t, err)
	assert.Equal(t, k1, k2)
}

func TestPTXCacheDir(t *testing.T) {
	t.Setenv("GOEP_PTX_CACHE", "/some/where")
	assert.Equal(t, "/some/where", PTXCacheDir())
	t.Setenv("GOEP_PTX_CACHE", "off")
	assert.Equal(t, "", PTXCacheDir())
	t.Setenv("GOEP_PTX_CACHE", "")
	t.Setenv("XDG_CACHE_HOME", "/xdg")
	assert.Equal(t, "/xdg/goep/ptx", PTXCacheDir())
}

func TestPickArch(t *testing.T) {
	supported := []int{75, 80, 86, 87, 89, 90}
	for _, c := range []struct{ cc, want int }{{90, 90}, {89, 89}, {100, 90}, {120, 90}, {86, 86}, {88, 87}, {80, 80}} {
		got, err := pickArch(c.cc, supported)
		require.NoError(t, err)
		assert.Equal(t, c.want, got, "cc %d", c.cc)
	}
	_, err := pickArch(70, supported)
	assert.ErrorContains(t, err, "compute capability 7.0")
	got, err := pickArch(90, nil)
	require.NoError(t, err)
	assert.Equal(t, 90, got)
}
