#!/usr/bin/env bash
# compare.sh: time two builds of ep-bench on the same configurations, alternately, so that a change is
# judged against the build before it under the same load (this VM's speed moves by up to 1.5x between
# runs; alternating spreads that over both builds).
#
#   scripts/bench/compare.sh BEFORE [ROUNDS]        (as root: the cross-host configurations use
#                                                    scripts/cluster's emulated hosts)
#
# BEFORE is a commit; the build after is the working tree's. Each configuration runs ROUNDS times
# (default 5) per build, before and after in turn: LL 128 and HT 4096 tokens (hidden 7168, top-8,
# 64 experts, bf16) on 2 ranks of one node, then across emulated hosts, 2 x 2 and 4 x 1. Every run
# also times the hand-written alltoallv of the same routing, so each line carries its own reference.
# Output: ep-bench's JSON lines with "build":"before" or "after" first, in docs/bench/compare.jsonl
# (OUT=... to change), and a summary table from scripts/bench/tables.py compare, which says for each
# configuration whether the change is told from the machine's noise: across the emulated hosts one
# run moves by up to 1.5x, so it takes every one of at least 5 pairs (a before run and the after run
# that followed it) on the same side; with fewer rounds, or pairs on both sides, it says it cannot.
set -euo pipefail
cd "$(dirname "$0")/../.."
before=${1:?usage: compare.sh BEFORE [ROUNDS]}
rounds=${2:-5}
OUT=${OUT:-docs/bench/compare.jsonl}
GO=${GO:-go}
MPIRUN=(mpirun --oversubscribe)
[ "$(id -u)" = 0 ] && MPIRUN+=(--allow-run-as-root)
rev=$(git rev-parse --short "$before")

# The build before, from a worktree of that commit; both binaries under the repository, where the
# emulated hosts see them.
wt=bin/compare/src-$rev
mkdir -p bin/compare
[ -d "$wt" ] || git worktree add -q --detach "$wt" "$rev"
(cd "$wt" && "$GO" build -tags mpi -o ../ep-bench-before ./cmd/ep-bench)
git worktree remove --force "$wt" # the binary is all that is needed of it
"$GO" build -tags mpi -o bin/compare/ep-bench-after ./cmd/ep-bench

stamp() { echo "# before $rev, after $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- . ':!docs' || echo '+changes'), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores, $(date -u +%FT%TZ), load $(cut -d' ' -f1-3 /proc/loadavg)"; }
stamp >"$OUT"
common=(-hidden 7168 -topk 8 -experts 64 -dtype bf16 -json -iters 8 -warmup 1)
one() { # BUILD LAUNCH...
  local b=$1; shift
  "$@" | grep '^{' | sed "s/^{/{\"build\":\"$b\",/" >>"$OUT"
}
alternate() { # LAUNCH... (the binary is appended, then the configuration's flags after --)
  local launch=() args=()
  while [ "$1" != -- ]; do launch+=("$1"); shift; done
  shift; args=("$@")
  for ((i = 0; i < rounds; i++)); do
    one before "${launch[@]}" bin/compare/ep-bench-before "${args[@]}"
    one after "${launch[@]}" bin/compare/ep-bench-after "${args[@]}"
  done
}

for cfg in "-mode ll -tokens 128" "-mode ht -tokens 4096"; do
  # shellcheck disable=SC2086
  alternate "${MPIRUN[@]}" -np 2 -- $cfg "${common[@]}"
done
export GOEP_CLUSTER_NAME=${GOEP_CLUSTER_NAME:-gcmp}
trap 'scripts/cluster/cluster.sh down >/dev/null 2>&1 || true' EXIT
scripts/cluster/cluster.sh up 4 --slots 2 >/dev/null
for hosts in goep-h1:2,goep-h2:2 goep-h1:1,goep-h2:1,goep-h3:1,goep-h4:1; do
  for cfg in "-mode ll -tokens 128" "-mode ht -tokens 4096"; do
    # the build after measures the network floor too; the build before may not know it
    # shellcheck disable=SC2086
    alternate scripts/cluster/mpirun -np 4 --host "$hosts" -- $cfg "${common[@]}"
  done
done
scripts/cluster/cluster.sh down >/dev/null
trap - EXIT
python3 scripts/bench/tables.py compare "$OUT"
