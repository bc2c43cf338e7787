package gpu

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func fakeLibrary(env string, defaults ...string) *library {
	return &library{what: "NCCL", name: "libnccl.so.2", env: env, defaults: defaults,
		open: opener(nil)}
}

func TestLibraryCandidates(t *testing.T) {
	dir := t.TempDir()
	for _, f := range []string{"libx.so.11.2", "libx.so.12", "libx.so.13", "libx-builtins.so.13"} {
		require.NoError(t, os.WriteFile(filepath.Join(dir, f), nil, 0o644))
	}
	l := fakeLibrary("GOEP_TEST_LIB", "libx.so.1", dir+"/libx.so*", "$GOEP_TEST_UNSET_VAR/lib/libx.so", "libx.so.1")
	t.Setenv("GOEP_TEST_LIB", "")
	t.Setenv("GOEP_TEST_UNSET_VAR", "")
	assert.Equal(t, []string{"libx.so.1", dir + "/libx.so.13", dir + "/libx.so.12", dir + "/libx.so.11.2"}, l.candidates(),
		"names as given, globs newest first, patterns under unset variables dropped, no repeats")

	t.Setenv("GOEP_TEST_LIB", "/opt/a/libx.so:"+dir+"/libx.so.1[23]")
	assert.Equal(t, []string{"/opt/a/libx.so", dir + "/libx.so.13", dir + "/libx.so.12"}, l.candidates(),
		"the variable replaces the defaults: a colon-separated list, globs allowed")
}

// TestMissingLibraryError checks the error of a library that cannot be
// loaded: it names the library, what was tried and the variable to set.
func TestMissingLibraryError(t *testing.T) {
	t.Setenv("GOEP_TEST_LIB", "/nonexistent/libnccl.so.2")
	l := &library{what: "NCCL", name: "libnccl.so.2", env: "GOEP_TEST_LIB", open: ncclLib.open}
	err := l.load()
	require.Error(t, err)
	assert.True(t, errors.Is(err, ErrLibraryMissing))
	var lerr *LibraryError
	require.ErrorAs(t, err, &lerr)
	assert.Equal(t, "GOEP_TEST_LIB", lerr.Env)
	assert.Contains(t, err.Error(), "libnccl.so.2")
	assert.Contains(t, err.Error(), "/nonexistent/libnccl.so.2")
	assert.Contains(t, err.Error(), "set GOEP_TEST_LIB")
	assert.Equal(t, err, l.load(), "the outcome of the first load stays")

	_, err = ncclUniqueID(l)
	assert.Equal(t, err, l.load(), "the ID generator returns the library error")

	// A file that is not a shared library.
	bogus := filepath.Join(t.TempDir(), "libcuda.so.1")
	require.NoError(t, os.WriteFile(bogus, []byte("not an ELF file"), 0o644))
	t.Setenv("GOEP_TEST_LIB", bogus)
	l = &library{what: "the CUDA driver", name: "libcuda.so.1", env: "GOEP_TEST_LIB", open: cudaLib.open}
	err = l.load()
	assert.ErrorIs(t, err, ErrLibraryMissing)
	assert.Contains(t, err.Error(), bogus)

	// A real library that lacks the symbols: libc is no NVRTC.
	t.Setenv("GOEP_TEST_LIB", "libc.so.6")
	l = &library{what: "NVRTC", name: "libnvrtc.so", env: "GOEP_TEST_LIB", open: nvrtcLib.open}
	err = l.load()
	assert.ErrorIs(t, err, ErrLibraryMissing)
	assert.Contains(t, err.Error(), "has no symbol nvrtc")
}

// TestEntryPointsNameTheMissingLibrary checks, on a machine without the CUDA
// driver or NCCL (like CI), that every GPU entry point fails with the
// library error naming the file and the variable to set.
func TestEntryPointsNameTheMissingLibrary(t *testing.T) {
	checked := 0
	if cudaLib.load() != nil {
		checked++
		_, err := DeviceCount()
		assertLibraryError(t, err, "libcuda.so.1", "GOEP_CUDA_LIB")
		_, err = OpenDevice(0)
		assertLibraryError(t, err, "libcuda.so.1", "GOEP_CUDA_LIB")
		_, err = DriverVersion()
		assertLibraryError(t, err, "libcuda.so.1", "GOEP_CUDA_LIB")
	}
	if ncclLib.load() != nil {
		checked++
		_, err := NCCLUniqueID()
		assertLibraryError(t, err, "libnccl.so.2", "GOEP_NCCL_LIB")
		_, err = NCCLVersion()
		assertLibraryError(t, err, "libnccl.so.2", "GOEP_NCCL_LIB")
	}
	if nvrtcLib.load() != nil {
		checked++
		_, _, err := CompilePTX("", "x.cu", nil)
		assertLibraryError(t, err, "libnvrtc.so", "GOEP_NVRTC_LIB")
	}
	if checked == 0 {
		t.Skip("the CUDA driver, NCCL and NVRTC all load here: nothing is missing")
	}
	t.Logf("libraries: %v", Libraries())
}

func assertLibraryError(t *testing.T, err error, file, env string) {
	t.Helper()
	if assert.ErrorIs(t, err, ErrLibraryMissing) {
		assert.Contains(t, err.Error(), file)
		assert.Contains(t, err.Error(), env)
	}
}
