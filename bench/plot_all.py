#!/usr/bin/python3
"""Turns the benchmark outputs in bench/results/ into JSON rows and plots, next to them.

  bench/plot_all.py [--cpu cpu-<date>.txt] [--peers peers-<...>.jsonl] [--sparse sparse-<date>.txt]
                    [--ring ring-<date>.txt] [--features features-<...>.txt] [--out DIR]

Each input defaults to the newest such file in bench/results/. Text outputs written before
the scripts emitted JSON rows (run_ring.sh, run_sparse.sh's distributed table,
run_features.sh) are parsed and their rows saved as <name>.jsonl beside them; the plots are
drawn from the rows:

  cpu-vs-n.png        time (ms per head) and GFLOP/s against N: dense, dilated and
                      block-sparse (forward solid, backward dashed), with the peer run's
                      PyTorch SDPA / FlexAttention rows and ringattn's rows of that run
                      (stars and diamonds) on the same axes
  ring-exposure.png   exposed communication / compute against P, and compute + exposed ms
  bytes-by-pattern.png  bytes sent per rank against pattern: block-sparse patterns next to a
                      full ring, grouped-query K/V heads next to MHA

Figures from different files are different runs (see each file's header): compare within
a file. Needs matplotlib (Debian: apt-get install python3-matplotlib); not a build need."""
import argparse
import glob
import json
import os
import re
import sys

try:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
except ImportError:
    sys.exit("plot_all.py: needs matplotlib (apt-get install python3-matplotlib)")

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


def newest(pattern, must_contain=None):
    """The newest file matching pattern (names carry the date), optionally holding a text."""
    files = sorted(glob.glob(os.path.join(RESULTS, pattern)))
    if must_contain:
        files = [f for f in files if must_contain in open(f, errors="replace").read()]
    return files[-1] if files else None


