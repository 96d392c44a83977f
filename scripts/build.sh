#!/usr/bin/env bash
# Configures and builds ringattn (Release, warnings as errors) into ./build.
# Extra arguments are passed to CMake's configure step.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/deps.sh"
cmake -S "$root" -B "$root/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DRINGATTN_WERROR=ON "$@"
cmake --build "$root/build" -j "$(nproc)"
