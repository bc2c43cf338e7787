#!/usr/bin/env bash
# cluster.sh: an emulated cluster on this machine: N hosts that share nothing but a network. Root.
#
#   scripts/cluster/cluster.sh up N [--slots S] [--rate R] [--delay D]
#       N hosts goep-h1..goep-hN. Each is a network namespace (its own interfaces, addresses and
#       ports), a UTS namespace (its own hostname) and a mount view of its own for every command
#       run in it (its own /tmp, /dev/shm, /sys and /etc/hosts; everything else, the repository
#       included, is the machine's; see inhost below for why not one mount namespace). Host i
#       has eth0 = 10.213.0.i/24, a veth link to a bridge that lives in a namespace of its own
#       (goep-br), so the machine's own network is not touched and no traffic leaves the
#       project's namespaces (no route, no address outside 10.213.0.0/24). Each link is capped in
#       both directions with tc: --rate (default 10gbit) and --delay (default 5us; needs the
#       kernel's netem: without it the default is dropped with a note, an explicit --delay fails).
#       Writes the hostfile (S slots per host, default 2) and the Open MPI settings (env) under
#       /run/NAME-cluster. Idempotent: a cluster already up with the same settings is kept; one
#       with other settings, or the remains of a crashed one, is removed first.
#   scripts/cluster/cluster.sh down
#       kill every process left in the hosts, remove namespaces, links, bridge and files. Safe to
#       run at any time, also after a failure; exit 0 when nothing is left.
#   scripts/cluster/cluster.sh status     hosts, addresses, caps; exit 3 when no cluster is up
#   scripts/cluster/cluster.sh exec HOST CMD [ARGS...]
#       run CMD inside HOST (goep-hI, hI, I or 10.213.0.I) in the current directory, with this
#       environment. scripts/cluster/rsh is the same for mpirun (its plm_rsh_agent).
#   scripts/cluster/cluster.sh hosts      the host names, one a line
#   scripts/cluster/cluster.sh check      leftovers of a cluster (namespaces, links, processes):
#                                         prints them and exits 1, or exits 0 when there are none
#
# Programs go across the hosts with scripts/cluster/mpirun (mpirun run on goep-h1 with the
# hostfile and every setting the emulated network needs), e.g.
#   scripts/cluster/cluster.sh up 2 && scripts/cluster/mpirun -np 4 bin/mpi-hello
# Environment: GOEP_CLUSTER_NAME (default goep): clusters of different names live side by side
# (namespaces NAME-br, NAME-h1.., each its own bridge, so even the subnet does not clash; host
# names are goep-hI in every one), for concurrent test runs on one machine. GOEP_CLUSTER_DIR
# (default /run/NAME-cluster; not under /tmp or /dev/shm, which every host has its own of).
set -euo pipefail

NAME=${GOEP_CLUSTER_NAME:-goep}
[[ "$NAME" =~ ^[a-z][a-z0-9]{0,11}$ ]] || { echo "cluster.sh: GOEP_CLUSTER_NAME=$NAME: want a lower-case letter, then up to 11 letters or digits" >&2; exit 2; }
DIR=${GOEP_CLUSTER_DIR:-/run/$NAME-cluster}
PROJECT=$(cd "$(dirname "$0")/../.." && pwd)  # the checkout these scripts are in
NET=10.213.0          # the private test subnet, /24 (each cluster has its own bridge)
PREFIX=$NAME          # namespaces NAME-br, NAME-h1..
HOSTNAME_PREFIX=goep  # host names goep-h1.., in every cluster
BRNS=$PREFIX-br
LOCK=$DIR.lock
HERE=$(cd "$(dirname "$0")" && pwd)

say() { echo "cluster.sh: $*" >&2; }
die() { say "$*"; exit 1; }

# host_ns I: the network namespace name of host I (its UTS namespace is bound to $DIR/ns/hI.uts).
host_ns() { echo "$PREFIX-h$1"; }

