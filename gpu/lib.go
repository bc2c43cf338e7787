package gpu

/*
#cgo CFLAGS: -O2 -std=gnu11 -Wall
#cgo LDFLAGS: -ldl
#include <stdlib.h>
#include "shim.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"unsafe"
)

// ErrLibraryMissing is matched (errors.Is) by every error that says a GPU
// library could not be loaded; the error itself is a *LibraryError.
var ErrLibraryMissing = errors.New("gpu: library missing")

// LibraryError reports that a library could not be opened: which one, the
// environment variable that names it, and what was tried.
type LibraryError struct {
	What  string   // "the CUDA driver", "NVRTC", "NCCL"
	Name  string   // the usual file name, e.g. libnccl.so.2
	Env   string   // the variable that overrides the search, e.g. GOEP_NCCL_LIB
	Tried []string // each candidate and why it failed
}

func (e *LibraryError) Error() string {
	tried := e.Tried
	more := ""
	if len(tried) > 3 {
		more = fmt.Sprintf("; and %d more", len(tried)-3)
		tried = tried[:3]
	}
	return fmt.Sprintf("gpu: %s library (%s) could not be loaded: %s%s; install it, or set %s to its path (or a colon-separated list of candidates)",
		e.What, e.Name, strings.Join(tried, "; "), more, e.Env)
}

// Is makes errors.Is(err, ErrLibraryMissing) true.
func (e *LibraryError) Is(target error) bool { return target == ErrLibraryMissing }

// library is one dynamically loaded library, opened at first use.
type library struct {
	what, name, env string
	// defaults are tried in order when env is unset: file names for
	// dlopen's own search, and glob patterns (absolute; $VAR expanded).
	defaults []string
	open     func(path string) error

	once sync.Once
	path string // the candidate that loaded
	err  error
}

// candidates lists what to try: the environment variable's entries if it is
// set, else the defaults. Glob patterns expand to their matches, newest
// (lexically greatest) first; a name without a slash is left for dlopen.
func (l *library) candidates() []string {
	var specs []string
	if v := os.Getenv(l.env); v != "" {
		specs = strings.Split(v, ":")
	} else {
		specs = l.defaults
	}
	var out []string
	seen := map[string]bool{}
	add := func(p string) {
		if p != "" && !seen[p] {
			seen[p] = true
			out = append(out, p)
		}
	}
	for _, s := range specs {
		unset := false
		s = os.Expand(strings.TrimSpace(s), func(v string) string {
			x := os.Getenv(v)
			unset = unset || x == ""
			return x
		})
		if unset {
			continue // a pattern under $VIRTUAL_ENV, say, when there is none
		}
		if !strings.ContainsAny(s, "*?[") {
			add(s)
			continue
		}
		m, _ := filepath.Glob(s)
		sort.Sort(sort.Reverse(sort.StringSlice(m)))
		for _, p := range m {
			add(p)
		}
	}
	return out
}

// load opens the library once; later calls return the first outcome.
func (l *library) load() error {
	l.once.Do(func() {
		var tried []string
		for _, p := range l.candidates() {
			if err := l.open(p); err != nil {
				tried = append(tried, err.Error())
				continue
			}
			l.path = p
			return
		}
		if len(tried) == 0 {
			tried = []string{"no candidate file found"}
		}
		l.err = &LibraryError{What: l.what, Name: l.name, Env: l.env, Tried: tried}
	})
	return l.err
}

// loaded returns the path the library was loaded from ("" if it was not).
func (l *library) loaded() string {
	if l.load() != nil {
		return ""
	}
	return l.path
}

type cLoader func(path *C.char, err *C.char, errlen C.size_t) C.int

func opener(f cLoader) func(string) error {
	return func(path string) error {
		cpath := C.CString(path)
		defer C.free(unsafe.Pointer(cpath))
		var buf [512]C.char
		if f(cpath, &buf[0], C.size_t(len(buf))) != 0 {
			return errors.New(C.GoString(&buf[0]))
		}
		return nil
	}
}

// nvrtcBuiltins is the NVRTC builtins library loaded beside NVRTC (see
// withBuiltins), "" if none was.
var nvrtcBuiltins string

// withBuiltins opens, before NVRTC itself, the libnvrtc-builtins.so.* that
// lies beside it. NVRTC loads its builtins library at its first
// compilation by soname, through the loader's search path, not from its
// own folder; when NVRTC comes from a folder off that path (a pip wheel's,
// a toolkit's not in ld.so.conf) every compilation would fail with
// NVRTC_ERROR_BUILTIN_OPERATION_FAILURE. A library already loaded under
// that soname is the one the loader gives it.
func withBuiltins(open func(string) error) func(string) error {
	return func(path string) error {
		if strings.Contains(path, "/") {
			m, _ := filepath.Glob(filepath.Join(filepath.Dir(path), "libnvrtc-builtins.so.*"))
			sort.Sort(sort.Reverse(sort.StringSlice(m)))
			for _, b := range m {
				if loadKept(b) == nil {
					nvrtcBuiltins = b
					break
				}
			}
		}
		return open(path)
	}
}

// loadKept loads the library at path for the life of the process.
func loadKept(path string) error {
	return opener(func(p, e *C.char, n C.size_t) C.int { return C.goep_dlopen_keep(p, e, n) })(path)
}

// pythonLibs lists glob patterns for a library that pip's nvidia-* wheels
// install (nvidia/<component>/lib/), under the usual site-packages roots.
func pythonLibs(file string) []string {
	roots := []string{
		"/usr/local/lib/python3*/dist-packages",
		"/usr/local/lib/python3*/site-packages",
		"/usr/lib/python3/dist-packages",
		"/usr/lib/python3*/site-packages",
		"/opt/conda/lib/python3*/site-packages",
		"$VIRTUAL_ENV/lib/python3*/site-packages",
		"$CONDA_PREFIX/lib/python3*/site-packages",
		"$HOME/.local/lib/python3*/site-packages",
	}
	out := make([]string, len(roots))
	for i, r := range roots {
		out[i] = r + "/nvidia/*/lib/" + file
	}
	return out
}

