// Package kernels holds the CUDA C sources of package gpu's kernels, the
// table of their entry points, and a CPU emulator that runs the same source
// compiled as C, so that the kernels are tested on machines with no GPU.
//
// The .cu files are text for NVRTC: cgo does not compile them. Only
// emulate.c, which includes them after prelude.cuh's host definitions, is
// compiled here. Embedding the sources also makes them part of this
// package's build hash, so that editing a .cu file rebuilds the emulator.
package kernels

import (
	"embed"
	"fmt"
	"github.com/goep/goep/internal/dtype"
	"strings"
)

//go:embed prelude.cuh layout.cu rows.cu reduce.cu convert.cu meta.cu
var files embed.FS

// Files lists the source files in the order they are compiled.
var Files = []string{"prelude.cuh", "layout.cu", "rows.cu", "reduce.cu", "convert.cu", "meta.cu"}

// Kernel is one entry point. Params has one letter per parameter, in order:
// p = a pointer (a device address, 8 bytes), l = a 64-bit integer, i = a
// 32-bit int.
type Kernel struct {
	Name   string
	Params string
}

// Index returns the position of the named kernel in List, or -1.
func Index(name string) int {
	for i, k := range List {
		if k.Name == name {
			return i
		}
	}
	return -1
}

// Names lists the entry points' names.
func Names() []string {
	out := make([]string, len(List))
	for i, k := range List {
		out[i] = k.Name
	}
	return out
}

// File returns one source file's text.
func File(name string) (string, error) {
	b, err := files.ReadFile(name)
	if err != nil {
		return "", fmt.Errorf("kernels: no source file %q", name)
	}
	return string(b), nil
}

// dtypeInclude is how prelude.cuh includes the element types.
const dtypeInclude = "#include \"dtype.h\"\n"

// includeLine is the line number of dtypeInclude in text (0 if absent).
func includeLine(text []byte) int {
	i := strings.Index(string(text), dtypeInclude)
	if i < 0 {
		return 0
	}
	return strings.Count(string(text[:i]), "\n") + 1
}

// Source is the whole program NVRTC compiles: every file in order, each
// preceded by a #line directive so that compiler messages name the file.
func Source() string {
	var b strings.Builder
	for _, f := range Files {
		text, err := files.ReadFile(f)
		if err != nil {
			panic("kernels: embedded file missing: " + f) // a build error, not a run-time condition
		}
		fmt.Fprintf(&b, "#line 1 \"%s\"\n", f)
		b.WriteString(strings.Replace(string(text), dtypeInclude, dtype.Header+fmt.Sprintf("#line %d \"%s\"\n", includeLine(text)+1, f), 1))
		if len(text) > 0 && text[len(text)-1] != '\n' {
			b.WriteByte('\n')
		}
	}
	return b.String()
}
