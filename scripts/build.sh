#!/usr/bin/env bash
# Configures and builds ringattn (Release, warnings as errors) into ./build.
# Extra arguments are passed to CMake's configure step.
# RINGATTN_BUILD_TARGETS="a b" builds only those targets (and what they depend on) after the
# same configure step; unset or empty, every target is built (tests and benchmarks included).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/deps.sh"
# The Python extension is off here (test.sh's `pip install` turns it on in this tree).
cmake -S "$root" -B "$root/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DRINGATTN_WERROR=ON \
  -DRINGATTN_BUILD_PYTHON=OFF "$@"
targets=()
if [ -n "${RINGATTN_BUILD_TARGETS:-}" ]; then
  read -r -a names <<<"$RINGATTN_BUILD_TARGETS"
  targets=(--target "${names[@]}")
fi
cmake --build "$root/build" -j "$(nproc)" ${targets[@]+"${targets[@]}"}
