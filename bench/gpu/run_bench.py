#!/usr/bin/env python3
"""The GPU benchmark sweep (run by device_run.sh on the lent GPU machine).

Rows: B*N = 16K*{1..8} tokens (batch 1, N = 16384*k), H*D = 2048 with D = 64 and 128,
causal and not, bf16; dense and the dilated configuration (segments 2048,4096,8192,
dilations 1,2,4, grouped). Each row is timed, forward and backward, for our native kernels
(gpu_bench --kernel native), cuDNN's graphs (gpu_bench --kernel cudnn; each pass recorded only
where cuDNN really ran it), and PyTorch (for dense, SDPA with each backend that runs the row:
torch_flash, torch_cudnn; torch_seed, a plain-PyTorch gather/SDPA/scatter (torch_rows.py),
for dilated); ratio_vs_torch is against PyTorch's fastest. Rows also time the sm_90a kernels
(gpu_bench --kernel hopper: CudaPlan's --kernel hopper, each pass a row where it ran the
Hopper kernel, the reason where it did not) where the device is an sm_90. Small N first
across all configs, so a
time budget cuts the largest rows and says which. Then the largest N of the dilated forward
against the memory bound.

Writes under --out: gpu_bench_rows.jsonl (one JSON row each: device, impl, attention, causal,
head_dim, seq_len, batch, heads, pass, ms, tflops, ratio_vs_torch for our rows), and
gpu_bench_table.txt; prints the table last."""
import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

SEGMENTS, DILATIONS = [2048, 4096, 8192], [1, 2, 4]


