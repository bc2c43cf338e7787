// Package study collects the results of ep-bench scaling studies into one
// HDF5 file, reads them back, and fits a latency-bandwidth model of ep's
// dispatch and combine that predicts them on clusters larger than the one
// measured.
//
// # The study file (format "goep-ep-study", version 1)
//
// One file per study. Every column of the results is a 1-D table (a chunked
// HDF5 dataset with an unlimited first dimension) under /results, one row per
// measured configuration: one JSON line of ep-bench -json plus the job step
// that produced it. Rows are appended step by step and the file is flushed
// after each, so a study killed half way leaves a readable file of the steps
// done.
//
//	/results/step                  int64    index of the job step (into the root attribute steps)
//	/results/mode                  int64    0 = ll, 1 = ht (the dataset's attribute labels)
//	/results/dtype                 int64    0 = f32, 1 = bf16, 2 = fp8 (attribute labels)
//	/results/elem_bytes            int64    bytes per element: 4 (f32), 2 (bf16) or 1 (fp8)
//	/results/ranks                 int64    MPI ranks
//	/results/nodes                 int64    nodes as ep saw them (Slurm nodes, or simulated nodes)
//	/results/tokens                int64    tokens per rank
//	/results/hidden                int64    elements per token
//	/results/topk                  int64    experts per token
//	/results/experts               int64    experts in all
//	/results/iters                 int64    timed iterations (medians are over these)
//	/results/bytes_per_rank        float64  bytes of the rows a rank sends per call, mean over ranks
//	/results/dispatch_us           float64  dispatch time, slowest rank's median, microseconds
//	/results/combine_us            float64  combine time, likewise
//	/results/dispatch_gbps         float64  dispatch algorithm bandwidth per rank, GB/s, mean over ranks
//	/results/combine_gbps          float64  combine algorithm bandwidth per rank, GB/s
//	/results/alltoallv_dispatch_us float64  the same dispatch by hand with MPI_Alltoallv (0: not run)
//	/results/alltoallv_combine_us  float64
//	/results/alltoallv_dispatch_gbps, /results/alltoallv_combine_gbps   float64
//	/results/speedup_vs_alltoallv  float64  alltoallv (dispatch+combine) time / ep's
//	/results/memcpy_gbps           float64  memcpy of the same bytes on every rank at once, GB/s per rank
//	/results/dispatch_memcpy_frac, /results/combine_memcpy_frac   float64   bandwidth / memcpy's
//	/results/buffer_bytes_per_rank int64    bytes of window memory ep's group holds per rank
//
// Every dataset has the attributes units and description. The root group has
// format, version, created (RFC 3339, UTC), go_version, host, host_cpus
// (logical CPUs of the host that collected), steps and step_commands (one
// string per job step: its name and its command line), and whatever the
// collector was given. scripts/slurm/study.sbatch adds the Slurm job
// (slurm_job_id, slurm_job_nodelist, slurm_job_num_nodes, slurm_cluster_name,
// slurm_job_partition, from the environment), date and finished, alloc_hosts
// (distinct real hosts behind the allocation's nodes: 1 on a one-machine test
// cluster, emulated hosts included), emulated_hosts (nodes that are hosts
// emulated on that one machine, scripts/slurm/cluster.sh --net; 0 otherwise),
// launcher, srun_mpi, ompi_mca_osc, the sweep (sweep_layouts,
// sweep_modes, sweep_dtypes, sweep_tokens_ll, sweep_tokens_ht, sweep_hidden,
// sweep_topk, sweep_experts, sweep_iters, sweep_warmup), skipped_layouts and
// failed_steps ("none" when none). A fitted model is stored as attributes of
// /model and /model/<mode>/<phase> (WriteModel).
//
//	h5ls -r out/study/study.h5                      # the tables
//	h5dump -A out/study/study.h5                    # every attribute
//	h5dump -d /results/dispatch_us out/study/study.h5
//
// # The model
//
// Fit fits, per mode (LL, HT) and phase (dispatch, combine),
//
//	t = f*(a + b*(R-1) + B/shm) + [N>1]*f*(c + d*(R-P) + X/net) + (f-1)*(o + B/over)
//
// for R ranks, P per node, N nodes, B bytes sent per rank and X of them
// across nodes (ExpectedBytes, InterNodeBytes), and f = max(1, ranks per
// host / cores) on a host with more ranks than cores; single-node runs
// first, then what the multi-node runs add, each by non-negative least
// absolute relative errors (RobustNNLS). Predict drops the terms of shared
// cores (f = 1) and may put a given network bandwidth per node in place of
// net. docs/scaling.md explains the terms and their assumptions.
package study
