#!/usr/bin/env python3
"""A/B of several gpu_bench builds on one GPU, interleaved: which commit (or which version of
a kernel file) made a row faster or slower. Each build is LABEL=PATH (scripts/
gpu_build_for_device.sh's gpu_bench, or one rebuilt with a kernel file from another commit);
each row runs through every build in turn, REPEATS times, and the table shows each build's
best time and TFLOP/s, and its speed relative to the first build.

  python3 bench/gpu/builds_ab.py --out DIR --build a9aff03=/path/gpu_bench \\
      --build d138a9f=/path/gpu_bench_d138a9f --kernel hopper --pass bwd

Rows: dense bf16, B=1, H*D=2048, N=16K at D = 64/128/256, full and causal (--rows narrows them,
e.g. --rows d128,d64c). Writes builds_ab_rows.jsonl and builds_ab_table.txt under --out."""
import argparse
import json
import os
import subprocess
import time

ROWS = {f"d{d}{'c' if c else ''}": (d, c) for d in (64, 128, 256) for c in (False, True)}


def run(exe, d, causal, kernel, pas, iters, env):
    args = [exe, "--seq-len", "16384", "--batch", "1", "--heads", str(2048 // d),
            "--head-dim", str(d), "--attention", "dense", "--kernel", kernel, "--pass", pas,
            "--warmup", "2", "--iters", str(iters)] + (["--causal"] if causal else [])
    try:
        p = subprocess.run(args, capture_output=True, text=True, timeout=90,
                           env={**os.environ, **env})
    except subprocess.TimeoutExpired:
        return [], "timed out after 90 s"
    got = [json.loads(line) for line in p.stdout.splitlines() if line.startswith("{")]
    return got, "" if p.returncode == 0 else f"exit {p.returncode}: {p.stderr.strip()[-300:]}"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--build", action="append", required=True, help="LABEL=PATH (first: base)")
    ap.add_argument("--kernel", default="hopper")
    ap.add_argument("--pass", dest="pas", default="bwd", choices=["fwd", "bwd", "both"])
    ap.add_argument("--rows", default="d128,d128c,d64,d256")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--budget-s", type=float, default=150)
    a = ap.parse_args()
    builds = [tuple(b.split("=", 1)) for b in a.build]
    rows = [r for r in a.rows.split(",") if r]
    for r in rows:
        if r not in ROWS:
            ap.error(f"--rows: unknown row '{r}' (known: {', '.join(ROWS)})")
    os.makedirs(a.out, exist_ok=True)
    t0, results, notes, skipped = time.time(), [], [], 0
    best = {}  # (row, build, pass) -> (ms, tflops)
    for repeat in range(a.repeats):
        for r in rows:
            for label, exe in builds:
                if time.time() - t0 > a.budget_s:
                    skipped += 1
                    continue
                got, err = run(exe, *ROWS[r], a.kernel, a.pas, a.iters, {})
                if err:
                    notes.append(f"{r} {label}: {err}")
                for g in got:
                    results.append({"row": r, "build": label, "repeat": repeat, **g})
                    key = (r, label, g["pass"])
                    if g.get("impl") != a.kernel:
                        notes.append(f"{r} {label} {g['pass']}: ran {g.get('impl')}")
                    if key not in best or g["ms"] < best[key][0]:
                        best[key] = (g["ms"], g["tflops"])
    with open(os.path.join(a.out, "builds_ab_rows.jsonl"), "w") as f:
        for x in results:
            f.write(json.dumps(x) + "\n")
    device = next((x.get("device") for x in results if x.get("device")), "unknown")
    passes = ["fwd", "bwd"] if a.pas == "both" else [a.pas]
    lines = [f"gpu_bench builds A/B on {device}, --kernel {a.kernel}, dense bf16 B=1 H*D=2048 "
             f"N=16384, best of {a.repeats} interleaved repeats: ms / TFLOP/s [x {builds[0][0]}], "
             f"{time.strftime('%Y-%m-%d %H:%M:%S')}",
             f"{'row':<8}{'pass':<6}" + "".join(f"{label:>26}" for label, _ in builds)]
    for r in rows:
        for pas in passes:
            base = best.get((r, builds[0][0], pas))
            cells = []
            for label, _ in builds:
                x = best.get((r, label, pas))
                rel = f" [{base[0] / x[0]:.2f}x]" if x and base else ""
                cells.append((f"{x[0]:.2f} / {x[1]:.1f}{rel}" if x else "-").rjust(26))
            lines.append(f"{r:<8}{pas:<6}" + "".join(cells))
    lines += [f"note: {n[:300]}" for n in notes[:20]]
    if skipped:
        lines.append(f"skipped for the time budget: {skipped} runs")
    table = "\n".join(lines)
    with open(os.path.join(a.out, "builds_ab_table.txt"), "w") as f:
        f.write(table + "\n")
    print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
