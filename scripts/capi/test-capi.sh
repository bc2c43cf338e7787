#!/usr/bin/env bash
# test-capi.sh: goep's C and Python interfaces under mpirun (make test-capi runs it after
# building bin/capi/ with make capi). About a minute here:
#
#   - the public header against what the library exports (capi/tests/check_header.py), and its
#     structs against NCCL EP's layouts and the library's sizes (capi/tests/abi.c)
#   - the C example (capi/examples/ep_test.c): full LL and HT rounds with the send-only splits,
#     cached rounds and zero-copy rounds (goepEpHandleRecvTokens), against its own reference, at 1, 2 and 4 ranks and 4 ranks on 2 simulated
#     nodes, in bfloat16 and float32; and once linked with the static archive; with goep's options
#     (a backend by name, the FP8 combine) and HT's overflow policy DROP
#   - the engine's optional features from C (capi/tests/ep_features.c): LL RANK_MAJOR, HT EXPERT_MAJOR with
#     padded zones, FP8 dispatch (with and without round_scales) and forwarded FP8 rows, every received value
#     checked against the reference, at 1, 2 and 4 ranks on 2 simulated nodes
#   - the C error tests (capi/tests/ep_errors.c): bad input and destroyed objects at 1, 2 and 4
#     ranks on 2 simulated nodes; a stalled peer (goepEpTimeout) and a masked rank at 2 ranks
#   - the C sequence tests (capi/tests/ep_sequences.c) at 2 and 4 ranks and 2 simulated nodes: one
#     rank's refused create, refused combine, destroy with a send-only call pending, each failing its
#     step on every rank with the combined values of the next steps checked, a retry that is
#     goepEpMismatch everywhere; -d: a rank that ends, named by the others' timeout, whose destroy
#     then returns at once
#   - a C++ program written for NCCL EP (capi/tests/nccl_shape/ep_round.cpp), compiled and run after
#     only the rename, goep_nccl.h for nccl.h and an MPI communicator (scripts/capi/test-rename.sh)
#   - the Python example (python/examples/ep_test.py) and the pytest tests (python/tests), the
#     same matrix, with MPI initialised by mpi4py (the stalled-rank tests at 2 ranks, the sequence
#     tests at 2 and 4); a rank with an uncaught exception ends the job (python/tests/dead_rank.py)
#   - pip install ./python into a throw-away venv, offline, and a round with the installed package
#
# PYTHON is Debian's /usr/bin/python3 (python3-numpy, python3-mpi4py, python3-pytest, python3-torch), not the
# first python3 on PATH. Each mpirun is bounded by `timeout`, so a hang fails the run.
set -euo pipefail
cd "$(dirname "$0")/../.."

MPIRUN=${MPIRUN:-mpirun}
PYTHON=${PYTHON:-/usr/bin/python3}
LIMIT=${CAPI_TEST_TIMEOUT:-180}
flags=(--oversubscribe)
[ "$(id -u)" = 0 ] && flags+=(--allow-run-as-root)
export PYTHONPATH="$PWD/python" PYTHONDONTWRITEBYTECODE=1
unset GOEP_EP_LIB

step() { echo "== $*"; }
mpi() { # mpi NP [sim] CMD...: NP ranks, or with sim 2 ranks per simulated node
  local np=$1 sim=$2
  shift 2
  local env=(-x PYTHONPATH -x PYTHONDONTWRITEBYTECODE)
  if [ "$sim" = sim ]; then
    env+=(-x GOEP_RANKS_PER_NODE=2)
  fi
  echo "+ mpirun -np $np ${env[*]} $*"
  timeout "$LIMIT" "$MPIRUN" "${flags[@]}" "${env[@]}" -np "$np" "$@"
}

step "the header against the library"
"$PYTHON" capi/tests/check_header.py capi/goep_ep.h bin/capi/libgoep_ep.h bin/capi/libgoep_ep.so
bin/capi/abi

