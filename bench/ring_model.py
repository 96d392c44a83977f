#!/usr/bin/env python3
"""The multi-GPU ring model of docs/COMMUNICATION.md: per-rank shard length where a ring
step's transfer hides behind its compute, and expected efficiency at P GPUs.

Every rate is an assumption to replace with a measurement (flags below); the anchor factor
eta is the zigzag ring's measured fraction of ideal on 8xH800 with communication hidden
(0.85 forward, 0.90 forward+backward), applied on top of the bandwidth model.

  bench/ring_model.py                       # the tables in docs/COMMUNICATION.md
  bench/ring_model.py --fwd-tflops 520      # with a measured kernel rate
"""
import argparse


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


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--fwd-tflops", type=float, default=400, help="bf16 flash forward, per GPU")
    ap.add_argument("--bwd-tflops", type=float, default=300, help="bf16 flash backward, per GPU")
    ap.add_argument("--nvlink-gbs", type=float, default=360, help="achieved p2p GB/s, one direction")
    ap.add_argument("--nvlink-lat-us", type=float, default=10)
    ap.add_argument("--ib-gbs", type=float, default=45, help="per GPU (one 400G NIC each), one direction")
    ap.add_argument("--ib-lat-us", type=float, default=20)
    ap.add_argument("--gpus-per-node", type=int, default=8)
    ap.add_argument("--leaf-gpus", type=int, default=256, help="GPUs under one leaf switch level")
    ap.add_argument("--spine-factor", type=float, default=0.8,
                    help="bandwidth fraction for traffic crossing the spine")
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--elem", type=int, default=2, help="bytes per K/V element (bf16)")
    ap.add_argument("--grad-elem", type=int, default=4, help="bytes per dK/dV partial (fp32)")
    ap.add_argument("--eta-f", type=float, default=0.85)
    ap.add_argument("--eta-fb", type=float, default=0.90)
    a = ap.parse_args()

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
