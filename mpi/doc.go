// Package mpi is the MPI layer of goep: process start-up, node topology,
// collectives, MPI-3 shared-memory windows and one-sided (RMA) windows.
//
// # Build modes
//
// Built with the mpi build tag (go build -tags mpi), the package links the
// system MPI library (Open MPI, found through pkg-config "ompi"). Built without
// it, every call behaves as a job of one rank: collectives copy, windows are
// plain process memory, and Init fails if a launcher started more than one
// process, so that a binary built without the tag never runs as N copies of
// rank 0.
//
// # What comes from empi and what is ours
//
// Initialisation, finalisation and the world rank and size come from
// github.com/emer/empi/v2/mpi (Init requests MPI_THREAD_MULTIPLE through
// empi's InitThreadSafe). empi keeps its MPI_Comm unexported and has no
// alltoall(v), no split by node and no windows, so every operation on a
// communicator (split, barrier, broadcast, allgather, alltoall(v), allreduce,
// windows) is a small cgo call of this package against the same MPI library.
//
// # Inside another program's MPI
//
// Adopt makes a Comm of a communicator that a C program or mpi4py created,
// when MPI was initialised by them: it duplicates it (so that this package's
// messages and error handler stay on its own copy) and neither initialises
// nor finalises MPI. Init is then not called. The C library of package capi
// works this way.
//
// # Threads
//
// Go moves goroutines between OS threads, so the package asks MPI for
// MPI_THREAD_MULTIPLE, and any goroutine may call it. If the MPI library
// provides less, Init locks the calling goroutine to its OS thread and
// ThreadLevel reports the level provided: the program must then make every
// MPI call from that goroutine.
//
// # Errors and timeouts
//
// MPI errors are returned (MPI_ERRORS_RETURN is set on every communicator and
// window) as *Error, naming the MPI call. Bad arguments (a negative rank,
// mismatched alltoallv lengths) are caught before MPI is called and named in
// the error. A communicator with a non-zero Timeout runs collectives as
// non-blocking MPI calls polled until the deadline, and a peer that never
// arrives yields a *TimeoutError instead of a hang; the communicator is then
// unusable. With Timeout zero, collectives block inside MPI as in a plain MPI
// program.
//
// # Point to point
//
// Comm.Exchange posts non-blocking sends and receives (MPI_Isend,
// MPI_Irecv) of memory outside the Go heap (a Buffer, C memory) and returns
// an *Exchange to poll (Test, Pending) or abandon (Cancel): the transport of
// the emulated GPU of package gpu/emulator, which stands where NCCL's
// grouped ncclSend/ncclRecv would. Messages between two ranks match in the
// order they were posted, and a receive must be matched by a send of its
// exact size.
//
// # Topology
//
// Topology groups the ranks of a communicator into nodes: ranks that share
// memory (MPI_Comm_split_type with MPI_COMM_TYPE_SHARED) and, under Slurm, run
// on the same Slurm node. The environment variable GOEP_RANKS_PER_NODE=N
// splits each node further into simulated nodes of N ranks, so that
// hierarchical (multi-node) code paths can run on one machine.
//
// # One-sided components (Open MPI)
//
// Windows across nodes (AllocateWindow over ranks of several hosts) need a
// one-sided component of Open MPI's osc framework that works between hosts
// with MPI_THREAD_MULTIPLE. Open MPI 4.1 without InfiniBand has one only if
// ucx is named: osc/sm is node-local, osc/rdma needs a transport with RDMA
// put and get (TCP has none), osc/pt2pt refuses MPI_THREAD_MULTIPLE, and
// osc/ucx offers itself on Mellanox devices only unless it is asked for, so
// MPI_Win_allocate fails with MPI_ERR_WIN. Debian and Ubuntu also ship
// "osc = ^ucx,pt2pt" in /etc/openmpi/openmpi-mca-params.conf.
//
// So Init, before MPI_Init, sets OMPI_MCA_osc=sm,ucx (OneSidedComponents:
// sm within a node, ucx across nodes) when nobody has chosen, and when this
// Open MPI has both components. The user has chosen when OMPI_MCA_osc is in
// the environment (mpirun --mca osc LIST and srun pass it that way, as does
// mpirun -x), or osc is set in ~/.openmpi/mca-params.conf or in a file named
// by OMPI_MCA_mca_base_param_files; the installation's
// openmpi-mca-params.conf counts when it names components, not when it only
// excludes some (as Debian's does). To override, set your own:
//
//	mpirun --mca osc sm,rdma ...        # on InfiniBand, say
//	OMPI_MCA_osc=^ucx,pt2pt mpirun ...  # Debian's default back
//	OMPI_MCA_osc= mpirun ...            # every component, Open MPI decides
//
// OneSided reports the choice: the osc parameter as Open MPI read it (through
// MPI_T) and who set it; examples/mpi-hello prints it.
//
// # Launch
//
// Init reads the launcher's environment (mpirun, srun, a PMI/PMIx launcher).
// A process started with no launcher is refused unless GOEP_ALLOW_SINGLETON=1,
// and a launcher that started N processes which MPI sees as N separate jobs of
// one rank is reported as such, with the fix (srun --mpi=pmix). With Debian's
// Open MPI, srun --mpi=none or pmi2 never gets that far: MPI_Init aborts with
// Open MPI's own message that it was built without Slurm's PMI support.
package mpi
