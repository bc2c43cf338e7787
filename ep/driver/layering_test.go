package driver_test

import (
	"go/build"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// TestLayering keeps the package graph going one way: the contract imports
// nothing of package ep's, of the engines' or of the GPU's, and the engines
// and their shared kernels import the contract, never package ep (which
// imports them) or the GPU backend.
func TestLayering(t *testing.T) {
	_, here, _, ok := runtime.Caller(0)
	if !ok {
		t.Fatal("cannot locate this file")
	}
	epDir := filepath.Dir(filepath.Dir(here))
	const mod = "github.com/goep/goep/"
	for _, c := range []struct {
		dir       string
		forbidden []string // import paths, or prefixes ending in "/"
	}{
		{"driver", []string{mod + "ep", mod + "ep/", mod + "gpu/"}},
		{"alltoallv", []string{mod + "ep", mod + "ep/epcpu", mod + "ep/epgpu", mod + "gpu/"}},
		{"epcpu", []string{mod + "ep", mod + "ep/alltoallv", mod + "ep/epgpu", mod + "gpu/"}},
		{"epgpu", []string{mod + "ep", mod + "ep/alltoallv", mod + "ep/epcpu"}},
		{"internal/hostrows", []string{mod + "ep", mod + "ep/alltoallv", mod + "ep/epcpu", mod + "ep/epgpu", mod + "gpu/"}},
	} {
		for _, tags := range [][]string{nil, {"mpi"}, {"gpu", "mpi"}} {
			ctx := build.Default
			ctx.BuildTags = tags
			pkg, err := ctx.ImportDir(filepath.Join(epDir, c.dir), 0)
			if err != nil {
				t.Fatalf("ep/%s: %v", c.dir, err)
			}
			for _, imp := range pkg.Imports {
				for _, f := range c.forbidden {
					if imp == f || strings.HasSuffix(f, "/") && strings.HasPrefix(imp, f) {
						t.Errorf("ep/%s (tags %v) imports %s, which it must not", c.dir, tags, imp)
					}
				}
			}
		}
	}
}
