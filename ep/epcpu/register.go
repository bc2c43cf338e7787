package epcpu

import "github.com/goep/goep/ep/driver"

// The CPU engine's backends, by name.
func init() {
	driver.Register(driver.Registration{Name: "cpu", Doc: "ep's CPU engine, on host memory: shared memory inside a node, messages across nodes (mpi.Mailbox); the default",
		Open: driver.NoOptions(New())})
	driver.Register(driver.Registration{Name: "cpu-onesided", Doc: "the CPU engine with one-sided MPI puts across nodes: for an MPI whose puts complete without the target (RDMA)",
		Open: driver.NoOptions(NewOneSided())})
}
