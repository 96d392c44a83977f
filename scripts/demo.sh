#!/usr/bin/env bash
# Installs what is missing, builds, and runs the main job: `ringattn run`, which with no
# options runs the embedded demo config and checks it against the float64 reference.
# Extra arguments replace the demo config (see `build/ringattn run --help`).
# Configures ./build exactly as scripts/build.sh does for scripts/test.sh, but builds only the
# CLI target (`ringattn`, at build/ringattn), not the tests and benchmarks.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
RINGATTN_BUILD_TARGETS=ringattn "$root/scripts/build.sh"
exec "$root/build/ringattn" run "$@"
