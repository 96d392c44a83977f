#!/usr/bin/env bash
# CPU ring benchmark on this machine: strong scaling (N fixed) and weak scaling (N/P fixed)
# for P = 1, 2, 4 ranks, dense and dilated, forward and backward. Prints per-rank compute,
# communication, exposed communication and bytes sent, the dilated traffic next to what a
# dense ring would send, and causal compute imbalance (max/mean over ranks). Output is
# saved as bench/results/ring-<date>.txt, its rows also as JSON lines in ring-<date>.jsonl
# (bench/plot_all.py plots them). Ranks share this machine's cores: with P ranks
# each gets cores/P threads (at least 1), so P=4 on 2 cores is oversubscribed.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bin="${RINGATTN_BIN:-$root/build/ringattn}"
[ -x "$bin" ] || "$root/scripts/build.sh"
commit=$(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)
out="$root/bench/results/ring-$(date -u +%Y%m%d-%H%M).txt"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
{
echo "# ringattn ring benchmark (CPU, MPI)"
echo "# command: bench/run_ring.sh   commit: $commit   date: $(date -u '+%Y-%m-%d %H:%M UTC')"
echo "# machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores; $(mpirun --version | head -1)"
echo "# B=1 H=8 D=64; dilated = segments 2048,4096,8192 dilations 1,2,4 (grouped); 1 warm-up + 1 timed iteration"
} | tee "$out"
run() {  # name P args...
  local name=$1 p=$2; shift 2
  "$root/launch/mpirun.sh" -n "$p" -b "$bin" -- run --heads 8 --head-dim 64 --backward \
      --warmup 1 --iters 1 --json "$@" > "$tmp/run.txt" 2>&1 || { cat "$tmp/run.txt"; exit 1; }
  tail -n 1 "$tmp/run.txt" | python3 "$root/bench/ring_row.py" "$name" "$p" "${out%.txt}.jsonl"
}
printf '%-24s %2s %7s %4s %10s %10s %9s %9s %7s %6s %12s %12s\n' config P N pass ms compute comm exposed exp/cmp imbal bytes_sent dense_ring | tee -a "$out"
for p in 1 2 4; do
  run "dense strong" $p --seq-len 16384 | tee -a "$out"
  run "dense causal strong" $p --seq-len 16384 --causal | tee -a "$out"
  run "dilated strong" $p --seq-len 65536 --attention dilated --segments 2048,4096,8192 --dilations 1,2,4 | tee -a "$out"
  run "dense weak N/P=8K" $p --seq-len $((8192 * p)) | tee -a "$out"
  run "dilated weak N/P=32K" $p --seq-len $((32768 * p)) --attention dilated --segments 2048,4096,8192 --dilations 1,2,4 | tee -a "$out"
done
run "dilated 8K/P=4 spanning" 4 --seq-len 16384 --attention dilated --segments 2048,4096,8192,16384 --dilations 1,2,4,8 | tee -a "$out"
echo "saved $out"
