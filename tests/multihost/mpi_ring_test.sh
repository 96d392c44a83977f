#!/usr/bin/env bash
# The ring across hosts (label multihost): ranks in different network namespaces, started by
# mpirun through netns_agent.sh and talking TCP only (no shared memory). Golden cases and
# randomized problems, dense, dilated, causal and block-sparse, forward and backward, must
# pass --check against the float64 reference, match the golden answers, and send exactly
# the computed minimum of bytes.
# Usage: mpi_ring_test.sh <ringattn binary> <source dir> [seed]
set -euo pipefail
bin=$1
src=$2
seed=${3:-$RANDOM}
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$(dirname "$0")/lib.sh"
require_namespaces
require_mpi
cluster_up 3
work=$(mktemp -d /tmp/ringattn-multihost.XXXXXX)
gold=$src/tests/data/golden
passed=0

# npy_rel_error A B: relative Frobenius error of float32 .npy B against A (no numpy needed).
npy_rel_error() {
  python3 - "$1" "$2" <<'PY'
import ast, math, struct, sys
def load(p):
    b = open(p, 'rb').read()
    n = struct.unpack('<H', b[8:10])[0] if b[6] == 1 else struct.unpack('<I', b[8:12])[0]
    off = (10 if b[6] == 1 else 12) + n
    h = ast.literal_eval(b[off - n:off].decode())
    assert h['descr'] == '<f4', h
    return struct.unpack('<%df' % ((len(b) - off) // 4), b[off:])
a, b = load(sys.argv[1]), load(sys.argv[2])
assert len(a) == len(b), (len(a), len(b))
num = sum((x - y) ** 2 for x, y in zip(a, b))
den = sum(x * x for x in a) or 1.0
print(f'{math.sqrt(num / den):.3e}')
PY
}

# run_case NAME NP ARGS...: one run on NP hosts; checks, byte count and host spread.
run_case() {
  local name=$1 np=$2
  shift 2
  local out=$work/$name
  local t0
  t0=$(now)
  if ! mpirun_hosts "$np" "$bin" run --check --json --iters 1 --warmup 0 --threads 1 \
      --out "$out.out.npy" "$@" > "$out.log" 2>&1; then
    cat "$out.log"
    fail "$name: the run failed"
  fi
  [ "$(json_field "$out.log" "j['world_size']")" = "$np" ] || fail "$name: not $np ranks"
  [ "$(json_field "$out.log" "j['check']['passed']")" = True ] || { cat "$out.log"; fail "$name: --check"; }
  local sent min
  sent=$(json_field "$out.log" "j['bytes_sent']")
  min=$(json_field "$out.log" "j['bytes_sent_min']")
  [ "$sent" = "$min" ] || fail "$name: bytes_sent $sent != bytes_sent_min $min"
  local r
  for ((r = 0; r < np; r++)); do
    grep -q "rank $r: host h$r," "$out.log" || fail "$name: rank $r did not run on host h$r"
  done
  note "$name: P=$np OK, bytes_sent $sent = minimum, $(elapsed "$t0" "$(now)") s"
  passed=$((passed + 1))
}

golden_case() {
  local name=$1 np=$2
  shift 2
  local g=$gold/$name
  run_case "$name" "$np" --q "$g/q.npy" --k "$g/k.npy" --v "$g/v.npy" --dout "$g/dout.npy" \
    --dq-out "$work/$name.dq.npy" "$@"
  local e
  e=$(npy_rel_error "$g/out.npy" "$work/$name.out.npy")
  python3 -c "import sys; sys.exit(float(sys.argv[1]) > 1e-5)" "$e" || fail "$name: output vs golden $e"
  e=$(npy_rel_error "$g/dq.npy" "$work/$name.dq.npy")
  python3 -c "import sys; sys.exit(float(sys.argv[1]) > 1e-5)" "$e" || fail "$name: dQ vs golden $e"
}

# Golden answers (tests/data/golden): dilated grouped causal, dense, uneven heads, mixture,
# and block masks.
golden_case g02_three_groups_causal 3 --attention dilated --segments 8,16,32 --dilations 1,2,4 \
  --causal --scale 0.35355339059327373
golden_case g03_dense_full 3 --attention dilated --segments 48 --dilations 1 \
  --scale 0.17677669529663687
golden_case m02_mixture_causal 2 --attention dilated --combine mixture --segments 8,16,32 \
  --dilations 1,2,4 --causal --scale 0.35355339059327373
golden_case b02_blockmask_causal 2 --attention block-sparse --block-size 16 \
  --block-mask "$gold/b02_blockmask_causal/block_mask.npy" --causal --scale 0.25

# Ulysses x ring across hosts: two hosts of two ranks, each host one group (its all-to-all
# stays inside the host), the ring between the hosts; forward and gradients pass --check,
# the all-to-all's and the ring's bytes each equal their minimum.
ulysses_case() {
  local name=$1
  shift
  local out=$work/$name t0
  t0=$(now)
  if ! mpirun_packed 2 2 "$bin" run --check --json --iters 1 --warmup 0 --threads 1 \
      --backward --ulysses 2 "$@" > "$out.log" 2>&1; then
    cat "$out.log"
    fail "$name: the run failed"
  fi
  [ "$(json_field "$out.log" "j['check']['passed']")" = True ] || { cat "$out.log"; fail "$name: --check"; }
  [ "$(json_field "$out.log" "j['bytes_sent_a2a'] == j['bytes_sent_a2a_min'] > 0")" = True ] ||
    fail "$name: all-to-all bytes differ from their minimum"
  [ "$(json_field "$out.log" "j['bytes_sent_ring'] == j['bytes_sent_ring_min'] > 0")" = True ] ||
    fail "$name: ring bytes differ from their minimum"
  local r
  for ((r = 0; r < 4; r++)); do
    grep -q "rank $r: host h$((r / 2))," "$out.log" || fail "$name: rank $r is not on host h$((r / 2))"
  done
  note "$name: 2 hosts x 2 ranks, U=2 inside each host, OK, $(elapsed "$t0" "$(now)") s"
  passed=$((passed + 1))
}
ulysses_case ulysses-causal-gqa --seq-len 256 --heads 4 --kv-heads 2 --head-dim 16 --causal
ulysses_case ulysses-dilated --seq-len 256 --heads 4 --head-dim 16 --attention dilated \
  --segments 64,256 --dilations 1,2

# Randomized problems: sizes, ring size and pattern drawn from the seed (printed, so that a
# failure can be rerun with the same seed as the third argument).
note "randomized cases, seed $seed"
RANDOM=$seed
pick() { local a=("$@"); echo "${a[RANDOM % ${#a[@]}]}"; }
for kind in dense dense-causal dilated block-sparse; do
  np=$(pick 2 3)
  blocks=$(pick 4 6 8)
  n=$((np * blocks * 16))
  h=$(pick 2 4)  # dilated: 2 head groups
  d=$(pick 8 16 32)
  common=(--seq-len "$n" --heads "$h" --head-dim "$d" --seed "$RANDOM" --backward)
  causal=()
  [ $((RANDOM % 2)) = 1 ] && causal=(--causal)
  case $kind in
    dense) run_case "random-$kind" "$np" "${common[@]}" ;;
    dense-causal) run_case "random-$kind" "$np" "${common[@]}" --causal ;;
    dilated)
      run_case "random-$kind" "$np" "${common[@]}" --attention dilated \
        --segments "$((n / 4)),$((n / 2))" --dilations 1,2 "${causal[@]}"
      ;;
    block-sparse)
      run_case "random-$kind" "$np" "${common[@]}" --attention block-sparse --block-size 16 \
        --pattern "local:window=1+global:blocks=1+random:blocks=1,seed=$RANDOM" \
        "${causal[@]}"
      ;;
  esac
done
echo "PASSED: $passed ring runs across hosts (TCP between namespaces), seed $seed"
