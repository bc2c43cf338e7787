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
#   train-srun      sbatch --wait train.sbatch: bin/moe-train by srun --mpi=pmix on 2 nodes x 2 ranks,
#                   200 steps; exit 0, one log per rank, trace.h5 (h5dump): nodes 2, world_size 4,
#                   /trace/loss of 200 rows; checkpoint ckpt-000200.h5
#   train-mpirun    the same job again with LAUNCHER=mpirun and -steps 300: resumes from
#                   ckpt-000200.h5 by itself and continues trace.h5: 300 rows, 2 segments
#   train-resubmit  the same output directory resubmitted on 1 node x 2 ranks (GOEP_TRAIN_RESUME=auto,
#                   GOEP_TRAIN_GLOBAL_BATCH keeping 256 tokens per step), -steps 400: continues the
#                   same run from ckpt-000300.h5: trace.h5 has 400 rows and 3 segments (4, 4, 2 ranks;
#                   2, 2, 1 nodes), one run_id in it and every checkpoint; then a new run into that
#                   directory (GOEP_TRAIN_RESUME="") is refused, naming the run and -fresh, and no
#                   file there changes
#   train-emulate   sbatch --wait train.sbatch with GOEP_TRAIN_DEVICE=emulate: bin/moe-train -device emulate
#                   by srun on 2 nodes x 2 ranks, 100 steps, LL bf16: the GPU engine on the emulated device,
#                   its communicator's unique ID made on rank 0 and handed to the 4 ranks over MPI; exit
#                   0, the start-up line shows the ID the trace records (comm_id), and trace.h5 and
#                   ckpt-000100.h5 record backend gpu:emulated
#   study-srun      sbatch --wait study.sbatch, a small sweep (layouts 1x1 1x2 1x4 2x2 2x4, LL and HT,
#                   f32 and bf16): exit 0, every 2-node step's JSON says "nodes":2, study.h5 passes
#                   ep-plot check and h5dump shows its tables and attributes, the two charts are
#                   PNG files, model.md holds the predicted-vs-measured table, /model is stored
#   study-mpirun    study.sbatch with LAUNCHER=mpirun, layouts 1x2 2x4, LL f32: exit 0, 1 and 2 nodes
#   study-fails     a sweep ep-bench refuses (6 experts on 4 ranks): the job fails (non-zero) and
#                   prints the log of each of the 4 ranks
#   gradsync-srun   sbatch --wait gradsync.sbatch, a tiny grad sync study on 2 nodes x 2 ranks
#                   (allreduce, a2sgd, topk:K): exit 0, 3 traces of 2 nodes and 4 ranks with their
#                   grad_sync, summary.md with a row per method, loss.png and cost.png
#   go-readers      go test -run TestSlurmOutputs ./internal/study: the trace (3 segments) read by runs.ReadTrace (moe/runs),
#                   the study by internal/study (2-node rows from 2-node steps only), the model
#   no-daemons      after stop, no slurmctld, slurmd, slurmstepd (or munged it started) is left
# The cluster is always stopped (trap EXIT). Each check prints PASS or FAIL with its time; a
# failure prints the check's output and the daemons' log tails. Exit status 1 if any failed.
# Nothing sets Open MPI's one-sided components: goep chooses them itself (srun-pmix checks it).
#
# --net (or GOEP_SLURM_NET=1; make test-slurm passes it): the 2 nodes are emulated hosts with a
# network of their own (cluster.sh start --net: scripts/cluster's network namespaces, one slurmd
# in each, slurmctld on goep-h1), so every multi-node step crosses TCP between hosts that share
# no memory; Slurm's clients (srun, sbatch) run on goep-h1, and no-daemons also checks that the
# hosts are gone. Without it the nodes n1, n2 are simulated on this machine, as before.
#
# Env: GO (the go command), GOEP_SLURM_TEST_LOGS (default out/test-slurm: one log per check,
# and the jobs' outputs in train/ and study*/), GOEP_SLURM_TEST_TIMEOUT (seconds per check,
# default 120; three times that for study-srun, ten job steps); cluster.sh's GOEP_SLURM_* variables.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
NET=${GOEP_SLURM_NET:-0}
for a in "$@"; do
  case "$a" in
    --net) NET=1 ;;
    --local) NET=0 ;;
    *) echo "test-slurm.sh: unknown argument $a (want --net or --local)" >&2; exit 2 ;;
  esac
