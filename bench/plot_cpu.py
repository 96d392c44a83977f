#!/usr/bin/python3
"""Renders a CPU benchmark run (a bench/results/cpu-<date>.txt that bench/run_cpu.sh wrote;
its last line is cpu_bench's JSON) as a plot next to it: GFLOP/s against N, forward and
backward, one line per configuration (causal dashed), and the same run's per-thread SGEMM
rate as the ceiling. Also prints each configuration's rate over the dense one at the same
N and causal setting (the dilated causal figure).

Usage: bench/plot_cpu.py bench/results/cpu-<date>.txt   → cpu-<date>.png
Needs matplotlib (Debian: apt-get install python3-matplotlib); not a build or test need."""
import json
import os
import sys

try:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
except ImportError:
    sys.exit("plot_cpu.py: needs matplotlib (apt-get install python3-matplotlib)")


def load(path):
    with open(path) as f:
        lines = [line for line in f if line.startswith("{")]
    if not lines:
        sys.exit(f"plot_cpu.py: {path} has no JSON line (is it a run_cpu.sh output?)")
    return json.loads(lines[-1])


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    run = load(sys.argv[1])
    rows = run["rows"]
    configs = sorted({r["config"] for r in rows}, key=lambda c: (not c.startswith("dense"), c))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    fig, axes = plt.subplots(1, 2, figsize=(13, 5.5), sharey=True)
    for ax, key, title in ((axes[0], "fwd_gflops", "forward"), (axes[1], "bwd_gflops", "backward")):
        for i, config in enumerate(configs):
            for causal in (False, True):
                pts = sorted((r["seq_len"], r[key]) for r in rows
                             if r["config"] == config and r["causal"] == causal and r[key] > 0)
                if pts:
                    ax.plot([x for x, _ in pts], [y for _, y in pts], marker="o", markersize=3,
                            color=colors[i % len(colors)], linestyle="--" if causal else "-",
                            label=config + (" (causal)" if causal else ""))
        ax.axhline(run["sgemm_gflops"], color="gray", linewidth=0.8)
        ax.text(0.01, run["sgemm_gflops"], "same-run SGEMM, one thread per call",
                transform=ax.get_yaxis_transform(), va="bottom", fontsize=7, color="gray")
        ax.set_xscale("log", base=2)
        top = max([run["sgemm_gflops"]] + [r[k] for r in rows for k in ("fwd_gflops", "bwd_gflops")])
        ax.set_ylim(0, 1.1 * top)
        ax.set_title(title)
        ax.set_xlabel("N (tokens, B = 1)")
        ax.set_ylabel("GFLOP/s")
        ax.grid(alpha=0.3)
    axes[1].legend(fontsize=6, loc="lower right")
    fig.suptitle(f"ringattn CPU, {run['machine']}, {run['threads']} threads, commit "
                 f"{run['commit']}, {run['date']}")
    fig.tight_layout()
    out = os.path.splitext(sys.argv[1])[0] + ".png"
    fig.savefig(out, dpi=110)
    print("wrote", out)

    # Dense at the same N and causal setting, else at its largest N (its rate barely moves
    # with N; the largest dense N is what a 2-core run can afford).
    dense = {(r["seq_len"], r["causal"]): r for r in rows if r["config"] == "dense"}
    for r in rows:
        if r["config"] == "dense":
            continue
        d = dense.get((r["seq_len"], r["causal"]))
        if d is None:
            same = [x for x in dense.values() if x["causal"] == r["causal"]]
            if not same:
                continue
            d = max(same, key=lambda x: x["seq_len"])
        print(f"{r['config']:<42} N={r['seq_len']:>7} causal={str(r['causal']):<5} "
              f"fwd {r['fwd_gflops'] / d['fwd_gflops']:.2f}x, "
              f"bwd {r['bwd_gflops'] / max(d['bwd_gflops'], 1e-9):.2f}x dense at N={d['seq_len']}")


if __name__ == "__main__":
    main()
