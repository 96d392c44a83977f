#!/usr/bin/env bash
# Builds the project (Release) and runs the CPU benchmark, saving its output under
# bench/results/cpu-<date>.txt. Extra arguments go to cpu_bench (see cpu_bench --help).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/build.sh"
commit=$(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)
out="$root/bench/results/cpu-$(date -u +%Y%m%d-%H%M).txt"
"$root/build/bench/cpu_bench" --commit "$commit" "$@" | tee "$out"
echo "saved $out"
