#!/usr/bin/env python3
"""The multi-GPU ring model of docs/COMMUNICATION.md: per-rank shard length where a ring
step's transfer hides behind its compute, and expected efficiency at P GPUs.

Every rate is an assumption to replace with a measurement (flags below); the anchor factor
eta is the zigzag ring's measured fraction of ideal on 8xH800 with communication hidden
(0.85 forward, 0.90 forward+backward), applied on top of the bandwidth model.

  bench/ring_model.py                       # the tables in docs/COMMUNICATION.md
  bench/ring_model.py --fwd-tflops 520      # with a measured kernel rate
  bench/ring_model.py --ulysses-table --ib-gbs 22.5   # Ulysses x ring splits, 4 NICs per node
  bench/ring_model.py --recommend --world 64 --seq-len 1048576 --kv-heads 8 --causal --backward

The Ulysses x ring model (docs/COMMUNICATION.md, "Ulysses x ring") is ported to C++ in
src/ring/ulysses_model.cpp for the engine's --ulysses auto; keep the two in step
(tests/ring/test_ulysses_model.cpp compares them).
"""
import argparse
import json
from dataclasses import dataclass, replace


def step_times(n, a, causal, backward):
    """Compute and transfer seconds of one ring step at shard length n (tokens)."""
    hd = a.heads * a.head_dim
    pairs = n * n / (2 if causal else 1)  # zigzag: half of a block's pairs per step
    if backward:
        compute = 2.5 * 4 * pairs * hd / (a.bwd_tflops * 1e12)
        sent = 2 * n * hd * (a.elem + a.grad_elem)  # K/V in, dK/dV partials (fp32) back
    else:
        compute = 4 * pairs * hd / (a.fwd_tflops * 1e12)
        sent = 2 * n * hd * a.elem
    return compute, sent


def link(a, p):
    """(bytes/s per direction, per-step latency) of the slowest link a step uses."""
    if p <= a.gpus_per_node:
        return a.nvlink_gbs * 1e9, a.nvlink_lat_us * 1e-6
    # Every ring step has some rank whose peer is on another node; the step waits for it.
    return inter_node_link(a, p)


def inter_node_link(a, p):
    """(bytes/s per direction, latency) of InfiniBand among p ranks."""
    # Past one leaf switch (--leaf-gpus) permutation traffic crosses the spine, where hash
    # collisions cost a fraction of the bandwidth (--spine-factor).
    factor = a.spine_factor if p > a.leaf_gpus else 1.0
    return a.ib_gbs * 1e9 * factor, a.ib_lat_us * 1e-6


def threshold(a, p, causal, backward):
    w, lat = link(a, p)
    n = 64
    while True:
        c, b = step_times(n, a, causal, backward)
        if c >= b / w + lat:
            return n
        n += 64


def comm_efficiency(a, p, n, causal, backward):
    """Ideal time over ring time from bandwidth and latency alone."""
    w, lat = link(a, p)
    c, b = step_times(n, a, causal, backward)
    m = b / w + lat
    return p * c / (c + (p - 1) * max(c, m))  # step 0 is local; steps 1..P-1 overlap


def efficiency(a, p, n, causal):
    """(forward, forward+backward) fraction of the ideal P-fold speedup."""
    ef = comm_efficiency(a, p, n, causal, False)
    eb = comm_efficiency(a, p, n, causal, True)
    cf, _ = step_times(n, a, causal, False)
    cb, _ = step_times(n, a, causal, True)
    return a.eta_f * ef, a.eta_fb * (cf + cb) / (cf / ef + cb / eb)


@dataclass
class Shape:
    """One attention call of the Ulysses x ring model; rates and element sizes come from the flags."""
    world: int
    seq_len: int
    heads: int
    kv_heads: int
    head_dim: int
    causal: bool
    backward: bool
    head_dim_v: int = 0  # v, out, dout, dv (MLA's 128 beside 192); 0: head_dim


def ulysses_valid(heads, kv_heads, p, u):
    """U divides the ranks and the heads, and each rank gets whole K/V heads (U | H_kv) or
    query heads of one K/V head (H_kv | U, i.e. H/U divides H/H_kv)."""
    return p % u == 0 and heads % u == 0 and (kv_heads % u == 0 or u % kv_heads == 0)


def a2a_link(a, p, u):
    """Link of a group's all-to-all: NVLink when every group of u consecutive ranks sits
    inside one node (all P ranks do, or u divides the ranks per node), else InfiniBand."""
    if p <= a.gpus_per_node or a.gpus_per_node % u == 0:
        return a.nvlink_gbs * 1e9, a.nvlink_lat_us * 1e-6
    return inter_node_link(a, u)


