package ep

import "github.com/goep/goep/ep/alltoallv"

// Alltoallv is the Backend of package ep/alltoallv: what the CPU engine
// does, the way one writes it by hand with two-sided MPI (pack by
// destination, MPI_Alltoall of the counts, MPI_Alltoallv of rows and
// metadata, unpack), combining with the same kernel in the same order, so
// that on one node its results are the CPU engine's bit for bit. Its
// timeouts cannot name a peer.
var Alltoallv Backend = alltoallv.New()

// AlltoallvBlocking is Alltoallv with plain blocking MPI calls and no
// timeout, exactly as a hand-written program: the baseline ep-bench times.
var AlltoallvBlocking Backend = alltoallv.NewBlocking()
