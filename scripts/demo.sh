#!/usr/bin/env bash
# Installs what is missing, builds, and runs the main job: `ringattn run`, which with no
# options runs the embedded demo config and checks it against the float64 reference.
# Extra arguments replace the demo config (see `build/ringattn run --help`).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/build.sh"
exec "$root/build/ringattn" run "$@"