# cluster_hosts: the host indices of the cluster that exists (from its network namespaces).
cluster_hosts() {
  ip netns list 2>/dev/null | awk '{print $1}' | sed -n "s/^$PREFIX-h\([0-9][0-9]*\)\$/\1/p" | sort -n
}

# resolve NAME: the host index of goep-hI, hI, I or 10.213.0.I (no output if none).
resolve() {
  local n=$1
  n=${n#"$HOSTNAME_PREFIX"-h}
  n=${n#h}
  n=${n#"$NET".}
  if [[ "$n" =~ ^[1-9][0-9]*$ ]] && [ -e "/run/netns/$(host_ns "$n")" ]; then echo "$n"; fi
}

# ns_inodes: the inode of every network namespace of the cluster, one a line.
ns_inodes() {
  local f
  for f in /run/netns/"$PREFIX"-br /run/netns/"$PREFIX"-h*; do
    [ -e "$f" ] && stat -L -c %i "$f" 2>/dev/null
  done
  return 0
}

# ns_pids: processes whose network namespace is one of the cluster's.
ns_pids() {
  local inodes p ino
  inodes=$(ns_inodes | sort -u)
  [ -n "$inodes" ] || return 0
  for p in /proc/[0-9]*; do
    ino=$(stat -L -c %i "$p/ns/net" 2>/dev/null) || continue
    grep -qx "$ino" <<<"$inodes" && echo "${p#/proc/}"
  done
  return 0
}

# preflight: refuse clearly where the cluster cannot be made.
preflight() {
  [ "$(id -u)" = 0 ] || die "run as root: it creates network, UTS and mount namespaces, veth links and a bridge"
  "$HERE/../install-deps.sh" --cluster
  local t
  for t in ip tc nsenter unshare mount umount flock ping; do
    command -v "$t" >/dev/null || die "$t not found (iproute2, util-linux): install it first"
  done
  unshare --net --uts --mount true 2>/dev/null ||
    die "this system refuses new network/UTS/mount namespaces (unshare --net --uts --mount fails): a container without CAP_SYS_ADMIN, or a kernel without namespaces"
}

# delete every trace of a cluster. Never fails.
teardown() {
  local pids i f
  # 1. processes inside the hosts (mpirun, orted, ranks, slurmd, ...): TERM, then KILL.
  pids=$(ns_pids | xargs)
  if [ -n "$pids" ]; then
    say "stopping processes left in the hosts: $pids"
    # shellcheck disable=SC2086
    kill -TERM $pids 2>/dev/null || true
    for _ in $(seq 30); do
      [ -z "$(ns_pids)" ] && break
      sleep 0.1
    done
    pids=$(ns_pids | xargs)
    # shellcheck disable=SC2086
    [ -z "$pids" ] || kill -KILL $pids 2>/dev/null || true
    for _ in $(seq 30); do
      [ -z "$(ns_pids)" ] && break
      sleep 0.1
    done
  fi
  # 2. the bridge namespace: deleting it deletes the bridge and every veth pair (both ends).
  [ ! -e "/run/netns/$BRNS" ] || ip netns delete "$BRNS" 2>/dev/null || true
  # 3. every mount under the state directory (the hosts' UTS namespace files, the memory file
  # system), deepest first, then the hosts' network namespaces.
  for f in $(awk -v d="$DIR" '$2 == d || index($2, d "/") == 1 { print $2 }' /proc/self/mounts | sort -r); do
    umount "$f" 2>/dev/null || umount -l "$f" 2>/dev/null || true
  done
  for i in $(cluster_hosts); do ip netns delete "$(host_ns "$i")" 2>/dev/null || true; done
  rm -rf "$DIR"
}

# leftovers: what of a cluster exists, one line each.
leftovers() {
  local x
  x=$(ip netns list 2>/dev/null | awk '{print $1}' | grep "^$PREFIX-" | xargs || true)
  [ -z "$x" ] || echo "network namespaces: $x"
  x=$(ns_pids | xargs)
  [ -z "$x" ] || echo "processes in them: $x"
  x=$(ip -o link show 2>/dev/null | awk -F': ' '{print $2}' | grep "^$PREFIX-" | xargs || true)
  [ -z "$x" ] || echo "links in the root namespace: $x"
  if [ -e "$DIR" ]; then echo "state directory: $DIR"; fi
  x=$(awk -v d="$DIR" '$2 == d || index($2, d "/") == 1 { print $2 }' /proc/self/mounts | xargs)
  [ -z "$x" ] || echo "mounts: $x"
  return 0
}

# up N RATE DELAY SLOTS DELAY_EXPLICIT
up() {
  local n=$1 rate=$2 delay=$3 slots=$4 explicit=$5 i ns want
  want="hosts=$n rate=$rate delay=$delay slots=$slots"
  # netem (for --delay), probed in a throw-away namespace before anything existing is touched.
  if [ "$delay" != 0 ] && ! unshare --net tc qdisc add dev lo root netem delay "$delay" 2>/dev/null; then
    [ "$explicit" = 0 ] || die "--delay $delay needs the netem qdisc, which this kernel lacks (CONFIG_NET_SCH_NETEM)"
    say "note: this kernel has no netem qdisc: no latency is added (the links keep the $rate cap)"
    delay=0
  fi
  if [ -f "$DIR/settings" ] && [ "$(cat "$DIR/settings")" = "$want" ] && healthy "$n"; then
    say "already up: $want"
    return 0
  fi
  [ -z "$(leftovers)" ] || { say "removing an earlier cluster first"; teardown; }
  # The rollback if anything below fails: nothing half-made stays.
  trap 'rc=$?; if [ $rc != 0 ]; then say "up failed (exit $rc): removing what was made"; teardown; fi' EXIT

  # Everything lives in a memory file system of the cluster's own: the hosts' /tmp and /dev/shm
  # (shared-memory transports want memory, not disk), and the namespace files, which must be
  # bound on a mount that is not shared.
  mkdir -p "$DIR"
  mount -t tmpfs -o mode=755 "$NAME-cluster" "$DIR"
  mount --make-private "$DIR"
  mkdir -p "$DIR/ns"
  {
    echo "127.0.0.1 localhost"
    echo "::1 localhost ip6-localhost ip6-loopback"
    for i in $(seq "$n"); do echo "$NET.$i $HOSTNAME_PREFIX-h$i"; done
  } >"$DIR/hosts"
  for i in $(seq "$n"); do echo "$HOSTNAME_PREFIX-h$i slots=$slots"; done >"$DIR/hostfile"

  ip netns add "$BRNS"
  ip -n "$BRNS" link set lo up
  ip -n "$BRNS" link add br0 type bridge
  ip -n "$BRNS" link set br0 up
  for i in $(seq "$n"); do
    ns=$(host_ns "$i")
    ip netns add "$ns"
    ip -n "$ns" link set lo up
    ip netns exec "$ns" sysctl -q -w net.ipv6.conf.all.disable_ipv6=1 net.ipv6.conf.default.disable_ipv6=1 >/dev/null
    ip -n "$BRNS" link add "p$i" type veth peer name eth0 netns "$ns"
    ip -n "$BRNS" link set "p$i" master br0 up
    ip -n "$ns" addr add "$NET.$i/24" dev eth0
    ip -n "$ns" link set eth0 up
    # The cap, both ways: the host's egress on eth0, its ingress as the bridge port's egress.
    cap "$ns" eth0 "$rate" "$delay"
    cap "$BRNS" "p$i" "$rate" "$delay"
    # The host's own /tmp and /dev/shm (bound in its mount view) and its hostname (a UTS
    # namespace bound to a file, so that every process started in the host shares it).
    install -d -m 1777 "$DIR/h$i/tmp" "$DIR/h$i/shm"
    mkdir -p "$DIR/h$i/cgroup"   # where the machine's cgroups wait while /sys is remounted
    mkdir -p "$DIR/h$i/cwd"      # where the project, if under /tmp, waits while /tmp is bound
    # A boot id of its own: UCX takes the kernel's boot id for the machine's identity, and with
    # the same one on every host it moves "remote" one-sided data through shared memory and
    # cross-memory attach (the hosts share the PID namespace), never through the network.
    cat /proc/sys/kernel/random/uuid >"$DIR/h$i/boot_id"
    touch "$DIR/ns/h$i.uts"
    unshare --uts="$DIR/ns/h$i.uts" hostname "$HOSTNAME_PREFIX-h$i"
  done
  writeenv
  echo "$want" >"$DIR/settings"   # as asked for: what up compares with the next time
  echo "hosts=$n rate=$rate delay=$delay slots=$slots" >"$DIR/effective"
  # A loaded machine may take a moment before the new links carry a first ping.
  local try
  for try in $(seq 10); do
    healthy "$n" && break
    [ "$try" = 10 ] && die "the hosts cannot reach each other (ping over $NET.0/24 failed 10 times, 1 s apart)"
    sleep 1
  done
  trap - EXIT
  local lat=""
  [ "$delay" = 0 ] || lat=" and $delay"
  say "up: $n host(s) $HOSTNAME_PREFIX-h1..$HOSTNAME_PREFIX-h$n on $NET.0/24 (cluster $NAME), links capped at $rate$lat each way, $slots slots each"
  say "hostfile $DIR/hostfile; run programs with $HERE/mpirun -np K PROGRAM"
}

# cap NS DEV RATE DELAY: tc caps on DEV's egress: netem (rate and delay) or, with no delay, tbf.
cap() {
  local ns=$1 dev=$2 rate=$3 delay=$4 burst
  if [ "$delay" != 0 ]; then
    tc -n "$ns" qdisc add dev "$dev" root netem delay "$delay" rate "$rate" limit 10000
    return
  fi
  # tbf: the bucket holds at least 128 KiB (a GSO packet of 64 KiB must fit) or 100 us at the rate.
  burst=$(rate_bytes "$rate")
  burst=$((burst / 10000))
  [ "$burst" -ge 131072 ] || burst=131072
  tc -n "$ns" qdisc add dev "$dev" root tbf rate "$rate" burst "$burst" latency 50ms
}

# rate_bytes RATE: bytes per second of a tc rate (10gbit, 800mbit, 100kbit, 1000000).
rate_bytes() {
  local r=${1,,} m=1
  case "$r" in
    *gbit) m=125000000 r=${r%gbit} ;;
    *mbit) m=125000 r=${r%mbit} ;;
    *kbit) m=125 r=${r%kbit} ;;
    *bit) m=1 r=${r%bit}; echo $((r / 8)); return ;;
  esac
  echo $((r * m))
}

