#!/usr/bin/env bash
# On the development machine (no GPU needed): configure and build a Release tree with the
# CUDA kernels, then pack what the lent GPU machine needs into .gpu-carry/ringattn-gpu.tar.xz
# at the repository root (git-ignored through .git/info/exclude): the CLI, the gpu-labelled
# test binaries, gpu_bench, and the shared libraries they load that a bare CUDA image may lack. Then call
# the device tool with carry [".gpu-carry"], timeout_s 560 and the one command in
# bench/gpu/device_run.sh's header (docs/GPU_PERFORMANCE.md has it too; for an H100 or H200,
# `ARCHS=90 PY_KIT=0` here builds only what it runs). Environment: BUILD (build dir, default
# /tmp/build-gpu-carry), ARCHS
# (CMAKE_CUDA_ARCHITECTURES, default "80-real;90"; "90" alone builds faster for an H100),
# JOBS (default 2), PY_KIT (default 1: also build the Python extension here and pack a kit
# that device_run.sh's python stage links on the device against the image's own Python,
# whose headers this machine lacks; 0 skips it).
set -euo pipefail
ROOT=$(git -C "$(dirname "$0")/.." rev-parse --show-toplevel)
BUILD=${BUILD:-/tmp/build-gpu-carry}
ARCHS=${ARCHS:-80-real;90}
JOBS=${JOBS:-2}
PY_KIT=${PY_KIT:-1}
PYTHON=${PYTHON:-$ROOT/.venv/bin/python}
py_args=()
py_target=()
if [ "$PY_KIT" = 1 ]; then
  py_args=(-DRINGATTN_BUILD_PYTHON=ON "-DPython_EXECUTABLE=$PYTHON")
  py_target=(_core)
fi
# -march=native off: the GPU machine's CPU may lack this machine's vector extensions.
# MPI off: the multi-rank path is not what runs there, and the image has no MPI library.
cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DRINGATTN_WERROR=ON \
  -DRINGATTN_NATIVE=OFF -DRINGATTN_WITH_MPI=OFF -DRINGATTN_BUILD_BENCH=ON \
  "-DCMAKE_CUDA_ARCHITECTURES=$ARCHS" "${py_args[@]}"
start=$(date +%s)
ninja -C "$BUILD" -j"$JOBS" ringattn test_cuda_kernels test_cuda_sparse test_cli_cuda test_nccl \
  test_cuda_ring test_job_cuda test_cudnn_graphs gpu_bench "${py_target[@]}"
echo "gpu_build_for_device: built in $(( $(date +%s) - start )) s"

# Staged here, then packed as one xz archive: the device tool carries at most 64 MiB with the
# working tree, and the binaries (two GPU architectures each) plus OpenBLAS are ~70 MiB raw.
STAGE=$(mktemp -d /tmp/ringattn-gpu-pack.XXXXXX)
trap 'rm -rf "$STAGE"' EXIT
CARRY=$STAGE
mkdir -p "$CARRY/bin" "$CARRY/lib"
cp "$BUILD/ringattn" "$BUILD/tests/test_cuda_kernels" "$BUILD/tests/test_cuda_sparse" \
  "$BUILD/tests/test_cli_cuda" "$BUILD/tests/test_nccl" "$BUILD/tests/test_cuda_ring" \
  "$BUILD/tests/test_job_cuda" "$BUILD/tests/test_cudnn_graphs" "$BUILD/bench/gpu_bench" \
  "$CARRY/bin/"
