#!/usr/bin/env bash
# run-on-device.sh: goep's GPU checks and figures on a machine with an NVIDIA
# GPU and no Go.
#
#   bin/gpu/run-on-device.sh            run what this machine can run
#   bin/gpu/run-on-device.sh --dry-run  walk every section without a GPU: check
#                                       the binaries and test names, say what
#                                       would run (make test-gpu runs this)
#
# Build on a machine with Go (no GPU needed): make test-gpu. That writes
# bin/gpu/: stripped test binaries of packages gpu and ep/epgpu (with and
# without MPI), ep-bench and moe-train (with and without MPI), gpu-info, the
# HDF5 library and what it links for a machine without them (lib/), and this
# script. Carry bin/gpu/ to the GPU machine and run it there.
#
# It first prints what the machine has (gpu-info: GPUs, the CUDA version of
# the driver, NVRTC, NCCL and where each was loaded from; whether mpirun
# exists), then runs each section under its own time limit, the whole within
# GOEP_DEVICE_BUDGET seconds (default 450): a section that no longer fits is
# skipped, saying so, as is one the machine cannot run (the MPI sections
# without mpirun, or with one GPU and an NCCL before 2.30, which refuses two
# ranks on one GPU).
#
#   gpu       package gpu's device tests: device, memory, streams, events,
#             the kernel suite against its references, NCCL on one rank
#   kernels   every kernel against a device-to-device copy of the same bytes
#             (device time from events) -> kernels.jsonl
#   epgpu     the ep conformance suite, refusals and statistics on the CUDA
#             backend, one rank
#   mpi-gpu,  the same under mpirun on GOEP_MPI_NP ranks (default 2): NCCL
#   mpi-epgpu bootstrapped over MPI, a stalled rank named after the timeout
#   bench-ll  ep-bench -device cuda, LL at 1, 8, 32 and 128 tokens per rank,
#   bench-ht  HT at 4096 (hidden 7168, top-8 of 64 experts, bf16), results
#             checked against the CPU engine -> bench.jsonl
#   train-cuda moe-train -device cuda and -device cpu, 300 steps each (make
#   train-cpu  run's model), and their last losses compared -> train.txt
#   ipc-epgpu the conformance suite, refusals and statistics on the CUDA
#             backend over IPC inside the node (epgpu.CUDAIPC), under mpirun
#             on GOEP_IPC_NP ranks (default 2), which may share one GPU
#   bench-ipc ep-bench -device cuda-ipc on 1, 2 and 4 ranks (LL 128 tokens,
#             HT 4096), with the bytes the IPC transport moved -> bench.jsonl
#
# GOEP_DEVICE_SECTIONS (default all) runs only the sections it names
# (space-separated); the others are printed as skipped.
#
# Everything goes under $OUT (default: a new temporary folder), at most 8
# files: summary.txt (section, PASS/FAIL/SKIP, seconds), info.json,
# kernels.jsonl, bench.jsonl, train.txt, logs.tgz (each section's full log),
# traces.tgz (the two trainings' HDF5 traces). The summary is printed last.
# Exit status 0 only if no section failed. A test never passes for want of
# a GPU: without one, or without a library, the gpu-tagged tests fail.
#
# Libraries: GOEP_CUDA_LIB, GOEP_NVRTC_LIB and GOEP_NCCL_LIB choose them (a
# path, or colon-separated candidates); unset, those of pip's NVIDIA wheels
# under python3's site-packages are added after the usual places.
set -uo pipefail

dry=0
case "${1:-}" in
  --dry-run) dry=1 ;;
  "") ;;
  *) echo "usage: $0 [--dry-run]" >&2; exit 2 ;;
esac

here=$(cd "$(dirname "$0")" && pwd)
bin=${GOEP_GPU_BIN:-}
if [ -z "$bin" ]; then
  for d in "$here" "$here/../../bin/gpu"; do
    if [ -x "$d/gpu.test" ]; then bin=$(cd "$d" && pwd); break; fi
  done
