#!/usr/bin/env bash
# On the lent GPU: A/B timing of two carried builds' native kernels on the same rows, runs
# interleaved (A, B, A, B) so drift shows as A-vs-A spread. Usage (after device_run.sh has
# unpacked the new build to /tmp/ringattn-carry):
#   bash bench/gpu/ab_forward.sh OLD_ARCHIVE   → prints one line per row and run, and a table
set -uo pipefail
old_archive=$1
OLD=/tmp/ringattn-carry-old
rm -rf "$OLD" && mkdir -p "$OLD"
python3 -c "import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])" "$old_archive" "$OLD"
NEW=/tmp/ringattn-carry
times() {  # build args... → "fwd_ms fwd_tf bwd_ms bwd_tf" (medians)
  local dir=$1
  shift
  "$dir/bin/gpu_bench" "$@" --kernel native --warmup 2 --iters 10 2>/dev/null |
    python3 -c "import json,sys
r={}
for l in sys.stdin:
    if l.startswith('{'):
        d=json.loads(l); r[d['pass']]=(d['ms'], d['tflops'])
print('%.3f %.1f %.3f %.1f' % (r['fwd'] + r['bwd']))"
}
printf "%-26s %-4s %15s %15s %15s %15s %8s\n" row pass "old ms TF" "new ms TF" "old ms TF" "new ms TF" new/old
for d in 64 128 256; do
  for n in 16384 65536; do
    for causal in "" --causal; do
      args=(--seq-len $n --heads $((2048 / d)) --head-dim $d --attention dense $causal)
      a1=($(times $OLD "${args[@]}")); b1=($(times $NEW "${args[@]}"))
      a2=($(times $OLD "${args[@]}")); b2=($(times $NEW "${args[@]}"))
      for i in 0 2; do
        pass=$([ $i = 0 ] && echo fwd || echo bwd)
        ratio=$(python3 -c "print('%.3f' % (min(${a1[$i]},${a2[$i]})/min(${b1[$i]},${b2[$i]})))")
        printf "%-26s %-4s %9s %5s %9s %5s %9s %5s %9s %5s %7sx\n" "D=$d N=$n ${causal:-full}" $pass \
          ${a1[$i]} ${a1[$((i+1))]} ${b1[$i]} ${b1[$((i+1))]} ${a2[$i]} ${a2[$((i+1))]} ${b2[$i]} ${b2[$((i+1))]} $ratio
      done
    done
  done
done
