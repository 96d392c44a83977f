#!/usr/bin/env python3
"""The Hopper kernels' first look on a lent sm_90 (device_run.sh stage `hopper`): each row
through gpu_bench (CudaPlan, bf16, B=1, H·D=2048) with --kernel native, cudnn and hopper,
the last seven times: the default, the plain kernel at every head dim
(RINGATTN_HOPPER_PINGPONG=0; the default runs the ping-pong kernel at D = 256), with the
forward's intra-warpgroup overlap (RINGATTN_HOPPER_OVERLAP=1), with one block per SM
(RINGATTN_HOPPER_BLOCKS_PER_SM=1), with the dense forward's ping-pong kernel in 64- and
128-key steps (RINGATTN_HOPPER_PINGPONG=1, 2) and with Q in registers for S = Q·Kᵀ
(RINGATTN_HOPPER_QREGS=1), and the fused backward (RINGATTN_HOPPER_BWD=fused) and its wide
form (=fused_wide, D = 64 and 128), each also in FlashAttention-3's order within a tile
(RINGATTN_HOPPER_BWD_SCHEDULE=overlap), run in turn and repeated so drift shows as the spread between
repeats.
Rows: dense full and causal at D = 64/128/256, N = 16K (and 64K at D = 128), and dilated
(segments 2048,4096,8192, dilations 1,2,4) at D = 128. Issue 31's goals read off this table:
dense forward >= 550 TFLOP/s at D = 128 (>= 0.85x cuDNN), backward >= 400; dilated >= 1.0x
our cuDNN path.

Writes hopper_ab_rows.jsonl and hopper_ab_table.txt under --out; prints the table."""
import argparse
import json
import os
import subprocess
import time

# hopper: the default (two blocks per SM where they fit, D <= 128; the plain loop; at D = 256
# the ping-pong kernel); "plain": RINGATTN_HOPPER_PINGPONG=0, the plain kernel at every D;
# "overlap": RINGATTN_HOPPER_OVERLAP=1; "1blk": one block per SM
# (RINGATTN_HOPPER_BLOCKS_PER_SM=1, shared memory padded past half the SM's); "pingpong":
# RINGATTN_HOPPER_PINGPONG=1, the dense forward as one block of two consumer warpgroups per
# 128 rows taking turns at the tensor cores, 64 keys a softmax step; "pingpong128": =2, 128
# keys a step (64 at D = 256); "qregs": RINGATTN_HOPPER_QREGS=1, the resident tiles in
# registers as wgmma's A (D <= 128): the plain forward's Q, the dQ pass's Q and dO, and at
# D = 64 the dK/dV pass's K and V; "fused": RINGATTN_HOPPER_BWD=fused, the backward as one
# launch a key tile adding dQ by bulk reduce-add (D <= 128; its forward is the default's);
# "fusedwide": RINGATTN_HOPPER_BWD=fused_wide, the fused backward in 128-key blocks of two
# consumer warpgroups, FlashAttention-3's shape (D = 64 and 128; dQ split by keys at 64); "fusedov"
# and "fusedwideov": those two with RINGATTN_HOPPER_BWD_SCHEDULE=overlap, FlashAttention-3's
# order within a tile (Sᵀ and dPᵀ issued together, the softmax under dPᵀ, dS under dV).
# The backward rows run as "hopper" under all the others.
VARIANTS = [("native", {}), ("cudnn", {}), ("hopper", {}),
            ("hopper-fused", {"RINGATTN_HOPPER_BWD": "fused"}),
            ("hopper-fusedwide", {"RINGATTN_HOPPER_BWD": "fused_wide"}),
            ("hopper-fusedov", {"RINGATTN_HOPPER_BWD": "fused",
                                "RINGATTN_HOPPER_BWD_SCHEDULE": "overlap"}),
            ("hopper-fusedwideov", {"RINGATTN_HOPPER_BWD": "fused_wide",
                                    "RINGATTN_HOPPER_BWD_SCHEDULE": "overlap"}),
            ("hopper-plain", {"RINGATTN_HOPPER_PINGPONG": "0"}),
            ("hopper-overlap", {"RINGATTN_HOPPER_OVERLAP": "1"}),
            ("hopper-1blk", {"RINGATTN_HOPPER_BLOCKS_PER_SM": "1"}),
            ("hopper-pingpong", {"RINGATTN_HOPPER_PINGPONG": "1"}),
            ("hopper-pingpong128", {"RINGATTN_HOPPER_PINGPONG": "2"}),
            ("hopper-qregs", {"RINGATTN_HOPPER_QREGS": "1"})]
# Measured on an H100 and slower than the default (bench/results/gpu-h100-20261126-353d64e):
# left out under --quick, so a short lease spends its time on what has not run.
MEASURED_SLOWER = {"hopper-overlap", "hopper-1blk"}


def rows(quick, head_dims):
    out = []
    for d, n in [(128, 16384), (128, 65536), (64, 16384), (256, 16384)]:
        if (quick and n > 16384) or d not in head_dims:
            continue
        for causal in (False, True):
            out.append({"attention": "dense", "head_dim": d, "seq_len": n, "causal": causal})
    if 128 in head_dims:
        out.append({"attention": "dilated", "head_dim": 128, "seq_len": 16384, "causal": False})
    return out


