#!/usr/bin/env bash
# Ulysses x ring on the CPU: P = 8 virtual ranks (threads of one process, one thread each;
# the transport is memcpy, so what this measures is how each split divides the compute and
# how long each rank waits, not a network), causal, forward and backward, every split
# (U, R) in {(1,8), (2,4), (4,2), (8,1)}: time, the most any rank stood waiting for a
# transfer, and the forward's bytes per rank (all-to-all and ring) beside their minima.
# Saved as bench/results/ulysses-cpu-<date>-<commit>.txt and .jsonl.
# Usage: bench/run_ulysses.sh [N] [H] [D]   (default 65536 8 32)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bin="${RINGATTN_BIN:-$root/build/ringattn}"
[ -x "$bin" ] || "$root/scripts/build.sh"
n=${1:-65536} h=${2:-8} d=${3:-32}
commit=$(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)
out="$root/bench/results/ulysses-cpu-$(date -u +%Y%m%d)-$commit.txt"
: > "${out%.txt}.jsonl"
{
  echo "# ringattn Ulysses x ring (CPU, 8 virtual ranks, 1 thread each)"
  echo "# command: bench/run_ulysses.sh $n $h $d   commit: $commit   date: $(date -u '+%Y-%m-%d %H:%M UTC')"
  echo "# machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores"
  echo "# B=1 N=$n H=$h D=$d causal, fp32; 0 warm-up + 1 timed iteration; exposed: max over ranks"
  printf '%-7s %10s %10s %12s %12s %14s %14s %14s %14s\n' "U x R" fwd_ms bwd_ms fwd_exposed \
    bwd_exposed a2a_bytes a2a_min ring_bytes ring_min
} | tee "$out"
for u in 1 2 4 8; do
  "$bin" run --ring-size 8 --ulysses "$u" --seq-len "$n" --heads "$h" --head-dim "$d" --causal \
    --backward --threads 1 --warmup 0 --iters 1 --quiet --json > "$out.run" 2>&1 ||
    { cat "$out.run"; exit 1; }
  tail -n 1 "$out.run" | python3 -c '
import json, sys
j = json.loads(sys.stdin.read())
u = j["ulysses"]
exp = lambda k: max(r["exposed_ms"] for r in j[k])
a2a, a2a_min = j.get("bytes_sent_a2a", 0), j.get("bytes_sent_a2a_min", 0)
ring = j.get("bytes_sent_ring", j["bytes_sent"])
ring_min = j.get("bytes_sent_ring_min", j["bytes_sent_min"])
row = dict(split=f"{u}x{8 // u}", fwd_ms=j["fwd_ms"], bwd_ms=j["bwd_ms"],
           fwd_exposed_ms=exp("fwd_ranks"), bwd_exposed_ms=exp("bwd_ranks"),
           a2a_bytes=a2a, a2a_min=a2a_min, ring_bytes=ring, ring_min=ring_min)
print("%-7s %10.1f %10.1f %12.1f %12.1f %14d %14d %14d %14d" % tuple(row.values()))
with open(sys.argv[1], "a") as f:
    f.write(json.dumps(row) + "\n")' "${out%.txt}.jsonl" | tee -a "$out"
  rm -f "$out.run"
done
echo "saved $out"
