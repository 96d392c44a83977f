#!/usr/bin/env bash
# Installs what is missing, builds, and runs the whole test suite with CTest; builds and runs
# examples/cpp against the installed CMake package; builds the Python package and runs its
# pytest suite (one process, then mpiexec -n 2 and -n 3), and again in a venv with PyPI's
# torch and transformers (torch.compile, the transformers integration); then builds
# the SIMT emulator into ./build-emu and runs every GPU test on it (label gpu-emu: the
# CUDA kernels, CudaPlan, NCCL and `ringattn --device cuda` on emulated devices), so the GPU
# code runs on every machine; then a portable build of the CPU kernels (./build-portable: no
# -march=native, no libxsmm), as a wheel or a machine without libxsmm builds them; then the
# sanitizer builds and the fuzzers
# (scripts/sanitize_and_fuzz.sh). Tests that need hardware this machine lacks print why
# they skip.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
start=$SECONDS
"$root/scripts/build.sh"
(cd "$root/build" && ctest --output-on-failure --timeout 600 -j "$(nproc)")
main_s=$((SECONDS - start))

# The installed CMake package: cmake --install into a fresh prefix, then examples/cpp (a
# project of its own, find_package(ringattn)) is configured, built and run against it: a
# single-process job and a distributed one (two MPI ranks) through the library API.
start=$SECONDS
rm -rf "$root/build/install" "$root/build/consumer"
cmake --install "$root/build" --prefix "$root/build/install" >/dev/null
cmake -S "$root/examples/cpp" -B "$root/build/consumer" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$root/build/install" >/dev/null
cmake --build "$root/build/consumer" -j "$(nproc)"
"$root/build/consumer/dilated_forward"
# The distributed consumer: a causal dense and a dilated job through make_engine on two MPI
# ranks, against float64. The library carries no CLI code: its link line has no
# Boost.Program_options.
if [ -x "$root/build/consumer/distributed_ring" ]; then
  link_line=$(ninja -C "$root/build/consumer" -t commands distributed_ring | tail -n 1)
  case "$link_line" in
    *distributed_ring*) ;;
    *) echo "test.sh: no link command for distributed_ring in build/consumer" >&2; exit 1 ;;
  esac
  if [[ "$link_line" == *program_options* ]]; then
    echo "test.sh: the installed ringattn::ringattn pulls in Boost.Program_options" >&2
    exit 1
  fi
  OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1 \
    mpiexec -n 2 --oversubscribe "$root/build/consumer/distributed_ring"
else
  echo "test.sh: SKIPPED: examples/cpp/distributed_ring (this build has no MPI)"
fi
install_s=$((SECONDS - start))

# The Python package: `pip install .` into ./.venv (Debian's python3, seeing Debian's torch,
# numpy and pytest), then its pytest suite on one process and the distributed tests under
# mpiexec -n 2 and -n 3. Explicit /usr/bin/python3: other interpreters (pyenv shims) may be
# first on PATH.
start=$SECONDS
venv="$root/.venv"
[ -x "$venv/bin/python" ] || /usr/bin/python3 -m venv --system-site-packages "$venv"
# The build requirements go into the venv and the build runs there (no isolated build
# environment), so that the build tree is reused and a second run rebuilds only what changed
# (an isolated build's temporary paths make scikit-build-core configure afresh each time).
# pip 22.1 or newer: --config-settings below (an older distribution's venv brings an older one).
"$venv/bin/python" -m pip install -q "pip>=22.1" "scikit-build-core>=0.10" "nanobind>=2.0"
# The package builds in ./build, the tree the suite above built, with the same options plus
# the extension: the library and its kernels are compiled once, not again in a tree of its own
# (about three minutes on two cores). A user's `pip install .` keeps pyproject's build/pip.
pkg_build=(--config-settings=build-dir=build
  --config-settings=cmake.define.RINGATTN_BUILD_TESTS=ON
  --config-settings=cmake.define.RINGATTN_BUILD_BENCH=ON
  --config-settings=cmake.define.RINGATTN_WERROR=ON)
CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" "$venv/bin/python" -m pip install -q --no-build-isolation \
  "${pkg_build[@]}" "$root"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
  OMPI_MCA_rmaps_base_oversubscribe=1
(cd "$root" && "$venv/bin/python" -m pytest -q -p no:cacheprovider python/tests)
for P in 2 3; do
  (cd "$root" && OMP_NUM_THREADS=1 mpiexec -n "$P" --oversubscribe "$venv/bin/python" -m pytest \
    -q -p no:cacheprovider --color=no python/tests/test_distributed.py)
done
python_s=$((SECONDS - start))

# torch.library, torch.compile and the transformers integration need a recent torch (Debian's
# is 1.13): a second venv, without Debian's site packages, with torch and transformers from
# PyPI (pinned: torch the GPU image's version) and the same ringattn wheel; the whole pytest
# suite runs there too, on the torch.library path. RINGATTN_SKIP_TORCH_VENV=1 skips it, saying so.
# PyPI's Linux torch wheel brings CUDA's libraries: the venv takes about 5 GiB, and pip needs
# room for the wheels while it unpacks them. A disk without that room skips the stage, saying
# so here and in the closing summary, rather than failing half-way through pip with ENOSPC.
# The wheels are not kept in pip's cache (another 3 GiB that a fresh machine never reuses).
start=$SECONDS
tvenv="$root/.venv-torch"
torch_skip=""
torch_need_kib=$((7 * 1024 * 1024))
if [ "${RINGATTN_SKIP_TORCH_VENV:-0}" = 1 ]; then
  torch_skip="RINGATTN_SKIP_TORCH_VENV=1"
