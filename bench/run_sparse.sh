#!/usr/bin/env bash
# Block-sparse benchmarks, saved to bench/results/sparse-<date>.txt:
#  1. sparse_bench: forward/backward time against sparsity (local bands and random blocks)
#     beside the same run's dense kernel, N = 64K..1M, one process;
#  2. distributed runs of the CLI over P = 2 and 4 ranks, N = 1M..4M, with the bytes each
#     rank sent against what a full ring (every K/V row to every other rank) would send.
# Usage: bench/run_sparse.sh [build dir] (default ./build, built by scripts/build.sh).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build}
[ -x "$build/bench/sparse_bench" ] || "$root/scripts/build.sh"
commit=$(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)
out="$root/bench/results/sparse-$(date -u +%Y%m%d-%H%M).txt"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
{
  echo "# machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-), $(nproc) cores"
  echo "# 1. time vs sparsity, one process"
  for spec in "65536 0.1,0.05,0.01" "262144 0.05" "1048576 0.005"; do
    set -- $spec
    echo "\$ sparse_bench --seq-lens $1 --densities $2 --dense-n 16384 --backward"
    "$build/bench/sparse_bench" --commit "$commit" --seq-lens "$1" --densities "$2" \
      --dense-n 16384 --backward --iters 3
  done
  echo
  echo "# 2. distributed, B=1 H=2 D=32 bs=128, forward, ranks share the cores"
  printf '%-40s %3s %9s %10s %12s %14s %14s %8s\n' pattern P N sparsity "fwd ms" \
    "sent/rank" "full ring" "ratio"
  for pattern in "local:window=1024" "local:window=1024+random:blocks=2"; do
    for n in 1048576 2097152 4194304; do
      for p in 2 4; do
        line=$(mpiexec -n "$p" --oversubscribe "$build/ringattn" run --attention block-sparse \
          --pattern "$pattern" --seq-len "$n" --heads 2 --head-dim 32 --threads 1 --iters 1 \
          --warmup 0 --json | tail -1)
        python3 - "$pattern" "$p" "$n" "$line" <<'PY'
import json, sys
pattern, p, n, line = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
j = json.loads(line)
full = (p - 1) * (n // p) * j["heads"] * j["head_dim"] * 4 * 2
sent = j["bytes_sent"]
assert sent == j["bytes_sent_min"], "bytes_sent differs from the computed minimum"
print(f'{pattern:40s} {p:3d} {n:9d} {j["sparsity"]:10.5f} {j["fwd_ms"]:12.1f} {sent:14d} {full:14d} {full / max(sent, 1):8.1f}x')
PY
      done
    done
  done
} 2>&1 | tee "$out"
echo "saved $out"