# healthy N: every host of 1..N exists and reaches host 1 and host N.
healthy() {
  local n=$1 i
  [ "$(cluster_hosts | xargs)" = "$(seq -s ' ' "$n")" ] || return 1
  [ -e "/run/netns/$BRNS" ] && [ -f "$DIR/env" ] || return 1
  for i in $(seq "$n"); do
    [ -e "$DIR/ns/h$i.uts" ] || return 1
    inhost "$i" ping -c 1 -W 2 "$NET.1" >/dev/null 2>&1 || return 1
    inhost "$i" ping -c 1 -W 2 "$NET.$n" >/dev/null 2>&1 || return 1
  done
}

# inhost I CMD...: run CMD in host I, in the current directory: in its network and UTS namespaces
# and in a mount namespace of its own where the host's directories are bound over /tmp and
# /dev/shm, a sysfs of the host's network namespace over /sys (Open MPI and UCX read interfaces
# there) with the machine's cgroups kept at /sys/fs/cgroup (slurmd needs them), the cluster's
# host table over /etc/hosts, and the host's own boot id over the kernel's (UCX tells machines
# apart by it: with one boot id it joins "hosts" through shared memory, bypassing the network). The mount view is made afresh for each
# command rather than kept in a persistent namespace: a namespace file bound after a host's view
# was copied is not visible in it, and pid 1's namespaces, the way back, may be out of reach.
inhost() {
  inhost_argv "$@"
  "${ARGV[@]}"
}

