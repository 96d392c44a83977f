#!/usr/bin/env bash
# Installs what is missing, builds, and runs the whole test suite with CTest.
# Tests that need hardware this machine lacks print why they skip.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/build.sh"
cd "$root/build"
ctest --output-on-failure --timeout 600 -j "$(nproc)"