def split_estimate(a, s, u):
    """Seconds of one call (forward, or forward then backward) at split (u, P/u): compute,
    exposed all-to-all, exposed ring transfer, total. Formulas: docs/COMMUNICATION.md."""
    r = s.world // u
    n = s.seq_len / s.world  # tokens per rank before the all-to-all
    hr = s.heads // u  # query heads per rank after it
    kvr = max(1, s.kv_heads // u)  # K/V heads per rank (one, held by U/H_kv ranks, when U > H_kv)
    wa, la = a2a_link(a, s.world, u)
    wr, lr = link(a, s.world)
    d, dv = s.head_dim, s.head_dim_v or s.head_dim
    # S = Q·Kᵀ sums over D, P·V over Dv: 2·n·N·H·(D + Dv), 4·n·N·H·D when they are equal.
    flops = 2 * n * s.seq_len * s.heads * (d + dv) * (0.5 if s.causal else 1.0)
    # Per phase: FLOP factor, kernel rate, the all-to-alls' bytes per position in the input
    # dtype (forward: q, k at D, v at Dv; backward: those and dout at Dv) and in fp32, as the
    # engines keep results (forward: out at Dv; backward: out in, dv back at Dv, dq, dk back
    # at D), and the bytes per K/V element a ring step moves (backward: K/V in, fp32 dK/dV
    # partials back).
    phases = [(1.0, a.fwd_tflops, (hr + kvr) * d + kvr * dv, hr * dv, a.elem)]
    if s.backward:
        phases.append((2.5, a.bwd_tflops, (hr + kvr) * d + (hr + kvr) * dv,
                       (hr + kvr) * d + (hr + kvr) * dv, a.elem + a.grad_elem))
    compute = a2a = ring = 0.0
    for factor, tflops, in_elems, f32_elems, ring_elem in phases:
        c = factor * flops / (tflops * 1e12)
        # Each rank keeps 1/U of every tensor and sends the rest, plus the fp32 lse; each
        # direction is U-1 shifted exchanges, one latency each.
        sent = (u - 1) * n * (in_elems * a.elem + f32_elems * 4 + hr * 4)
        step = (s.seq_len / r) * kvr * (d + dv) * ring_elem
        compute += c
        a2a += sent / wa + 2 * (u - 1) * la
        ring += (r - 1) * max(0.0, step / wr + lr - c / r)
    return compute, a2a, ring, compute + a2a + ring


def estimate_splits(a, s):
    """[(u, r, compute, a2a, ring, total)] for every valid split, ascending u."""
    return [(u, s.world // u) + split_estimate(a, s, u)
            for u in range(1, s.world + 1) if ulysses_valid(s.heads, s.kv_heads, s.world, u)]


def recommend(splits):
    """The split with the lowest total; ties go to the smaller U (it moves fewer bytes)."""
    best = splits[0]
    for e in splits[1:]:
        if e[5] < best[5]:
            best = e
    return best[0]


def print_recommendation(a):
    s = Shape(a.world, a.seq_len, a.heads, a.kv_heads or a.heads, a.head_dim, a.causal,
              a.backward, a.head_dim_v or a.head_dim)
    if min(s.world, s.seq_len, s.heads, s.kv_heads, s.head_dim) < 1 or s.heads % s.kv_heads:
        raise SystemExit("--recommend needs positive sizes and --kv-heads dividing --heads")
    splits = estimate_splits(a, s)
    keys = ("ulysses", "ring", "compute_s", "a2a_s", "ring_exposed_s", "total_s")
    for e in splits:
        print(json.dumps(dict(zip(keys, e))))
    print(json.dumps({"recommended_ulysses": recommend(splits)}))


def print_ulysses_table(a, s, label):
    """One markdown row per P: (all-to-all + exposed ring) / total ms for each split."""
    us = [u for u in range(1, 1025) if ulysses_valid(s.heads, s.kv_heads, 1024, u)]
    print(label)
    print("| P | n per GPU | " + " | ".join(f"U={u}" for u in us) + " | best (U x R) |")
    print("| ---: | ---: | " + " | ".join("---:" for _ in us) + " | --- |")
    for p in (8, 16, 32, 64, 128, 256, 512, 1024):
        splits = {e[0]: e for e in estimate_splits(a, replace(s, world=p))}
        cells = [f"{(splits[u][3] + splits[u][4]) * 1e3:.1f} / {splits[u][5] * 1e3:.1f}"
                 if u in splits else "" for u in us]
        best = recommend(list(splits.values()))
        print(f"| {p} | {s.seq_len // p:,} | " + " | ".join(cells) + f" | {best} x {p // best} |")
    print()


def ulysses_tables(a):
    print(f"Ulysses x ring, ms per call: (all-to-all + exposed ring) / total; "
          f"{a.gpus_per_node} GPUs per node, NVLink {a.nvlink_gbs:g} GB/s, "
          f"InfiniBand {a.ib_gbs:g} GB/s per GPU, {a.fwd_tflops:g}/{a.bwd_tflops:g} TFLOP/s, "
          f"{a.elem}-byte elements")
    print()
    print_ulysses_table(a, Shape(0, 2**20, 32, 8, 128, True, True),
                        "N = 1M, H = 32, H_kv = 8, D = 128, causal, forward + backward")
    print_ulysses_table(a, Shape(0, 2**18, 32, 32, 128, False, False),
                        "N = 256K, H = H_kv = 32, D = 128, non-causal, forward")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--fwd-tflops", type=float, default=400, help="bf16 flash forward, per GPU")
    ap.add_argument("--bwd-tflops", type=float, default=300, help="bf16 flash backward, per GPU")
    ap.add_argument("--nvlink-gbs", type=float, default=360, help="achieved p2p GB/s, one direction")
    ap.add_argument("--nvlink-lat-us", type=float, default=10)
    ap.add_argument("--ib-gbs", type=float, default=45, help="per GPU (one 400G NIC each), one direction")
    ap.add_argument("--ib-lat-us", type=float, default=20)
    ap.add_argument("--gpus-per-node", "--ranks-per-node", type=int, default=8)
    ap.add_argument("--leaf-gpus", type=int, default=256, help="GPUs under one leaf switch level")
    ap.add_argument("--spine-factor", type=float, default=0.8,
                    help="bandwidth fraction for traffic crossing the spine")
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--head-dim-v", type=int, default=0,
                    help="v, out, dout, dv's head dim (--recommend; default --head-dim)")
    ap.add_argument("--elem", type=int, default=2, help="bytes per K/V element (bf16)")
    ap.add_argument("--grad-elem", type=int, default=4, help="bytes per dK/dV partial (fp32)")
    ap.add_argument("--eta-f", type=float, default=0.85)
    ap.add_argument("--eta-fb", type=float, default=0.90)
    ap.add_argument("--ulysses-table", action="store_true",
                    help="print the Ulysses x ring split tables instead")
    ap.add_argument("--recommend", action="store_true",
                    help="print one JSON line per Ulysses x ring split of --world, then the choice")
    ap.add_argument("--world", type=int, default=8, help="ranks P (--recommend)")
    ap.add_argument("--seq-len", type=int, default=2**20, help="tokens N (--recommend)")
    ap.add_argument("--kv-heads", type=int, help="K/V heads (--recommend; default --heads)")
    ap.add_argument("--causal", action="store_true", help="(--recommend)")
    ap.add_argument("--backward", action="store_true", help="forward + backward (--recommend)")
    a = ap.parse_args()
    if a.recommend:
        return print_recommendation(a)
    if a.ulysses_table:
        return ulysses_tables(a)

    print("shard length n (tokens per GPU) where a step's transfer hides behind its compute")
    print("| GPUs | link | fwd | fwd causal | bwd | bwd causal |")
    print("| ---: | --- | ---: | ---: | ---: | ---: |")
    for p, name in ((8, "NVLink"), (64, "InfiniBand"), (1024, "InfiniBand across the spine")):
        row = [threshold(a, p, c, b) for b in (False, True) for c in (False, True)]
        print(f"| {p} | {name} | " + " | ".join(f"{x:,}" for x in row) + " |")
    print()
    print("expected efficiency (fraction of ideal P-fold speedup), causal zigzag, fwd / fwd+bwd")
    print("| n per GPU | 8 GPUs (NVLink) | 64 GPUs (IB) | 1024 GPUs (IB) | N at 1024 GPUs |")
    print("| ---: | ---: | ---: | ---: | ---: |")
    for n in (2048, 4096, 8192, 16384, 32768):
        cells = [efficiency(a, p, n, True) for p in (8, 64, 1024)]
        print(f"| {n:,} | " + " | ".join(f"{f:.0%} / {fb:.0%}" for f, fb in cells) +
              f" | {n * 1024 / 2**20:.0f}M |")

if __name__ == "__main__":
    main()