fi
if [ -z "$bin" ] || [ ! -x "$bin/gpu.test" ]; then
  echo "run-on-device.sh: no gpu.test next to this script or in bin/gpu: run 'make test-gpu' on a machine with Go, then carry bin/gpu/" >&2
  exit 2
fi

out=${OUT:-$(mktemp -d "${TMPDIR:-/tmp}/goep-device.XXXXXX")}
mkdir -p "$out"
work=$(mktemp -d "${TMPDIR:-/tmp}/goep-device-work.XXXXXX")
logs=$work/logs
mkdir -p "$logs" "$work/traces"
budget=${GOEP_DEVICE_BUDGET:-450}
t0=$(date +%s)

# pip's NVIDIA wheels: when a variable is unset, offer the libraries under
# python3's site-packages as extra candidates after the usual ones.
site_libs() {
  command -v python3 >/dev/null || return 0
  python3 - "$1" <<'PY' 2>/dev/null || true
import glob, os, site, sys
roots = set(site.getsitepackages() + [site.getusersitepackages()])
try:
    import nvidia
    roots.update(os.path.dirname(p) for p in nvidia.__path__)
except Exception:
    pass
found = []
for r in sorted(roots):
    found += sorted(glob.glob(os.path.join(r, "nvidia", "*", "lib", sys.argv[1])), reverse=True)
print(":".join(found))
PY
}
if [ "$dry" = 0 ]; then
  if [ -z "${GOEP_NVRTC_LIB:-}" ]; then
    extra=$(site_libs 'libnvrtc.so*')
    [ -n "$extra" ] && export GOEP_NVRTC_LIB="libnvrtc.so.13:libnvrtc.so.12:libnvrtc.so.11.2:libnvrtc.so:/usr/local/cuda/lib64/libnvrtc.so*:$extra"
  fi
  if [ -z "${GOEP_NCCL_LIB:-}" ]; then
    extra=$(site_libs 'libnccl.so*')
    [ -n "$extra" ] && export GOEP_NCCL_LIB="libnccl.so.2:$extra"
  fi
fi
export NCCL_DEBUG=${NCCL_DEBUG:-WARN}
export GOEP_REQUIRE_TOOLS=1
export GOEP_PTX_CACHE=${GOEP_PTX_CACHE:-$work/ptx}

rows=()   # "section status seconds note"
failed=0
record() { rows+=("$(printf '%-11s %-5s %6s  %s' "$1" "$2" "$3" "$4")"); }

# section NAME LIMIT CMD...: run CMD under LIMIT seconds (less if the budget
# has less left), its output in logs/NAME.log; with STDOUT_TO set, its
# standard output is appended to that file instead.
section() {
  local name=$1 limit=$2
  shift 2
  if ! chosen "$name"; then
    record "$name" SKIP - "not in GOEP_DEVICE_SECTIONS"
    return 0
  fi
  if [ "$dry" = 1 ]; then
    echo "DRY   $name (limit ${limit}s): $*"
    record "$name" DRY - "would run: $*"
    return 0
  fi
  local left=$((budget - ($(date +%s) - t0)))
  if [ "$left" -lt 20 ]; then
    echo "SKIPPED: $name: out of time (${left}s of the ${budget}s budget left)"
    record "$name" SKIP - "out of time"
    return 0
  fi
  [ "$limit" -gt "$left" ] && limit=$left
  echo "== $name (limit ${limit}s): $*"
  local s=$(date +%s) rc
  if [ -n "${STDOUT_TO:-}" ]; then
    timeout -k 5 "$limit" "$@" >>"$STDOUT_TO" 2>"$logs/$name.log"
  else
    timeout -k 5 "$limit" "$@" >"$logs/$name.log" 2>&1
  fi
  rc=$?
  local secs=$(($(date +%s) - s))
  if [ "$rc" = 0 ]; then
    local skips
    skips=$(grep -c -- '--- SKIP' "$logs/$name.log" 2>/dev/null) || true
    record "$name" PASS "$secs" "${skips:+$skips test(s) skipped, see below}"
  else
    failed=1
    local why="exit $rc"
    [ "$rc" = 124 ] || [ "$rc" = 137 ] && why="over its ${limit}s limit"
    record "$name" FAIL "$secs" "$why"
    echo "-- $name failed ($why); the end of its log:"
    grep -E -- '--- FAIL|Error:|error|panic|FAIL' "$logs/$name.log" | head -20
    tail -n 15 "$logs/$name.log"
  fi
  return 0
}

