package gpu

/*
#include <stdlib.h>
#include "shim.h"
*/
import "C"

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"unsafe"

	"github.com/goep/goep/gpu/internal/kernels"
)

// NVRTCError is a failed NVRTC call; for a failed compilation Log holds the
// compiler's messages.
type NVRTCError struct {
	Call    string
	Code    int
	Message string
	Log     string
}

func (e *NVRTCError) Error() string {
	s := fmt.Sprintf("gpu: %s: %s (%d)", e.Call, e.Message, e.Code)
	if e.Log != "" {
		s += ":\n" + strings.TrimSpace(e.Log)
	}
	return s
}

func nvrtcErr(call string, r C.int, log string) error {
	if r == 0 {
		return nil
	}
	msg := "unknown NVRTC status"
	if s := C.goep_nvrtc_error_string(r); s != nil {
		msg = C.GoString(s)
	}
	return &NVRTCError{Call: call, Code: int(r), Message: msg, Log: log}
}

// NVRTCVersion returns the version of the NVRTC library found (11.8 for
// Debian's libnvrtc11.2 package).
func NVRTCVersion() (major, minor int, err error) {
	if err := nvrtcLib.load(); err != nil {
		return 0, 0, err
	}
	var a, b C.int
	if err := nvrtcErr("nvrtcVersion", C.goep_nvrtc_version(&a, &b), ""); err != nil {
		return 0, 0, err
	}
	return int(a), int(b), nil
}

// NVRTCSupportedArchs lists the architectures NVRTC can compile for, in
// increasing order (90 = compute_90); nil without error when this NVRTC is
// too old to say (before 11.2).
func NVRTCSupportedArchs() ([]int, error) {
	if err := nvrtcLib.load(); err != nil {
		return nil, err
	}
	var buf [128]C.int
	var n C.int
	r := C.goep_nvrtc_supported_archs(&buf[0], C.int(len(buf)), &n)
	if r == -1 {
		return nil, nil
	}
	if err := nvrtcErr("nvrtcGetSupportedArchs", r, ""); err != nil {
		return nil, err
	}
	out := make([]int, int(n))
	for i := range out {
		out[i] = int(buf[i])
	}
	sort.Ints(out)
	return out, nil
}

// CompilePTX compiles CUDA C++ source to PTX with NVRTC. name is the
// program's file name in messages; options are NVRTC's
// (--gpu-architecture=compute_90, say). log holds the compiler's messages
// (warnings) even on success.
func CompilePTX(src, name string, options []string) (ptx, log string, err error) {
	if err := nvrtcLib.load(); err != nil {
		return "", "", err
	}
	for _, o := range options {
		if strings.ContainsAny(o, "\n\x00") {
			return "", "", fmt.Errorf("gpu: CompilePTX: option %q contains a newline or NUL", o)
		}
	}
	if len(options) > 64 {
		return "", "", fmt.Errorf("gpu: CompilePTX: %d options, at most 64", len(options))
	}
	csrc, cname, copts := C.CString(src), C.CString(name), C.CString(strings.Join(options, "\n"))
	defer C.free(unsafe.Pointer(csrc))
	defer C.free(unsafe.Pointer(cname))
	defer C.free(unsafe.Pointer(copts))
	var stage C.int
	var cptx, clog *C.char
	var nptx, nlog C.size_t
	r := C.goep_nvrtc_compile(csrc, cname, copts, &stage, &cptx, &nptx, &clog, &nlog)
	if clog != nil {
		log = C.GoStringN(clog, C.int(nlog))
		C.free(unsafe.Pointer(clog))
	}
	if cptx != nil {
		ptx = C.GoStringN(cptx, C.int(nptx))
		C.free(unsafe.Pointer(cptx))
	}
	call := [...]string{"nvrtcCreateProgram", "nvrtcCompileProgram", "nvrtcGetPTX"}[stage]
	if err := nvrtcErr(call, r, log); err != nil {
		return "", log, fmt.Errorf("%w (compiling %s with %s)", err, name, strings.Join(options, " "))
	}
	return ptx, log, nil
}

