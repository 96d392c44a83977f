#!/usr/bin/env bash
# Benchmarks of the issue-12 features on the CPU engine (virtual ranks share this machine's
# cores, so these are traffic and balance figures, plus time ratios within one run):
#   1. grouped-query attention: forward bytes each rank sends for HKV = H, H/4, 1 (P = 4);
#   2. causal packed sequences: the layout's imbalance (max / mean attended pairs over ranks)
#      for 64K tokens of documents log-uniform in 128..16K, P = 2, 4, 8, next to what the
#      zigzag layout would give on the same documents;
#   3. sliding window: forward time against N for a fixed causal window (linear in N), next
#      to dense causal attention's (quadratic);
#   4. block-sparse with GQA and a window inside the listed blocks: K/V bytes per rank (P = 4).
# Output: bench/results/features-<date>-<commit>.txt.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bin="${RINGATTN_BIN:-$root/build/ringattn}"
[ -x "$bin" ] || "$root/scripts/build.sh"
commit=$(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)
out="$root/bench/results/features-$(date -u +%Y%m%d)-$commit.txt"
py=/usr/bin/python3
json() { "$bin" run --json --quiet "$@" 2>/dev/null | tail -n 1; }
field() { "$py" -c "import json,sys; j=json.loads(sys.argv[1]); print(*[j[k] for k in sys.argv[2:]])" "$@"; }
{
echo "# ringattn feature benchmarks (CPU; virtual ranks share the cores)"
echo "# command: bench/run_features.sh   commit: $commit   date: $(date -u '+%Y-%m-%d %H:%M UTC')"
echo "# machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores"
echo
echo "## 1. grouped-query attention (16:1, 8:1 = HKV 2, 4:1, MHA): forward K/V bytes per rank and time (P = 4, N = 16384, H = 16, D = 64, causal)"
printf '%-8s %14s %14s %10s %10s\n' HKV bytes_sent bytes_min vs_MHA fwd_ms
mha=0
for kv in 16 4 2 1; do
  j=$(json --ring-size 4 --seq-len 16384 --heads 16 --kv-heads $kv --head-dim 64 --causal --iters 1 --warmup 0)
  read -r sent smin ms <<<"$(field "$j" bytes_sent bytes_sent_min fwd_ms)"
  [ "$kv" = 16 ] && mha=$sent
  printf '%-8s %14s %14s %9.2fx %10.1f\n' "$kv" "$sent" "$smin" "$("$py" -c "print($mha/$sent)")" "$ms"
done
echo
echo "## 2. causal packed sequences, 65536 tokens, documents log-uniform in 128..16384 (seeded)"
echo "##    imbalance = max / mean attended pairs over ranks; zigzag = the same documents on the zigzag layout"
printf '%-6s %3s %6s %10s %10s %9s %10s\n' seed P docs layout imbalance zigzag fwd_ms
for seed in 1 2 3; do
  lens=$("$py" - "$seed" <<'PY'
import math, random, sys
rng = random.Random(int(sys.argv[1]))
n, out = 65536, []
while sum(out) < n:
    out.append(min(n - sum(out), int(math.exp(rng.uniform(math.log(128), math.log(16384))))))
print(",".join(map(str, out)))
PY
)
  for p in 2 4 8; do
    zig=$("$py" - "$lens" "$p" <<'PY'
import sys
lens = [int(x) for x in sys.argv[1].split(",")]; p = int(sys.argv[2]); n = sum(lens)
work = []
for L in lens: work += [i + 1 for i in range(L)]
c = n // (2 * p); load = [0] * p
for r in range(p):
    load[r] = sum(work[r * c:(r + 1) * c]) + sum(work[(2 * p - 1 - r) * c:(2 * p - r) * c])
print(f"{max(load) / (sum(load) / p):.3f}")
PY
)
    j=$(json --ring-size "$p" --seq-len 65536 --heads 1 --head-dim 64 --causal --seqlens "$lens" --iters 1 --warmup 0)
    read -r layout imb ms <<<"$(field "$j" layout imbalance fwd_ms)"
    printf '%-6s %3s %6s %10s %10.3f %9s %10.1f\n' "$seed" "$p" "$(tr ',' '\n' <<<"$lens" | wc -l)" "$layout" "$imb" "$zig" "$ms"
  done
done
echo
echo "## 3. causal sliding window 512 against dense causal, H = 4, D = 64, one process: forward time"
printf '%8s %12s %12s %10s %12s %12s\n' N window_ms ms_per_Ktok GFLOP/s dense_ms dense/window
for n in 16384 32768 65536 131072; do
  j=$(json --seq-len $n --heads 4 --head-dim 64 --causal --window 512 --iters 3 --warmup 1)
  read -r ms gf <<<"$(field "$j" fwd_ms fwd_gflops)"
  dense="-" ratio="-"
  if [ "$n" -le 65536 ]; then
    dense=$(field "$(json --seq-len $n --heads 4 --head-dim 64 --causal --iters 1 --warmup 0)" fwd_ms)
    ratio=$("$py" -c "print(f'{$dense/$ms:.1f}')")
  fi
  printf '%8s %12.1f %12.3f %10.1f %12s %12s\n' "$n" "$ms" "$("$py" -c "print($ms/($n/1024))")" "$gf" "$dense" "$ratio"
done
echo
echo "## 4. block-sparse (local:window=4096+global:blocks=1, bs 128), P = 4, N = 65536, H = 16, D = 64, causal:"
echo "##    forward K/V bytes per rank with GQA and with a window inside the listed blocks"
printf '%-26s %14s %14s %10s %10s %10s\n' run bytes_sent bytes_min vs_MHA imbalance fwd_ms
base=0
for spec in "MHA|--kv-heads 16" "GQA 8:1|--kv-heads 2" "GQA 8:1, window 1024|--kv-heads 2 --window 1024"; do
  name=${spec%%|*}; extra=${spec#*|}
  # shellcheck disable=SC2086
  j=$(json --attention block-sparse --pattern local:window=4096+global:blocks=1 --block-size 128 \
    --ring-size 4 --seq-len 65536 --heads 16 --head-dim 64 --causal $extra --iters 1 --warmup 0)
  read -r sent smin imb ms <<<"$(field "$j" bytes_sent bytes_sent_min imbalance fwd_ms)"
  [ "$base" = 0 ] && base=$sent
  printf '%-26s %14s %14s %9.2fx %10.3f %10.1f\n' "$name" "$sent" "$smin" "$("$py" -c "print($base/$sent)")" "$imb" "$ms"
done
} | tee "$out"
echo "saved $out"
