#!/usr/bin/env bash
# test-rename.sh: a program written for NCCL EP's C API compiles and runs on goep after renaming
# (test-capi.sh runs it, after make capi). capi/tests/nccl_shape/ep_round.cpp, written with NCCL's
# and CUDA's names, is copied to a temporary directory and changed there by exactly:
#
#   - the rename: ncclEp -> goepEp, NCCL_EP_ -> GOEP_EP_, nccl_ep.h -> goep_ep.h
#   - its #include "nccl.h" -> #include "goep_nccl.h" (nccl.h's names, as goep's)
#   - its marked communicator blocks: the set-up becomes `ncclComm_t comm = MPI_COMM_WORLD;`, the
#     tear-down goes (goep's communicator is an MPI one)
#
# then built with mpicxx -std=c++17 -Wall -Wextra -Werror (less -Wmissing-field-initializers: the
# *_INIT macros name only size, magic and version, as NCCL EP's do, and g++ warns of the rest in
# C++; and without MPI's deprecated C++ bindings, whose own casts g++ warns of) against capi/goep_ep.h
# and the host
# stand-in capi/tests/hoststubs/cuda_runtime.h (device memory on the host), linked with
# bin/capi/libgoep_ep.so, and run in LL and HT at 2 and 4 ranks and 4 ranks on 2 simulated nodes,
# each checking its combined values against capi/examples/ep_reference.h. Prints how many lines
# each change touched.
set -euo pipefail
cd "$(dirname "$0")/../.."

MPIRUN=${MPIRUN:-mpirun}
MPICXX=${MPICXX:-mpicxx}
LIMIT=${CAPI_TEST_TIMEOUT:-180}
flags=(--oversubscribe)
[ "$(id -u)" = 0 ] && flags+=(--allow-run-as-root)

src=capi/tests/nccl_shape/ep_round.cpp
tmp=$(mktemp -d /tmp/goep-rename.XXXXXX)
trap 'rm -rf "$tmp"' EXIT

sed -e 's/ncclEp/goepEp/g' -e 's/NCCL_EP_/GOEP_EP_/g' -e 's/nccl_ep\.h/goep_ep.h/g' \
  -e 's|^#include "nccl.h"$|#include "goep_nccl.h"|' "$src" >"$tmp/renamed.cpp"
awk '
  /\/\/ communicator set-up: begin/ { print "    ncclComm_t comm = MPI_COMM_WORLD;"; skip = 1; next }
  /\/\/ communicator tear-down: begin/ { skip = 1; next }
  /\/\/ communicator (set-up|tear-down): end/ { skip = 0; next }
  !skip { print }
' "$tmp/renamed.cpp" >"$tmp/ep_round.cpp"
renamed=$(diff "$src" "$tmp/renamed.cpp" | grep -c '^<' || true)
comm=$(diff "$tmp/renamed.cpp" "$tmp/ep_round.cpp" | grep -c '^<' || true)
echo "test-rename: $src: $renamed lines renamed, $comm lines of communicator set-up and tear-down replaced, no other change"

"$MPICXX" -std=c++17 -O1 -Wall -Wextra -Wno-missing-field-initializers -Werror -DOMPI_SKIP_MPICXX -DMPICH_SKIP_MPICXX -Icapi -Icapi/tests/hoststubs -Icapi/examples \
  -o "$tmp/ep_round" "$tmp/ep_round.cpp" -Lbin/capi -lgoep_ep -Wl,-rpath,"$PWD/bin/capi"

# Each mode's layouts: LL expert-major and rank-major, HT flat and expert-major.
for algo in "ll -" "ll rm" "ht -" "ht em"; do
  for run in "2 -" "4 -" "4 sim"; do
    set -- $run $algo
    env=()
    [ "$2" = sim ] && env=(-x GOEP_RANKS_PER_NODE=2)
    echo "+ mpirun -np $1 ${env[*]} ep_round -a $3 -L $4"
    timeout "$LIMIT" "$MPIRUN" "${flags[@]}" "${env[@]}" -np "$1" "$tmp/ep_round" -a "$3" -L "$4"
  done
done