def write_jsonl(path, rows):
    with open(path, "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    print("wrote", path)


def last_json(path):
    with open(path) as f:
        lines = [line for line in f if line.startswith("{")]
    return json.loads(lines[-1]) if lines else None


# ---- parsers: one per text format, each returning JSON rows -------------------------------

def cpu_rows(path):
    """cpu_bench's JSON line → rows with pass split out (fwd and bwd rows)."""
    run = last_json(path)
    rows = []
    for r in run["rows"]:
        for pss in ("fwd", "bwd"):
            if r[f"{pss}_ms"] > 0:
                rows.append({"impl": "ringattn", "config": r["config"], "causal": r["causal"],
                             "pass": pss, "N": r["seq_len"], "H": r["heads"], "D": r["head_dim"],
                             "ms": r[f"{pss}_ms"], "gflops": r[f"{pss}_gflops"],
                             "source": os.path.basename(path), "commit": run["commit"]})
    return rows, run


def sparse_rows(path):
    """run_sparse.sh: the time-vs-sparsity JSON lines and the distributed bytes table."""
    time_rows, byte_rows = [], []
    with open(path) as f:
        text = f.read()
    for line in text.splitlines():
        if line.startswith('{"bench":"sparse"'):
            run = json.loads(line)
            for r in run["rows"]:
                pairs_fwd_flops = 4.0 * run["heads"] * run["head_dim"] * (1 - r["sparsity"]) * \
                    r["seq_len"] ** 2
                for pss, ms in (("fwd", r["fwd_ms"]), ("bwd", r.get("bwd_ms"))):
                    if ms:
                        f = pairs_fwd_flops * (2.5 if pss == "bwd" else 1.0)
                        time_rows.append({
                            "impl": "ringattn", "config": "block-sparse " + r["pattern"].split(
                                ":")[0], "pattern": r["pattern"], "sparsity": r["sparsity"],
                            "causal": False, "pass": pss, "N": r["seq_len"], "H": run["heads"],
                            "D": run["head_dim"], "ms": ms, "gflops": f / (ms * 1e6),
                            "source": os.path.basename(path), "commit": run["commit"]})
    row = re.compile(r"^(\S+)\s+(\d+)\s+(\d+)\s+([0-9.]+)\s+([0-9.]+)\s+(\d+)\s+(\d+)\s+([0-9.]+)x$")
    for line in text.splitlines():
        m = row.match(line.strip())
        if m:
            byte_rows.append({"pattern": m[1], "P": int(m[2]), "N": int(m[3]),
                              "sparsity": float(m[4]), "fwd_ms": float(m[5]),
                              "bytes_sent_per_rank": int(m[6]), "full_ring_bytes": int(m[7]),
                              "source": os.path.basename(path)})
    return time_rows, byte_rows


def ring_rows(path):
    row = re.compile(r"^(.+?)\s+(\d+)\s+(\d+)\s+(fwd|bwd)\s+([0-9.]+)\s+([0-9.]+)\s+([0-9.]+)\s+"
                     r"([0-9.]+)\s+([0-9.]+)%\s+([0-9.]+)\s+(\d+)\s*(\d*)$")
    rows = []
    with open(path) as f:
        for line in f:
            m = row.match(line.rstrip("\n"))
            if m:
                rows.append({"config": m[1].strip(), "P": int(m[2]), "N": int(m[3]), "pass": m[4],
                             "ms": float(m[5]), "compute_ms": float(m[6]),
                             "comm_ms": float(m[7]), "exposed_ms": float(m[8]),
                             "exposed_over_compute": float(m[9]) / 100,
                             "imbalance": float(m[10]), "bytes_sent": int(m[11]),
                             "dense_ring_bytes": int(m[12]) if m[12] else None,
                             "source": os.path.basename(path)})
    return rows


def gqa_rows(path):
    rows, on = [], False
    with open(path) as f:
        for line in f:
            if line.startswith("## 1."):
                on = True
                continue
            if line.startswith("##"):
                on = False
            m = re.match(r"^(\d+)\s+(\d+)\s+(\d+)\s+([0-9.]+)x\s+([0-9.]+)$", line.strip())
            if on and m:
                rows.append({"kv_heads": int(m[1]), "bytes_sent": int(m[2]),
                             "bytes_min": int(m[3]), "fwd_ms": float(m[5]), "P": 4, "N": 16384,
                             "H": 16, "source": os.path.basename(path)})
    return rows


def read_jsonl(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


# ---- plots --------------------------------------------------------------------------------

def plot_cpu(cpu, cpu_run, sparse, peers, out):
    fig, axes = plt.subplots(1, 2, figsize=(14, 7.5))
    series = {}
    for r in cpu + sparse:
        if r["config"].startswith("legacy") or "mixture" in r["config"]:
            continue
        if "sparsity" in r and not 0.94 <= r["sparsity"] <= 0.96:
            continue  # one sparsity across N (the run's 95 % rows) keeps the plot readable
        label = r["config"] + (" causal" if r["causal"] else "")
        if "sparsity" in r:
            label += " ~95% sparse"
        series.setdefault((label, r["pass"]), []).append(r)
    labels = sorted({k[0] for k in series}, key=lambda s: (not s.startswith("dense"), s))
    colors = plt.get_cmap("tab10").colors
    color_of = {lab: colors[i % len(colors)] for i, lab in enumerate(labels)}
    for (label, pss), rs in sorted(series.items()):
        rs.sort(key=lambda r: r["N"])
        kw = dict(color=color_of[label], marker="o", markersize=3,
                  linestyle="-" if pss == "fwd" else "--")
        axes[0].plot([r["N"] for r in rs], [r["ms"] / r["H"] for r in rs], **kw,
                     label=f"{label} {pss} (H={rs[0]['H']}, {rs[0]['source']})")
        axes[1].plot([r["N"] for r in rs], [r["gflops"] for r in rs], **kw)
    peer_style = {"torch_sdpa": "*", "torch_sdpa_bnhd": "p", "torch_flex_compiled": "P",
                  "ringattn": "D", "ringattn_bhnd": "d"}
    pc = {("dense", False): "black", ("dense", True): "dimgray", ("block-sparse", False): "purple"}
    for r in peers or []:
        if r.get("pass") not in ("fwd", "bwd") or not r.get("ms"):
            continue
        color = pc.get((r["attention"], r["causal"]), "red")
        name = (f"{r['impl']} {r['attention']}{' causal' if r['causal'] else ''} {r['pass']}"
                f" (peer run, H={r['H']})")
        face = color if r["pass"] == "fwd" else "none"
        for ax, y in ((axes[0], r["ms"] / r["H"]), (axes[1], r["gflops"])):
            ax.scatter([r["N"]], [y], marker=peer_style.get(r["impl"], "x"),
                       s=45 if r["impl"].startswith("ringattn") else 120, facecolors=face,
                       edgecolors=color, label=name if ax is axes[0] else None, zorder=5)
    if cpu_run:
        axes[1].axhline(cpu_run["sgemm_gflops"], color="gray", linewidth=0.8)
        axes[1].text(0.01, cpu_run["sgemm_gflops"],
                     f"SGEMM of the cpu_bench run ({cpu_run['commit']})",
                     transform=axes[1].get_yaxis_transform(), va="bottom", fontsize=7, color="gray")
    gemm = [r for r in peers or [] if r.get("impl") == "sgemm"]
    if gemm:
        axes[1].axhline(gemm[0]["gflops"], color="purple", linewidth=0.8, linestyle=":")
        axes[1].text(0.01, gemm[0]["gflops"], "SGEMM of the peer run",
                     transform=axes[1].get_yaxis_transform(), va="bottom", fontsize=7,
                     color="purple")
    peak = [r for r in peers or [] if r.get("impl") == "fma_peak"]
    peak_rate = peak[0]["gflops"] if peak else (cpu_run or {}).get("fma_peak_gflops")
    if peak_rate:  # the machine's ceiling: no kernel of this build runs faster
        axes[1].axhline(peak_rate, color="firebrick", linewidth=0.8, linestyle="--")
        axes[1].text(0.01, peak_rate, "FMA peak (registers only)",
                     transform=axes[1].get_yaxis_transform(), va="bottom", fontsize=7,
                     color="firebrick")
    axes[0].set_yscale("log")
    axes[0].set_ylabel("ms per head (B = 1, D = 64)")
    axes[0].set_title("time against N (solid / filled: forward; dashed / open: backward)",
                      fontsize=10)
    axes[1].set_ylabel("GFLOP/s (fwd 4·H·D·pairs, bwd 2.5×)")
    axes[1].set_title("rate against N", fontsize=10)
    axes[1].set_ylim(bottom=0)
    for ax in axes:
        ax.set_xscale("log", base=2)
        ax.set_xlabel("N (tokens)")
        ax.grid(alpha=0.3)
    handles, names = axes[0].get_legend_handles_labels()
    fig.legend(handles, names, loc="lower center", ncol=3, fontsize=7, frameon=False)
    fig.suptitle("ringattn CPU (2 threads, fp32); PyTorch from the peer run on the same axes"
                 + (f" ({os.path.basename(peers[0]['_source'])})" if peers else ""), fontsize=10)
    fig.tight_layout(rect=(0, 0.2, 1, 1))
    fig.savefig(out, dpi=110)
    print("wrote", out)


def plot_ring(rows, out):
    fig, axes = plt.subplots(1, 2, figsize=(13, 5.5))
    configs = list(dict.fromkeys(r["config"] for r in rows))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, c in enumerate(configs):
        for pss, ls in (("fwd", "-"), ("bwd", "--")):
            rs = sorted((r for r in rows if r["config"] == c and r["pass"] == pss),
                        key=lambda r: r["P"])
            if not rs:
                continue
            axes[0].plot([r["P"] for r in rs], [100 * r["exposed_over_compute"] for r in rs],
                         marker="o", color=colors[i % len(colors)], linestyle=ls,
                         label=f"{c} {pss}")
            axes[1].plot([r["P"] for r in rs], [r["compute_ms"] for r in rs], marker="o",
                         color=colors[i % len(colors)], linestyle=ls)
            axes[1].plot([r["P"] for r in rs], [r["exposed_ms"] for r in rs], marker="x",
                         color=colors[i % len(colors)], linestyle=":", linewidth=0.8)
    axes[0].set_ylabel("exposed communication / compute (%), slowest rank")
    axes[0].set_title("communication left exposed by the overlap")
    axes[1].set_yscale("symlog", linthresh=10)
    axes[1].set_ylabel("ms (o: compute of the slowest rank, x dotted: exposed comm.)")
    axes[1].set_title("compute and exposed time per call")
    for ax in axes:
        ax.set_xlabel("P (MPI ranks sharing 2 cores)")
        ax.set_xticks(sorted({r["P"] for r in rows}))
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.suptitle(f"ringattn CPU ring, H = 8, D = 64 ({rows[0]['source']})", fontsize=9)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    print("wrote", out)


def plot_bytes(byte_rows, gqa, out):
    fig, axes = plt.subplots(1, 2, figsize=(14, 5.5), gridspec_kw={"width_ratios": [3, 1]})
    ax = axes[0]
    labels = [f"{r['pattern']}  P={r['P']} N={r['N'] // 1048576}M" for r in byte_rows]
    x = range(len(byte_rows))
    ax.bar([i - 0.2 for i in x], [r["bytes_sent_per_rank"] for r in byte_rows], width=0.4,
           label="block-sparse: bytes sent per rank (= computed minimum)")
    ax.bar([i + 0.2 for i in x], [r["full_ring_bytes"] for r in byte_rows], width=0.4,
           color="lightgray", label="a full ring: every other rank's K/V")
    ax.set_yscale("log")
    ax.set_xticks(list(x))
    ax.set_xticklabels(labels, fontsize=7, rotation=35, ha="right")
    ax.set_ylabel("bytes per rank, forward")
    ax.set_title(f"block-sparse exchange (H=2 D=32; {byte_rows[0]['source']})", fontsize=9)
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3, axis="y")
    ax = axes[1]
    if gqa:
        ax.bar([str(r["kv_heads"]) for r in gqa], [r["bytes_sent"] for r in gqa])
        ax.set_yscale("log")
        ax.set_xlabel("K/V heads (H = 16; 16 = MHA)")
        ax.set_ylabel("bytes sent per rank, forward")
        ax.set_title(f"grouped-query ring, P=4 N=16K causal\n({gqa[0]['source']})", fontsize=9)
        ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    print("wrote", out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cpu", default=newest("cpu-2*.txt", '"sgemm_gflops"'))
    ap.add_argument("--peers", default=newest("peers-*.jsonl"))
    ap.add_argument("--sparse", default=newest("sparse-*.txt"))
    ap.add_argument("--ring", default=newest("ring-*.txt"))
    ap.add_argument("--features", default=newest("features-*.txt"))
    ap.add_argument("--out", default=RESULTS)
    a = ap.parse_args()

    cpu, cpu_run = cpu_rows(a.cpu) if a.cpu else ([], None)
    sparse_time, sparse_bytes = sparse_rows(a.sparse) if a.sparse else ([], [])
    peers = read_jsonl(a.peers) if a.peers else []
    for r in peers:
        r["_source"] = a.peers
    if a.cpu:
        write_jsonl(os.path.splitext(a.cpu)[0] + ".jsonl", cpu)
    if a.sparse:
        write_jsonl(os.path.splitext(a.sparse)[0] + ".jsonl", sparse_time + sparse_bytes)
    plot_cpu(cpu, cpu_run, sparse_time, peers, os.path.join(a.out, "cpu-vs-n.png"))
    if a.ring:
        ring = ring_rows(a.ring)
        write_jsonl(os.path.splitext(a.ring)[0] + ".jsonl", ring)
        plot_ring(ring, os.path.join(a.out, "ring-exposure.png"))
    gqa = gqa_rows(a.features) if a.features else []
    if gqa:
        write_jsonl(os.path.splitext(a.features)[0] + ".jsonl", gqa)
    if sparse_bytes:
        plot_bytes(sparse_bytes, gqa, os.path.join(a.out, "bytes-by-pattern.png"))


if __name__ == "__main__":
    main()
