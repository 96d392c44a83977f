#!/usr/bin/env bash
# Fault test (label fault): the output disk is full. --out and --dq-out point into a small
# tmpfs; ringattn must exit 3 naming the file it could not write, leave the previous
# content of an existing output file untouched, and leave no temporary files behind.
# Usage: fault_disk_full.sh <ringattn binary>
set -euo pipefail
bin=$1
skip() { echo "SKIPPED: $*"; exit 0; }
fail() { echo "FAILED: $*"; exit 1; }
[ "$(id -u)" -eq 0 ] || skip "mounting a small tmpfs needs root"
command -v mount >/dev/null || skip "mount not installed"

disk=$(mktemp -d /tmp/ringattn-diskfull.XXXXXX)
cleanup() {
  mountpoint -q "$disk" && umount "$disk"
  rmdir "$disk"
}
trap cleanup EXIT
mount -t tmpfs -o size=256k tmpfs "$disk" || skip "cannot mount a tmpfs here"

printf 'previous result, must survive\n' > "$disk/out.npy"
cp "$disk/out.npy" "$disk/expected"
# The output is 1 MiB (1024 x 4 x 64 float32): it cannot fit in 256 KiB.
check_case() {
  local name=$1
  shift
  local rc=0 t0=$SECONDS
  "$bin" run --seq-len 1024 --heads 4 --head-dim 64 --iters 1 --warmup 0 --quiet "$@" \
    > "$disk/../ringattn-diskfull-$$.log" 2>&1 || rc=$?
  local log
  log=$(cat "$disk/../ringattn-diskfull-$$.log")
  rm -f "$disk/../ringattn-diskfull-$$.log"
  echo "-- $name: exit $rc after $((SECONDS - t0)) s: $(grep error: <<<"$log")"
  [ "$rc" -eq 3 ] || { echo "$log"; fail "$name: exit code $rc, want 3"; }
  grep -q "error: .*$disk/out.npy.*No space left on device" <<<"$log" ||
    { echo "$log"; fail "$name: the message does not name $disk/out.npy and the full disk"; }
  cmp -s "$disk/out.npy" "$disk/expected" || fail "$name: the existing output file was changed"
  local left
  left=$(find "$disk" -name '*.tmp.*')
  [ -z "$left" ] || fail "$name: temporary files left: $left"
}
check_case "one process" --out "$disk/out.npy"
check_case "2 virtual ranks, forward and backward" --ring-size 2 --backward \
  --dq-out "$disk/dq.npy" --out "$disk/out.npy"
[ ! -e "$disk/dq.npy" ] || fail "dq.npy was written although the run failed"
# A run whose small output fits still writes (the tmpfs itself works).
"$bin" run --seq-len 16 --heads 1 --head-dim 8 --iters 1 --warmup 0 --quiet --out "$disk/small.npy" >/dev/null
[ -s "$disk/small.npy" ] || fail "a small output was not written"
echo "PASSED: full disk: exit 3 naming the file, previous content kept, no temporary files"
