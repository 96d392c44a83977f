#!/usr/bin/env bash
# Installs what is missing, builds, and runs the whole test suite with CTest; then builds
# the SIMT emulator into ./build-emu and runs every GPU test on it (label gpu-emu: the
# CUDA kernels, CudaPlan, NCCL and `ringattn --device cuda` on emulated devices), so the GPU
# code runs on every machine; then the sanitizer builds and the fuzzers
# (scripts/sanitize_and_fuzz.sh). Tests that need hardware this machine lacks print why
# they skip.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
start=$SECONDS
"$root/scripts/build.sh"
(cd "$root/build" && ctest --output-on-failure --timeout 600 -j "$(nproc)")
main_s=$((SECONDS - start))

# The emulator needs none of the CUDA toolkit, MPI or the benchmarks; only the emulated GPU's
# targets are built.
start=$SECONDS
cmake -S "$root" -B "$root/build-emu" -G Ninja -DCMAKE_BUILD_TYPE=Release -DRINGATTN_WERROR=ON \
  -DRINGATTN_CUDA_EMULATION=ON -DRINGATTN_WITH_CUDA=OFF -DRINGATTN_WITH_MPI=OFF \
  -DRINGATTN_BUILD_BENCH=OFF
cmake --build "$root/build-emu" -j "$(nproc)" --target ringattn_emu_tests
(cd "$root/build-emu" && ctest -L gpu-emu --output-on-failure --timeout 600 -j "$(nproc)")
emu_s=$((SECONDS - start))

# Sanitizers (ASan+UBSan, TSan) over the CPU suite, and the fuzzers for a fixed time each;
# it prints its own timings and the fuzzers' executions and findings.
start=$SECONDS
"$root/scripts/sanitize_and_fuzz.sh"
san_s=$((SECONDS - start))
echo "test.sh: main suite ${main_s} s (build + ctest); emulated GPU ${emu_s} s (build + ctest -L gpu-emu);" \
  "sanitizers and fuzzing ${san_s} s (scripts/sanitize_and_fuzz.sh)"
