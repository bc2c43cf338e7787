// ep_online_cpus is the machine's online processors, whatever this
// process's affinity (mpirun may bind each rank to one core): the waits of
// flags.go spin only when every rank of a node can have a core.
#include "kernels.h"
#include <unistd.h>

long ep_online_cpus(void) { return sysconf(_SC_NPROCESSORS_ONLN); }
