// Package alltoallv is the two-sided MPI baseline of package ep's contract:
// a Backend (New, NewBlocking) whose engines pack each dispatch's rows by
// destination rank, exchange the counts with MPI_Alltoall, move rows and
// metadata with MPI_Alltoallv and unpack them into the receive layout the
// group asked for (layouts.go); the combine goes back the same way and
// reduces with the kernel and in the order of the CPU engine, so that on
// one node the two agree bit for bit. It treats the ranks as one flat node
// and keeps its buffers on the Go heap. Programs reach it as ep.Alltoallv
// and ep.AlltoallvBlocking, or by the names "alltoallv" and
// "alltoallv-blocking" (ep.OpenBackend).
package alltoallv
