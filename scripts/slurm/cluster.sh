#!/usr/bin/env bash
# cluster.sh: a throw-away Slurm cluster on this machine, for tests. Run as root.
#
#   scripts/slurm/cluster.sh start [N]   start munge, slurmctld and N slurmd daemons: "nodes"
#                                        n1..nN, all on localhost (default N=2); wait until every
#                                        node is idle. Installs Slurm and munge first if missing
#                                        (scripts/install-deps.sh --slurm). A cluster already
#                                        running is stopped first, so start always begins afresh.
#   scripts/slurm/cluster.sh stop        cancel every job and stop every daemon this script
#                                        started. Idempotent; also cleans up after a failed start.
#   scripts/slurm/cluster.sh status      the daemons, the controller and sinfo; exit 0 when the
#                                        controller answers, 3 when nothing runs.
#   scripts/slurm/cluster.sh env         print the export line the Slurm clients need when the
#                                        config is not in /etc/slurm (eval "$(cluster.sh env)").
#
# With --net after the command (or GOEP_SLURM_NET=1), the nodes are hosts of their own instead:
# start brings up N emulated hosts goep-h1..goep-hN (scripts/cluster/cluster.sh up N: network
# namespaces on a bridge, own hostnames, /tmp and /dev/shm, links capped at 10 Gbit/s) unless they
# are up already, runs one slurmd in each and slurmctld on goep-h1 (10.213.0.1), so job steps
# span a real network; stop also brings the hosts down if start brought them up. Slurm's clients
# must then run on a host: scripts/cluster/cluster.sh exec goep-h1 srun ... (the hosts reach the
# controller; the machine itself has no address on their network). In this mode the config is
# in GOEP_SLURM_STATE_DIR/etc (never /etc/slurm) and the state directory defaults to
# /var/tmp/NAME-slurm-net for the hosts' cluster NAME (GOEP_CLUSTER_NAME, default goep; the
# hosts have their own /tmp).
#
# Environment (the defaults suit a throw-away test machine or container):
#   GOEP_SLURM_NODES=2             N when start is given no argument
#   GOEP_SLURM_CPUS=4              CPUs declared per node; may exceed the real cores, so a 2-core
#                                  machine runs 4-8 tasks (SlurmdParameters=config_overrides)
#   GOEP_SLURM_CONF_DIR=/etc/slurm where slurm.conf is written. /etc/slurm is where srun, sbatch,
#                                  sinfo look with no SLURM_CONF, so the default is for a test
#                                  machine only; a slurm.conf there that this script did not write
#                                  is never overwritten. Elsewhere, export SLURM_CONF (see env).
#   GOEP_SLURM_STATE_DIR=/tmp/goep-slurm
#                                  everything else: spool, logs (log/), pid files (run/), the task
#                                  prolog, and each node's TmpFS (tmp/n1..tmp/nN)
#   GOEP_SLURM_CTLD_PORT=6817      slurmctld's port
#   GOEP_SLURM_PORT_BASE=17000     slurmd of node ni listens on GOEP_SLURM_PORT_BASE+i
#   GOEP_SLURM_WAIT=30             seconds start waits for every node to be idle; on time-out
#                                  it prints the daemons' log tails, stops everything and fails
#
# Simulated nodes on one host need (and get): a spool directory, a pid file and a port per slurmd;
# TmpFS per node; and a task prolog that gives Open MPI's shared-memory transport (btl vader) a
# per-node backing directory, else ranks of two "nodes" with the same local rank collide on one
# segment file name. MpiDefault=pmix: Debian's Open MPI only starts under srun through PMIx.
# munge is started as user munge when it is not already running, and stopped only if started here.
set -euo pipefail

# --net anywhere in the arguments selects the network mode (see the header).
NET=${GOEP_SLURM_NET:-0}
args=()
for a in "$@"; do
  if [ "$a" = --net ]; then NET=1; else args+=("$a"); fi
done
set -- "${args[@]+"${args[@]}"}"
[[ "$NET" =~ ^[01]$ ]] || { echo "cluster.sh: GOEP_SLURM_NET=$NET: want 0 or 1" >&2; exit 2; }
if [ "$NET" = 1 ]; then
  STATE=${GOEP_SLURM_STATE_DIR:-/var/tmp/${GOEP_CLUSTER_NAME:-goep}-slurm-net}
  CONF_DIR=${GOEP_SLURM_CONF_DIR:-$STATE/etc}