# inhost_argv I CMD...: sets ARGV to the command line of inhost (exec runs it in place, so that
# the caller's pid becomes CMD's: a daemon started in the background keeps the pid it was given).
inhost_argv() {
  local i=$1
  shift
  ARGV=(nsenter --net="/run/netns/$(host_ns "$i")" --uts="$DIR/ns/h$i.uts"
    unshare --mount --propagation private /bin/sh -ec '
      # The project stays visible where it is, also in a clone under /tmp: every host sees
      # it (the programs mpirun starts), and only the rest of /tmp is the host'"'"'s own.
      case "$4" in /tmp/?*) mount --bind "$4" "$1/h$2/cwd" ;; esac
      mount --bind "$1/h$2/tmp" /tmp
      case "$4" in /tmp/?*) mkdir -p "$4" && mount --bind "$1/h$2/cwd" "$4" ;; esac
      mount --bind "$1/h$2/shm" /dev/shm
      if mountpoint -q /sys/fs/cgroup; then mount --rbind /sys/fs/cgroup "$1/h$2/cgroup"; fi
      mount -t sysfs "goep-h$2-sys" /sys
      if mountpoint -q "$1/h$2/cgroup"; then mount --move "$1/h$2/cgroup" /sys/fs/cgroup; fi
      mount --bind "$1/hosts" /etc/hosts
      mount --bind "$1/h$2/boot_id" /proc/sys/kernel/random/boot_id
      cd "$3"
      shift 4
      exec "$@"' inhost "$DIR" "$i" "$PWD" "$PROJECT" "$@")
}