// Kernel sources and their PTX.

// KernelNames lists the entry points of the package's kernels.
func KernelNames() []string { return kernels.Names() }

// KernelSource returns the CUDA C++ program holding every kernel, as NVRTC
// compiles it.
func KernelSource() string { return kernels.Source() }

// kernelOptions are the NVRTC options for the kernels on compute_<arch>.
func kernelOptions(arch int) []string {
	return []string{fmt.Sprintf("--gpu-architecture=compute_%d", arch)}
}

// KernelPTX returns the kernels compiled to PTX for virtual architecture
// compute_<arch> (80, 90, ...), from the PTX cache when it holds them
// (PTXCacheDir), else compiled by NVRTC and stored there.
func KernelPTX(arch int) (string, error) {
	ptx, _, err := cachedPTX(PTXCacheDir(), KernelSource(), "goep_kernels.cu", kernelOptions(arch))
	return ptx, err
}

// PTXCacheDir is where compiled PTX is kept: $GOEP_PTX_CACHE if set ("off"
// turns the cache off: the result is ""), else $XDG_CACHE_HOME/goep/ptx or
// ~/.cache/goep/ptx. "" when no directory can be found.
func PTXCacheDir() string {
	if v := os.Getenv("GOEP_PTX_CACHE"); v != "" {
		if v == "off" || v == "0" {
			return ""
		}
		return v
	}
	dir, err := os.UserCacheDir()
	if err != nil {
		return ""
	}
	return filepath.Join(dir, "goep", "ptx")
}

// cacheTrailer ends every cache file, naming its key: a file cut short (a
// full disk, a killed writer) lacks it and is compiled again.
const cacheTrailer = "\n// goep-ptx-cache "

// cachedPTX compiles src with NVRTC unless dir holds the PTX for the same
// source, options and NVRTC (version and library path). dir "" means no
// cache. A cache that cannot be read or written is not an error: the
// source is compiled.
func cachedPTX(dir, src, name string, options []string) (ptx string, hit bool, err error) {
	major, minor, err := NVRTCVersion()
	if err != nil {
		return "", false, err
	}
	h := sha256.New()
	fmt.Fprintf(h, "nvrtc %d.%d %s\n", major, minor, nvrtcLib.loaded())
	for _, o := range options {
		fmt.Fprintf(h, "option %s\n", o)
	}
	fmt.Fprintf(h, "name %s\n\n%s", name, src)
	key := hex.EncodeToString(h.Sum(nil))
	file := filepath.Join(dir, key+".ptx")
	trailer := cacheTrailer + key + "\n"
	if dir != "" {
		if b, err := os.ReadFile(file); err == nil && strings.HasSuffix(string(b), trailer) {
			return strings.TrimSuffix(string(b), trailer), true, nil
		}
	}
	ptx, _, err = CompilePTX(src, name, options)
	if err != nil {
		return "", false, err
	}
	if dir != "" {
		_ = writeAtomic(file, []byte(ptx+trailer))
	}
	return ptx, false, nil
}

// writeAtomic writes a file under a temporary name, then renames it, so
// readers never see half a file.
func writeAtomic(file string, data []byte) error {
	if err := os.MkdirAll(filepath.Dir(file), 0o755); err != nil {
		return err
	}
	f, err := os.CreateTemp(filepath.Dir(file), ".tmp-*")
	if err != nil {
		return err
	}
	_, werr := f.Write(data)
	cerr := f.Close()
	if err := errors.Join(werr, cerr); err != nil {
		os.Remove(f.Name())
		return err
	}
	if err := os.Rename(f.Name(), file); err != nil {
		os.Remove(f.Name())
		return err
	}
	return nil
}
