#!/usr/bin/python3
"""Renders a GPU benchmark run (the gpu_bench_rows.jsonl that bench/gpu/run_bench.py wrote)
as plots next to it: TFLOP/s against N, one figure per head dim, panels for dense and
dilated, forward and backward; our native kernels, our cuDNN path (forward only) and PyTorch on the same
axes, causal dashed, and the card's measured bf16 matmul ceiling (ceilings.json) as a line.

Usage: bench/plot_gpu.py bench/results/gpu-<device>-<date>-<commit>/
Needs matplotlib (Debian: apt-get install python3-matplotlib); not a build or test need."""
import json
import os
import sys

try:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
except ImportError:
    sys.exit("plot_gpu.py: needs matplotlib (apt-get install python3-matplotlib)")

STYLE = {"native": ("tab:blue", "ringattn native"), "cudnn": ("tab:green", "ringattn cuDNN path"),
         "torch_sdpa": ("tab:red", "PyTorch SDPA"),
         "torch_seed": ("tab:red", "replaced project (gather/SDPA/scatter)")}


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    folder = sys.argv[1]
    rows = []
    with open(os.path.join(folder, "gpu_bench_rows.jsonl")) as f:
        for line in f:
            r = json.loads(line)
            if "impl" in r and r.get("pass") in ("fwd", "bwd"):
                rows.append(r)
    ceiling = None
    path = os.path.join(folder, "ceilings.json")
    if os.path.exists(path):
        with open(path) as f:
            ceiling = json.load(f).get("bf16_matmul_tflops")
    device = rows[0]["device"] if rows else "unknown device"
    for d in sorted({r["head_dim"] for r in rows}):
        fig, axes = plt.subplots(2, 2, figsize=(11, 8), sharex=True)
        for col, attention in enumerate(("dense", "dilated")):
            for row_i, p in enumerate(("fwd", "bwd")):
                ax = axes[row_i][col]
                for impl, (color, label) in STYLE.items():
                    if impl == "cudnn" and p == "bwd":
                        continue  # the cuDNN path is forward only: its backward is native
                    for causal in (False, True):
                        pts = sorted((r["seq_len"], r["tflops"]) for r in rows
                                     if r["impl"] == impl and r["attention"] == attention
                                     and r["pass"] == p and r["causal"] == causal
                                     and r["head_dim"] == d)
                        if not pts:
                            continue
                        ax.plot([x for x, _ in pts], [y for _, y in pts], color=color,
                                linestyle="--" if causal else "-", marker="o", markersize=3,
                                label=label + (" (causal)" if causal else ""))
                if ceiling:
                    ax.axhline(ceiling, color="gray", linewidth=0.8)
                    ax.text(0.01, ceiling, "bf16 matmul ceiling (cuBLAS, measured)",
                            transform=ax.get_yaxis_transform(), va="bottom", fontsize=7,
                            color="gray")
                ax.set_xscale("log", base=2)
                ax.set_ylim(bottom=0)
                ax.set_title(f"{attention} {'forward' if p == 'fwd' else 'backward'}")
                ax.set_xlabel("N (tokens, B = 1)")
                ax.set_ylabel("TFLOP/s")
                ax.grid(alpha=0.3)
                ax.legend(fontsize=7)
        fig.suptitle(f"{device}, bf16, D = {d}, H = {2048 // d} (dilated: segments "
                     "2048,4096,8192, dilations 1,2,4, grouped)")
        fig.tight_layout()
        out = os.path.join(folder, f"tflops_vs_n_d{d}.png")
        fig.savefig(out, dpi=110)
        print("wrote", out)


if __name__ == "__main__":
    main()
