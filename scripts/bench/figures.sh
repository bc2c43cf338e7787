#!/usr/bin/env bash
# figures.sh: measure the figures of the README's "Figures" table and write them, as ep-bench's
# JSON lines, under docs/bench/ (one file per part), with the commit, the machine and its load.
#
#   scripts/bench/figures.sh [one-node] [latency] [cross-host] [fp8] [layouts] [train] [serve] [capi]
#                                                                                    (default: all)
#
# one-node    ep-bench LL 128 and HT 4096 (hidden 7168, top-8, 64 experts, bf16) on 2 and 4 ranks
# latency     ep-bench -latency on 2 ranks (hidden 128, top-2, 8 experts), and its chart
# cross-host  the same LL and HT across emulated hosts (scripts/cluster, as root): 2x2, 4x1, 4x2
#             (HT without the baseline there: both do not fit in 24 GB; and HT 2048 with it), 2+2+1;
#             RUNS times (default 5), every configuration once per pass: across the emulated hosts
#             one run moves by up to 1.5x, so the tables show each figure's median over the runs
#             with the lowest and highest
# fp8         FP8 dispatch and the FP8 combine beside bf16, one node and 2x2 hosts, twice each
# layouts     HT's expert-major zones against the flat layout plus the user's permutation, 2 ranks
#             and 2x2 hosts
# train       the main job, moe-train (4 ranks, LL, f32, 2000 steps), on the CPU engine and on the GPU
#             engine's emulated device, alternately, twice each; its summaries in docs/bench/train.txt
# serve       moe-serve: a full batch (64 requests at once, 16 per rank) and a stream (128 requests at
#             60/s), overlap on and off alternately, on 1 node x 2 ranks and 2 hosts x 2 ranks; the
#             summaries in docs/bench/serve.txt
# capi        the C and Python boundaries against the same round in Go (scripts/capi/bench-boundary.sh)
#
# python3 scripts/bench/tables.py update rewrites the tables of the README and docs/bench.md
# from these files; python3 scripts/bench/tables.py reproduce FILE... says whether other runs of
# cross-host fall within the spread the tables print.
#
# Each configuration runs once (cross-host: RUNS times); the machine's other work should be stopped
# (this VM's speed moves by up to 1.5x between runs: the README reads ratios taken within one run).
# OUT=DIR writes the files there instead of docs/bench.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
parts=("$@")
[ ${#parts[@]} -gt 0 ] || parts=(one-node latency cross-host fp8 layouts train serve capi)
OUT=${OUT:-docs/bench}
MPIRUN=(mpirun --oversubscribe)
[ "$(id -u)" = 0 ] && MPIRUN+=(--allow-run-as-root)
GO=${GO:-go}
mkdir -p "$OUT" bin
"$GO" build -tags mpi -o bin/ep-bench ./cmd/ep-bench
"$GO" build -o bin/ep-plot ./cmd/ep-plot
"$GO" build -tags mpi -o bin/moe-train ./cmd/moe-train
"$GO" build -tags mpi -o bin/moe-serve ./cmd/moe-serve
stamp() { echo "# commit $(git rev-parse --short HEAD), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores, $(date -u +%FT%TZ), load $(cut -d' ' -f1-3 /proc/loadavg)"; }
common=(-hidden 7168 -topk 8 -experts 64 -dtype bf16 -json)

for part in "${parts[@]}"; do
  case "$part" in
  one-node)
    f=$OUT/one-node.jsonl; stamp >"$f"
    for np in 2 4; do
      "${MPIRUN[@]}" -np $np bin/ep-bench -mode ll -tokens 128 "${common[@]}" -iters 10 -warmup 2 >>"$f"
      "${MPIRUN[@]}" -np $np bin/ep-bench -mode ht -tokens 4096 "${common[@]}" -iters 10 -warmup 2 >>"$f"
    done ;;
  latency)
    f=$OUT/latency.jsonl; stamp >"$f"
    "${MPIRUN[@]}" -np 2 bin/ep-bench -latency -json -hidden 128 -topk 2 -experts 8 -iters 200 >>"$f"
    grep -v '^#' "$f" >docs/latency/ll-round.jsonl
    bin/ep-plot latency -o docs/latency/ll-round.png docs/latency/ll-round.jsonl >/dev/null ;;
  cross-host)
    export GOEP_CLUSTER_NAME=${GOEP_CLUSTER_NAME:-gfig}
    trap 'scripts/cluster/cluster.sh down >/dev/null 2>&1 || true' EXIT
    scripts/cluster/cluster.sh up 4 --slots 2 >/dev/null
    f=$OUT/cross-host.jsonl; stamp >"$f"
    runs=${RUNS:-5}
    run() { # PASS NP HOSTS ARGS...: one run, its line marked with its pass
      local k=$1 np=$2 hosts=$3; shift 3
      scripts/cluster/mpirun -np "$np" --host "$hosts" bin/ep-bench "$@" -iters 8 -warmup 1 | grep '^{' |
        sed "s/^{/{\"run\":$k,/" >>"$f"
    }
    for ((k = 1; k <= runs; k++)); do # passes, so that the machine's drift spreads over every configuration
      [ "$k" = 1 ] || echo "# run $k: $(date -u +%FT%TZ), load $(cut -d' ' -f1-3 /proc/loadavg)" >>"$f"
      for layout in "4 goep-h1:2,goep-h2:2" "4 goep-h1:1,goep-h2:1,goep-h3:1,goep-h4:1" \
        "8 goep-h1:2,goep-h2:2,goep-h3:2,goep-h4:2" "5 goep-h1:2,goep-h2:2,goep-h3:1"; do
        set -- $layout
        experts=64; [ "$1" = 5 ] && experts=80
        run "$k" "$1" "$2" -mode ll -tokens 128 -hidden 7168 -topk 8 -experts $experts -dtype bf16 -json
        if [ "$1" = 8 ]; then
          run "$k" "$1" "$2" -mode ht -tokens 4096 -hidden 7168 -topk 8 -experts 64 -dtype bf16 -json -no-baseline
          run "$k" "$1" "$2" -mode ht -tokens 2048 -hidden 7168 -topk 8 -experts 64 -dtype bf16 -json
        else
          run "$k" "$1" "$2" -mode ht -tokens 4096 -hidden 7168 -topk 8 -experts $experts -dtype bf16 -json
        fi
      done
    done
    scripts/cluster/cluster.sh down >/dev/null; trap - EXIT ;;
  fp8)
    export GOEP_CLUSTER_NAME=${GOEP_CLUSTER_NAME:-gfig}
    trap 'scripts/cluster/cluster.sh down >/dev/null 2>&1 || true' EXIT
    scripts/cluster/cluster.sh up 2 --slots 2 >/dev/null
    f=$OUT/fp8.jsonl; stamp >"$f"
    ll=(-mode ll -tokens 128 -hidden 7168 -topk 8 -experts 64 -json -iters 10 -warmup 2 -no-baseline)
    for run in 1 2; do # twice: one run of these moves by up to 1.5x
      "${MPIRUN[@]}" -np 2 bin/ep-bench "${ll[@]}" -dtype fp8 >>"$f"
      "${MPIRUN[@]}" -np 2 bin/ep-bench "${ll[@]}" -combine fp8 >>"$f"
      scripts/cluster/mpirun -np 4 --host goep-h1:2,goep-h2:2 bin/ep-bench "${ll[@]}" -dtype fp8 | grep '^{' >>"$f"
      scripts/cluster/mpirun -np 4 --host goep-h1:2,goep-h2:2 bin/ep-bench "${ll[@]}" -combine fp8 | grep '^{' >>"$f"
    done
    scripts/cluster/cluster.sh down >/dev/null; trap - EXIT ;;
  layouts)
    export GOEP_CLUSTER_NAME=${GOEP_CLUSTER_NAME:-gfig}
    trap 'scripts/cluster/cluster.sh down >/dev/null 2>&1 || true' EXIT
    scripts/cluster/cluster.sh up 2 --slots 2 >/dev/null
    f=$OUT/layouts.jsonl; stamp >"$f"
    em=(-mode ht -tokens 4096 -hidden 7168 -topk 8 -experts 64 -dtype bf16 -layout expert-major -align 128
      -max-recv 40000 -no-baseline -json)
    "${MPIRUN[@]}" -np 2 bin/ep-bench "${em[@]}" -iters 10 -warmup 2 >>"$f"
    scripts/cluster/mpirun -np 4 --host goep-h1:2,goep-h2:2 bin/ep-bench "${em[@]}" -floor=false -iters 8 -warmup 1 |
      grep '^{' >>"$f"
    scripts/cluster/cluster.sh down >/dev/null; trap - EXIT ;;
  train)
    f=$OUT/train.txt; stamp >"$f"
    for dev in cpu emulate cpu emulate; do
      echo "== device $dev" >>"$f"
      "${MPIRUN[@]}" -np 4 bin/moe-train -device $dev -mode ll -dtype f32 -steps 2000 -ckpt-every 1000 \
        -progress lines -progress-every 1000 -trace out/figures/trace.h5 -ckpt-dir out/figures -fresh |
        sed -n '/moe-train: done/,/copies/p' >>"$f"
    done
    rm -rf out/figures ;;
  serve)
    export GOEP_CLUSTER_NAME=${GOEP_CLUSTER_NAME:-gfig}
    trap 'scripts/cluster/cluster.sh down >/dev/null 2>&1 || true' EXIT
    scripts/cluster/cluster.sh up 2 --slots 2 >/dev/null
    f=$OUT/serve.txt; stamp >"$f"
    for where in "1 node x 2" "2 hosts x 2"; do
      launch=("${MPIRUN[@]}" -np 2)
      [ "$where" = "2 hosts x 2" ] && launch=(scripts/cluster/mpirun -np 4 --host goep-h1:2,goep-h2:2)
      for w in "full batch|-requests 64 -rate 0 -prompt 8:48 -gen 64:64 -batch 16" \
        "stream, 60 requests/s|-requests 128 -rate 60 -prompt 8:48 -gen 16:48"; do
        for overlap in true false; do
          echo "== ${w%%|*} | $where | overlap $overlap" >>"$f"
          rm -rf out/figures
          # shellcheck disable=SC2086
          "${launch[@]}" bin/moe-serve ${w#*|} -overlap=$overlap -trace out/figures/serve.h5 |
            grep -E '^  (decode|prefill|TTFT|tokens/s) ' >>"$f"
        done
      done
    done
    rm -rf out/figures
    scripts/cluster/cluster.sh down >/dev/null; trap - EXIT ;;
  capi)
    make -s capi >/dev/null
    f=$OUT/capi.jsonl; stamp >"$f"
    scripts/capi/bench-boundary.sh | grep '^{' >>"$f" ;;
  *) echo "figures.sh: unknown part $part (one-node, latency, cross-host, fp8, layouts, train, serve, capi)" >&2
    exit 2 ;;
  esac
  echo "figures.sh: $part -> $f"
done