else
  STATE=${GOEP_SLURM_STATE_DIR:-/tmp/goep-slurm}
  CONF_DIR=${GOEP_SLURM_CONF_DIR:-/etc/slurm}
fi
CPUS=${GOEP_SLURM_CPUS:-4}
CTLD_PORT=${GOEP_SLURM_CTLD_PORT:-6817}
PORT_BASE=${GOEP_SLURM_PORT_BASE:-17000}
WAIT=${GOEP_SLURM_WAIT:-30}
CONF=$CONF_DIR/slurm.conf
MARK="# written by goep scripts/slurm/cluster.sh"
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
HOSTS=$ROOT/scripts/cluster/cluster.sh
export SLURM_CONF=$CONF
# IN: how Slurm's clients reach the controller (on a host in the network mode).
IN=()
if [ "$NET" = 1 ]; then IN=("$HOSTS" exec goep-h1); fi

say() { echo "cluster.sh: $*" >&2; }

# running PID: true if PID is a process that has not exited (a zombie, exited but not yet reaped
# by its parent, has: where init does not reap promptly, zombies of stopped daemons linger).
running() { [ -r "/proc/$1/stat" ] && [ "$(sed 's/^.*) //' "/proc/$1/stat" 2>/dev/null | cut -d' ' -f1)" != Z ]; }

