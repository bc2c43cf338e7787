package mpi

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// OneSidedComponents is what goep asks Open MPI for when nobody has chosen its
// one-sided components: osc/sm for windows within a node, osc/ucx for windows
// across nodes. See the package doc ("One-sided components").
const OneSidedComponents = "sm,ucx"

// OneSidedChoice tells how Open MPI's one-sided (osc) components were chosen
// for this process.
type OneSidedChoice struct {
	// Components is Open MPI's osc parameter as MPI_Init read it (from
	// MPI_T): a list such as "sm,ucx", an exclusion such as "^ucx,pt2pt", or
	// "" for every component. Empty too without the mpi build tag.
	Components string
	// ByGoep is true when goep set OMPI_MCA_osc because nobody had chosen.
	ByGoep bool
	// Reason says why, naming the setting or file that decided.
	Reason string
}

// oneSided is the choice Init made; read by OneSided.
var oneSided = OneSidedChoice{Reason: notInitialised}

const notInitialised = "MPI is not initialised"

// OneSided reports how the one-sided components were chosen. Valid after Init.
func OneSided() OneSidedChoice {
	initMu.Lock()
	defer initMu.Unlock()
	return oneSided
}

// oscInputs is what the choice depends on, so that it can be tested without
// MPI: the environment, the parameter files and the components installed.
type oscInputs struct {
	lookupEnv func(string) (string, bool)
	readFile  func(string) ([]byte, error)
	// userFiles hold the user's settings (~/.openmpi/mca-params.conf, or the
	// files named by OMPI_MCA_mca_base_param_files); siteFiles the
	// installation's (openmpi-mca-params.conf in its sysconfdir).
	userFiles, siteFiles []string
	// missing names the first of the components goep would ask for that this
	// Open MPI lacks ("" when it has them all).
	missing string
}

// decideOneSided returns the value goep sets OMPI_MCA_osc to ("" and false to
// leave it alone) and the reason. The user's choice always wins: OMPI_MCA_osc
// in the environment (mpirun --mca osc and srun pass it that way), or an osc
// line in the user's parameter files. In the installation's own file, a list
// of components is a choice and wins too, while an exclusion list is not: it
// names no component that works across hosts, and Debian and Ubuntu ship
// "osc = ^ucx,pt2pt", which leaves none with MPI_THREAD_MULTIPLE over TCP.
func decideOneSided(in oscInputs) (value string, set bool, reason string) {
	if v, ok := in.lookupEnv("OMPI_MCA_osc"); ok {
		return "", false, fmt.Sprintf("OMPI_MCA_osc=%q is set in the environment", v)
	}
	for _, f := range in.userFiles {
		if v, ok := paramInFile(in.readFile, f, "osc"); ok {
			return "", false, fmt.Sprintf("%s sets osc = %s", f, v)
		}
	}
	overridden := ""
	for _, f := range in.siteFiles {
		if v, ok := paramInFile(in.readFile, f, "osc"); ok {
			if !strings.HasPrefix(v, "^") {
				return "", false, fmt.Sprintf("%s sets osc = %s", f, v)
			}
			if overridden == "" {
				overridden = fmt.Sprintf(" (in place of osc = %s of %s, an exclusion list)", v, f)
			}
		}
	}
	if in.missing != "" {
		return "", false, fmt.Sprintf("nobody chose, but this Open MPI has no osc/%s component: Open MPI's default", in.missing)
	}
	return OneSidedComponents, true, "nobody chose: goep set OMPI_MCA_osc=" + OneSidedComponents + overridden
}

// paramInFile returns the value of an Open MPI parameter in a parameter file
// ("name = value" lines, # comments); the last line that sets it counts.
func paramInFile(readFile func(string) ([]byte, error), path, name string) (string, bool) {
	b, err := readFile(path)
	if err != nil {
		return "", false
	}
	value, found := "", false
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		line := sc.Text()
		if i := strings.IndexByte(line, '#'); i >= 0 {
			line = line[:i]
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok || strings.TrimSpace(k) != name {
			continue
		}
		value, found = strings.Trim(strings.TrimSpace(v), `"'`), true
	}
	return value, found
}

// paramFiles lists Open MPI's parameter files: the user's and the
// installation's. prefix is the installation prefix ("" if unknown).
func paramFiles(lookupEnv func(string) (string, bool), prefix string) (user, site []string) {
	for _, name := range []string{"OMPI_MCA_mca_base_param_files", "OMPI_MCA_mca_param_files"} {
		if v, ok := lookupEnv(name); ok {
			// The user named the files: whatever they set is the user's.
			for _, f := range strings.Split(v, ":") {
				if f != "" {
					user = append(user, f)
				}
			}
			return user, nil
		}
	}
	if home, err := os.UserHomeDir(); err == nil {
		user = append(user, filepath.Join(home, ".openmpi", "mca-params.conf"))
	}
	var dirs []string
	if v, ok := lookupEnv("OPAL_SYSCONFDIR"); ok && v != "" {
		dirs = append(dirs, v)
	}
	if v, ok := lookupEnv("OPAL_PREFIX"); ok && v != "" {
		dirs = append(dirs, filepath.Join(v, "etc"))
	}
	if prefix != "" && prefix != "/usr" {
		dirs = append(dirs, filepath.Join(prefix, "etc"))
	}
	dirs = append(dirs, "/etc/openmpi", "/etc") // distributions' packages (prefix /usr)
	seen := map[string]bool{}
	for _, d := range dirs {
		f := filepath.Join(d, "openmpi-mca-params.conf")
		if !seen[f] {
			seen[f] = true
			site = append(site, f)
		}
	}
	return user, site
}

// installPrefix guesses the installation prefix from the library's path:
// PREFIX/lib, PREFIX/lib64 or PREFIX/lib/<multiarch triplet>.
func installPrefix(lib string) string {
	if lib == "" {
		return ""
	}
	d := filepath.Dir(lib)
	for _, suffix := range []string{"/lib", "/lib64"} {
		if strings.HasSuffix(d, suffix) {
			return strings.TrimSuffix(d, suffix)
		}
	}
	if p := filepath.Dir(d); strings.HasSuffix(p, "/lib") { // lib/x86_64-linux-gnu
		return strings.TrimSuffix(p, "/lib")
	}
	return ""
}
