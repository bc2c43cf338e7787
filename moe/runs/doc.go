// Package runs manages training runs of package moe's toy MoE layer, as
// cmd/moe-train does: it ties a moe.Trainer's steps to an HDF5 trace
// and checkpoints, gives each run an identity, resumes runs, and reports
// the rank the others waited for. Package moe is the model and its
// training step; this package is what persists across jobs.
//
// # Runs, traces and checkpoints
//
// Train drives a whole run. Rank 0 writes an HDF5 trace (CreateTrace, one
// row per step of moe.StepStats gathered from every rank, flushed every
// step) and checkpoints (SaveCheckpoint: the trainer's moe.State, every
// rank's experts gathered to rank 0, in one file written atomically with
// h5.WriteAtomic).
//
// Each step's statistics include, per pair of ranks, how long one waited
// for the other in the ep calls and the token rows it sent to and received
// from it (moe.StepStats.WaitUS, PeerSent, PeerRecv: each rank's
// ep.Group.Stats, read and reset once per step, gathered). Result sums the
// waits over the run, and FindStraggler names the rank the others waited
// for most when it stands out (at least StragglerFactor times the mean for
// another rank, and StragglerMinUS in all).
//
// A run has an identity, its run id (NewID), made when it starts from
// scratch, written into its trace and every checkpoint, and kept by its
// resumes. Before it changes any file, Train looks at what is at its trace
// path and in its checkpoint directory: a run from scratch refuses another
// run's files unless Options.Fresh, which moves them aside (to
// DIR/moved-aside/<time>/, never deleting them); a resume refuses a trace or
// checkpoints of another run. Resume ResumeAuto continues the run of the
// checkpoint directory from its newest checkpoint, and refuses a directory
// of two runs. A resume continues its run's trace (ContinueTrace): the rows
// up to the checkpoint's step are kept, those after it (work lost with a
// crash) are dropped and counted, new rows append, and the trace's /segments
// records every segment of the run (start step, checkpoint, ranks, nodes,
// hosts, mode, dtype, tokens, command, start time, device).
//
// LoadCheckpoint resumes on any number of ranks that divides the experts
// (the checkpoint holds them all in global order; each rank takes its
// share: moe.Trainer.RestoreState), in either mode and element type, with
// any tokens per rank, on any backend. It refuses a checkpoint of another
// model or training configuration, naming each field that differs and both
// values (CheckpointInfo.Compatible), and a truncated or damaged file (a
// checksum covers the arrays). A grad sync with error feedback keeps
// per-rank state, which the checkpoint holds rank by rank (moe.SyncState;
// for A2SGD with each rank's own copy of the gate and shared expert and of
// their Adam moments). On the same ranks, mode and element type a run of 2N
// steps and a run of N steps resumed for N more end bit-identical, with any
// grad sync; on another number of ranks the ranks' errors are pooled and
// spread evenly (none is lost) and, under A2SGD, every rank starts from rank
// 0's copy, and the run says so (CheckpointInfo.Changes); on another number
// of ranks with the same global batch the resumed run trains on the same
// tokens and follows the uninterrupted run's loss within rounding
// (docs/trace-schema.md has the measured tolerance). The file formats are
// in docs/trace-schema.md; ReadTrace and ReadCheckpoint read every version
// written so far.
//
// # Collectives and errors
//
// Train, SaveCheckpoint and LoadCheckpoint are collective: every rank calls
// them in the same order. CreateTrace, ContinueTrace, ReadTrace and the
// other file functions are not: one process (rank 0) calls them. Errors are
// returned, never panics. Those that every rank meets at the same point
// (bad configuration, an unusable checkpoint, a file rank 0 cannot write)
// come back from Train as *CollectiveError, and the job can end normally;
// others may be on one rank only, and the program should call mpi.Abort so
// that the other ranks do not wait for it.
package runs