strip --strip-unneeded "$CARRY"/bin/*
# Shared libraries other than glibc and the C++ runtime (the GPU image's are newer).
for b in "$CARRY"/bin/*; do ldd "$b"; done | awk '/=> \// {print $3}' | sort -u |
  grep -vE '/(libc|libm|libdl|librt|libpthread|ld-linux[^/]*|libstdc\+\+|libgcc_s|libnccl|libcudnn)\.so' |
  while read -r lib; do cp -L "$lib" "$CARRY/lib/"; done
# NCCL (218 MB) and cuDNN are not carried: the GPU image's PyTorch ships both as wheels
# (nvidia/nccl/lib, nvidia/cudnn/lib), which device_run.sh puts on LD_LIBRARY_PATH.
# OpenBLAS is opened with dlopen (kernels/cpu_blas.cpp), so ldd does not list it: carry the
# OpenMP build and what it loads; on the device its configured path is absent and
# libopenblas.so.0 is found through LD_LIBRARY_PATH.
for d in /usr/lib/x86_64-linux-gnu/openblas-openmp /usr/lib/aarch64-linux-gnu/openblas-openmp; do
  if [ -f "$d/libopenblas.so.0" ]; then
    cp -L "$d/libopenblas.so.0" "$CARRY/lib/"
    ldd "$d/libopenblas.so.0" | awk '/=> \// {print $3}' |
      grep -vE '/(libc|libm|libdl|librt|libpthread|ld-linux[^/]*|libstdc\+\+|libgcc_s)\.so' |
      while read -r lib; do cp -L "$lib" "$CARRY/lib/"; done
  fi
done
if [ "$PY_KIT" = 1 ]; then
  # The Python extension for the device's interpreter: the static libraries built here, and
  # the commands that built _core replayed there with its Python's headers and suffix
  # (nanobind's own sources travel too; every other path is rewritten to a variable that
  # bench/gpu/py_kit_build.sh sets).
  KIT=$CARRY/py
  mkdir -p "$KIT/lib" "$KIT/include"
  cp "$BUILD/libringattn.a" "$BUILD/libringattn_cuda.a" /usr/lib/libxsmm.a /usr/lib/libxsmmnoblas.a "$KIT/lib/"
  cp -r /usr/include/x86_64-linux-gnu/openblas-openmp "$KIT/include/"
  NB=$("$PYTHON" -c "import nanobind, os; print(os.path.dirname(nanobind.__file__))")
  mkdir -p "$KIT/nanobind"
  cp -r "$NB/include" "$NB/src" "$NB/ext" "$KIT/nanobind/"
  pyinc=$("$PYTHON" -c "import sysconfig; print(sysconfig.get_paths()['include'])")
  suffix=$("$PYTHON" -c "import sysconfig; print(sysconfig.get_config_var('EXT_SUFFIX'))")
  ninja -C "$BUILD" -t commands _core | grep -E 'python/(CMakeFiles|libnanobind|_core)' |
    grep -v 'ringattn_lib.dir' |
    sed -e "s|$NB|\${KIT}/nanobind|g" -e "s|$ROOT|\${ROOT}|g" -e "s|-I$pyinc |-I\${PYINC} |g" \
      -e "s|$suffix|\${EXT_SUFFIX}|g" -e 's| -Werror | |g' \
      -e "s|-I/usr/include/x86_64-linux-gnu/openblas-openmp|-I\${KIT}/include/openblas-openmp|g" \
      -e "s| /usr/lib/libxsmm| \${KIT}/lib/libxsmm|g" \
      -e "s| libringattn| \${KIT}/lib/libringattn|g" \
      -e 's| /usr/lib/gcc/[^ ]*/libgomp.so| -lgomp|g' -e 's| /usr/lib/[^ ]*/libpthread.a| -lpthread|g' \
      -e "s| /usr/local/cuda/lib/libnccl.so| \${NCCL_SO}|g" \
      -e "s| /usr/local/cuda/lib/libcudart.so| \${CUDART_SO}|g" \
      -e 's|/usr/bin/cmake -E rm -f|rm -f|g' -e 's|/usr/bin/c++ |${CXX} |g' \
      -e 's|/usr/bin/ar |${AR} |g' -e 's|/usr/bin/ranlib |${RANLIB} |g' >"$KIT/commands.sh"
  grep -q '_core' "$KIT/commands.sh" || { echo "gpu_build_for_device: no _core commands found"; exit 1; }
  echo "py kit: $(wc -l <"$KIT/commands.sh") commands, $(du -sh "$KIT" | cut -f1)"
fi
{
  echo "commit: $(git -C "$ROOT" rev-parse --short HEAD)$(git -C "$ROOT" diff --quiet || echo ' (with uncommitted changes)')"
  echo "built: $(date -u '+%Y-%m-%d %H:%M UTC') on $(hostname)"
  echo "cuda architectures: $ARCHS"
  /usr/local/cuda/bin/nvcc --version | tail -1
} >"$CARRY/build_info.txt"
OUTDIR=$ROOT/.gpu-carry
rm -rf "$OUTDIR"
mkdir -p "$OUTDIR"
# One LZMA window over the whole archive (192 MiB, past the staged bytes): every binary links
# the same kernels' cubins, which a window that spans them all stores once. Measured on the 8
# gpu-labelled binaries of an sm_90 Release build: 36.7 MB at xz -6 (8 MiB window), 9.0 MB here
# (44 s on 2 cores; unpacking needs 192 MiB of memory).
tar -C "$STAGE" -cf - . | xz -T"$JOBS" --lzma2=preset=6,dict=192MiB >"$OUTDIR/ringattn-gpu.tar.xz"
cp "$STAGE/build_info.txt" "$OUTDIR/"
exclude=$(git -C "$ROOT" rev-parse --git-path info/exclude)
mkdir -p "$(dirname "$exclude")"
grep -qx '/.gpu-carry/' "$exclude" 2>/dev/null || echo '/.gpu-carry/' >>"$exclude"
du -sh "$OUTDIR"
echo "gpu_build_for_device: now run on the device (carry .gpu-carry, timeout_s 560):"
echo "  bash bench/gpu/device_run.sh verify tests sanitize ab flex ring dilated sinks mla"
