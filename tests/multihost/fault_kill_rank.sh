#!/usr/bin/env bash
# Fault test (labels multihost, fault): rank 1 (on host h1) is SIGKILLed in the middle of a
# 3-host ring. The job must end promptly on every host, long before --timeout (the launcher
# sees the death, not the watchdog), with a failing exit code and no output file.
# Usage: fault_kill_rank.sh <ringattn binary>
set -euo pipefail
bin=$1
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$(dirname "$0")/lib.sh"
require_namespaces
require_mpi
prompt_s=10  # far below --timeout: the watchdog must not be what ends the job

cluster_up 3
work=$(mktemp -d /tmp/ringattn-kill.XXXXXX)
export RINGATTN_PROGRESS_INTERVAL=0
t0=$(now)
mpirun_hosts 3 -x RINGATTN_PROGRESS_INTERVAL "$bin" run --seq-len 6144 --heads 4 --head-dim 64 \
  --iters 500 --warmup 0 --threads 1 --timeout 60 --progress --backward \
  --out "$work/out.npy" > "$work/stdout" 2> "$work/stderr" &
job=$!
for _ in $(seq 1 600); do
  grep -q "^ringattn: forward, iteration 2/" "$work/stderr" && break
  kill -0 "$job" 2>/dev/null || { cat "$work/stderr"; fail "the job ended before the fault"; }
  sleep 0.02
done
victim=""
for p in $(ip netns pids "$cluster-h1"); do
  [ "$(ps -o comm= -p "$p" 2>/dev/null)" = ringattn ] && victim=$p
done
[ -n "$victim" ] || fail "no ringattn process on h1"
kill -9 "$victim"
t_kill=$(now)
note "rank 1 (pid $victim on h1) killed $(elapsed "$t0" "$t_kill") s after the start"

rc=0
for _ in $(seq 1 $((prompt_s * 10))); do kill -0 "$job" 2>/dev/null || break; sleep 0.1; done
if kill -0 "$job" 2>/dev/null; then
  kill -9 "$job" 2>/dev/null || true
  wait "$job" || true
  cat "$work/stderr"
  fail "the job was still running $prompt_s s after rank 1 was killed"
fi
wait "$job" || rc=$?
t_end=$(elapsed "$t_kill" "$(now)")
note "mpirun exited $rc, $t_end s after the kill"
for h in 0 1 2; do
  for p in $(ip netns pids "$cluster-h$h"); do
    [ "$(ps -o comm= -p "$p" 2>/dev/null)" = ringattn ] && fail "a rank is still running on h$h"
  done
done
grep -i "signal 9\|killed" "$work/stderr" | head -3 || true
[ "$rc" -ne 0 ] || fail "the job exited 0 although a rank was killed"
[ ! -e "$work/out.npy" ] || fail "an output file was written"
[ -z "$(find "$work" -name 'out.npy.tmp*')" ] || fail "temporary output files were left"
echo "PASSED: rank 1 killed: the whole job ended $t_end s later (exit $rc), no output"
