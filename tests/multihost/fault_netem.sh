#!/usr/bin/env bash
# Fault test (labels multihost, fault): host h1's link delays every packet by 20 ms and
# drops 2% of them (tc netem). The 3-host job must still complete, with outputs bitwise
# equal to the same job on a clean network; the slowdown is printed. Kernels built without
# sch_netem (CONFIG_NET_SCH_NETEM) cannot delay packets: there the 2% loss is made with
# nftables (random drop of h1's outgoing packets) and the output says that no delay was added.
# Usage: fault_netem.sh <ringattn binary>
set -euo pipefail
bin=$1
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$(dirname "$0")/lib.sh"
require_namespaces
require_mpi
command -v tc >/dev/null || skip "tc not installed (scripts/deps.sh installs iproute2)"
ip netns add "rat$$-probe"
if ip netns exec "rat$$-probe" tc qdisc add dev lo root netem delay 20ms loss 2% 2>/dev/null; then
  impairment="netem delay 20ms loss 2%"
elif command -v nft >/dev/null; then
  impairment="loss 2% (nftables; this kernel has no sch_netem, so no delay)"
else
  ip netns del "rat$$-probe"
  skip "the kernel has no sch_netem and nft is not installed (scripts/deps.sh installs nftables)"
fi
ip netns del "rat$$-probe"

cluster_up 3
work=$(mktemp -d /tmp/ringattn-netem.XXXXXX)
args=(run --seq-len 1536 --heads 4 --head-dim 32 --seed 7 --iters 3 --warmup 1 --threads 1
  --backward --timeout 60 --json)

run() {
  local tag=$1 t0
  t0=$(now)
  mpirun_hosts 3 "$bin" "${args[@]}" --out "$work/$tag.out.npy" --dq-out "$work/$tag.dq.npy" \
    --dk-out "$work/$tag.dk.npy" > "$work/$tag.log" 2>&1 || { cat "$work/$tag.log"; fail "the $tag run failed"; }
  wall=$(elapsed "$t0" "$(now)")
  fwd=$(json_field "$work/$tag.log" "f\"{j['fwd_ms']:.1f}\"")
  bwd=$(json_field "$work/$tag.log" "f\"{j['bwd_ms']:.1f}\"")
  note "$tag: wall $wall s, forward $fwd ms, backward $bwd ms (medians)"
}

run clean
clean_wall=$wall clean_fwd=$fwd clean_bwd=$bwd
if [[ $impairment == netem* ]]; then
  "$cluster_sh" tc "$cluster" 1 add dev eth0 root netem delay 20ms loss 2%
  note "h1: $(ip netns exec "$cluster-h1" tc qdisc show dev eth0)"
else
  ip netns exec "$cluster-h1" nft -f - <<'NFT'
table inet ringattn_loss {
  chain out { type filter hook output priority 0; policy accept; oifname "eth0" numgen random mod 100 < 2 counter drop; }
}
NFT
fi
run netem
if [[ $impairment != netem* ]]; then
  note "h1 dropped: $(ip netns exec "$cluster-h1" nft list ruleset | grep -o 'counter packets [0-9]* bytes [0-9]*')"
fi
for f in out dq dk; do
  cmp "$work/clean.$f.npy" "$work/netem.$f.npy" || fail "$f differs from the clean run"
done
slow() { python3 -c "import sys; print(f'{float(sys.argv[2]) / float(sys.argv[1]):.1f}')" "$1" "$2"; }
echo "PASSED: $impairment on h1: outputs bitwise equal to the clean run;" \
  "slowdown: wall $(slow "$clean_wall" "$wall")x ($clean_wall -> $wall s)," \
  "forward $(slow "$clean_fwd" "$fwd")x ($clean_fwd -> $fwd ms)," \
  "backward $(slow "$clean_bwd" "$bwd")x ($clean_bwd -> $bwd ms)"
