#!/usr/bin/env bash
# A cluster of 2-3 "hosts" on one machine for the multihost and fault tests: each host is a
# Linux network namespace with its own address (10.77.0.1, .2, ...) and its own host name
# (h0, h1, ...), joined by veth pairs to a bridge that lives in a namespace of its own, so
# nothing is added to the machine's own network and nothing leaves it.
#
#   cluster.sh up NAME N            create hosts NAME-h0..NAME-h<N-1> and the switch NAME-sw
#   cluster.sh down NAME            kill what runs in them and delete them (idempotent)
#   cluster.sh exec NAME I CMD...   run CMD on host I (its namespace and host name)
#   cluster.sh daemon NAME I CMD... the same, but keeping the machine's /sys (and with it
#                                   /sys/fs/cgroup, which slurmd needs); no /etc/hosts
#   cluster.sh link NAME I up|down  take host I's link up or down (its end of the veth)
#   cluster.sh tc NAME I ARGS...    `tc qdisc ARGS` on host I's link, e.g. add dev eth0 ...
#   cluster.sh reap                 delete clusters whose owner process is gone
#
# NAME must be "rat<pid>" for the process that owns the cluster: `reap` (run by every `up`)
# deletes the clusters of dead owners, so an interrupted run leaves nothing behind for long.
# Inside a host, /etc/hosts (via /etc/netns/<ns>/hosts, which `ip netns exec` mounts) names
# every host, and $RINGATTN_CLUSTER names the cluster for netns_agent.sh.
set -euo pipefail

subnet_prefix=10.77.0
die() { echo "cluster.sh: $*" >&2; exit 1; }

check_name() {
  [[ $1 =~ ^rat[0-9]+$ ]] || die "cluster name must be rat<owner pid>, got '$1'"
}

host_ns() { echo "$1-h$2"; }

hosts_of() {
  ip netns list | awk '{print $1}' | grep -E "^$1-h[0-9]+$" || true
}

down() {
  local name=$1 ns
  check_name "$name"
  for ns in $(hosts_of "$name") "$name-sw"; do
    if ip netns list | awk '{print $1}' | grep -qx "$ns"; then
      # Every process left in the namespace was started by this cluster's user (daemons,
      # ranks); kill them by id so that deleting the namespace really frees it.
      local pids
      pids=$(ip netns pids "$ns" 2>/dev/null || true)
      if [ -n "$pids" ]; then
        # shellcheck disable=SC2086
        kill -9 $pids 2>/dev/null || true
      fi
      ip netns del "$ns" 2>/dev/null || true
    fi
    rm -rf "/etc/netns/$ns"
  done
}

reap() {
  local ns owner
  for ns in $(ip netns list | awk '{print $1}' | grep -E '^rat[0-9]+-(sw|h[0-9]+)$' || true); do
    owner=${ns%%-*}
    owner=${owner#rat}
    if [ ! -d "/proc/$owner" ]; then
      down "rat$owner"
    fi
  done
}

up() {
  local name=$1 n=$2 i ns hosts
  check_name "$name"
  [[ $n =~ ^[2-9]$ ]] || die "hosts: 2 to 9, got '$n'"
  reap
  down "$name"
  ip netns add "$name-sw"
  ip -n "$name-sw" link add br0 type bridge
  ip -n "$name-sw" link set br0 up
  hosts="127.0.0.1 localhost"$'\n'
  for ((i = 0; i < n; i++)); do
    hosts+="$subnet_prefix.$((i + 1)) h$i"$'\n'
  done
  for ((i = 0; i < n; i++)); do
    ns=$(host_ns "$name" "$i")
    ip netns add "$ns"
    mkdir -p "/etc/netns/$ns"
    printf '%s' "$hosts" > "/etc/netns/$ns/hosts"
    ip link add eth0 netns "$ns" type veth peer name "p$i" netns "$name-sw"
    ip -n "$name-sw" link set "p$i" master br0 up
    ip -n "$ns" addr add "$subnet_prefix.$((i + 1))/24" dev eth0
    ip -n "$ns" link set lo up
    ip -n "$ns" link set eth0 up
  done
  # The bridge forwards as soon as its ports have carrier (no STP); wait for every link.
  local state
  for ((i = 0; i < n; i++)); do
    for _ in $(seq 1 50); do
      state=$(ip -n "$(host_ns "$name" "$i")" -br link show eth0 | awk '{print $2}')
      [ "$state" = UP ] && break
      sleep 0.1
    done
    [ "$state" = UP ] || die "host h$i's link did not come up ($state)"
  done
}

run_on() {
  local name=$1 i=$2
  shift 2
  check_name "$name"
  local ns
  ns=$(host_ns "$name" "$i")
  ip netns list | awk '{print $1}' | grep -qx "$ns" || die "no host h$i in cluster $name"
  # A UTS namespace per command gives the host its own name (Open MPI and Slurm tell hosts
  # apart by name).
  # shellcheck disable=SC2016 # $0 and $@ are for the inner shell
  RINGATTN_CLUSTER=$name exec ip netns exec "$ns" unshare --uts \
    sh -c 'hostname "$0" && exec "$@"' "h$i" "$@"
}

# `ip netns exec` mounts a fresh /sys for the namespace, which hides the cgroup mounts;
# nsenter enters only the network namespace.
daemon_on() {
  local name=$1 i=$2
  shift 2
  check_name "$name"
  local ns
  ns=$(host_ns "$name" "$i")
  [ -e "/var/run/netns/$ns" ] || die "no host h$i in cluster $name"
  # shellcheck disable=SC2016 # $0 and $@ are for the inner shell
  RINGATTN_CLUSTER=$name exec nsenter --net="/var/run/netns/$ns" unshare --uts \
    sh -c 'hostname "$0" && exec "$@"' "h$i" "$@"
}

cmd=${1:-}
case "$cmd" in
  up) [ $# -eq 3 ] || die "usage: up NAME N"; up "$2" "$3" ;;
  down) [ $# -eq 2 ] || die "usage: down NAME"; down "$2" ;;
  exec) [ $# -ge 4 ] || die "usage: exec NAME I CMD..."; shift; run_on "$@" ;;
  daemon) [ $# -ge 4 ] || die "usage: daemon NAME I CMD..."; shift; daemon_on "$@" ;;
  link)
    [ $# -eq 4 ] || die "usage: link NAME I up|down"
    check_name "$2"
    ip -n "$(host_ns "$2" "$3")" link set eth0 "$4"
    ;;
  tc)
    [ $# -ge 4 ] || die "usage: tc NAME I ARGS..."
    check_name "$2"
    ns=$(host_ns "$2" "$3")
    shift 3
    ip netns exec "$ns" tc qdisc "$@"
    ;;
  reap) reap ;;
  *) die "usage: cluster.sh up|down|exec|daemon|link|tc|reap ..." ;;
esac