def attended_pairs(row):
    """docs/SEMANTICS.md: (query, key) pairs, causal counted as attended."""
    b, n, h = row["batch"], row["seq_len"], row["heads"]
    causal = row["causal"]
    def sub(m):  # pairs of one m-row subsequence
        return m * (m + 1) // 2 if causal else m * m
    if row["attention"] == "dense":
        return b * h * sub(n)
    groups = len(SEGMENTS)
    total = 0
    for g, (w, r) in enumerate(zip(SEGMENTS, DILATIONS)):
        base, extra = divmod(h, groups)
        count = base + (1 if g < extra else 0)
        off = g % r
        m = 0 if off >= w else (w - off + r - 1) // r
        total += b * count * (n // w) * sub(m)
    return total


def rows(quick, attentions=("dense", "dilated")):
    ks = [1, 4, 8] if quick else list(range(1, 9))
    out = []
    for k in ks:
        for d in (64, 128):
            for attention in attentions:
                for causal in (False, True):
                    row = {"attention": attention, "causal": causal, "head_dim": d,
                           "heads": 2048 // d, "seq_len": 16384 * k, "batch": 1}
                    if attention == "dilated":
                        row.update(segments=SEGMENTS, dilations=DILATIONS)
                    out.append(row)
    return out


def iters_for(row):
    n = row["seq_len"]
    return (2, 10) if n <= 32768 else (1, 5) if n <= 65536 else (1, 3)


def gpu_bench(exe, row, kernel, warmup, iters, timeout):
    args = [exe, "--seq-len", str(row["seq_len"]), "--batch", str(row["batch"]),
            "--heads", str(row["heads"]), "--head-dim", str(row["head_dim"]),
            "--attention", row["attention"], "--kernel", kernel,
            "--warmup", str(warmup), "--iters", str(iters)]
    if row["attention"] == "dilated":
        args += ["--segments", ",".join(map(str, SEGMENTS)),
                 "--dilations", ",".join(map(str, DILATIONS))]
    if row["causal"]:
        args.append("--causal")
    try:
        p = subprocess.run(args, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return [], f"timed out after {timeout} s"
    results = [json.loads(line) for line in p.stdout.splitlines() if line.startswith("{")]
    err = "" if p.returncode == 0 else f"exit {p.returncode}: {p.stderr.strip()[-400:]}"
    return results, err


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpu-bench", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--budget-s", type=float, default=480)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--no-torch", action="store_true")
    ap.add_argument("--skip-max-n", action="store_true", help="leave out the max-N search")
    # The dilated rows alone (against the replaced project's gather/SDPA/scatter) when a short
    # lease has come for them; the dense ones are measured (bench/results/gpu-*).
    ap.add_argument("--attention", choices=["dense", "dilated", "both"], default="both")
    a = ap.parse_args()
    attentions = ("dense", "dilated") if a.attention == "both" else (a.attention,)
    os.makedirs(a.out, exist_ok=True)
    t0 = time.time()
    torch_rows = None
    device = "unknown"
    if not a.no_torch:
        import torch  # noqa: F401
        import torch_rows as tr
        torch_rows = tr
        device = torch.cuda.get_device_name(0)
    results, skipped, errors = [], [], []
    for row in rows(a.quick, attentions):
        if time.time() - t0 > a.budget_s:
            skipped.append(row)
            continue
        warmup, iters = iters_for(row)
        flops = 4.0 * row["head_dim"] * attended_pairs(row)
        kernels = ("native", "cudnn", "hopper")
        for kernel in kernels:
            got, err = gpu_bench(a.gpu_bench, row, kernel, warmup, iters, timeout=300)
            if err:
                errors.append({**row, "impl": kernel, "error": err})
            for r in got:
                device = r["device"]
                if "error" in r:  # the Hopper kernel declines (not an sm_90 device, ...)
                    errors.append({**row, "impl": kernel, "error": r["error"]})
                    continue
                if kernel == "hopper" and r["impl"] != "hopper":
                    # the plan ran this pass natively (its notes say why): not a Hopper row
                    errors.append({**row, "impl": "hopper", "pass": r["pass"],
                                   "error": "; ".join(r.get("notes", []))})
                    continue
                if kernel == "cudnn" and r["impl"] != "cudnn":
                    # cuDNN did not run this pass (the plan's notes say why): not a cuDNN row.
                    errors.append({**row, "impl": "cudnn", "pass": r["pass"],
                                   "error": "; ".join(r.get("notes", []))})
                    continue
                results.append(r)
        if torch_rows is not None:
            for r in torch_rows.run(row, warmup, iters):
                if "error" in r:
                    errors.append({**row, **r})
                    continue
                f = flops * (2.5 if r["pass"] == "bwd" else 1.0)
                results.append({"device": device, **row, "dtype": "bf16", **r,
                                "tflops": f / (r["ms"] * 1e9)})
    # ratio_vs_torch: PyTorch's fastest time (over its backends) on the same row and pass over
    # ours (> 1: we are faster).
    key = lambda r: (r["attention"], r["causal"], r["head_dim"], r["seq_len"], r["batch"],
                     r["heads"], r["pass"])
    torch_ms = {}
    for r in results:
        if r["impl"].startswith("torch"):
            torch_ms[key(r)] = min(r["ms"], torch_ms.get(key(r), float("inf")))
    for r in results:
        if not r["impl"].startswith("torch") and key(r) in torch_ms:
            r["ratio_vs_torch"] = torch_ms[key(r)] / r["ms"]
    # Largest N of the dilated forward on this GPU (D = 128, H = 16).
    if a.skip_max_n:
        pass
    elif time.time() - t0 < a.budget_s + 60:
        p = subprocess.run([a.gpu_bench, "--max-n", "--attention", "dilated", "--segments",
                            ",".join(map(str, SEGMENTS)), "--dilations", ",".join(map(str, DILATIONS)),
                            "--heads", "16", "--head-dim", "128", "--pass", "fwd"],
                           capture_output=True, text=True, timeout=400)
        for line in p.stdout.splitlines():
            if line.startswith("{"):
                results.append(json.loads(line))
        if p.returncode:
            errors.append({"pass": "max_n", "error": p.stderr.strip()[-400:]})
    else:
        skipped.append({"pass": "max_n"})

    with open(os.path.join(a.out, "gpu_bench_rows.jsonl"), "w") as f:
        for r in results:
            f.write(json.dumps(r) + "\n")
        for e in errors:
            f.write(json.dumps({"error_row": e}) + "\n")
        for s in skipped:
            f.write(json.dumps({"skipped_for_time_budget": s}) + "\n")
    lines = [f"ringattn GPU benchmark on {device}, bf16, {time.strftime('%Y-%m-%d %H:%M:%S')}",
             f"{'impl':<11}{'attention':<9}{'causal':<7}{'D':>4}{'N':>8}{'pass':>5}"
             f"{'ms':>11}{'TFLOP/s':>9}{'vs torch':>9}"]
    for r in results:
        if r["pass"] == "max_n":
            continue
        ratio = f"{r['ratio_vs_torch']:.2f}x" if "ratio_vs_torch" in r else ""
        lines.append(f"{r['impl']:<11}{r['attention']:<9}{str(r['causal']):<7}{r['head_dim']:>4}"
                     f"{r['seq_len']:>8}{r['pass']:>5}{r['ms']:>11.3f}{r['tflops']:>9.1f}{ratio:>9}")
    for r in results:
        if r["pass"] == "max_n":
            lines.append(f"max N, dilated forward (D=128, H=16): {r['max_seq_len']} of the memory "
                         f"bound {r['memory_bound_seq_len']} ({100 * r['fraction_of_bound']:.1f}%)")
    for e in errors:
        lines.append(f"error: {json.dumps(e)[:300]}")
    if skipped:
        lines.append(f"skipped for the time budget ({a.budget_s:.0f} s): {len(skipped)} rows")
    table = "\n".join(lines)
    with open(os.path.join(a.out, "gpu_bench_table.txt"), "w") as f:
        f.write(table + "\n")
    print(table)


if __name__ == "__main__":
    main()
