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
# moe-train gets -trace DIR/trace.h5 -ckpt-dir DIR -progress lines first, then this script's
# arguments, which win (a flag given twice takes its last value). With GOEP_TRAIN_RESUME=auto it
# continues from the newest DIR/ckpt-NNNNNN.h5 (the trace is then DIR/trace-from-NNNNNN.h5), so a
# requeued or resubmitted job picks up where the last one stopped; when that checkpoint is already
# at -steps there is nothing to do and it exits 0.
#
# Environment:
#   GOEP_TRAIN_NODES=2             nodes (srun -N); inside an allocation, default its node count
#   GOEP_TRAIN_TASKS_PER_NODE=2    ranks per node; inside an allocation, default SLURM_NTASKS_PER_NODE
#   GOEP_OUT_DIR=out/train-<job id, or date>   trace, checkpoints, logs/ (one log per rank)
#   GOEP_TRAIN_RESUME=             "" (start afresh), auto (newest checkpoint in GOEP_OUT_DIR if
#                                  any) or a checkpoint's path
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

# The -steps the run asks for (moe-train's default is 1000), for a resume that has nothing to do.
steps=1000
args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do
  case "${args[i]}" in
    -steps | --steps) steps=${args[i + 1]:-$steps} ;;
    -steps=* | --steps=*) steps=${args[i]#*=} ;;
  esac
done

trace="$out/trace.h5"
step=train   # the job step's name: its logs are logs/STEP.R.out and .err
resume=()
case "${GOEP_TRAIN_RESUME:-}" in
  "") ;;
  auto)
    last=$(ls "$out"/ckpt-[0-9]*.h5 2>/dev/null | sort | tail -n 1 || true)
    if [ -n "$last" ]; then
      at=$(basename "$last" .h5)
      at=$((10#${at#ckpt-}))
      if [ "$at" -ge "$steps" ]; then
        goep_say "$last is at step $at, the run asks for $steps: nothing to do"
        exit 0
      fi
      resume=(-resume "$last")
      trace=$(printf '%s/trace-from-%06d.h5' "$out" "$at")
      step=$(printf 'train-from-%06d' "$at")
    fi
    ;;
  *)
    resume=(-resume "$GOEP_TRAIN_RESUME")
    step=train-from-$(basename "$GOEP_TRAIN_RESUME" .h5)
    ;;
esac

goep_say "$((nodes * ppn)) ranks on $nodes node(s), launcher $LAUNCHER, output in $out${resume[1]:+, resuming from ${resume[1]}}"
rc=0
goep_step "$step" "$out/logs" "$nodes" $((nodes * ppn)) "$bin" -trace "$trace" -ckpt-dir "$out" -progress lines \
  "${resume[@]}" "$@" || rc=$?
# Rank 0 reports progress and the summary: show it.
[ ! -s "$out/logs/$step.0.out" ] || cat "$out/logs/$step.0.out"
if [ "$rc" = 0 ]; then goep_say "done: $trace, checkpoints in $out, logs in $out/logs"; fi
exit "$rc"
