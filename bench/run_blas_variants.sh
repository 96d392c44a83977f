#!/usr/bin/env bash
# The CPU speed with each OpenBLAS build selected, in one run (ratios within the run are what
# count on a noisy machine): dense and dilated forward+backward through `ringattn run` with
# the default (the OpenMP build ringattn opens itself), the pthreads build named through
# RINGATTN_BLAS_LIBRARY, each with OPENBLAS_NUM_THREADS=8, and OpenBLAS left to pick its own
# CPU kernels (OPENBLAS_CORETYPE unset is what ringattn replaces; shown by forcing what
# OpenBLAS 0.3.21 picks alone on CPUs newer than it knows). Saves
# bench/results/blas-variants-<date>.txt. Usage: bench/run_blas_variants.sh [N] [extra args]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/build.sh" >/dev/null
n=${1:-16384}
shift || true
exe="$root/build/ringattn"
arch=$(gcc -print-multiarch 2>/dev/null || echo x86_64-linux-gnu)
pthreads=/usr/lib/$arch/openblas-pthread/libopenblas.so.0
out="$root/bench/results/blas-variants-$(date -u +%Y%m%d-%H%M).txt"
{
  echo "# ringattn CPU speed by OpenBLAS build"
  echo "# commit: $(git -C "$root" rev-parse --short HEAD) ($(date -u '+%Y-%m-%d %H:%M UTC'))"
  echo "# machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-), $(nproc) cores"
  echo "# alternatives' libopenblas.so.0: $(readlink -f /usr/lib/$arch/libopenblas.so.0 2>/dev/null || echo none)"
  echo "# OpenBLAS's own choice of kernels here (OPENBLAS_CORETYPE unset): $(env -u OPENBLAS_CORETYPE python3 -c "
import ctypes, glob
lib = ctypes.CDLL(sorted(glob.glob('/usr/lib/*/openblas-openmp/libopenblas.so.0'))[0])
lib.openblas_get_corename.restype = ctypes.c_char_p
print(lib.openblas_get_corename().decode())" 2>/dev/null || echo unknown)"
  echo "# each row: ringattn run --device cpu --seq-len $n --heads 8 --head-dim 64 --backward --iters 3 $*"
  printf "%-58s %-10s %9s %9s %9s %9s  %s\n" selection attention fwd_ms fwd_GF bwd_ms bwd_GF "blas (threading, threads per call, kernels)"
} | tee "$out"
row() {
  local label=$1 attention=$2
  shift 2
  local extra=()
  [ "$attention" = dilated ] && extra=(--segments 2048,4096,8192 --dilations 1,2,4)
  env "$@" "$exe" run --device cpu --seq-len "$n" --heads 8 --head-dim 64 --backward --iters 3 \
    --attention "$attention" "${extra[@]}" --json | tail -1 | python3 -c "
import json, sys
d = json.loads(sys.stdin.read()); b = d.get('blas', {})
print(f\"%-58s %-10s %9.1f %9.1f %9.1f %9.1f  %s, %s, %s\" % ('$label', '$attention', d['fwd_ms'],
      d['fwd_gflops'], d['bwd_ms'], d['bwd_gflops'], b.get('threading'), b.get('threads_per_call'), b.get('core')))
" | tee -a "$out"
}
for attention in dense dilated; do
  row "default (OpenMP build)" $attention OPENBLAS_NUM_THREADS=8
  [ -f "$pthreads" ] && row "RINGATTN_BLAS_LIBRARY=pthreads build" $attention \
    RINGATTN_BLAS_LIBRARY=$pthreads OPENBLAS_NUM_THREADS=8
  row "OPENBLAS_CORETYPE=Prescott (SSE3 kernels)" $attention OPENBLAS_CORETYPE=Prescott
done
echo "saved $out"
