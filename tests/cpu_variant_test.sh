#!/usr/bin/env bash
# Runs a test binary with the CPU kernels forced to one vector variant
# (RINGATTN_CPU_KERNELS, kernels/cpu_isa.hpp); exit 77 (ctest: skipped) with the reason when
# this CPU cannot execute that variant. Usage: cpu_variant_test.sh VARIANT BINARY [ARGS...]
set -euo pipefail
variant=$1
shift
flags=$(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null || true)
has() { [[ " $flags " == *" $1 "* ]]; }
case $variant in
  portable) ;;
  avx2) has avx2 && has fma || { echo "SKIPPED: this CPU has no AVX2 and FMA"; exit 77; } ;;
  avx512)
    for f in avx512f avx512cd avx512bw avx512dq avx512vl; do
      has $f || { echo "SKIPPED: this CPU has no $f"; exit 77; }
    done ;;
  *) echo "cpu_variant_test.sh: unknown variant '$variant'" >&2; exit 2 ;;
esac
echo "CPU kernels forced to $variant (RINGATTN_CPU_KERNELS)"
RINGATTN_CPU_KERNELS=$variant exec "$@"