var (
	cudaLib = &library{
		what: "the CUDA driver", name: "libcuda.so.1", env: "GOEP_CUDA_LIB",
		defaults: []string{"libcuda.so.1", "libcuda.so", "/usr/lib/x86_64-linux-gnu/libcuda.so.1",
			"/usr/lib64/libcuda.so.1", "/usr/lib/wsl/lib/libcuda.so.1"},
		open: opener(func(p, e *C.char, n C.size_t) C.int { return C.goep_load_cuda(p, e, n) }),
	}
	nvrtcLib = &library{
		what: "NVRTC", name: "libnvrtc.so", env: "GOEP_NVRTC_LIB",
		defaults: append([]string{"libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so.11.2", "libnvrtc.so",
			"/usr/local/cuda/lib64/libnvrtc.so*", "/usr/local/cuda/targets/*/lib/libnvrtc.so*",
			"/usr/local/cuda-*/lib64/libnvrtc.so*", "/usr/lib/x86_64-linux-gnu/libnvrtc.so*"},
			pythonLibs("libnvrtc.so*")...),
		open: withBuiltins(opener(func(p, e *C.char, n C.size_t) C.int { return C.goep_load_nvrtc(p, e, n) })),
	}
	ncclLib = &library{
		what: "NCCL", name: "libnccl.so.2", env: "GOEP_NCCL_LIB",
		defaults: append([]string{"libnccl.so.2", "libnccl.so", "/usr/local/nccl*/lib/libnccl.so*",
			"/usr/lib/x86_64-linux-gnu/libnccl.so*"}, pythonLibs("libnccl.so*")...),
		open: opener(func(p, e *C.char, n C.size_t) C.int { return C.goep_load_nccl(p, e, n) }),
	}
)

// Libraries reports where each GPU library was loaded from, loading them if
// needed: a path, or the error that says why it is missing. For logs.
func Libraries() map[string]string {
	out := map[string]string{}
	for _, l := range []*library{cudaLib, nvrtcLib, ncclLib} {
		if err := l.load(); err != nil {
			out[l.what] = err.Error()
		} else {
			out[l.what] = l.path
		}
	}
	if nvrtcBuiltins != "" {
		out["NVRTC builtins"] = nvrtcBuiltins
	}
	return out
}
