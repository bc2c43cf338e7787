package ep

import "github.com/goep/goep/ep/epcpu"

// CPU is the default Backend: the CPU engine of package ep/epcpu, on host
// memory. Inside a node every rank maps every other rank's buffers (an
// MPI-3 shared-memory window), so a dispatched row is copied once, from the
// sender's tensor into its slot in the receiver's buffer, and combine reads
// the expert outputs in place; across nodes rows go by message into a
// staging memory of the receiver. See docs/ep.md.
var CPU Backend = epcpu.New()

// CPUOneSided is CPU with rows across nodes put by one-sided MPI instead of
// sent by message, for an MPI whose one-sided operations complete without
// the target's help (RDMA hardware).
var CPUOneSided Backend = epcpu.NewOneSided()