def bench(exe, row, kernel, env, iters, timeout=90):
    args = [exe, "--seq-len", str(row["seq_len"]), "--batch", "1",
            "--heads", str(2048 // row["head_dim"]), "--head-dim", str(row["head_dim"]),
            "--attention", row["attention"], "--kernel", kernel.split("-")[0],
            "--warmup", "2", "--iters", str(iters)]
    if row["attention"] == "dilated":
        args += ["--segments", "2048,4096,8192", "--dilations", "1,2,4"]
    if row["causal"]:
        args.append("--causal")
    try:
        p = subprocess.run(args, capture_output=True, text=True, timeout=timeout,
                           env={**os.environ, **env})
    except subprocess.TimeoutExpired:
        return {}, f"timed out after {timeout} s"
    got = {}
    for line in p.stdout.splitlines():
        if line.startswith("{"):
            r = json.loads(line)
            got[r["pass"]] = r
    return got, ("" if p.returncode == 0 else f"exit {p.returncode}: {p.stderr.strip()[-300:]}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpu-bench", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--budget-s", type=float, default=240)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--quick", action="store_true")
    # A short lease spends its minutes on the columns it came for (device_run.sh's `ab`: the
    # backward's forms at D = 128), and leaves out a form whose tests hung there.
    ap.add_argument("--variants", help="comma list of VARIANTS names (default: all)")
    ap.add_argument("--head-dims", default="64,128,256", help="comma list (default: all)")
    a = ap.parse_args()
    names = [n for n, _ in VARIANTS]
    wanted = a.variants.split(",") if a.variants else names
    unknown = [n for n in wanted if n not in names]
    if unknown:
        ap.error(f"--variants: unknown {', '.join(unknown)} (known: {', '.join(names)})")
    head_dims = [int(d) for d in a.head_dims.split(",")]
    os.makedirs(a.out, exist_ok=True)
    t0 = time.time()
    results, notes, skipped = [], [], []
    table_rows = rows(a.quick, head_dims)
    variants = [(n, e) for n, e in VARIANTS
                if n in wanted and not (a.quick and n in MEASURED_SLOWER)]
    hopper = [name for name, _ in variants if name.startswith("hopper")]
    for row in table_rows:
        best = {}  # (variant, pass) -> (ms, tflops, impl)
        for repeat in range(2):
            for name, env in variants:
                if time.time() - t0 > a.budget_s:
                    skipped.append(f"{row} {name} repeat {repeat}")
                    continue
                got, err = bench(a.gpu_bench, row, name, env, a.iters)
                if err:
                    notes.append(f"{row} {name}: {err}")
                for pas, r in got.items():
                    key = (name, pas)
                    results.append({**row, "variant": name, "repeat": repeat, "pass": pas,
                                    "impl": r["impl"], "ms": r["ms"], "tflops": r["tflops"],
                                    "device": r.get("device"), "notes": r.get("notes", [])})
                    # The backward's impl names its form ("hopper-fused", "hopper-fused-wide").
                    if name.startswith("hopper") and not r["impl"].startswith("hopper"):
                        notes.append(f"{row} {name} {pas}: ran {r['impl']}: "
                                     + "; ".join(r.get("notes", [])))
                        continue
                    if key not in best or r["ms"] < best[key][0]:
                        best[key] = (r["ms"], r["tflops"], r["impl"])
        row["best"] = {f"{k[0]}/{k[1]}": v for k, v in best.items()}
    with open(os.path.join(a.out, "hopper_ab_rows.jsonl"), "w") as f:
        for r in results:
            f.write(json.dumps(r) + "\n")
    device = next((r["device"] for r in results if r.get("device")), "unknown")
    lines = [f"Hopper A/B on {device}, bf16, B=1, H*D=2048, best of 2 interleaved repeats "
             f"(TFLOP/s; x cuDNN in brackets), {time.strftime('%Y-%m-%d %H:%M:%S')}",
             f"{'row':<34}{'pass':<5}{'native':>9}{'cudnn':>9}"
             + "".join(f"{v.replace('hopper-', '') if v != 'hopper' else v:>24}" for v in hopper)]
    for row in table_rows:
        name = (f"{row['attention']} D={row['head_dim']} N={row['seq_len']}"
                + (" causal" if row["causal"] else ""))
        for pas in ("fwd", "bwd"):
            best = row.get("best", {})

            def tf(v):
                x = best.get(f"{v}/{pas}")
                return x[1] if x else None
            cud = tf("cudnn")

            def cell(v, width):
                x = tf(v)
                if x is None:
                    return f"{'-':>{width}}"
                rel = f" [{x / cud:.2f}x]" if cud and v.startswith("hopper") else ""
                return f"{x:.1f}{rel}".rjust(width)
            lines.append(f"{name:<34}{pas:<5}{cell('native', 9)}{cell('cudnn', 9)}"
                         + "".join(cell(v, 24) for v in hopper))
    lines += [f"note: {n[:300]}" for n in notes[:20]]
    if skipped:
        lines.append(f"skipped for the time budget: {len(skipped)} runs")
    table = "\n".join(lines)
    with open(os.path.join(a.out, "hopper_ab_table.txt"), "w") as f:
        f.write(table + "\n")
    print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
