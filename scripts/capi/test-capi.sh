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
#     padded zones, FP8 dispatch (with and without round_scales), forwarded FP8 and NVFP4 rows and the NVFP4
#     combine, every received value checked against the reference, one rank's bad NVFP4 payloads and scales
#     refused on every rank, at 1, 2 and 4 ranks on 2 simulated nodes
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
#   - the Python quick start of README.md as written: its venv and pip install ./python line exactly,
#     with no package index (a download would fail it), and a round with the installed package
#   - the C quick start of docs/capi.md as written: a program compiled with its exact lines
#     (pkg-config's flags from bin/capi/goep_ep.pc), run from / with no LD_LIBRARY_PATH
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

work=$(mktemp -d /tmp/goep-capi.XXXXXX)
trap 'rm -rf "$work"' EXIT

step() { echo "== $*"; }
# doc_cmd FILE REGEX: the one line of FILE matching REGEX (a command its quick start gives), without its
# trailing comment; fails unless exactly one line matches.
doc_cmd() {
  local lines
  lines=$(grep -E -- "$2" "$1" | sed -E 's/[[:space:]]+#[[:space:]].*$//')
  if [ "$(printf '%s' "$lines" | grep -c '')" != 1 ]; then
    echo "test-capi: want one line of $1 matching $2, got:" >&2
    printf '%s\n' "$lines" >&2
    return 1
  fi
  printf '%s\n' "$lines"
}
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
"$PYTHON" capi/tests/check_header.py capi/goep_ep.h bin/capi/libgoep_ep.h bin/capi/libgoep_ep.so capi/goep_ep_bench.h
bin/capi/abi

step "C: ep_test (full rounds against the reference)"
mpi 1 - bin/capi/ep_test -c
mpi 2 - bin/capi/ep_test -c -z -s none,dispatch,combine,both
mpi 4 - bin/capi/ep_test -c -f f32
mpi 4 sim bin/capi/ep_test -c -z -s none,dispatch,combine,both
mpi 2 - bin/capi/ep_test_static
# goep's options and NCCL EP's overflow policy: the one-sided backend by name, the FP8 combine of LL
# and HT (within its bound), HT with GOEP_EP_OVERFLOW_DROP (each rank keeps its first rows, the dropped
# contribute 0)
mpi 4 sim bin/capi/ep_test -c -b cpu-onesided
mpi 2 - bin/capi/ep_test -a ll -c -z -Q
mpi 4 sim bin/capi/ep_test -a ht -c -Q
mpi 2 - bin/capi/ep_test -a ht -c -D 12
mpi 4 sim bin/capi/ep_test -a ht -c -z -D 20 -f f32

step "C: ep_features (LL rank-major, HT expert-major, FP8 dispatch, forwarded FP8 and NVFP4 rows, the NVFP4 combine against the reference)"
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

step "Python: the quick start of README.md as written (a venv, pip install ./python), with no package index"
# The README's line exactly, in a directory of its own whose python/ is the checkout's: with no index
# any download (a build tool in pip's isolated build environment, a missing dependency) fails it. The
# wheel's library is built by the package's backend (go build), as a user's is.
pip_line=$(doc_cmd README.md '-m venv --system-site-packages \.venv && \.venv/bin/pip install \./python')
if [ "$(doc_cmd docs/capi.md '^[^ ]+ -m venv --system-site-packages')" != "$pip_line" ]; then
  echo "test-capi: docs/capi.md does not give README.md's install line: $pip_line" >&2
  exit 1
fi
mkdir "$work/py"
ln -s "$PWD/python" "$work/py/python"
(
  cd "$work/py"
  unset PYTHONPATH
  # pip's settings from the environment (find-links, say) and config files left out, as on a fresh machine
  for v in $(compgen -e | grep '^PIP_' || true); do unset "$v"; done
  export PIP_NO_INDEX=1 PIP_CONFIG_FILE=/dev/null
  echo "+ $pip_line"
  eval "$pip_line"
)
venv=$work/py/.venv
(cd /tmp && unset PYTHONPATH && "$venv/bin/python" -c 'import goep.ep as e, goep.core as c, sys; p = str(e.get_lib_path()); print("installed:", p, c.__file__); sys.exit(not (p.startswith(sys.argv[1]) and c.__file__.startswith(sys.argv[1])))' "$venv")
PYTHONPATH= mpi 2 - "$venv/bin/python" python/examples/ep_test.py -a ll,ht

step "C: the quick start of docs/capi.md as written, the program run from / with no LD_LIBRARY_PATH"
if ! readelf -d bin/capi/libgoep_ep.so | grep -q 'SONAME.*\[libgoep_ep\.so\]'; then
  echo "test-capi: bin/capi/libgoep_ep.so has no SONAME libgoep_ep.so" >&2
  exit 1
fi
export_line=$(doc_cmd docs/capi.md '^export PKG_CONFIG_PATH=')
cc_line=$(doc_cmd docs/capi.md '^mpicc .*pkg-config')
doc_cmd docs/capi.md '^mpirun -np 2 \./my_ep$' >/dev/null
mkdir "$work/c"
cp capi/examples/readme.c "$work/c/my_ep.c"
(
  echo "+ $export_line"
  eval "$export_line"
  cd "$work/c"
  echo "+ $cc_line"
  eval "$cc_line"
)
(cd / && unset LD_LIBRARY_PATH && mpi 2 - "$work/c/my_ep")
echo "test-capi: ok"