step "C: ep_test (full rounds against the reference)"
mpi 1 - bin/capi/ep_test -c
mpi 2 - bin/capi/ep_test -c -z -s none,dispatch,combine,both
mpi 4 - bin/capi/ep_test -c -f f32
mpi 4 sim bin/capi/ep_test -c -z -s none,dispatch,combine,both
mpi 2 - bin/capi/ep_test_static
# goep's options and NCCL EP's overflow policy: the one-sided backend by name, LL's FP8 combine (within
# its bound), HT with GOEP_EP_OVERFLOW_DROP (each rank keeps its first rows, the dropped contribute 0)
mpi 4 sim bin/capi/ep_test -c -b cpu-onesided
mpi 2 - bin/capi/ep_test -a ll -c -z -Q
mpi 2 - bin/capi/ep_test -a ht -c -D 12
mpi 4 sim bin/capi/ep_test -a ht -c -z -D 20 -f f32

step "C: ep_features (LL rank-major, HT expert-major, FP8 dispatch and forwarded FP8 rows against the reference)"
mpi 1 - bin/capi/ep_features
mpi 2 - bin/capi/ep_features
mpi 4 sim bin/capi/ep_features

step "C: ep_errors (bad input, destroyed objects, stalled and masked peers)"
mpi 1 - bin/capi/ep_errors
mpi 2 - bin/capi/ep_errors -s
mpi 4 sim bin/capi/ep_errors

step "C: ep_sequences (a refusal on one rank fails its step everywhere; the next steps are right; a dead rank)"
mpi 2 - bin/capi/ep_sequences
mpi 4 - bin/capi/ep_sequences
mpi 4 sim bin/capi/ep_sequences
mpi 2 - bin/capi/ep_sequences -d
mpi 4 sim bin/capi/ep_sequences -d

step "C++: a program written for NCCL EP, renamed (scripts/capi/test-rename.sh)"
MPIRUN="$MPIRUN" scripts/capi/test-rename.sh

step "Python: ep_test.py and the pytest tests (MPI initialised by mpi4py)"
pytest=("$PYTHON" -m pytest -q -p no:cacheprovider --color=no python/tests)
pytest_sequences=("$PYTHON" -m pytest -q -p no:cacheprovider --color=no python/tests/test_sequences.py python/tests/test_update.py)
mpi 1 - "$PYTHON" python/examples/ep_test.py -c
mpi 2 - "$PYTHON" python/examples/ep_test.py -c -s none,dispatch,combine,both
mpi 4 sim "$PYTHON" python/examples/ep_test.py -c
mpi 1 - "${pytest[@]}" -m "not multirank"
mpi 2 - "${pytest[@]}"
mpi 4 sim "${pytest[@]}" -m "not multirank"
mpi 4 - "${pytest_sequences[@]}"
mpi 4 sim "${pytest_sequences[@]}"

step "Python: a rank whose exception nothing catches ends the job (the excepthook aborts it), default timeout"
# Without the hook the others would wait for it until the group's timeout (60 s), then in MPI_Finalize:
# the limit here is well under that, and the run takes a few seconds.
dead_log=$(mktemp /tmp/goep-dead.XXXXXX)
set +e
LIMIT=45 mpi 2 - "$PYTHON" python/tests/dead_rank.py >"$dead_log" 2>&1
rc=$?
set -e
if [ "$rc" = 0 ] || [ "$rc" = 124 ] || ! grep -q "uncaught RuntimeError: aborting the MPI job" "$dead_log" ||
  grep -q "every step done" "$dead_log"; then
  cat "$dead_log"
  echo "test-capi: the job with a dead Python rank did not end by the excepthook's abort (exit status $rc)" >&2
  exit 1
fi
rm -f "$dead_log"

step "Python: pip install ./python, offline, into a throw-away venv"
venv=$(mktemp -d /tmp/goep-venv.XXXXXX)
trap 'rm -rf "$venv"' EXIT
"$PYTHON" -m venv --system-site-packages "$venv"
# The library is the one just built (GOEP_EP_LIB is copied, not rebuilt); --no-index: no network.
GOEP_EP_LIB="$PWD/bin/capi/libgoep_ep.so" "$venv/bin/pip" install --quiet --no-index --no-build-isolation ./python
rm -rf python/build python/goep.egg-info
(cd /tmp && unset PYTHONPATH && "$venv/bin/python" -c 'import goep.ep as e, goep.core as c, sys; p = str(e.get_lib_path()); print("installed:", p, c.__file__); sys.exit(not (p.startswith(sys.argv[1]) and c.__file__.startswith(sys.argv[1])))' "$venv")
PYTHONPATH= mpi 2 - "$venv/bin/python" python/examples/ep_test.py -a ll,ht
echo "test-capi: ok"