done
GO=${GO:-$(command -v go 2>/dev/null || echo /usr/local/go/bin/go)}
LOGS=${GOEP_SLURM_TEST_LOGS:-$ROOT/out/test-slurm}
TMO=${GOEP_SLURM_TEST_TIMEOUT:-120}
CLUSTER=$ROOT/scripts/slurm/cluster.sh
# MODE: cluster.sh's mode flag; IN: how clients reach the controller; N1, N2: the node names.
MODE=() IN=() N1=n1 N2=n2
STATE=${GOEP_SLURM_STATE_DIR:-/tmp/goep-slurm}
if [ "$NET" = 1 ]; then
  # Hosts of this run's own, so that runs from other checkouts on the machine do not collide.
  export GOEP_CLUSTER_NAME=${GOEP_CLUSTER_NAME:-gs$$}
  MODE=(--net) IN=("$ROOT/scripts/cluster/cluster.sh" exec goep-h1) N1=goep-h1 N2=goep-h2
  STATE=${GOEP_SLURM_STATE_DIR:-/var/tmp/$GOEP_CLUSTER_NAME-slurm-net}
fi
T0=$SECONDS
failed=()

[ "$(id -u)" = 0 ] || { echo "test-slurm.sh: run as root (it starts Slurm and munge daemons)" >&2; exit 1; }
rm -rf "$LOGS" && mkdir -p "$LOGS"
eval "$("$CLUSTER" env "${MODE[@]}")"   # SLURM_CONF for srun, sbatch

# daemons: pids of the Slurm and munge daemons running now. A zombie (exited, its parent not yet
# told) is not running: init reaps the stopped daemons' zombies a moment later.
daemons() {
  ps -eo pid=,stat=,comm= | awk '$2 !~ /^Z/ && ($3 == "slurmctld" || $3 == "slurmd" || $3 == "slurmstepd" || $3 == "munged") { print $1 }' | sort
}

"$ROOT/scripts/install-deps.sh" --slurm
before=$(daemons)   # daemons of someone else's, running before this test: not ours to judge
echo "test-slurm: building bin/mpi-hello bin/moe-train bin/ep-bench bin/ep-plot"
for p in moe-train ep-bench; do "$GO" build -tags mpi -o "bin/$p" "./cmd/$p"; done; "$GO" build -tags mpi -o bin/mpi-hello ./examples/mpi-hello
"$GO" build -o bin/ep-plot ./cmd/ep-plot

trap '"$CLUSTER" stop "${MODE[@]}"' EXIT
t=$SECONDS
"$CLUSTER" start 2 "${MODE[@]}"
echo "test-slurm: cluster up in $((SECONDS - t)) s ($([ "$NET" = 1 ] && echo "2 hosts with their own network" || echo "2 nodes simulated on this machine"))"

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
timeout "$TMO" "${IN[@]}" srun -N 2 -n 4 --ntasks-per-node=2 --mpi=pmix bin/mpi-hello >"$LOGS/srun-pmix.log" 2>&1 || rc=$?
errs=$( [ "$rc" = 0 ] || echo "exit status $rc;"; hello_errors "$LOGS/srun-pmix.log" 4 2 "0 0 1 1" srun
  grep -q '^one-sided components: osc="sm,ucx" chosen-by=goep' "$LOGS/srun-pmix.log" ||
    echo "goep did not choose Open MPI's one-sided components (osc=sm,ucx) by itself;"
  if [ "$NET" = 1 ]; then
    got=$(awk '$1 ~ /^[0-9]+$/ && NF == 7 { print $6 }' "$LOGS/srun-pmix.log" | sort | uniq -c | awk '{print $1 "x" $2}' | xargs)
    [ "$got" = "2xgoep-h1 2xgoep-h2" ] || echo "host names \"$got\", want 2 ranks on each of goep-h1, goep-h2;"
  fi)
result srun-pmix "$t" "$errs"