# writeenv: the Open MPI settings every launch across the hosts needs, as export lines.
writeenv() {
  cat >"$DIR/env" <<EOF
# Open MPI settings for the emulated cluster (written by scripts/cluster/cluster.sh up).
# mpirun reaches the hosts through the rsh agent (no sshd), with this hostfile:
export OMPI_MCA_plm_rsh_agent=$DIR/rsh
export OMPI_MCA_orte_default_hostfile=$DIR/hostfile
# Daemons and TCP messages only on the test subnet:
export OMPI_MCA_oob_tcp_if_include=$NET.0/24
export OMPI_MCA_btl_tcp_if_include=$NET.0/24
# Shared memory (vader) within a host, TCP between hosts:
export OMPI_MCA_btl=self,vader,tcp
# The hosts share this machine's cores: more ranks than cores, no binding to cores that other
# hosts use too.
export OMPI_MCA_rmaps_base_oversubscribe=1
export OMPI_MCA_hwloc_base_binding_policy=none
EOF
  if [ "$(id -u)" = 0 ]; then
    echo "export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1" >>"$DIR/env"
  fi
  # The agent names this cluster itself: orted on another host runs it with a fresh environment.
  cat >"$DIR/rsh" <<EOF
#!/bin/sh
GOEP_CLUSTER_NAME=$NAME GOEP_CLUSTER_DIR=$DIR exec $HERE/rsh "\$@"
EOF
  chmod 755 "$DIR/rsh"
}

