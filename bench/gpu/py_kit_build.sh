#!/usr/bin/env bash
# Runs ON the lent GPU machine: links ringattn._core for the image's own Python from the kit
# that scripts/gpu_build_for_device.sh packs (the static libraries built on the development
# machine, nanobind's sources, and the commands that built _core there), then lays out an
# importable package at DEST. The development machine has no headers for the image's Python
# (3.12), so only the binding's own sources are compiled here, in parallel.
#   bash bench/gpu/py_kit_build.sh KIT ROOT DEST
set -uo pipefail
KIT=$1 ROOT=$2 DEST=$3
PYINC=$(python3 -c "import sysconfig; print(sysconfig.get_paths()['include'])")
EXT_SUFFIX=$(python3 -c "import sysconfig; print(sysconfig.get_config_var('EXT_SUFFIX'))")
if [ ! -f "$PYINC/Python.h" ]; then
  echo "py_kit_build: no Python.h under $PYINC: cannot build the extension here"
  exit 3
fi
CXX=$(command -v c++ || command -v g++) || { echo "py_kit_build: no C++ compiler"; exit 3; }
AR=$(command -v ar) RANLIB=$(command -v ranlib)
NCCL_SO=${NCCL_SO:-}
[ -n "$NCCL_SO" ] || NCCL_SO=$(python3 - <<'PY'
import glob, site
for sp in site.getsitepackages():
    for f in sorted(glob.glob(sp + "/nvidia/nccl/lib/libnccl.so*") + glob.glob(sp + "/nvidia/cu13/lib/libnccl.so*")):
        print(f); raise SystemExit
PY
)
CUDART_SO=${CUDART_SO:-}
[ -n "$CUDART_SO" ] || for f in /usr/local/cuda/lib64/libcudart.so /usr/local/cuda/targets/x86_64-linux/lib/libcudart.so; do
  [ -e "$f" ] && { CUDART_SO=$f; break; }
done
[ -n "$NCCL_SO" ] && [ -n "$CUDART_SO" ] || { echo "py_kit_build: libnccl ($NCCL_SO) or libcudart ($CUDART_SO) not found"; exit 3; }
export KIT ROOT PYINC EXT_SUFFIX CXX AR RANLIB NCCL_SO CUDART_SO
echo "py_kit_build: $("$CXX" --version | head -1); Python headers $PYINC; suffix $EXT_SUFFIX"
echo "py_kit_build: nccl $NCCL_SO; cudart $CUDART_SO"
BUILD=$KIT/build
rm -rf "$BUILD" && mkdir -p "$BUILD" && cd "$BUILD" || exit 3
# Object directories, then every compile at once, then the archive and the link in order.
grep -oE ' -o [^ ]+' "$KIT/commands.sh" | awk '{print $2}' | xargs -n1 dirname | sort -u | xargs mkdir -p
start=$(date +%s)
grep -E ' -c ' "$KIT/commands.sh" | xargs -d '\n' -P "$(nproc)" -n 1 bash -c 'eval "$1"' _ || { echo "py_kit_build: compile failed"; exit 1; }
grep -vE ' -c ' "$KIT/commands.sh" | while IFS= read -r cmd; do eval "$cmd" || exit 1; done ||
  { echo "py_kit_build: link failed"; exit 1; }
so=$(ls python/_core*.so 2>/dev/null | head -1)
[ -n "$so" ] || { echo "py_kit_build: no _core was linked"; exit 1; }
rm -rf "$DEST" && mkdir -p "$DEST" && cp -r "$ROOT/python/ringattn" "$DEST/" && cp "$so" "$DEST/ringattn/"
echo "py_kit_build: $DEST/ringattn/$(basename "$so") in $(( $(date +%s) - start )) s"