# a2. SLURMD_NODENAME alone tells nodes apart within one shared-memory node.
t=$SECONDS; rc=0
timeout "$TMO" "${IN[@]}" srun -N 1 -n 4 --mpi=pmix bash -c 'SLURMD_NODENAME=fake$((SLURM_PROCID / 2)) exec bin/mpi-hello' \
  >"$LOGS/slurmd-nodename.log" 2>&1 || rc=$?
errs=$( [ "$rc" = 0 ] || echo "exit status $rc;"; hello_errors "$LOGS/slurmd-nodename.log" 4 2 "0 0 1 1" srun)
result slurmd-nodename "$t" "$errs"

# b. sbatch --wait: mpirun inside a 2-node allocation.
t=$SECONDS; rc=0
timeout "$TMO" "${IN[@]}" sbatch --wait --output="$LOGS/sbatch-mpirun.log" scripts/slurm/hello.sbatch \
  >"$LOGS/sbatch-mpirun.submit" 2>&1 || rc=$?
cat "$LOGS/sbatch-mpirun.submit" "$LOGS/sbatch-mpirun.log" >"$LOGS/sbatch-mpirun.both" 2>/dev/null || true
mv "$LOGS/sbatch-mpirun.both" "$LOGS/sbatch-mpirun.log" && rm -f "$LOGS/sbatch-mpirun.submit"
errs=$( [ "$rc" = 0 ] || echo "sbatch --wait exit status $rc;"; hello_errors "$LOGS/sbatch-mpirun.log" 4 2 "0 0 1 1" mpirun)
result sbatch-mpirun "$t" "$errs"

# c. srun --mpi=none: no PMI for Open MPI, which aborts inside MPI_Init with its own message.
t=$SECONDS; rc=0
timeout "$TMO" "${IN[@]}" srun -n 2 --mpi=none bin/mpi-hello >"$LOGS/srun-mpi-none.log" 2>&1 || rc=$?
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
timeout "$TMO" "${IN[@]}" srun -n 2 --mpi=none env -u SLURM_NODELIST bin/mpi-hello >"$LOGS/srun-singletons.log" 2>&1 || rc=$?
want='srun started 2 processes but MPI_COMM_WORLD has 1 rank(s): .*use srun --mpi=pmix'
errs=$( [ "$rc" != 0 ] && [ "$rc" != 124 ] || echo "exit status $rc, want a failure (not 0, not a time-out);"
  n=$(grep -c "$want" "$LOGS/srun-singletons.log" || true)
  [ "$n" = 2 ] || echo "$n of 2 tasks printed \"$want\";")
[ -n "$errs" ] || echo "  srun-singletons: $(grep -m1 "$want" "$LOGS/srun-singletons.log")"
result srun-singletons "$t" "$errs"

# sbatch_wait NAME [SBATCH OPTIONS] SCRIPT [ARGS...]: sbatch --wait, the job's output (and sbatch's)
# in LOGS/NAME.log; sets rc to the job's exit status. The job gets the caller's environment.
sbatch_wait() {
  local name=$1
  shift
  rc=0
  timeout "${JOB_TMO:-$TMO}" "${IN[@]}" sbatch --wait --output="$LOGS/$name.job" "$@" >"$LOGS/$name.log" 2>&1 || rc=$?
  cat "$LOGS/$name.job" >>"$LOGS/$name.log" 2>/dev/null || true
  rm -f "$LOGS/$name.job"
}

# h5attr FILE NAME: the value of the root attribute NAME, as h5dump prints it.
h5attr() { h5dump -a "/$2" "$1" 2>/dev/null | sed -n 's/^ *(0): *//p' | tr -d '"' | head -n 1; }
# h5rows FILE DATASET: the number of rows of a table (h5ls: {rows/Inf} or {rows, cols/Inf}).
h5rows() { h5ls "$1/$2" 2>/dev/null | sed -n 's/.*{\([0-9]*\).*/\1/p'; }

# trace_errors FILE NODES RANKS ROWS: what is wrong with a moe-train trace.
trace_errors() {
  local f=$1 got
  [ -s "$f" ] || { echo "no $f;"; return; }
  got=$(h5attr "$f" nodes)
  [ "$got" = "$2" ] || echo "$f: attribute nodes is \"$got\", want $2;"
  got=$(h5attr "$f" world_size)
  [ "$got" = "$3" ] || echo "$f: attribute world_size is \"$got\", want $3;"
  got=$(h5rows "$f" trace/loss)
  [ "$got" = "$4" ] || echo "$f: /trace/loss has \"$got\" rows, want $4;"
}


