#!/usr/bin/env python3
"""Values of their own head dim (MLA) and logit soft-capping on one GPU (device_run.sh stage
`mla`): each row through the CLI (`run --device cuda --json --backward`, bf16, B=1, H=16,
causal, N = 16K by default) on each kernel family that computes it (docs/SEMANTICS.md): the
native kernels, the sm_90a ones (`--kernel hopper`: the cap, and 192/128; an sm_90 only) and
cuDNN's graphs (`--kernel cudnn`: Dv != D and the cap as its score modifier); beside the plain
problem on the same kernels, and PyTorch's SDPA on the same MLA shape where torch is installed
(its backend's choice; a shape it refuses says so). A family that does not take a row runs
another with a note; the row says which ran.

Rows: D = 128 (the baseline), D = 192 / Dv = 128 (DeepSeek's MLA), D = 128 with --softcap 50
(Gemma 2's cap), D = 192 / Dv = 128 with the cap. FLOP/s count 2·(D + Dv) per attended pair
forward and 2·(3·D + 2·Dv) backward, as the CLI reports them.

Writes mla_cost_rows.jsonl (each row as it lands) and mla_cost_table.txt under --out."""
import argparse
import json
import os
import time

from ring_bench import finish_table, run_cli  # noqa: E402  (the CLI's --json runs, as the ring rows take them)

H = 16
ROWS = (("D=128 (plain)", 128, 128, 0.0),
        ("D=192 Dv=128 (MLA)", 192, 128, 0.0),
        ("D=128 softcap 50", 128, 128, 50.0),
        ("D=192 Dv=128 softcap 50", 192, 128, 50.0))
KERNELS = ("native", "hopper", "cudnn")


def torch_row(n, d, dv, iters):
    """(fwd_ms, bwd_ms, backend note) of torch SDPA on q, k [1, H, n, d] and v [1, H, n, dv],
    causal, bf16; None and why where torch or the shape is not available."""
    try:
        import torch
        import torch.nn.functional as F
        from torch_rows import time_ms
    except ImportError as e:
        return None, None, f"torch unavailable ({e})"
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(1, H, n, d, device="cuda", dtype=torch.bfloat16, generator=g,
                    requires_grad=True)
    k = torch.randn(1, H, n, d, device="cuda", dtype=torch.bfloat16, generator=g,
                    requires_grad=True)
    v = torch.randn(1, H, n, dv, device="cuda", dtype=torch.bfloat16, generator=g,
                    requires_grad=True)
    try:
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        grad = torch.randn_like(out)
        fwd, _ = time_ms(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True), 2,
                         iters)
        both, _ = time_ms(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True)
                          .backward(grad), 2, iters)
        return fwd, max(both - fwd, 0.0), "torch SDPA (its backend's choice)"
    except RuntimeError as e:
        return None, None, f"torch SDPA refused D={d}, Dv={dv}: {str(e)[:160]}"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cli", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--seq-len", type=int, default=16384)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--budget-s", type=float, default=120)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    t0 = time.time()
    n = a.seq_len
    rows, notes, skipped = [], [], []
    rows_path = os.path.join(a.out, "mla_cost_rows.jsonl")
    open(rows_path, "w").close()
    for (name, d, dv, cap), kernel in ((r, k) for r in ROWS for k in KERNELS):
        if time.time() - t0 > a.budget_s:
            skipped.append(f"{name} ({kernel})")
            continue
        args = ["--seq-len", str(n), "--warmup", "2", "--iters", str(a.iters), "--causal",
                "--kernel", kernel, "--head-dim-v", str(dv)]
        if cap:
            args += ["--softcap", str(cap)]
        j, err = run_cli(a.cli, args, 240, H, d)
        if err:
            notes.append(f"{name} ({kernel}): {err}")
            continue
        row = {"config": name, "asked": kernel, "seq_len": n, "head_dim": d, "head_dim_v": dv,
               "softcap": cap, "device": j.get("device"), "kernel": j.get("kernel"),
               "kernel_backward": j.get("kernel_backward"), "fwd_ms": j["fwd_ms"],
               "bwd_ms": j.get("bwd_ms"), "fwd_gflops": j.get("fwd_gflops"),
               "bwd_gflops": j.get("bwd_gflops")}
        if dv != d and not cap and kernel == "native" and time.time() - t0 < a.budget_s:
            row["torch_fwd_ms"], row["torch_bwd_ms"], row["torch_note"] = \
                torch_row(n, d, dv, a.iters)
        rows.append(row)
        with open(rows_path, "a") as f:
            f.write(json.dumps(row) + "\n")
    device = next((r["device"] for r in rows if r.get("device")), "unknown")
    lines = [f"MLA head dims and soft-capping on {device}, bf16, B=1, H={H}, N={n}, causal, "
             f"{time.strftime('%Y-%m-%d %H:%M:%S')}",
             f"{'config':<28}{'asked':>8}{'ran fwd/bwd':>24}{'fwd ms':>10}{'TFLOP/s':>9}"
             f"{'bwd ms':>10}{'TFLOP/s':>9}{'torch fwd/bwd ms':>20}"]
    for r in rows:
        torch_cell = (f"{r['torch_fwd_ms']:.3f}/{r['torch_bwd_ms']:.3f}"
                      if r.get("torch_fwd_ms") is not None else "-")
        bwd = r.get("bwd_ms") or 0.0
        ran = f"{r.get('kernel')}/{r.get('kernel_backward')}"
        lines.append(f"{r['config']:<28}{r['asked']:>8}{ran:>24}"
                     f"{r['fwd_ms']:>10.3f}{(r['fwd_gflops'] or 0) / 1e3:>9.1f}"
                     f"{bwd:>10.3f}{(r.get('bwd_gflops') or 0) / 1e3:>9.1f}{torch_cell:>20}")
        if r.get("torch_note") and r.get("torch_fwd_ms") is None:
            notes.append(r["torch_note"])
    finish_table(lines, a.out, "mla_cost_table.txt", notes, skipped)
    return 1 if notes and not rows else 0


if __name__ == "__main__":
    raise SystemExit(main())