# pids_alive lists "name pid" for each pid file of this script's in $STATE/run whose process still
# runs the program it names (a recycled pid is ignored). The daemons' own pid files are elsewhere
# ($STATE/run/daemons): a daemon removes its file while it shuts down, before it has exited.
pids_alive() {
  local f name pid
  for f in "$STATE"/run/*.pid; do
    [ -f "$f" ] || continue
    name=$(basename "$f" .pid)
    pid=$(cat "$f" 2>/dev/null || true)
    [[ "$pid" =~ ^[0-9]+$ ]] || continue
    # the program name: slurmctld, slurmd (for slurmd-nI)
    if [ "$(cat /proc/"$pid"/comm 2>/dev/null)" = "${name%%-*}" ] && running "$pid"; then
      echo "$name $pid"
    fi
  done
}

# stepds lists the slurmstepd processes of this cluster (their environment names its slurm.conf,
# inherited from the slurmd this script started). slurmd daemonizes them: they outlive it briefly.
stepds() {
  local pid
  for pid in $(pgrep -x slurmstepd 2>/dev/null || true); do
    running "$pid" && tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null | grep -qx "SLURM_CONF=$CONF" && echo "$pid"
  done
  return 0
}

# ours reports whether $CONF is absent or was written by this script.
ours() { [ ! -e "$CONF" ] || [[ "$(head -n 1 "$CONF")" == "$MARK"* ]]; }

# logs prints the tail of each daemon's log file, or of its standard error if the log is empty
# (a daemon that fails before it opens its log, on a bad slurm.conf say, tells only there).
logs() {
  local f
  for f in "$STATE"/log/*.out; do
    [ -s "${f%.out}.log" ] && f=${f%.out}.log
    [ -s "$f" ] || continue
    echo "---- tail of $f" >&2
    tail -n 25 "$f" >&2
  done
}

stop() {
  local alive name pid
  # Jobs first, so that no slurmstepd outlives its slurmd.
  if [ -n "$(pids_alive | grep '^slurmctld ' || true)" ]; then
    local jobs
    jobs=$(timeout 5 "${IN[@]}" squeue -h -o %i 2>/dev/null || true)
    # shellcheck disable=SC2086
    [ -z "$jobs" ] || timeout 10 "${IN[@]}" scancel $jobs >/dev/null 2>&1 || true
    for _ in $(seq 50); do
      [ -z "$(timeout 5 "${IN[@]}" squeue -h -o %i 2>/dev/null || true)" ] && break
      sleep 0.2
    done
  fi
  pids_alive | while read -r name pid; do kill -TERM "$pid" 2>/dev/null || true; done
  for _ in $(seq 100); do   # up to 10 s, then SIGKILL
    alive=$(pids_alive)
    [ -z "$alive" ] && break
    sleep 0.1
  done
  alive=$(pids_alive)
  if [ -n "$alive" ]; then
    say "still running after SIGTERM, killing: $(echo $alive)"
    echo "$alive" | while read -r name pid; do kill -KILL "$pid" 2>/dev/null || true; done
    sleep 0.2
  fi
  for _ in $(seq 100); do   # the job steps' slurmstepd: up to 10 s more, then SIGKILL
    [ -z "$(stepds)" ] && break
    sleep 0.1
  done
  alive=$(stepds)
  if [ -n "$alive" ]; then
    say "slurmstepd still running after its slurmd stopped, killing: $(echo $alive)"
    # shellcheck disable=SC2086
    kill -KILL $alive 2>/dev/null || true
    sleep 0.2
  fi
  rm -f "$STATE"/run/slurm*.pid "$STATE"/run/daemons/*.pid
  if [ -f "$STATE/run/munge.ours" ]; then
    munged --stop >/dev/null 2>&1 || true
    rm -f "$STATE/run/munge.ours"
  fi
  if [ -f "$STATE/run/hosts.ours" ]; then
    "$HOSTS" down >/dev/null 2>&1 || "$HOSTS" down
    rm -f "$STATE/run/hosts.ours"
  fi
}

start() {
  local nn=${1:-${GOEP_SLURM_NODES:-2}} i pid
  [[ "$nn" =~ ^[1-9][0-9]*$ ]] || { say "N must be a positive number of nodes, not '$nn'"; exit 2; }
  [[ "$CPUS" =~ ^[1-9][0-9]*$ ]] || { say "GOEP_SLURM_CPUS must be a positive number, not '$CPUS'"; exit 2; }
  [ "$(id -u)" = 0 ] || { say "run as root (it starts Slurm and munge daemons)"; exit 1; }
  ours || { say "$CONF exists and was not written by this script: set GOEP_SLURM_CONF_DIR"; exit 1; }
  "$ROOT/scripts/install-deps.sh" --slurm
  stop   # leftovers of an earlier run

  # munge: Slurm authenticates every message through it; the daemon runs as user munge.
  if ! munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
    [ -s /etc/munge/munge.key ] || runuser -u munge -- mungekey --create
    install -d -o munge -g munge -m 0755 /run/munge
    mkdir -p "$STATE/run"
    runuser -u munge -- munged   # forks; pid in /run/munge/munged.pid
    touch "$STATE/run/munge.ours"
    munge -n | unmunge >/dev/null
  fi

  rm -rf "$STATE/spool" "$STATE/tmp"
  mkdir -p "$CONF_DIR" "$STATE"/{run/daemons,log,spool/ctld}
  rm -f "$STATE"/log/*
  local names=() launch=()
  for i in $(seq "$nn"); do
    if [ "$NET" = 1 ]; then names+=("goep-h$i"); else names+=("n$i"); fi
    mkdir -p "$STATE/spool/${names[i - 1]}"
    [ "$NET" = 1 ] || install -d -m 1777 "$STATE/tmp/n$i"
  done
  if [ "$NET" = 1 ]; then
    # The hosts: kept if the emulated cluster is up with at least N hosts, else made (and
    # brought down again by stop).
    if [ "$("$HOSTS" hosts | grep -c . || true)" -lt "$nn" ]; then
      "$HOSTS" up "$nn"
      touch "$STATE/run/hosts.ours"
    fi
  fi
  # TaskProlog: lines "export NAME=value" on its stdout enter the task's environment. Not for
  # the batch script (no SLURM_STEP_ID): mpirun there would pass its OMPI_MCA_* variables on to
  # the ranks of every node, overriding their own (node n1's directory on n2 made both nodes'
  # segments collide, and MPI_Comm_split_type crashed in Open MPI 4.1.4).
  cat > "$STATE/taskprolog.sh" <<EOF
#!/bin/sh
[ -n "\$SLURM_STEP_ID" ] || exit 0
echo "export OMPI_MCA_btl_vader_backing_directory=$STATE/tmp/\$SLURMD_NODENAME"
EOF
  chmod 755 "$STATE/taskprolog.sh"
  # What differs between the modes: where the controller and the nodes are, each node's port
  # (one address for all on localhost), TmpFS, and the task prolog (hosts have their own /dev/shm).
  local ctld=localhost nodes tmpfs="TmpFS=$STATE/tmp/%n" prolog="TaskProlog=$STATE/taskprolog.sh" where="on localhost"
  nodes="NodeName=n[1-$nn] NodeHostname=localhost Port=[$((PORT_BASE + 1))-$((PORT_BASE + nn))] CPUs=$CPUS RealMemory=1000 State=UNKNOWN"
  if [ "$NET" = 1 ]; then
    ctld="goep-h1(10.213.0.1)" tmpfs="TmpFS=/tmp" prolog="" where="on hosts of their own (10.213.0.0/24)"
    # Feature goep_emulated: the hosts are namespaces of this one machine and share its cores
    # (study.sbatch then counts one real host, for the model's cost of sharing cores).
    nodes=$(for i in $(seq "$nn"); do
      echo "NodeName=goep-h$i NodeAddr=10.213.0.$i NodeHostname=goep-h$i CPUs=$CPUS RealMemory=1000 Features=goep_emulated State=UNKNOWN"
    done)
  fi
  cat > "$CONF.tmp" <<EOF
$MARK: a throw-away test cluster of $nn node(s) $where
ClusterName=goep
SlurmctldHost=$ctld
SlurmctldPort=$CTLD_PORT
AuthType=auth/munge
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$STATE/spool/ctld
SlurmdSpoolDir=$STATE/spool/%n
SlurmctldPidFile=$STATE/run/daemons/slurmctld.pid
SlurmdPidFile=$STATE/run/daemons/slurmd-%n.pid
SlurmctldLogFile=$STATE/log/slurmctld.log
SlurmdLogFile=$STATE/log/slurmd-%n.log
$tmpfs
$prolog
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
MpiDefault=pmix
ReturnToService=2
MailProg=/bin/true
$nodes
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
  mv "$CONF.tmp" "$CONF"

  # Foreground daemons in their own sessions: the pid is known at once, even if a daemon dies
  # before it writes its pid file, and stop can always find it.
  # In the network mode each runs on its host (slurmctld on goep-h1), entered in place.
  if [ "$NET" = 1 ]; then launch=("$HOSTS" exec goep-h1); fi
  "${launch[@]}" setsid slurmctld -D -c -f "$CONF" </dev/null >>"$STATE/log/slurmctld.out" 2>&1 &
  echo $! > "$STATE/run/slurmctld.pid"
  local n
  for i in $(seq "$nn"); do
    n=${names[i - 1]}
    if [ "$NET" = 1 ]; then launch=("$HOSTS" exec "$n"); fi
    "${launch[@]}" setsid slurmd -D -N "$n" -f "$CONF" </dev/null >>"$STATE/log/slurmd-$n.out" 2>&1 &
    echo $! > "$STATE/run/slurmd-$n.pid"
  done

  local deadline=$((SECONDS + WAIT)) idle=""
  while [ "$SECONDS" -lt "$deadline" ]; do
    if timeout 5 "${IN[@]}" scontrol ping >/dev/null 2>&1; then
      idle=$(timeout 5 "${IN[@]}" sinfo -h -t idle -o %D 2>/dev/null || true)
      [ "$idle" = "$nn" ] && break
    fi
    sleep 0.2
  done
  if [ "$idle" != "$nn" ]; then
    say "not all $nn node(s) idle after ${WAIT}s (idle: ${idle:-none})"
    timeout 5 "${IN[@]}" sinfo -N -l >&2 2>&1 || true
    logs
    stop
    exit 1
  fi
  say "up: $nn node(s) ${names[0]}..${names[nn - 1]} $where, $CPUS CPUs each; config $CONF, state $STATE"
  timeout 5 "${IN[@]}" sinfo >&2 || true
}

status() {
  local alive
  alive=$(pids_alive)
  if [ -z "$alive" ]; then
    echo "cluster.sh: no daemons running (state $STATE)"
    return 3
  fi
  echo "$alive" | sed 's/^/running: /'
  timeout 5 "${IN[@]}" scontrol ping && timeout 5 "${IN[@]}" sinfo
}

case "${1:-}" in
  start) start "${2:-}" ;;
  stop) stop ;;
  status) status ;;
  env) echo "export SLURM_CONF=$CONF" ;;
  *) sed -n '2,24p' "$0" >&2; exit 2 ;;
esac
