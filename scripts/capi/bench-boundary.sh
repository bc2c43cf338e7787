#!/usr/bin/env bash
# bench-boundary.sh: the cost of goep's C and Python interfaces (make bench-capi). For an LL decode
# round of 1 and 128 tokens and an HT round of 4096 tokens (hidden 7168, top-8, 256 experts,
# bfloat16), the same round is timed through the C interface (bin/capi/ep_bench_capi) and the
# Python one (python/bench/bench_boundary.py), each against the round in Go inside the library on
# the same group in the same process, alternately. Prints the JSON lines (api go/c/python, round_us:
# the slowest rank's median, vs_go: the interface's round over Go's).
#
#   NP=2 ITERS_LL=200 ITERS_HT=10 scripts/capi/bench-boundary.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
MPIRUN=${MPIRUN:-mpirun}
PYTHON=${PYTHON:-/usr/bin/python3}
NP=${NP:-2}
ITERS_LL=${ITERS_LL:-200}
ITERS_HT=${ITERS_HT:-10}
REPEATS=${REPEATS:-5}
flags=(--oversubscribe -np "$NP" -x PYTHONPATH="$PWD/python")
[ "$(id -u)" = 0 ] && flags+=(--allow-run-as-root)
unset GOEP_EP_LIB
for cfg in "ll 1 $ITERS_LL" "ll 128 $ITERS_LL" "ht 4096 $ITERS_HT"; do
  set -- $cfg
  "$MPIRUN" "${flags[@]}" bin/capi/ep_bench_capi -m "$1" -t "$2" -i "$3" -r "$REPEATS"
  "$MPIRUN" "${flags[@]}" "$PYTHON" python/bench/bench_boundary.py -m "$1" -t "$2" -i "$3" -r "$REPEATS"
done
