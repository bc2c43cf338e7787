# lib.sh: what train.sh, train.sbatch and study.sbatch share. Sourced, not run.
#
# Site settings, all from the environment (every script's header repeats the ones it reads):
#   LAUNCHER=srun             srun: each job step is `srun --mpi=$GOEP_SRUN_MPI -N nodes -n ranks`;
#                             mpirun: `$GOEP_MPIRUN -np ranks --host <nodes of the allocation>`
#                             (inside an allocation: sbatch or salloc; or outside Slurm with GOEP_HOSTS)
#   GOEP_HOSTS=               with LAUNCHER=mpirun: the hosts to run on, comma-separated, instead of the
#                             allocation's (and outside Slurm): e.g. localhost, or the emulated cluster's
#                             goep-h1,goep-h2 with GOEP_MPIRUN=scripts/cluster/mpirun. A step on N nodes
#                             takes the first N, each with the step's ranks per node (a :slots suffix is
#                             ignored)
#   GOEP_SRUN_MPI=pmix        srun's MPI plugin (Debian's Open MPI starts under srun only with pmix;
#                             elsewhere pmix_v4, pmi2, ... as `srun --mpi=list` shows)
#   GOEP_SRUN_FLAGS=          more srun options for every step (e.g. "--cpu-bind=cores")
#   GOEP_MPIRUN=mpirun        the mpirun command;  GOEP_MPIRUN_FLAGS=  more mpirun options
#   GOEP_MODULES=             modules to `module load` first, e.g. "openmpi/4.1.6 hdf5/1.12"
#   GOEP_SETUP=               shell code run first (eval), e.g. "source /site/env.sh; ulimit -l unlimited"
#   GOEP_BIN_DIR=bin          where the programs are (relative to the repository, or absolute)
#   GOEP_STEP_TIMEOUT=0       seconds a job step may run before it is killed (0: no limit)
#   GOEP_RANKS_PER_NODE=      simulated nodes of this many ranks inside each node (tests)
# As root (containers, the one-machine test cluster) OMPI_ALLOW_RUN_AS_ROOT* are set.

LAUNCHER=${LAUNCHER:-srun}
GOEP_SRUN_MPI=${GOEP_SRUN_MPI:-pmix}
GOEP_SRUN_FLAGS=${GOEP_SRUN_FLAGS:-}
GOEP_MPIRUN=${GOEP_MPIRUN:-mpirun}
GOEP_MPIRUN_FLAGS=${GOEP_MPIRUN_FLAGS:-}
GOEP_STEP_TIMEOUT=${GOEP_STEP_TIMEOUT:-0}

goep_say() { echo "${GOEP_SCRIPT:-goep}: $*" >&2; }
goep_die() { goep_say "$*"; exit 1; }

# goep_setup: modules, site code, Open MPI settings; checks LAUNCHER.
goep_setup() {
  if [ -n "${GOEP_MODULES:-}" ]; then
    command -v module >/dev/null 2>&1 || goep_die "GOEP_MODULES is set but there is no module command"
    # shellcheck disable=SC2086
    module load $GOEP_MODULES
  fi
  if [ -n "${GOEP_SETUP:-}" ]; then eval "$GOEP_SETUP"; fi
  if [ "$(id -u)" = 0 ]; then
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  fi
  # Open MPI's one-sided components across nodes: goep chooses them itself (sm,ucx) unless
  # OMPI_MCA_osc or an MCA parameter file does (go doc ./mpi, "One-sided components").
  [ -z "${GOEP_OMPI_OSC+set}" ] ||
    goep_die "GOEP_OMPI_OSC is gone: goep chooses Open MPI's one-sided components itself; to override, set OMPI_MCA_osc"
  case "$LAUNCHER" in
    srun) command -v srun >/dev/null || goep_die "LAUNCHER=srun but there is no srun" ;;
    mpirun)
      command -v "$GOEP_MPIRUN" >/dev/null || goep_die "LAUNCHER=mpirun but there is no $GOEP_MPIRUN"
      [ -n "${SLURM_JOB_ID:-}" ] || [ -n "${GOEP_HOSTS:-}" ] ||
        goep_die "LAUNCHER=mpirun runs inside an allocation (sbatch or salloc), or outside Slurm on the hosts of GOEP_HOSTS"
      ;;
    *) goep_die "LAUNCHER=$LAUNCHER: want srun or mpirun" ;;
  esac
  [[ "$GOEP_STEP_TIMEOUT" =~ ^[0-9]+$ ]] || goep_die "GOEP_STEP_TIMEOUT=$GOEP_STEP_TIMEOUT: want seconds"
}

# goep_bin NAME: the path of program NAME, or a failure that says how to build it.
goep_bin() {
  local b="${GOEP_BIN_DIR:-bin}/$1"
  [ -x "$b" ] || goep_die "$b not found: build it first (make $b, or GOEP_BIN_DIR=...)"
  echo "$b"
}

