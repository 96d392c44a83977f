#!/usr/bin/env python3
"""What attention sinks cost on the GPU (device_run.sh stage `sinks`): each row through the
CLI (`run --device cuda --json --backward`, bf16, B=1, H=16, D=128) without and with
`--sinks` (one logit per head), the two runs back to back so drift shows as little as it can.
Sinks are one epilogue above every engine (docs/SEMANTICS.md), so the forward's extra is a
small device kernel over out and lse, the backward's the dsinks sum: the cost should be a few
per cent at most, on every path.

Rows: one GPU, causal, N = 16K, on --kernel hopper, cudnn and native; the ring on P = 2
virtual ranks (causal, --kernel hopper); block-sparse (local window, ~90 % sparse,
--kernel hopper).

Writes sinks_cost_rows.jsonl (each row as it lands, so a run cut short keeps what it
measured) and sinks_cost_table.txt under --out; prints the table."""
import argparse
import json
import os
import struct
import tempfile
import time

from ring_bench import add_kernels_option, chosen_kernels, finish_table, run_cli  # noqa: E402  (the CLI's --json runs, as the ring rows take them)

H, D = 16, 128
KERNELS = ("hopper", "cudnn", "native")


def write_sinks(path, heads, value):
    """A float32 [heads] .npy of `value` (no numpy needed: the format's version 1.0 header,
    padded so the data starts at a multiple of 64 bytes)."""
    header = f"{{'descr': '<f4', 'fortran_order': False, 'shape': ({heads},), }}"
    header += " " * (63 - (10 + len(header)) % 64) + "\n"
    with open(path, "wb") as f:
        f.write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header.encode("latin1"))
        f.write(struct.pack(f"<{heads}f", *([value] * heads)))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cli", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--seq-len", type=int, default=16384)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--budget-s", type=float, default=120)
    add_kernels_option(ap, KERNELS)
    a = ap.parse_args()
    kernels = chosen_kernels(ap, a, KERNELS)
    os.makedirs(a.out, exist_ok=True)
    t0 = time.time()
    n = a.seq_len
    sinks = os.path.join(tempfile.mkdtemp(prefix="ringattn-sinks-"), "sinks.npy")
    write_sinks(sinks, H, 0.5)
    window90 = 2 * 128 * max(1, (n // 128) // 20)
    configs = [(f"one GPU causal ({k})", ["--kernel", k, "--causal"]) for k in kernels]
    if "hopper" in kernels:
        configs += [("ring P=2 causal (hopper)", ["--kernel", "hopper", "--causal",
                                                  "--ring-size", "2"]),
                    ("block-sparse 90% (hopper)", ["--kernel", "hopper", "--attention",
                                                   "block-sparse", "--pattern",
                                                   f"local:window={window90}"])]
    rows, notes, skipped = [], [], []
    rows_path = os.path.join(a.out, "sinks_cost_rows.jsonl")
    open(rows_path, "w").close()
    for name, extra in configs:
        if time.time() - t0 > a.budget_s:
            skipped.append(name)
            continue
        got = {}
        for label, more in (("without", []), ("with", ["--sinks", sinks])):
            j, err = run_cli(a.cli, ["--seq-len", str(n), "--warmup", "2", "--iters",
                                     str(a.iters)] + extra + more, 180, H, D)
            if err:
                notes.append(f"{name} {label} sinks: {err}")
                break
            got[label] = j
        if len(got) < 2:
            continue
        row = {"config": name, "seq_len": n, "device": got["with"].get("device"),
               "kernel": got["with"].get("kernel"),
               "kernel_backward": got["with"].get("kernel_backward")}
        for label, j in got.items():
            row[f"fwd_ms_{label}"] = j["fwd_ms"]
            row[f"bwd_ms_{label}"] = j.get("bwd_ms")
        rows.append(row)
        with open(rows_path, "a") as f:
            f.write(json.dumps(row) + "\n")
    device = next((r["device"] for r in rows if r.get("device")), "unknown")
    lines = [f"Attention sinks' cost on {device}, bf16, B=1, H={H}, D={D}, N={n}, "
             f"{time.strftime('%Y-%m-%d %H:%M:%S')}",
             "ms without / with --sinks (with over without: 1.00 is free)",
             f"{'config':<30}{'kernel':>10}{'fwd':>24}{'bwd':>24}"]
    for r in rows:
        cells = []
        for pas in ("fwd", "bwd"):
            off, on = r.get(f"{pas}_ms_without"), r.get(f"{pas}_ms_with")
            cells.append(f"{off:.3f} / {on:.3f} ({on / off:.2f}x)" if off and on else "-")
        kernel = r["kernel"] + (f"/{r['kernel_backward']}" if r.get("kernel_backward") else "")
        lines.append(f"{r['config']:<30}{kernel:>10}{cells[0]:>24}{cells[1]:>24}")
    finish_table(lines, a.out, "sinks_cost_table.txt", notes, skipped)
    return 1 if notes and not rows else 0


if __name__ == "__main__":
    raise SystemExit(main())
