#!/usr/bin/env bash
# train.sh: train the toy MoE (bin/moe-train) on Slurm, one job step of srun --mpi=$GOEP_SRUN_MPI
# (or mpirun inside an allocation). From a login node srun makes the allocation itself; inside
# sbatch or salloc the step runs in the job's allocation (train.sbatch calls this script).
#
#   make bin/moe-train
#   scripts/slurm/train.sh -steps 2000 -mode ht -dtype bf16      # moe-train's flags, as they are
#   GOEP_TRAIN_NODES=4 GOEP_TRAIN_TASKS_PER_NODE=8 scripts/slurm/train.sh -experts 64 -tokens 256
#   salloc -N 2 --ntasks-per-node=2 env LAUNCHER=mpirun scripts/slurm/train.sh -steps 500
#
# moe-train gets -device $GOEP_TRAIN_DEVICE -trace DIR/trace.h5 -ckpt-dir DIR -progress lines first, then this script's
# arguments, which win (a flag given twice takes its last value). DIR holds one run: its one trace
# and its checkpoints. With GOEP_TRAIN_RESUME=auto moe-train continues the run in DIR from its newest
# checkpoint (-resume auto), on this job's ranks whatever the last job's were, and continues its
# trace; a requeued or resubmitted job, on the same or another number of nodes, picks up where the
# last one stopped, and one that finds the run done exits 0. A new run (GOEP_TRAIN_RESUME="")
# refuses a DIR that holds another run; pass -fresh to move that run's files aside and start over.
# Set GOEP_TRAIN_GLOBAL_BATCH to keep the tokens per step over all ranks (moe-train's -tokens is
# then that divided by the ranks), so that a job on another node count trains on the same data.
#
# Environment:
#   GOEP_TRAIN_NODES=2             nodes (srun -N); inside an allocation, default its node count
#   GOEP_TRAIN_TASKS_PER_NODE=2    ranks per node; inside an allocation, default SLURM_NTASKS_PER_NODE
#   GOEP_OUT_DIR=out/train-<job id, or date>   trace, checkpoints, logs/ (one log per rank)
#   GOEP_TRAIN_RESUME=             "" (a new run), auto (continue the run in GOEP_OUT_DIR from its
#                                  newest checkpoint, or start one) or a checkpoint's path
#   GOEP_TRAIN_GLOBAL_BATCH=       tokens per step over all ranks: -tokens GLOBAL/ranks (must divide)
#   GOEP_TRAIN_DEVICE=cpu          moe-train's -device, any ep backend by name (bin/ep-bench -device
#                                  list): cpu (ep's CPU engine), emulate (the GPU engine on the
#                                  emulated device, no GPU needed), cuda (each rank's GPU, with NCCL:
#                                  the unique ID is made on rank 0 and handed over MPI), alltoallv,
#                                  ...; a resume may change it
#   GOEP_ROOT=                     the repository (default: the submit directory, else this
#                                  script's); relative paths are from there
#   Site settings, see lib.sh: LAUNCHER=srun|mpirun, GOEP_SRUN_MPI=pmix, GOEP_SRUN_FLAGS,
#   GOEP_MPIRUN=mpirun, GOEP_MPIRUN_FLAGS, GOEP_MODULES, GOEP_SETUP, GOEP_BIN_DIR=bin,
#   GOEP_STEP_TIMEOUT=0, GOEP_RANKS_PER_NODE. Partition, account, time of
#   the allocation srun makes: Slurm's own SLURM_PARTITION, SLURM_ACCOUNT, SLURM_TIMELIMIT.
# Exit status: moe-train's. On failure every rank's log is printed.
set -euo pipefail
GOEP_SCRIPT=train.sh
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
GOEP_ROOT=${GOEP_ROOT:-${SLURM_SUBMIT_DIR:-$(cd "$here/../.." && pwd)}}
cd "$GOEP_ROOT"
# shellcheck source=lib.sh
source "$GOEP_ROOT/scripts/slurm/lib.sh"
goep_setup

if [ -n "${SLURM_JOB_ID:-}" ]; then
  nodes=${GOEP_TRAIN_NODES:-${SLURM_JOB_NUM_NODES:-2}}
  ppn=${GOEP_TRAIN_TASKS_PER_NODE:-${SLURM_NTASKS_PER_NODE:-2}}
else
  nodes=${GOEP_TRAIN_NODES:-2}
  ppn=${GOEP_TRAIN_TASKS_PER_NODE:-2}
fi
out=${GOEP_OUT_DIR:-out/train-${SLURM_JOB_ID:-$(date +%Y%m%d-%H%M%S)}}
mkdir -p "$out/logs"
bin=$(goep_bin moe-train)

ranks=$((nodes * ppn))
tokens=()
if [ -n "${GOEP_TRAIN_GLOBAL_BATCH:-}" ]; then
  [[ "$GOEP_TRAIN_GLOBAL_BATCH" =~ ^[1-9][0-9]*$ ]] && [ $((GOEP_TRAIN_GLOBAL_BATCH % ranks)) = 0 ] ||
    goep_die "GOEP_TRAIN_GLOBAL_BATCH=$GOEP_TRAIN_GLOBAL_BATCH: want a positive multiple of the $ranks ranks"
  tokens=(-tokens $((GOEP_TRAIN_GLOBAL_BATCH / ranks)))
fi
device=${GOEP_TRAIN_DEVICE:-cpu}
# any ep backend by name with options (bin/ep-bench -device list); moe-train refuses an unknown one
[[ "$device" =~ ^[A-Za-z0-9:+,=._-]+$ ]] || goep_die "GOEP_TRAIN_DEVICE=$device: want a backend name such as cpu, emulate or cuda"
resume=()
case "${GOEP_TRAIN_RESUME:-}" in
  "") ;;
  *) resume=(-resume "$GOEP_TRAIN_RESUME") ;;
esac
trace="$out/trace.h5"
# The job step's name, its logs logs/STEP.R.out and .err: one per job (and requeue), so that no job
# replaces another's logs.
step=train-${SLURM_JOB_ID:-$(date -u +%Y%m%dT%H%M%SZ)}
if [ "${SLURM_RESTART_COUNT:-0}" != 0 ]; then step+=-restart$SLURM_RESTART_COUNT; fi

goep_say "$ranks ranks on $nodes node(s), launcher $LAUNCHER, -device $device, output in $out${resume[1]:+, -resume ${resume[1]}}"
rc=0
goep_step "$step" "$out/logs" "$nodes" "$ranks" "$bin" -device "$device" -trace "$trace" -ckpt-dir "$out" -progress lines \
  "${tokens[@]}" "${resume[@]}" "$@" || rc=$?
# Rank 0 reports progress and the summary: show it.
[ ! -s "$out/logs/$step.0.out" ] || cat "$out/logs/$step.0.out"
if [ "$rc" = 0 ]; then goep_say "done: $trace, checkpoints in $out, logs in $out/logs"; fi
exit "$rc"
