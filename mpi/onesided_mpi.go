//go:build mpi

package mpi

/*
#cgo pkg-config: ompi
#cgo LDFLAGS: -ldl
#include <stdlib.h>
#include "shim_mpi.h"
*/
import "C"

import (
	"os"
	"path/filepath"
	"strings"
	"unsafe"
)

// chooseOneSided sets OMPI_MCA_osc before MPI_Init when nobody has chosen
// Open MPI's one-sided components (see decideOneSided), and records why.
func chooseOneSided() {
	if C.goep_is_open_mpi() == 0 {
		oneSided = OneSidedChoice{Reason: "not Open MPI: its own choice"}
		return
	}
	lib := libmpiPath()
	user, site := paramFiles(os.LookupEnv, installPrefix(lib))
	in := oscInputs{lookupEnv: os.LookupEnv, readFile: os.ReadFile, userFiles: user, siteFiles: site}
	for _, comp := range strings.Split(OneSidedComponents, ",") {
		if !haveOSCComponent(comp, componentDirs(lib)) {
			in.missing = comp
			break
		}
	}
	value, set, reason := decideOneSided(in)
	if set {
		if err := os.Setenv("OMPI_MCA_osc", value); err != nil {
			reason = "setting OMPI_MCA_osc failed: " + err.Error()
			set = false
		}
	}
	oneSided = OneSidedChoice{ByGoep: set, Reason: reason}
}

// readOneSided fills in the osc parameter as Open MPI read it, after MPI_Init.
func readOneSided() {
	if C.goep_is_open_mpi() == 0 {
		return
	}
	buf := make([]byte, 8192)
	name := C.CString("osc")
	defer C.free(unsafe.Pointer(name))
	if rc := C.goep_mca_string(name, (*C.char)(unsafe.Pointer(&buf[0])), C.int(len(buf))); rc != C.MPI_SUCCESS {
		oneSided.Reason += " (MPI_T could not read osc: " + mpiError("MPI_T_cvar_read", rc).Error() + ")"
		return
	}
	oneSided.Components = C.GoString((*C.char)(unsafe.Pointer(&buf[0])))
}

// libmpiPath is the real path of the MPI library this process runs with.
func libmpiPath() string {
	buf := make([]byte, 4096)
	if C.goep_libmpi_path((*C.char)(unsafe.Pointer(&buf[0])), C.int(len(buf))) != 0 {
		return ""
	}
	p := C.GoString((*C.char)(unsafe.Pointer(&buf[0])))
	if r, err := filepath.EvalSymlinks(p); err == nil {
		p = r
	}
	return p
}

// componentDirs lists where Open MPI's component libraries may be: the
// component path the user set, or the usual places beside the library
// (LIBDIR/openmpi; Debian's LIBDIR/openmpi/lib/openmpi3), and the user's.
func componentDirs(lib string) []string {
	if v, ok := os.LookupEnv("OMPI_MCA_mca_base_component_path"); ok {
		return filepath.SplitList(v)
	}
	var dirs []string
	if lib != "" {
		d := filepath.Dir(lib)
		dirs = append(dirs, filepath.Join(d, "openmpi"))
		for _, pat := range []string{"openmpi*/lib/openmpi*", "openmpi*"} {
			m, _ := filepath.Glob(filepath.Join(d, pat))
			dirs = append(dirs, m...)
		}
	}
	if home, err := os.UserHomeDir(); err == nil {
		dirs = append(dirs, filepath.Join(home, ".openmpi", "components"))
	}
	return dirs
}

// haveOSCComponent reports whether Open MPI can open osc component name:
// linked in, or a shared object in one of dirs that loads.
func haveOSCComponent(name string, dirs []string) bool {
	sym := C.CString("mca_osc_" + name + "_component")
	defer C.free(unsafe.Pointer(sym))
	if C.goep_static_component(sym) != 0 {
		return true
	}
	for _, d := range dirs {
		p := filepath.Join(d, "mca_osc_"+name+".so")
		if _, err := os.Stat(p); err != nil {
			continue
		}
		cp := C.CString(p)
		ok := C.goep_can_load(cp) != 0
		C.free(unsafe.Pointer(cp))
		return ok
	}
	return false
}
