package main

import (
	"io"
	"os"
	"strconv"
	"strings"

	"github.com/goep/goep/mpi"
)

// isTerminal reports whether w is a terminal that a live progress bar can
// redraw. Open MPI gives each rank a pseudo-terminal for its output even when
// mpirun's own output goes to a file (a Slurm log), so under a launcher the
// launcher's output (its standard output, read from /proc) must be a
// terminal too.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok || !fdIsTerminal(f.Fd(), "self") {
		return false
	}
	if mpi.DetectLaunch().Launcher == "" {
		return true
	}
	return fdIsTerminal(1, strconv.Itoa(os.Getppid()))
}

// fdIsTerminal reports whether file descriptor fd of process pid ("self"
// or a number) is a terminal device, from its /proc link.
func fdIsTerminal(fd uintptr, pid string) bool {
	target, err := os.Readlink("/proc/" + pid + "/fd/" + strconv.FormatUint(uint64(fd), 10))
	if err != nil {
		return false
	}
	return strings.HasPrefix(target, "/dev/pts/") || strings.HasPrefix(target, "/dev/tty") || target == "/dev/console"
}
