# Shared by the multihost and fault tests (sourced, not run): skipping with a reason, a
# namespace cluster that is deleted on exit, mpirun across its hosts, and checks on
# ringattn's JSON report.
# shellcheck shell=bash

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cluster_sh=$here/cluster.sh
cluster=""

skip() { echo "SKIPPED: $*"; exit 0; }
fail() { echo "FAILED: $*"; exit 1; }
note() { echo "-- $*"; }

# Skips (with the reason) where network namespaces cannot be made.
require_namespaces() {
  [ "$(id -u)" -eq 0 ] || skip "network namespaces for the test hosts need root"
  command -v ip >/dev/null || skip "ip not installed (scripts/deps.sh installs iproute2)"
  command -v unshare >/dev/null || skip "unshare not installed (util-linux)"
  unshare -n true 2>/dev/null || skip "this machine does not allow new network namespaces"
  ip link add ratprobe$$ type bridge 2>/dev/null || skip "cannot create a bridge (no CAP_NET_ADMIN)"
  ip link del ratprobe$$
}

require_mpi() {
  command -v mpirun >/dev/null || skip "mpirun not installed (scripts/deps.sh installs openmpi-bin)"
}

# Creates a cluster of $1 hosts for this shell, deleted when the script exits.
cluster_up() {
  cluster=rat$$
  trap cluster_down EXIT
  trap 'exit 130' INT TERM
  "$cluster_sh" up "$cluster" "$1"
  hostfile=$(mktemp /tmp/ringattn-hosts.XXXXXX)
  local i
  for ((i = 0; i < $1; i++)); do echo "h$i slots=1"; done > "$hostfile"
}

cluster_down() {
  [ -n "$cluster" ] && "$cluster_sh" down "$cluster"
  [ -n "${hostfile:-}" ] && rm -f "$hostfile"
  [ -n "${work:-}" ] && rm -rf "$work"
  return 0
}

on_host() {
  local i=$1
  shift
  "$cluster_sh" exec "$cluster" "$i" "$@"
}

# mpirun_hosts NP CMD...: NP ranks, one per host (h0 first), started from h0 through the
# namespace agent; TCP between hosts only (no shared memory), on the cluster's subnet.
mpirun_hosts() {
  local np=$1
  shift
  on_host 0 mpirun --allow-run-as-root --hostfile "$hostfile" -np "$np" --map-by node \
    --mca plm_rsh_agent "$here/netns_agent.sh" \
    --mca btl tcp,self --mca btl_tcp_if_include 10.77.0.0/24 \
    --mca oob_tcp_if_include 10.77.0.0/24 "$@"
}

# mpirun_packed HOSTS SLOTS CMD...: HOSTS x SLOTS ranks, SLOTS consecutive ranks per host (as
# mpirun and srun place ranks by node), otherwise as mpirun_hosts.
mpirun_packed() {
  local hosts=$1 slots=$2 i packed
  shift 2
  packed=$(mktemp /tmp/ringattn-hosts.XXXXXX)
  for ((i = 0; i < hosts; i++)); do echo "h$i slots=$slots"; done > "$packed"
  local rc=0
  on_host 0 mpirun --allow-run-as-root --hostfile "$packed" -np "$((hosts * slots))" \
    --map-by slot --mca plm_rsh_agent "$here/netns_agent.sh" \
    --mca btl tcp,self --mca btl_tcp_if_include 10.77.0.0/24 \
    --mca oob_tcp_if_include 10.77.0.0/24 "$@" || rc=$?
  rm -f "$packed"
  return $rc
}

# json_field FILE EXPR: evaluates a Python expression over `j`, the last line of FILE
# (ringattn --json's object).
json_field() {
  python3 -c 'import json,sys
j = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
print(eval(sys.argv[2]))' "$1" "$2"
}

# Seconds since the epoch, with milliseconds.
now() { date +%s.%N | cut -c1-14; }
elapsed() { python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.2f}')" "$1" "$2"; }