TRAIN=$LOGS/train
# e. train.sbatch with srun: 2 nodes x 2 ranks.
t=$SECONDS; rc=0
(export GOEP_OUT_DIR=$TRAIN GOEP_STEP_TIMEOUT=$TMO
  sbatch_wait train-srun scripts/slurm/train.sbatch -steps 200 -ckpt-every 100 -progress-every 100 -mode ht; exit "$rc") || rc=$?
errs=$( [ "$rc" = 0 ] || echo "sbatch --wait exit status $rc;"
  trace_errors "$TRAIN/trace.h5" 2 4 200
  [ -s "$TRAIN/ckpt-000200.h5" ] || echo "no checkpoint ckpt-000200.h5;"
  for r in 0 1 2 3; do compgen -G "$TRAIN/logs/train-*.$r.out" >/dev/null || echo "no log of rank $r;"; done
  grep -q "srun --mpi=pmix -N 2 -n 4" "$LOGS/train-srun.log" || echo "no srun --mpi=pmix -N 2 -n 4 step;")
result train-srun "$t" "$errs"

# f. the same job with mpirun in the allocation, to step 300: it resumes from ckpt-000200.h5.
t=$SECONDS; rc=0
(export LAUNCHER=mpirun GOEP_OUT_DIR=$TRAIN GOEP_STEP_TIMEOUT=$TMO
  sbatch_wait train-mpirun scripts/slurm/train.sbatch -steps 300 -ckpt-every 100 -progress-every 100 -mode ht; exit "$rc") || rc=$?
errs=$( [ "$rc" = 0 ] || echo "sbatch --wait exit status $rc;"
  trace_errors "$TRAIN/trace.h5" 2 4 300
  [ "$(h5attr "$TRAIN/trace.h5" start_step)" = 200 ] || echo "trace.h5: start_step is not 200;"
  [ "$(h5attr "$TRAIN/trace.h5" segment_count)" = 2 ] || echo "trace.h5: not 2 segments;"
  [ -s "$TRAIN/ckpt-000300.h5" ] || echo "no checkpoint ckpt-000300.h5;"
  grep -q "mpirun -np 4 --host $N1:2,$N2:2" "$LOGS/train-mpirun.log" || echo "no mpirun -np 4 --host $N1:2,$N2:2 step;")
result train-mpirun "$t" "$errs"

# f2. the same output directory resubmitted on fewer nodes continues the same run; a new run there
# is refused and changes nothing.
t=$SECONDS; rc=0
(export GOEP_OUT_DIR=$TRAIN GOEP_STEP_TIMEOUT=$TMO GOEP_TRAIN_RESUME=auto GOEP_TRAIN_GLOBAL_BATCH=256
  sbatch_wait train-resubmit -N 1 --ntasks-per-node=2 scripts/slurm/train.sbatch -steps 400 -ckpt-every 100 \
    -progress-every 100 -mode ht; exit "$rc") || rc=$?