status() {
  local hosts i
  hosts=$(cluster_hosts | xargs)
  if [ -z "$hosts" ]; then
    echo "cluster.sh: no cluster is up"
    return 3
  fi
  echo "settings: $(cat "$DIR/effective" 2>/dev/null || echo unknown)"
  for i in $hosts; do
    echo "$HOSTNAME_PREFIX-h$i $(inhost "$i" hostname 2>/dev/null) $(ip -n "$(host_ns "$i")" -4 -o addr show dev eth0 2>/dev/null | awk '{print $4}')" \
      "qdisc: $(tc -n "$(host_ns "$i")" qdisc show dev eth0 2>/dev/null | head -n 1)"
  done
  local pids
  pids=$(ns_pids | xargs)
  echo "processes in the hosts: ${pids:-none}"
}

usage() { sed -n '2,32p' "$0" >&2; exit 2; }

cmd=${1:-}
[ $# -eq 0 ] || shift
case "$cmd" in
  up)
    n="" rate=10gbit delay=5us slots=2 explicit=0
    while [ $# -gt 0 ]; do
      case "$1" in
        --rate) rate=${2:?--rate needs a value}; shift 2 ;;
        --rate=*) rate=${1#*=}; shift ;;
        --delay) delay=${2:?--delay needs a value}; explicit=1; shift 2 ;;
        --delay=*) delay=${1#*=}; explicit=1; shift ;;
        --slots) slots=${2:?--slots needs a value}; shift 2 ;;
        --slots=*) slots=${1#*=}; shift ;;
        -h | --help) usage ;;
        -*) die "unknown flag $1 (want --rate R, --delay D, --slots S)" ;;
        *) [ -z "$n" ] || die "one host count only (got $n and $1)"; n=$1; shift ;;
      esac
    done
    [[ "$n" =~ ^[1-9][0-9]*$ ]] && [ "$n" -le 200 ] || die "up N: N must be a number of hosts from 1 to 200, not '${n}'"
    [[ "$rate" =~ ^[1-9][0-9]*([kmg]?bit)$ ]] || die "--rate $rate: want a tc rate such as 10gbit, 800mbit"
    [[ "$delay" =~ ^(0|[1-9][0-9]*(us|ms))$ ]] || die "--delay $delay: want 0 or a time such as 5us, 1ms"
    [[ "$slots" =~ ^[1-9][0-9]*$ ]] || die "--slots $slots: want a positive number of slots per host"
    [ "$delay" != 0 ] || explicit=0
    case "$DIR" in /tmp/* | /dev/shm/*) die "GOEP_CLUSTER_DIR=$DIR: every host has its own /tmp and /dev/shm; use a directory elsewhere" ;; esac
    preflight
    mkdir -p "$(dirname "$LOCK")"
    exec 9>"$LOCK"
    flock -w 60 9 || die "another cluster.sh up/down holds $LOCK"
    up "$n" "$rate" "$delay" "$slots" "$explicit"
    ;;
  down)
    [ "$(id -u)" = 0 ] || die "run as root"
    mkdir -p "$(dirname "$LOCK")"
    exec 9>"$LOCK"
    flock -w 60 9 || die "another cluster.sh up/down holds $LOCK"
    teardown
    rm -f "$LOCK"
    left=$(leftovers)
    [ -z "$left" ] || die "still there after down: $left"
    say "down: nothing left"
    ;;
  check)
    left=$(leftovers)
    if [ -n "$left" ]; then echo "$left"; exit 1; fi
    ;;
  status) status ;;
  hosts) for i in $(cluster_hosts); do echo "$HOSTNAME_PREFIX-h$i"; done ;;
  exec)
    [ $# -ge 2 ] || die "exec HOST CMD [ARGS...]"
    i=$(resolve "$1")
    [ -n "$i" ] || die "exec: no host '$1' in cluster $NAME (hosts: $(cluster_hosts | sed "s/^/$HOSTNAME_PREFIX-h/" | xargs))"
    shift
    inhost_argv "$i" "$@"
    exec "${ARGV[@]}"
    ;;
  *) usage ;;
esac