elif ! "$tvenv/bin/python" -c 'import torch, transformers, timm, scipy, PIL' 2>/dev/null; then
  for dir in "$root" "${TMPDIR:-/tmp}"; do
    free_kib=$(df -Pk "$dir" 2>/dev/null | awk 'NR == 2 { print $4 }') || free_kib=""
    if [ -n "$free_kib" ] && [ "$free_kib" -lt "$torch_need_kib" ]; then
      torch_skip="installing torch needs 7 GiB free on $dir's disk; it has $((free_kib / 1024)) MiB"
    fi
  done
fi
if [ -n "$torch_skip" ]; then
  echo "test.sh: SKIPPED: the PyPI torch tests (torch.compile, transformers): $torch_skip"
else
  [ -x "$tvenv/bin/python" ] || /usr/bin/python3 -m venv "$tvenv"
  # pillow, scipy and timm: the image processors and timm backbones some model families
  # need, so that the transformers sweep builds them too.
  "$tvenv/bin/python" -m pip install -q --no-cache-dir "torch==2.11.0" "transformers==5.24.0" \
    numpy pytest "pillow==13.0.0" "scipy==1.17.1" "timm==1.0.31"
  rm -rf "$root/build/wheel"
  "$venv/bin/python" -m pip wheel -q --no-build-isolation --no-deps "${pkg_build[@]}" \
    -w "$root/build/wheel" "$root"
  "$tvenv/bin/python" -m pip install -q --force-reinstall --no-deps "$root"/build/wheel/ringattn-*.whl
  (cd "$root" && "$tvenv/bin/python" -m pytest -q -p no:cacheprovider python/tests \
    --ignore=python/tests/test_transformers_sweep.py)
  # Every transformers model family against eager (issue 54): the table is printed; a
  # silently different or crashing family fails the run.
  (cd "$root" && "$tvenv/bin/python" python/tests/transformers_sweep.py)
fi
torch_s=$((SECONDS - start))

# The emulator needs none of the CUDA toolkit, MPI or the benchmarks; only the emulated GPU's
# targets are built.
start=$SECONDS
# The Python extension is built there too: its device path (CUDA DLPack tensors, the GPU
# engines) runs on emulated devices (python/tests/test_device_arrays.py).
cmake -S "$root" -B "$root/build-emu" -G Ninja -DCMAKE_BUILD_TYPE=Release -DRINGATTN_WERROR=ON \
  -DRINGATTN_CUDA_EMULATION=ON -DRINGATTN_WITH_CUDA=OFF -DRINGATTN_WITH_MPI=OFF \
  -DRINGATTN_BUILD_BENCH=OFF -DRINGATTN_BUILD_PYTHON=ON -DPython_EXECUTABLE="$venv/bin/python"
cmake --build "$root/build-emu" -j "$(nproc)" --target ringattn_emu_tests _core
(cd "$root/build-emu" && ctest -L gpu-emu --output-on-failure --timeout 600 -j "$(nproc)")
(cd "$root" && RINGATTN_EMU_CORE="$root/build-emu/python" "$venv/bin/python" -m pytest -q \
  -p no:cacheprovider -rs python/tests/test_device_arrays.py)
emu_s=$((SECONDS - start))

# The CPU kernels as a portable build runs them (no -march=native, no libxsmm): the vector
# variant still chosen from CPUID (kernels/cpu_isa.hpp) and the tile products on ringattn's
# AVX2 kernel where the CPU runs AVX2; then as a CPU without AVX2 would, with the portable
# softmax forms and every tile product on OpenBLAS. Their float64, golden and determinism
# tests.
start=$SECONDS
cmake -S "$root" -B "$root/build-portable" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DRINGATTN_WERROR=ON -DRINGATTN_NATIVE=OFF -DRINGATTN_WITH_LIBXSMM=OFF \
  -DRINGATTN_WITH_CUDA=OFF -DRINGATTN_WITH_MPI=OFF -DRINGATTN_BUILD_BENCH=OFF >/dev/null
cmake --build "$root/build-portable" -j "$(nproc)" --target test_kernels test_sparse
"$root/build-portable/tests/test_kernels" --gtest_brief=1
"$root/build-portable/tests/test_sparse" --gtest_brief=1
RINGATTN_CPU_KERNELS=portable RINGATTN_SMALL_GEMM=openblas \
  "$root/build-portable/tests/test_kernels" --gtest_brief=1
RINGATTN_CPU_KERNELS=portable RINGATTN_SMALL_GEMM=openblas \
  "$root/build-portable/tests/test_sparse" --gtest_brief=1
portable_s=$((SECONDS - start))

# Sanitizers (ASan+UBSan, TSan) over the CPU suite, and the fuzzers for a fixed time each;
# it prints its own timings and the fuzzers' executions and findings.
start=$SECONDS
"$root/scripts/sanitize_and_fuzz.sh"
san_s=$((SECONDS - start))
echo "test.sh: main suite ${main_s} s (build + ctest); installed package ${install_s} s" \
  "(install + examples/cpp); Python ${python_s} s (pip install + pytest, mpiexec -n 2, -n 3);" \
  "PyPI torch ${torch_s} s (venv + pytest: torch.compile, transformers; the transformers sweep${torch_skip:+; SKIPPED: $torch_skip});" \
  "emulated GPU ${emu_s} s (build + ctest -L gpu-emu); portable CPU kernels ${portable_s} s" \
  "(build + test_kernels, test_sparse); sanitizers and fuzzing ${san_s} s" \
  "(scripts/sanitize_and_fuzz.sh)"