train_run=$(h5attr "$TRAIN/trace.h5" run_id)
errs=$( [ "$rc" = 0 ] || echo "sbatch --wait exit status $rc;"
  trace_errors "$TRAIN/trace.h5" 1 2 400
  [ -n "$train_run" ] || echo "trace.h5 has no run_id;"
  for c in 100 200 300 400; do
    got=$(h5attr "$TRAIN/ckpt-000$c.h5" run_id)
    [ "$got" = "$train_run" ] || echo "ckpt-000$c.h5: run_id \"$got\", the trace's \"$train_run\";"
  done
  [ "$(h5attr "$TRAIN/trace.h5" segment_count)" = 3 ] || echo "trace.h5: not 3 segments;"
  got=$(for i in 0 1 2; do h5attr "$TRAIN/trace.h5" "segments/000$i/world_size"; done | xargs)
  [ "$got" = "4 4 2" ] || echo "segments' world_size \"$got\", want \"4 4 2\";"
  got=$(for i in 0 1 2; do h5attr "$TRAIN/trace.h5" "segments/000$i/nodes"; done | xargs)
  [ "$got" = "2 2 1" ] || echo "segments' nodes \"$got\", want \"2 2 1\";"
  got=$(h5attr "$TRAIN/trace.h5" segments/0002/tokens)
  [ "$got" = 128 ] || echo "segment 2: tokens \"$got\", want 128 (256 per step on 2 ranks);"
  [[ "$(h5attr "$TRAIN/trace.h5" segments/0000/hosts)" =~ ^$N1@.+:2,$N2@.+:2$ ]] || echo "segment 0: hosts are not $N1@...:2,$N2@...:2;"
  grep -q "run $train_run: resuming (newest checkpoint) from .*ckpt-000300.h5 at step 300" "$LOGS/train-resubmit.log" ||
    echo "no \"run $train_run: resuming (newest checkpoint) from ckpt-000300.h5\" in the output;"
  grep -q "world size = 4 ranks in the checkpoint, 2 in this run" "$LOGS/train-resubmit.log" || echo "the new world size is not said;"
  ! grep -q "global batch changed" "$LOGS/train-resubmit.log" || echo "the global batch changed;")
