// Package epcpu is the CPU engine of package ep's contract (package
// ep/driver), on host memory: the default backend, which programs reach as
// ep.CPU or by the name "cpu" (and "cpu-onesided").
//
// Inside a node every rank maps every other rank's buffers (an MPI-3
// shared-memory window): a dispatched row is copied once, from the sender's
// tensor into its slot in the receiver's buffer, and the combine reads the
// expert outputs where the experts wrote them. Across nodes rows go by a
// network kind (network.go): messages into a staging memory of the
// receiver (mpi.Mailbox, the default) or one-sided puts; the modes read
// what the network can do (send in place, land in place), never which one
// it is.
//
// The files: engine.go opens a group's engine and lays out its memories;
// transport.go moves rows and flags between ranks (loads and stores inside
// a node, the network across nodes) and waits with deadlines; flags.go is
// the flags; sequence.go numbers the calls and finds ranks whose calls no
// longer match; ll.go, lldirect.go, llrank.go and llcombine.go are the
// LowLatency mode (expert-major and rank-major layouts, the combine's wire
// formats); ht.go and htzones.go the HighThroughput mode (flat and
// expert-major layouts); plan.go says what a group holds before it is made
// (ep.BufferPlan); timeline.go records the steps of calls.
package epcpu