skip() {
  echo "SKIPPED: $1: $2"
  record "$1" SKIP - "$2"
}

# chosen NAME: whether GOEP_DEVICE_SECTIONS lets section NAME run.
chosen() {
  local want=${GOEP_DEVICE_SECTIONS:-all}
  [ "$want" = all ] && return 0
  case " $want " in *" ${1%%-[0-9]*} "*|*" $1 "*) return 0 ;; esac
  return 1
}

# list_tests BINARY PATTERN: the tests of BINARY that PATTERN selects (a
# dry run checks that each section runs something).
list_tests() { GOEP_ALLOW_SINGLETON=1 "$1" -test.list "$2" 2>/dev/null | grep -c '^Test'; }

echo "== machine"
uname -srm
ldd --version 2>/dev/null | head -1
if [ "$dry" = 0 ]; then
  nvidia-smi --query-gpu=index,name,compute_cap,driver_version,memory.total --format=csv 2>/dev/null || echo "nvidia-smi: not available"
fi
"$bin/gpu-info" >"$out/info.json" 2>"$logs/gpu-info.log" || echo "gpu-info failed: $(cat "$logs/gpu-info.log")"
cat "$out/info.json"
field() { # field NAME: a value of info.json
  python3 -c 'import json,sys; v=json.load(open(sys.argv[1])).get(sys.argv[2]); print(len(v) if isinstance(v, list) else (v if v is not None else ""))' \
    "$out/info.json" "$1" 2>/dev/null
}
ngpu=$(field devices); ngpu=${ngpu:-0}
nccl=$(field nccl_code); nccl=${nccl:-0}
multi=$(field nccl_multi_rank_gpu)
have_mpirun=0
command -v mpirun >/dev/null && have_mpirun=1
echo "GPUs: $ngpu; NCCL code: $nccl (two ranks on one GPU: $multi); mpirun: $([ $have_mpirun = 1 ] && { command -v mpirun; mpirun --version 2>&1 | head -1; } | tr '\n' ' ' || echo none)"
echo "GOEP_NVRTC_LIB=${GOEP_NVRTC_LIB:-}"
echo "GOEP_NCCL_LIB=${GOEP_NCCL_LIB:-}"
if [ "$dry" = 1 ]; then
  echo "(dry run: the sections below are those of a machine with one GPU, NCCL 2.28 and no mpirun, as lent here)"
  ngpu=1 nccl=22800 multi=False have_mpirun=0
  for b in gpu.test gpu-mpi.test epgpu.test epgpu-mpi.test ep-bench ep-bench-1rank moe-train moe-train-1rank gpu-info; do
    [ -x "$bin/$b" ] || { echo "DRY   missing: $bin/$b"; failed=1; }
  done
  for check in "gpu.test:^TestGPU" "gpu.test:^(TestGPUKernelBandwidth|TestGPUNCCLGroupCost)$" "epgpu.test:CUDA" "epgpu-mpi.test:CUDAIPC"; do
    b=${check%%:*} p=${check#*:}
    n=$(list_tests "$bin/$b" "$p")
    echo "DRY   $b -test.run '$p' selects $n test(s)"
    [ "${n:-0}" -gt 0 ] || failed=1
  done
fi

mpi_args=(--oversubscribe -np "${GOEP_MPI_NP:-2}")
[ "$(id -u)" = 0 ] && mpi_args+=(--allow-run-as-root)
for v in NCCL_DEBUG GOEP_REQUIRE_TOOLS GOEP_CUDA_LIB GOEP_NVRTC_LIB GOEP_NCCL_LIB GOEP_PTX_CACHE; do
  [ -n "${!v:-}" ] && mpi_args+=(-x "$v")
done
mpi_ok() { # can the MPI sections run here? else the reason on stdout
  if [ "$have_mpirun" = 0 ]; then echo "no mpirun on this machine (Open MPI 4.1 needed)"; return 1; fi
  if [ "$ngpu" -lt "${GOEP_MPI_NP:-2}" ] && [ "$multi" != True ]; then
    echo "$ngpu GPU(s) for ${GOEP_MPI_NP:-2} ranks, and NCCL $nccl refuses two ranks on one GPU (2.30 allows it)"; return 1
  fi
  return 0
}

section gpu 150 "$bin/gpu.test" -test.run '^TestGPU' -test.skip '^(TestGPUKernelBandwidth|TestGPUNCCLGroupCost)$' -test.v -test.count=1 -test.timeout=145s
section kernels 90 env GOEP_BENCH_OUT="$out" "$bin/gpu.test" -test.run '^(TestGPUKernelBandwidth|TestGPUNCCLGroupCost)$' -test.v -test.count=1 -test.timeout=85s
[ "$dry" = 1 ] || grep 'bandwidth_test.go' "$logs/kernels.log" 2>/dev/null | sed 's/.*bandwidth_test.go:[0-9]*: /  /' 
section epgpu 150 "$bin/epgpu.test" -test.run 'CUDA' -test.v -test.count=1 -test.timeout=145s
# mpi_runs BINARY: whether mpirun can start BINARY here (its MPI libraries
# found); else the reason on stdout.
mpi_runs() {
  if [ "$have_mpirun" = 0 ]; then echo "no mpirun on this machine (Open MPI 4.1 needed)"; return 1; fi
  if [ ! -x "$1" ]; then echo "$(basename "$1") was not carried here"; return 1; fi
  if ldd "$1" | grep -q 'not found'; then echo "$(basename "$1") lacks $(ldd "$1" | awk '/not found/ {print $1}' | tr '\n' ' ')here"; return 1; fi
  return 0
}

if why=$(mpi_ok); then
  section mpi-gpu 90 mpirun "${mpi_args[@]}" "$bin/gpu-mpi.test" -test.run 'NCCL|Bootstrap|Agree|LocalRank' -test.count=1 -test.timeout=85s
  section mpi-epgpu 120 mpirun "${mpi_args[@]}" "$bin/epgpu-mpi.test" -test.run 'CUDA' -test.count=1 -test.timeout=115s
  bench=(mpirun "${mpi_args[@]}" "$bin/ep-bench")
  train=(mpirun "${mpi_args[@]}" -x LD_LIBRARY_PATH "$bin/moe-train")
else
  skip mpi-gpu "$why"
  skip mpi-epgpu "$why"
  bench=("$bin/ep-bench-1rank")
  train=("$bin/moe-train-1rank")
fi

# ep-bench's JSON lines go to bench.jsonl, its messages to its log.
common=(-device cuda -hidden 7168 -topk 8 -experts 64 -dtype bf16 -iters 20 -warmup 3 -json)
STDOUT_TO=$out/bench.jsonl section bench-ll 90 "${bench[@]}" -mode ll -tokens 1,8,32,128 "${common[@]}"
STDOUT_TO=$out/bench.jsonl section bench-ht 90 "${bench[@]}" -mode ht -tokens 4096 "${common[@]}"

# moe-train writes HDF5: where the machine lacks the library (or what it
# links), bin/gpu/lib stands in.
if ldd "${train[-1]}" 2>/dev/null | grep -q 'not found'; then
  export LD_LIBRARY_PATH="$bin/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  echo "($(basename "${train[-1]}") takes its shared libraries from $bin/lib)"
fi
train_args=(-mode ll -dtype f32 -steps "${GOEP_MOE_STEPS:-300}" -ckpt-every 0 -progress-every 100)
for dev in cuda cpu; do
  section "train-$dev" 75 "${train[@]}" -device "$dev" "${train_args[@]}" -trace "$work/traces/$dev.h5" -ckpt-dir "$work/traces/$dev-ckpt"
done
if [ "$dry" = 0 ]; then
  last() { grep -o 'last step loss [^ ,]*, aux loss [^ ]*' "$logs/train-$1.log" 2>/dev/null | head -1; }
  lc=$(last cuda) lp=$(last cpu)
  {
    echo "cuda: ${lc:-no result}"
    echo "cpu:  ${lp:-no result}"
  } >"$out/train.txt"
  if [ -n "$lc" ] && [ "$lc" = "$lp" ]; then
    record losses PASS - "the last step's loss and aux loss equal on cuda and cpu: ${lc#last step loss }"
  elif [ -n "$lc" ] && [ -n "$lp" ]; then
    failed=1
    record losses FAIL - "cuda: ${lc#last step }; cpu: ${lp#last step }"
  else
    record losses SKIP - "a training did not finish"
  fi
  cat "$out/train.txt"
else
  record losses DRY - "would compare the last step's losses of train-cuda and train-cpu (exact)"
fi

# Several ranks on one GPU over IPC: NCCL is not needed inside a node.
ipc_np=${GOEP_IPC_NP:-2}
ipc_args=(--oversubscribe)
[ "$(id -u)" = 0 ] && ipc_args+=(--allow-run-as-root)
for v in NCCL_DEBUG GOEP_REQUIRE_TOOLS GOEP_CUDA_LIB GOEP_NVRTC_LIB GOEP_NCCL_LIB GOEP_PTX_CACHE; do
  [ -n "${!v:-}" ] && ipc_args+=(-x "$v")
done
if [ "$dry" = 0 ] && chosen ipc-epgpu && ! why=$(mpi_runs "$bin/epgpu-mpi.test"); then
  skip ipc-epgpu "$why"
else
  section ipc-epgpu 150 mpirun "${ipc_args[@]}" -np "$ipc_np" "$bin/epgpu-mpi.test" -test.run 'CUDAIPC' \
    -test.skip 'Lifecycle/CreateRunClose50Times' -test.count=1 -test.v -test.timeout=145s
fi
if [ "$dry" = 0 ] && chosen bench-ipc && ! why=$(mpi_runs "$bin/ep-bench"); then
  skip bench-ipc "$why"
else
  for np in 1 2 4; do
    STDOUT_TO=$out/bench.jsonl section "bench-ipc-$np" 60 mpirun "${ipc_args[@]}" -np "$np" "$bin/ep-bench" -device cuda-ipc \
      -mode ll -tokens 128 -hidden 7168 -topk 8 -experts 64 -dtype bf16 -iters 10 -warmup 2 -json
    STDOUT_TO=$out/bench.jsonl section "bench-ipc-$np-ht" 60 mpirun "${ipc_args[@]}" -np "$np" "$bin/ep-bench" -device cuda-ipc \
      -mode ht -tokens 4096 -hidden 7168 -topk 8 -experts 64 -dtype bf16 -iters 10 -warmup 2 -json
  done
fi

tar -C "$work" -czf "$out/logs.tgz" logs 2>/dev/null
tar -C "$work" -czf "$out/traces.tgz" traces 2>/dev/null
{
  echo "run-on-device.sh on $(hostname), $(date -u +%FT%TZ), $(($(date +%s) - t0))s of a ${budget}s budget"
  printf '%-11s %-5s %6s  %s\n' section state secs note
  for r in "${rows[@]}"; do echo "$r"; done
  for f in "$logs"/*.log; do
    grep -h -- '--- SKIP' -A1 "$f" 2>/dev/null | grep -v '^--$' | sed "s|^|  $(basename "$f" .log): |"
  done
} >"$out/summary.txt"
rm -rf "$work"
echo
cat "$out/summary.txt"
if [ "$failed" = 0 ]; then echo "== run-on-device.sh: PASS (files in $out)"; else echo "== run-on-device.sh: FAIL (files in $out)"; fi
exit "$failed"