if [ -z "$errs" ]; then
  train_sums=$(cd "$TRAIN" && sha256sum ./*.h5)
  rc=0
  (export GOEP_OUT_DIR=$TRAIN GOEP_STEP_TIMEOUT=$TMO GOEP_TRAIN_RESUME=
    sbatch_wait train-refused -N 1 --ntasks-per-node=2 scripts/slurm/train.sbatch -steps 100 -mode ht; exit "$rc") || rc=$?
  cat "$LOGS/train-refused.log" >>"$LOGS/train-resubmit.log"
  errs=$( [ "$rc" != 0 ] && [ "$rc" != 124 ] || echo "a new run into the run's directory: exit status $rc, want a refusal;"
    grep -q "refusing to start a new run .*run $train_run.*-fresh" "$LOGS/train-refused.log" || echo "the refusal does not name run $train_run and -fresh;"
    [ "$(cd "$TRAIN" && sha256sum ./*.h5)" = "$train_sums" ] || echo "the refused run changed the run's files;")
fi
result train-resubmit "$t" "$errs"

# f3. -device emulate by srun: the GPU engine on the emulated device across the 2 nodes.
t=$SECONDS; rc=0
EMU=$LOGS/train-emulate
(export GOEP_OUT_DIR=$EMU GOEP_STEP_TIMEOUT=$TMO GOEP_TRAIN_DEVICE=emulate GOEP_TRAIN_RESUME=
  sbatch_wait train-emulate scripts/slurm/train.sbatch -steps 100 -ckpt-every 100 -progress-every 50 -mode ll -dtype bf16; exit "$rc") || rc=$?
emu_id=$(h5attr "$EMU/trace.h5" comm_id)
errs=$( [ "$rc" = 0 ] || echo "sbatch --wait exit status $rc;"
  trace_errors "$EMU/trace.h5" 2 4 100
  [ "$(h5attr "$EMU/trace.h5" backend)" = gpu:emulated ] || echo "trace.h5: backend is not gpu:emulated;"
  [ "$(h5attr "$EMU/ckpt-000100.h5" backend)" = gpu:emulated ] || echo "ckpt-000100.h5: backend is not gpu:emulated;"
  [[ "$emu_id" =~ ^[0-9a-f]{12}$ ]] || echo "trace.h5: comm_id \"$emu_id\" is not an ID's digest;"
  grep -q "device emulate: .* handed to the 4 ranks over MPI (mpi.BootstrapID): $emu_id (sha256" "$LOGS/train-emulate.log" ||
    echo "no start-up line showing the ID $emu_id handed to the 4 ranks;"
  grep -q "copies per rank per step" "$LOGS/train-emulate.log" || echo "the summary does not count the copies;"
  grep -q "srun --mpi=pmix -N 2 -n 4 .* -device emulate" "$LOGS/train-emulate.log" || echo "no srun --mpi=pmix -N 2 -n 4 ... -device emulate step;")
result train-emulate "$t" "$errs"

# The small sweep of the study checks (a few seconds per step here).
small=(STUDY_DTYPES=f32,bf16 STUDY_TOKENS_LL=16,64 STUDY_TOKENS_HT=64,256 STUDY_HIDDEN=256 STUDY_TOPK=2
  STUDY_EXPERTS=8 STUDY_ITERS=5 STUDY_WARMUP=1 GOEP_STEP_TIMEOUT=$TMO)

# study_errors DIR LOG ROWS NODES: what is wrong with a study's outputs.
study_errors() {
  local dir=$1 log=$2 f
  "$ROOT/bin/ep-plot" check -rows "$3" -nodes "$4" -attrs slurm_job_id,slurm_job_nodelist,date,sweep_layouts \
    "$dir/study.h5" >>"$log" 2>&1 || echo "ep-plot check failed;"
  for f in "$dir"/logs/*-2x*.jsonl; do
    [ -e "$f" ] || continue
    grep -q '"nodes":2,' "$f" || echo "$(basename "$f"): no \"nodes\":2 in the JSON of a 2-node step;"
    ! grep -q '"nodes":1,' "$f" || echo "$(basename "$f"): \"nodes\":1 in the JSON of a 2-node step;"
  done
  h5dump -d /results/nodes "$dir/study.h5" >>"$log" 2>&1 || echo "h5dump -d /results/nodes failed;"
  f=$(h5rows "$dir/study.h5" results/dispatch_us)
  [ "$f" = "$3" ] || echo "/results/dispatch_us has \"$f\" rows (h5ls), want $3;"
  [ -n "$(h5attr "$dir/study.h5" slurm_job_id)" ] || echo "no attribute slurm_job_id (h5dump);"
}

# g. study.sbatch with srun: 5 layouts x 2 modes, 8 rows per layout.
t=$SECONDS; rc=0
(export "${small[@]}" GOEP_OUT_DIR="$LOGS/study" STUDY_LAYOUTS="1x1 1x2 1x4 2x2 2x4" JOB_TMO=$((3 * TMO))
  sbatch_wait study-srun --ntasks-per-node=4 scripts/slurm/study.sbatch; exit "$rc") || rc=$?
errs=$( [ "$rc" = 0 ] || echo "sbatch --wait exit status $rc;"
  study_errors "$LOGS/study" "$LOGS/study-srun.log" 40 1,2
  for f in ll-latency.png ht-bandwidth.png model.png; do
    [ "$(head -c 4 "$LOGS/study/$f" 2>/dev/null | tail -c 3)" = PNG ] || echo "$f is not a PNG file;"
  done
  grep -q "^## Predicted against measured" "$LOGS/study/model.md" 2>/dev/null || echo "model.md has no predicted-vs-measured table;"
  h5dump -a /model/ll/dispatch/alpha_us "$LOGS/study/study.h5" >/dev/null 2>&1 || echo "no /model/ll/dispatch in study.h5;")
result study-srun "$t" "$errs"

# h. study.sbatch with mpirun in the allocation.
t=$SECONDS; rc=0
(export "${small[@]}" LAUNCHER=mpirun GOEP_OUT_DIR="$LOGS/study-mpirun" STUDY_LAYOUTS="1x2 2x4" STUDY_MODES=ll STUDY_DTYPES=f32
  sbatch_wait study-mpirun --ntasks-per-node=4 scripts/slurm/study.sbatch; exit "$rc") || rc=$?
errs=$( [ "$rc" = 0 ] || echo "sbatch --wait exit status $rc;"
  study_errors "$LOGS/study-mpirun" "$LOGS/study-mpirun.log" 4 1,2
  grep -q "mpirun -np 4 --host $N1:2,$N2:2" "$LOGS/study-mpirun.log" || echo "no mpirun -np 4 --host $N1:2,$N2:2 step;")
result study-mpirun "$t" "$errs"

# i. a step that fails prints every rank's log, and the job fails.
t=$SECONDS; rc=0
(export "${small[@]}" GOEP_OUT_DIR="$LOGS/study-fails" STUDY_LAYOUTS="2x4" STUDY_MODES=ll STUDY_DTYPES=f32 STUDY_EXPERTS=6
  sbatch_wait study-fails --ntasks-per-node=4 scripts/slurm/study.sbatch; exit "$rc") || rc=$?
errs=$( [ "$rc" != 0 ] && [ "$rc" != 124 ] || echo "exit status $rc, want a failure (not 0, not a time-out);"
  for r in 0 1 2 3; do
    grep -q "^---- .*/000-2x4-ll\.$r\.err" "$LOGS/study-fails.log" || echo "the log of rank $r is not printed;"
  done
  grep -q "not a multiple of the 4 ranks" "$LOGS/study-fails.log" || echo "ep's error is not in the job's output;")
