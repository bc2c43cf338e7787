package alltoallv

import "github.com/goep/goep/ep/driver"

// The baseline's backends, by name.
func init() {
	driver.Register(driver.Registration{Name: "alltoallv", Doc: "the two-sided baseline: pack, MPI_Alltoallv, unpack, under the group's timeout",
		Open: driver.NoOptions(New())})
	driver.Register(driver.Registration{Name: "alltoallv-blocking", Doc: "the baseline with plain blocking MPI calls and no timeout, as a hand-written program",
		Open: driver.NoOptions(NewBlocking())})
}
