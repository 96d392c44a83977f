#!/usr/bin/env bash
# Open MPI's remote launch agent for the namespace cluster (cluster.sh), used in place of ssh
# (`--mca plm_rsh_agent`): `netns_agent.sh hN COMMAND...` runs COMMAND, which mpirun builds
# as a shell command line as it would for ssh, on host hN of cluster $RINGATTN_CLUSTER.
set -euo pipefail
host=$1
shift
[[ $host =~ ^h([0-9]+)$ ]] || { echo "netns_agent.sh: unknown host '$host'" >&2; exit 255; }
[ -n "${RINGATTN_CLUSTER:-}" ] || { echo "netns_agent.sh: RINGATTN_CLUSTER is not set" >&2; exit 255; }
here=$(cd "$(dirname "$0")" && pwd)
# Like sshd: the words form one command line for a shell on the remote host.
exec "$here/cluster.sh" exec "$RINGATTN_CLUSTER" "${BASH_REMATCH[1]}" sh -c "$*"
