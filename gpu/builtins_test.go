//go:build !mpi

package gpu

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestNVRTCBuiltinsBesideTheLibrary: NVRTC opened by path from a folder
// off the loader's search path compiles with the builtins library of that
// folder. A copy of this machine's NVRTC and its builtins goes into a
// temporary folder, and a child process (this test binary) compiles the
// kernels with GOEP_NVRTC_LIB naming the copy; the builtins it then maps
// must be the copy's, not the system's that the loader's own search finds
// (NVRTC opens them by soname, so without the preload it would map those,
// and, where the loader finds none, fail every compilation with
// NVRTC_ERROR_BUILTIN_OPERATION_FAILURE).
func TestNVRTCBuiltinsBesideTheLibrary(t *testing.T) {
	if os.Getenv("GOEP_BUILTINS_CHILD") == "1" {
		_, _, err := CompilePTX("extern \"C\" __global__ void k(float *x) { x[threadIdx.x] = 1.0f; }", "k.cu", nil)
		require.NoError(t, err)
		maps, err := os.ReadFile("/proc/self/maps")
		require.NoError(t, err)
		for _, line := range strings.Split(string(maps), "\n") {
			if i := strings.Index(line, "/"); i >= 0 && strings.Contains(line, "libnvrtc-builtins") {
				os.Stdout.WriteString("BUILTINS " + line[i:] + "\n")
			}
		}
		return
	}
	requireNVRTC(t)
	lib, err := filepath.EvalSymlinks(nvrtcLib.loaded())
	if !strings.Contains(nvrtcLib.loaded(), "/") {
		// Loaded by name: find the file the loader chose.
		lib, err = filepath.EvalSymlinks(findMapped(t, "libnvrtc.so"))
	}
	require.NoError(t, err)
	builtins, _ := filepath.Glob(filepath.Join(filepath.Dir(lib), "libnvrtc-builtins.so.*"))
	require.NotEmpty(t, builtins, "no builtins library beside %s", lib)

	dir := t.TempDir()
	copyFile(t, lib, filepath.Join(dir, filepath.Base(lib)))
	for _, b := range builtins {
		target, err := filepath.EvalSymlinks(b)
		require.NoError(t, err)
		copyFile(t, target, filepath.Join(dir, filepath.Base(b)))
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestNVRTCBuiltinsBesideTheLibrary$", "-test.count=1")
	cmd.Env = append(os.Environ(), "GOEP_BUILTINS_CHILD=1", "GOEP_NVRTC_LIB="+filepath.Join(dir, filepath.Base(lib)),
		"GOEP_PTX_CACHE=off")
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	var mapped []string
	for _, line := range strings.Split(string(out), "\n") {
		if p, ok := strings.CutPrefix(line, "BUILTINS "); ok {
			mapped = append(mapped, p)
		}
	}
	require.NotEmpty(t, mapped, "the child mapped no builtins library:\n%s", out)
	for _, p := range mapped {
		assert.Equal(t, dir, filepath.Dir(p), "builtins mapped from outside NVRTC's folder")
	}
}

// findMapped is the path of the first library of this process whose name
// contains name.
func findMapped(t *testing.T, name string) string {
	t.Helper()
	maps, err := os.ReadFile("/proc/self/maps")
	require.NoError(t, err)
	for _, line := range strings.Split(string(maps), "\n") {
		if i := strings.Index(line, "/"); i >= 0 && strings.Contains(filepath.Base(line[i:]), name) {
			return line[i:]
		}
	}
	t.Fatalf("no library %q mapped", name)
	return ""
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	b, err := os.ReadFile(from)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(to, b, 0o755))
}
