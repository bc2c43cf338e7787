#!/usr/bin/env bash
# test-slurm.sh: the MPI layer under a real Slurm cluster on this machine (make test-slurm). Root.
#
# Builds bin/mpi-hello (-tags mpi), starts a 2-node cluster (scripts/slurm/cluster.sh), and checks:
#   srun-pmix       srun -N 2 -n 4 --ntasks-per-node=2 --mpi=pmix: 4 ranks on 2 real Slurm nodes,
#                   node indices 0 0 1 1, launcher srun, one bootstrap ID on every rank
#   slurmd-nodename srun -N 1 -n 4 with SLURMD_NODENAME set per pair of ranks: the name alone
#                   splits one shared-memory node into 2 (how simulated Slurm nodes are told apart)
#   sbatch-mpirun   sbatch --wait scripts/slurm/hello.sbatch: mpirun in the allocation, 2 nodes,
#                   0 0 1 1, launcher mpirun
#   srun-mpi-none   srun -n 2 --mpi=none: fails, non-zero, with a clear message (Open MPI aborts in
#                   MPI_Init, before the package's launch check can run)
#   srun-singletons srun -n 2 --mpi=none with SLURM_NODELIST hidden, so Open MPI starts each task
#                   as a singleton: the package's launch check must refuse with "use srun --mpi=pmix"
#   no-daemons      after stop, no slurmctld, slurmd, slurmstepd (or munged it started) is left
# The cluster is always stopped (trap EXIT). Each check prints PASS or FAIL with its time; a
# failure prints the check's output and the daemons' log tails. Exit status 1 if any failed.
#
# Env: GO (the go command), GOEP_SLURM_TEST_LOGS (default out/test-slurm: one log per check),
# GOEP_SLURM_TEST_TIMEOUT (seconds per check, default 120); cluster.sh's GOEP_SLURM_* variables.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
GO=${GO:-$(command -v go 2>/dev/null || echo /usr/local/go/bin/go)}
LOGS=${GOEP_SLURM_TEST_LOGS:-$ROOT/out/test-slurm}
TMO=${GOEP_SLURM_TEST_TIMEOUT:-120}
CLUSTER=$ROOT/scripts/slurm/cluster.sh
STATE=${GOEP_SLURM_STATE_DIR:-/tmp/goep-slurm}
T0=$SECONDS
failed=()

[ "$(id -u)" = 0 ] || { echo "test-slurm.sh: run as root (it starts Slurm and munge daemons)" >&2; exit 1; }
rm -rf "$LOGS" && mkdir -p "$LOGS"
eval "$("$CLUSTER" env)"   # SLURM_CONF for srun, sbatch

daemons() { for d in slurmctld slurmd slurmstepd munged; do pgrep -x "$d" || true; done | sort; }

"$ROOT/scripts/install-deps.sh" --slurm
before=$(daemons)   # daemons of someone else's, running before this test: not ours to judge
echo "test-slurm: building bin/mpi-hello"
"$GO" build -tags mpi -o bin/mpi-hello ./examples/mpi-hello

trap '"$CLUSTER" stop' EXIT
t=$SECONDS
"$CLUSTER" start 2
echo "test-slurm: cluster up in $((SECONDS - t)) s"