# goep_cpus_per_node: the CPUs the allocation has on its first node (0 if unknown).
goep_cpus_per_node() {
  local c=${SLURM_JOB_CPUS_PER_NODE:-0}
  c=${c%%(*}; c=${c%%,*}
  [[ "$c" =~ ^[0-9]+$ ]] && echo "$c" || echo 0
}

# goep_logs NAME DIR: print every rank's log of step NAME (stdout and stderr), then the launcher's.
goep_logs() {
  local name=$1 dir=$2 f r last=-1
  for f in "$dir/$name".*.out "$dir/$name".*.err; do   # the highest rank with a log
    r=${f#"$dir/$name".}
    r=${r%.*}
    if [[ "$r" =~ ^[0-9]+$ ]] && [ "$r" -gt "$last" ]; then last=$r; fi
  done
  for r in $(seq 0 "$last"); do
    for f in "$dir/$name.$r.err" "$dir/$name.$r.out"; do
      [ -e "$f" ] || { echo "---- $f: missing"; continue; }
      echo "---- $f"
      cat "$f"
    done
  done
  if [ -s "$dir/$name.launcher.log" ]; then
    echo "---- $dir/$name.launcher.log"
    cat "$dir/$name.launcher.log"
  fi
}

# goep_step NAME LOGDIR NODES RANKS PROGRAM [ARGS...]: run one job step of RANKS ranks on NODES
# nodes with the launcher of LAUNCHER. Rank r's output goes to LOGDIR/NAME.r.out and .err, the
# launcher's own to LOGDIR/NAME.launcher.log, the command line to LOGDIR/NAME.cmd. On failure it
# prints every rank's log and returns the step's exit status.
goep_step() {
  local name=$1 dir=$2 nodes=$3 ranks=$4
  shift 4
  [[ "$nodes" =~ ^[1-9][0-9]*$ && "$ranks" =~ ^[1-9][0-9]*$ ]] || goep_die "step $name: bad nodes ($nodes) or ranks ($ranks)"
  [ $((ranks % nodes)) = 0 ] || goep_die "step $name: $ranks ranks do not divide into $nodes nodes"
  local ppn=$((ranks / nodes)) cpus rc=0 r
  cpus=$(goep_cpus_per_node)
  mkdir -p "$dir"
  rm -rf "$dir/$name".*
  local cmd=()
  [ "$GOEP_STEP_TIMEOUT" = 0 ] || cmd=(timeout -k 10 "$GOEP_STEP_TIMEOUT")
  if [ "$LAUNCHER" = srun ]; then
    cmd+=(srun --mpi="$GOEP_SRUN_MPI" -N "$nodes" -n "$ranks" --ntasks-per-node="$ppn" --kill-on-bad-exit=1
      --output="$dir/$name.%t.out" --error="$dir/$name.%t.err")
    # more ranks than CPUs on a node (small test clusters): let Slurm place them anyway
    if [ "$cpus" -gt 0 ] && [ "$ppn" -gt "$cpus" ]; then cmd+=(--overcommit); fi
    # shellcheck disable=SC2206
    cmd+=($GOEP_SRUN_FLAGS)
  else
    local hosts
    if [ -n "${GOEP_HOSTS:-}" ]; then # outside Slurm: the given hosts, with ppn slots each
      hosts=$(echo "$GOEP_HOSTS" | tr , '\n' | grep . | head -n "$nodes" | sed "s/:.*//; s/\$/:$ppn/" | paste -sd, -)
      [ "$(echo "$hosts" | tr , '\n' | grep -c .)" = "$nodes" ] ||
        goep_die "step $name: wants $nodes nodes, GOEP_HOSTS has $GOEP_HOSTS"
    else
      hosts=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n "$nodes" | sed "s/\$/:$ppn/" | paste -sd, -)
      [ "$(echo "$hosts" | tr , '\n' | grep -c .)" = "$nodes" ] ||
        goep_die "step $name: wants $nodes nodes, the allocation has $SLURM_JOB_NODELIST"
    fi
    cmd+=("$GOEP_MPIRUN" -np "$ranks" --host "$hosts" --map-by "ppr:$ppn:node" --output-filename "$dir/$name.mpirun")
    if [ "$cpus" -gt 0 ] && [ "$ppn" -gt "$cpus" ]; then cmd+=(--oversubscribe); fi
    [ -z "${GOEP_RANKS_PER_NODE:-}" ] || cmd+=(-x GOEP_RANKS_PER_NODE)
    # shellcheck disable=SC2206
    cmd+=($GOEP_MPIRUN_FLAGS)
  fi
  cmd+=("$@")
  echo "${GOEP_RANKS_PER_NODE:+GOEP_RANKS_PER_NODE=$GOEP_RANKS_PER_NODE }${cmd[*]}" >"$dir/$name.cmd"
  goep_say "step $name: ${cmd[*]}"
  "${cmd[@]}" >"$dir/$name.launcher.log" 2>&1 </dev/null || rc=$?
  if [ "$LAUNCHER" = mpirun ]; then # DIR/NAME.mpirun/1/rank.R/{stdout,stderr} -> DIR/NAME.R.{out,err}
    for r in $(seq 0 $((ranks - 1))); do
      for f in "$dir/$name".mpirun/*/rank."$r"; do
        [ -d "$f" ] || continue
        [ ! -f "$f/stdout" ] || mv "$f/stdout" "$dir/$name.$r.out"
        [ ! -f "$f/stderr" ] || mv "$f/stderr" "$dir/$name.$r.err"
      done
    done
    rm -rf "$dir/$name.mpirun"
  fi
  if [ "$rc" != 0 ]; then
    goep_say "step $name FAILED (exit status $rc); the logs of every rank follow"
    goep_logs "$name" "$dir" >&2
  fi
  return "$rc"
}