result study-fails "$t" "$errs"

# i2. the grad sync study on 2 nodes x 2 ranks, tiny.
t=$SECONDS; rc=0
GS=$LOGS/gradsync
(export GOEP_OUT_DIR=$GS GOEP_STEP_TIMEOUT=$TMO GRADSYNC_RANKS=4 GRADSYNC_STEPS=20 GRADSYNC_HIDDEN=16 GRADSYNC_SHARED_FFN=32 \
    GRADSYNC_FFN=16 GRADSYNC_TOKENS=16 GRADSYNC_LR=0.01 GRADSYNC_TOPK_DENSITY=0.05 GRADSYNC_NET="test cluster"
  sbatch_wait gradsync-srun -N 2 --ntasks-per-node=2 scripts/slurm/gradsync.sbatch; exit "$rc") || rc=$?
errs=$( [ "$rc" = 0 ] || echo "sbatch --wait exit status $rc;"
  n=0
  for f in "$GS"/*/trace.h5; do
    [ -s "$f" ] || continue
    n=$((n + 1))
    trace_errors "$f" 2 4 20
    m=$(h5attr "$f" grad_sync)
    grep -q "^| $m | 4 | 20 |" "$GS/summary.md" 2>/dev/null || echo "summary.md has no row of $m;"
  done
  [ "$n" = 3 ] || echo "$n traces, want 3 (allreduce, a2sgd, topk);"
  for f in loss.png cost.png; do
    [ "$(head -c 4 "$GS/$f" 2>/dev/null | tail -c 3)" = PNG ] || echo "$f is not a PNG file;"
  done
  grep -q "srun --mpi=pmix -N 2 -n 4" "$LOGS/gradsync-srun.log" || echo "no srun --mpi=pmix -N 2 -n 4 step;")
result gradsync-srun "$t" "$errs"

# j. the project's readers: runs.ReadTrace (moe/runs), internal/study.
t=$SECONDS; rc=0
GOEP_SLURM_OUTPUTS=$LOGS GOEP_SLURM_FIRST_NODE=$N1 "$GO" test -count=1 -run TestSlurmOutputs -v ./internal/study >"$LOGS/go-readers.log" 2>&1 || rc=$?
errs=$( [ "$rc" = 0 ] || echo "go test exit status $rc;"
  grep -q -- "--- PASS: TestSlurmOutputs" "$LOGS/go-readers.log" || echo "TestSlurmOutputs did not pass (skipped?);")
result go-readers "$t" "$errs"

# d. stop, and nothing of ours is left running (nor, in the network mode, any host).
t=$SECONDS
"$CLUSTER" stop "${MODE[@]}"
trap - EXIT
left=$(comm -13 <(echo "$before") <(daemons) | xargs)
[ -z "$left" ] || ps -o pid,args -p "${left// /,}" >"$LOGS/no-daemons.log" 2>&1 || true
: >>"$LOGS/no-daemons.log"
hosts_left=""
if [ "$NET" = 1 ]; then hosts_left=$("$ROOT/scripts/cluster/cluster.sh" check || true); fi
result no-daemons "$t" "${left:+still running after stop: pids $left;}${hosts_left:+ hosts left: $hosts_left}"
# The hosts' state directory is this run's own (its name has the run's pid): failures have
# printed the daemons' logs by now.
if [ "$NET" = 1 ] && [ -z "${GOEP_SLURM_STATE_DIR:-}" ]; then rm -rf "$STATE"; fi

echo "test-slurm: $((SECONDS - T0)) s in all; logs in $LOGS"
if [ ${#failed[@]} -gt 0 ]; then
  echo "test-slurm: FAILED: ${failed[*]}"
  exit 1
fi
echo "test-slurm: all checks passed"