# result NAME T0 ERRORS: print PASS (no ERRORS) or FAIL with the check's log and daemon logs.
result() {
  local name=$1 t=$2 errs=$3 f
  if [ -z "$errs" ]; then
    echo "PASS $name ($((SECONDS - t)) s)"
    if grep -q '^goep mpi-hello' "$LOGS/$name.log"; then sed -n '/^goep mpi-hello/,$p' "$LOGS/$name.log" | sed 's/^/    /'; fi
    return 0
  fi
  echo "FAIL $name ($((SECONDS - t)) s): $(tr "\n" " " <<<"$errs")"
  echo "---- output of $name ($LOGS/$name.log)"
  sed 's/^/    /' "$LOGS/$name.log"
  for f in "$STATE"/log/*.log; do
    if [ -s "$f" ]; then echo "---- tail of $f"; tail -n 15 "$f" | sed 's/^/    /'; fi
  done
  failed+=("$name")
}

# hello_errors LOG NRANKS NODES WANT_NODES LAUNCHER: what is wrong with mpi-hello's output in LOG.
hello_errors() {
  local log=$1 np=$2 nn=$3 want=$4 launcher=$5 rows got ids
  grep -q "^goep mpi-hello: $np ranks on $nn node(s), MPI" "$log" ||
    echo "no line \"goep mpi-hello: $np ranks on $nn node(s)\" (not simulated);"
  # rank node local nodesz launcher host bootstrap-id
  rows=$(awk '$1 ~ /^[0-9]+$/ && NF == 7' "$log" | sort -n -k1,1)
  [ "$(echo "$rows" | grep -c .)" = "$np" ] || echo "want $np rank lines;"
  got=$(echo "$rows" | awk '{print $2}' | xargs)
  [ "$got" = "$want" ] || echo "node indices \"$got\", want \"$want\";"
  got=$(echo "$rows" | awk '{print $5}' | sort -u | xargs)
  [ "$got" = "$launcher" ] || echo "launcher \"$got\", want \"$launcher\";"
  ids=$(echo "$rows" | awk '{print $7}' | sort -u | grep -c . || true)
  [ "$ids" = 1 ] || echo "$ids different bootstrap IDs, want 1;"
}

# a. srun with PMIx across 2 Slurm nodes.
t=$SECONDS; rc=0
timeout "$TMO" srun -N 2 -n 4 --ntasks-per-node=2 --mpi=pmix bin/mpi-hello >"$LOGS/srun-pmix.log" 2>&1 || rc=$?
errs=$( [ "$rc" = 0 ] || echo "exit status $rc;"; hello_errors "$LOGS/srun-pmix.log" 4 2 "0 0 1 1" srun)
result srun-pmix "$t" "$errs"

# a2. SLURMD_NODENAME alone tells nodes apart within one shared-memory node.
t=$SECONDS; rc=0
timeout "$TMO" srun -N 1 -n 4 --mpi=pmix bash -c 'SLURMD_NODENAME=fake$((SLURM_PROCID / 2)) exec bin/mpi-hello' \
  >"$LOGS/slurmd-nodename.log" 2>&1 || rc=$?
errs=$( [ "$rc" = 0 ] || echo "exit status $rc;"; hello_errors "$LOGS/slurmd-nodename.log" 4 2 "0 0 1 1" srun)
result slurmd-nodename "$t" "$errs"

# b. sbatch --wait: mpirun inside a 2-node allocation.
t=$SECONDS; rc=0
timeout "$TMO" sbatch --wait --output="$LOGS/sbatch-mpirun.log" scripts/slurm/hello.sbatch \
  >"$LOGS/sbatch-mpirun.submit" 2>&1 || rc=$?
cat "$LOGS/sbatch-mpirun.submit" "$LOGS/sbatch-mpirun.log" >"$LOGS/sbatch-mpirun.both" 2>/dev/null || true
mv "$LOGS/sbatch-mpirun.both" "$LOGS/sbatch-mpirun.log" && rm -f "$LOGS/sbatch-mpirun.submit"
errs=$( [ "$rc" = 0 ] || echo "sbatch --wait exit status $rc;"; hello_errors "$LOGS/sbatch-mpirun.log" 4 2 "0 0 1 1" mpirun)
result sbatch-mpirun "$t" "$errs"

# c. srun --mpi=none: no PMI for Open MPI, which aborts inside MPI_Init with its own message.
t=$SECONDS; rc=0
timeout "$TMO" srun -n 2 --mpi=none bin/mpi-hello >"$LOGS/srun-mpi-none.log" 2>&1 || rc=$?
errs=$( [ "$rc" != 0 ] && [ "$rc" != 124 ] || echo "exit status $rc, want a failure (not 0, not a time-out);"
  grep -q 'use srun --mpi=pmix\|direct launched using "srun"' "$LOGS/srun-mpi-none.log" ||
    echo "neither the package's \"use srun --mpi=pmix\" nor Open MPI's \"direct launched using srun\" message;")
if [ -z "$errs" ]; then
  if grep -q 'use srun --mpi=pmix' "$LOGS/srun-mpi-none.log"; then
    echo "  srun-mpi-none: the package's launch check: $(grep -m1 'use srun --mpi=pmix' "$LOGS/srun-mpi-none.log")"
  else
    echo "  srun-mpi-none: Open MPI aborted in MPI_Init (exit $rc): $(grep -m1 -A2 'direct launched using "srun"' "$LOGS/srun-mpi-none.log" | tr '\n' ' ' | sed 's/execute\..*/execute./')"
  fi
fi
result srun-mpi-none "$t" "$errs"

# c2. srun --mpi=none, tasks started as singleton MPI jobs: the package's launch check refuses.
t=$SECONDS; rc=0
timeout "$TMO" srun -n 2 --mpi=none env -u SLURM_NODELIST bin/mpi-hello >"$LOGS/srun-singletons.log" 2>&1 || rc=$?
want='srun started 2 processes but MPI_COMM_WORLD has 1 rank(s): .*use srun --mpi=pmix'
errs=$( [ "$rc" != 0 ] && [ "$rc" != 124 ] || echo "exit status $rc, want a failure (not 0, not a time-out);"
  n=$(grep -c "$want" "$LOGS/srun-singletons.log" || true)
  [ "$n" = 2 ] || echo "$n of 2 tasks printed \"$want\";")
[ -n "$errs" ] || echo "  srun-singletons: $(grep -m1 "$want" "$LOGS/srun-singletons.log")"
result srun-singletons "$t" "$errs"

# d. stop, and nothing of ours is left running.
t=$SECONDS
"$CLUSTER" stop
trap - EXIT
left=$(comm -13 <(echo "$before") <(daemons) | xargs)
[ -z "$left" ] || ps -o pid,args -p "${left// /,}" >"$LOGS/no-daemons.log" 2>&1 || true
: >>"$LOGS/no-daemons.log"
result no-daemons "$t" "${left:+still running after stop: pids $left}"

echo "test-slurm: $((SECONDS - T0)) s in all; logs in $LOGS"
if [ ${#failed[@]} -gt 0 ]; then
  echo "test-slurm: FAILED: ${failed[*]}"
  exit 1
fi
echo "test-slurm: all checks passed"
