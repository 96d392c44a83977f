#!/usr/bin/env bash
# Fault test (labels multihost, fault): host h1's link goes down in the middle of a 3-host
# ring, during the forward or the backward pass. Every rank must end within --timeout plus
# a few seconds, each printing "rank R: error:" with the ring step and peer it waited for
# (or the collective it was in); the job exits 3 and writes no output file.
# Usage: fault_link_down.sh <ringattn binary> forward|backward
set -euo pipefail
bin=$1
phase=$2
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$(dirname "$0")/lib.sh"
require_namespaces
require_mpi
timeout_s=3
slack_s=5

cluster_up 3
work=$(mktemp -d /tmp/ringattn-linkdown.XXXXXX)
args=(run --seq-len 6144 --heads 4 --head-dim 64 --iters 500 --warmup 0 --threads 1
  --timeout "$timeout_s" --progress --out "$work/out.npy")
[ "$phase" = backward ] && args+=(--backward)

# A progress line at every change (rank 0's stderr) tells when the wanted phase has begun.
export RINGATTN_PROGRESS_INTERVAL=0
t0=$(now)
mpirun_hosts 3 -x RINGATTN_PROGRESS_INTERVAL "$bin" "${args[@]}" > "$work/stdout" 2> "$work/stderr" &
job=$!
# The second call of the phase: the ring is connected and running at full speed.
for _ in $(seq 1 600); do
  [ "$(grep -c "^ringattn: $phase, iteration 2/" "$work/stderr" || true)" -gt 0 ] && break
  kill -0 "$job" 2>/dev/null || { cat "$work/stderr"; fail "the job ended before the fault"; }
  sleep 0.02
done
"$cluster_sh" link "$cluster" 1 down
t_down=$(now)
note "link of h1 down $(elapsed "$t0" "$t_down") s after the start, during the $phase pass"

ranks_alive() {
  local h pids
  for h in 0 1 2; do
    pids=$(ip netns pids "$cluster-h$h" 2>/dev/null || true)
    # shellcheck disable=SC2086
    [ -n "$pids" ] && ps -o comm= -p $pids 2>/dev/null | grep -q '^ringattn$' && echo "h$h"
  done
  return 0
}
deadline=$((timeout_s + slack_s))
gone=""
while :; do
  alive=$(ranks_alive)
  t=$(elapsed "$t_down" "$(now)")
  [ -z "$alive" ] && { gone=$t; break; }
  python3 -c "import sys; sys.exit(float(sys.argv[1]) > $deadline)" "$t" || break
  sleep 0.1
done
[ -n "$gone" ] || { cat "$work/stderr"; fail "ranks still running on $alive ${deadline} s after the link went down"; }
note "every rank ended $gone s after the link went down (--timeout $timeout_s)"

# mpirun itself waits for h1's daemon, which it cannot reach: give the link back so the
# launcher can wind down, as a real cluster's would once the node returns or is fenced.
"$cluster_sh" link "$cluster" 1 up
rc=0
for _ in $(seq 1 200); do kill -0 "$job" 2>/dev/null || break; sleep 0.1; done
if kill -0 "$job" 2>/dev/null; then
  kill -9 "$job" 2>/dev/null || true
  note "mpirun did not exit 20 s after the link returned (killed)"
fi
wait "$job" || rc=$?
note "mpirun exited $rc $(elapsed "$t0" "$(now)") s after the start"
grep "error:" "$work/stderr" || true

for r in 0 1 2; do
  grep -q "^ringattn: rank $r: error: " "$work/stderr" || fail "rank $r printed no error"
done
grep -Eq "rank [0-9]: error: ring step [0-9]+ \(($phase K/V|dK/dV return)\) did not complete within $timeout_s s \(--timeout\): (receiving|sending) [0-9]+ bytes (from|to) rank [0-9]" \
  "$work/stderr" || fail "no rank named the $phase ring step and the peer it waited for"
# Ranks that were past their last exchange when the link went down wait in a collective.
if grep "error:" "$work/stderr" | grep -Ev "ring step [0-9]+ \(.*\) did not complete|did not complete within $timeout_s s \(--timeout\), waiting for" | grep -q .; then
  fail "a rank failed for another reason than the lost link"
fi
[ "$rc" -eq 3 ] || fail "exit code $rc, want 3"
[ ! -e "$work/out.npy" ] || fail "an output file was written"
[ -z "$(find "$work" -name 'out.npy.tmp*')" ] || fail "temporary output files were left"
echo "PASSED: link down in the $phase pass: all ranks ended ${gone} s after it (--timeout $timeout_s), exit 3, no output"
