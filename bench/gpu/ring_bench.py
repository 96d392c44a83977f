#!/usr/bin/env python3
"""The GPU ring and block-sparse benchmark (run by device_run.sh `ring` on the lent GPU).

Through the CLI (`ringattn run --device cuda --json`), bf16, B=1, H=16, D=128:
- The ring on P = 1, 2, 4 ranks for dense, causal (zigzag) and dilated grouped attention,
  forward and backward. On a machine with one GPU the P ranks are virtual ranks sharing that
  GPU through the in-process device communicator (device-to-device copies, no NVLink or
  network), so the P ranks together do the same work as P = 1: `vs_p1` (P=1 time over this
  time; 1.0 means the ring added nothing) measures the engine's own overhead — packing,
  events, lse merges, smaller kernels — not multi-GPU scaling. `comm_exposed_ms` is the most
  any rank's compute waited for an exchange. bytes_sent (the forward's K/V per rank, the
  most over ranks) must equal bytes_sent_min; dilated against dense shows the traffic saving.
- The ring's cuDNN steps (--kernel cudnn) beside the sm_90a ones: dense, causal, a causal
  sliding window and packed documents (8 equal ones), and causal under --kernel auto (the
  row's kernel/kernel_backward name what auto chose, its first-call timing).
- Distributed block-sparse (causal local window, ~90 % sparse) on P = 1, 2, 4 ranks, read as
  the ring rows are.
- Block-sparse on one rank (local window pattern at ~90 % and ~95 % sparsity) against the
  same run's dense rate: `vs_ideal` is (dense time x density) / sparse time (1.0: the whole
  1/density speed-up), for the native kernels and, on an sm_90, for `--kernel hopper` (the
  sm_90a forward and backward of the local blocks) against the same run's dense
  `--kernel hopper`.

Writes ring_bench_rows.jsonl and ring_bench_table.txt under --out; prints the table."""
import argparse
import json
import os
import subprocess
import time

H, D = 16, 128
KERNELS = ("native", "cudnn", "hopper", "auto")


def config_kernel(name):
    """The kernel a config's name gives in brackets ("causal (cudnn)"), native without."""
    return name[name.rindex("(") + 1:-1] if name.endswith(")") else "native"


def device_name():
    try:
        p = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                           capture_output=True, text=True, timeout=30)
        return p.stdout.strip().splitlines()[0] if p.returncode == 0 and p.stdout.strip() else ""
    except (OSError, subprocess.TimeoutExpired):
        return ""


def run_cli(exe, args, timeout, heads=None, head_dim=None):
    """(the CLI's --json report, "") of one bf16 GPU run, forward and backward, or (None, why)."""
    cmd = [exe, "run", "--device", "cuda", "--dtype", "bf16", "--heads", str(heads or H),
           "--head-dim", str(head_dim or D), "--batch", "1", "--json", "--backward", "--timeout",
           "60"] + args
    t = time.time()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, f"timed out after {timeout} s: {' '.join(cmd[1:])}"
    lines = [x for x in p.stdout.splitlines() if x.startswith("{")]
    if p.returncode != 0 or not lines:
        return None, f"exit {p.returncode} ({time.time() - t:.0f} s): {' '.join(cmd[1:])}: " \
                     f"{p.stderr.strip()[-400:]}"
    return json.loads(lines[-1]), ""


def add_kernels_option(ap, known):
    """--kernels: which kernels' rows run (device_run.sh leaves out a form whose tests hung)."""
    ap.add_argument("--kernels", default=",".join(known), help="comma list (default: all)")


def chosen_kernels(ap, a, known):
    """The --kernels list, or the parser's error naming the unknown ones."""
    kernels = a.kernels.split(",")
    unknown = [k for k in kernels if k not in known]
    if unknown:
        ap.error(f"--kernels: unknown {', '.join(unknown)} (known: {', '.join(known)})")
    return kernels


def finish_table(lines, out_dir, name, notes=(), skipped=()):
    """The table's tail (each note cut to 300 characters, what the time budget skipped),
    written to out_dir/name and printed; returns the table."""
    lines = list(lines) + [f"note: {x[:300]}" for x in notes]
    if skipped:
        lines.append(f"skipped for the time budget: {', '.join(skipped)}")
    table = "\n".join(lines)
    with open(os.path.join(out_dir, name), "w") as f:
        f.write(table + "\n")
    print(table)
    return table


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cli", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--budget-s", type=float, default=300)
    ap.add_argument("--seq-len", type=int, default=65536)
    ap.add_argument("--heads", type=int, default=H)
    ap.add_argument("--head-dim", type=int, default=D)
    ap.add_argument("--iters", type=int, default=5)
    # Which kernels' rows run (a config's kernel is the one in its name's brackets, native where
    # it has none): a short lease's call takes the rows it came for, and device_run.sh leaves
    # out a kernel whose tests hung on this GPU (each of its runs would cost 240 s).
    add_kernels_option(ap, KERNELS)
    a = ap.parse_args()
    kernels = chosen_kernels(ap, a, KERNELS)
    globals().update(H=a.heads, D=a.head_dim)
    os.makedirs(a.out, exist_ok=True)
    t0 = time.time()
    n = a.seq_len
    results, errors, skipped = [], [], []
    configs = [("dense", []), ("causal", ["--causal"]),
               ("dilated", ["--attention", "dilated", "--segments", "2048,4096,8192",
                            "--dilations", "1,2,4"])]
    # Distributed block-sparse (causal local window, ~90 % sparse) on P = 1, 2, 4 ranks.
    window90 = 2 * 128 * max(1, (n // 128) // 20)
    configs.append(("sparse 90% causal", ["--attention", "block-sparse", "--pattern",
                                          f"local:window={window90}", "--causal"]))
    # Every row names its kernel, so P = 1 is the like-for-like base: native by default;
    # cuDNN (--kernel cudnn: each ring step's views on cuDNN's graphs, merged by lse; P = 1 is
    # the single-GPU cuDNN plan); on an sm_90 the sm_90a kernels (--kernel hopper, forward and
    # backward; elsewhere those rows say why they ran native).
    configs.insert(1, ("dense (cudnn)", ["--kernel", "cudnn"]))
    configs += [("causal (cudnn)", ["--kernel", "cudnn", "--causal"]),
                ("causal (hopper)", ["--kernel", "hopper", "--causal"]),
                ("sparse 90% causal (hopper)", ["--kernel", "hopper", "--attention",
                                                "block-sparse", "--pattern",
                                                f"local:window={window90}", "--causal"])]
    # Windows and packed documents on the ring: cuDNN's bands per document beside ours
    # (--kernel auto's choice, timed on the first call; its notes give both times).
    window = max(256, n // 16)
    docs = ",".join(str(n // 8) for _ in range(7)) + "," + str(n - 7 * (n // 8))
    configs += [(f"causal window {window} (cudnn)", ["--kernel", "cudnn", "--causal",
                                                     "--window", str(window)]),
                (f"causal window {window} (hopper)", ["--kernel", "hopper", "--causal",
                                                      "--window", str(window)]),
                ("packed 8 docs causal (cudnn)", ["--kernel", "cudnn", "--causal",
                                                  "--seqlens", docs]),
                ("packed 8 docs causal (hopper)", ["--kernel", "hopper", "--causal",
                                                   "--seqlens", docs]),
                ("causal (auto)", ["--kernel", "auto", "--causal"])]
    configs = [(name, extra) for name, extra in configs if config_kernel(name) in kernels]
    for name, extra in configs:
        base = None
        for p in (1, 2, 4):
            if time.time() - t0 > a.budget_s:
                skipped.append(f"{name} P={p}")
                continue
            j, err = run_cli(a.cli, ["--seq-len", str(n), "--ring-size", str(p), "--warmup", "1",
                                     "--iters", str(a.iters)]
                             + ([] if "cudnn" in name or "hopper" in name or "auto" in name
                                else ["--kernel", "native"]) + extra,
                             timeout=240)
            if err:
                errors.append(err)
                continue
            row = {"bench": "ring", "config": name, "ranks": p, "seq_len": n, "device": j["device"],
                   "fwd_ms": j["fwd_ms"], "bwd_ms": j.get("bwd_ms"),
                   "fwd_tflops": j["fwd_gflops"] / 1e3,
                   "bwd_tflops": (j.get("bwd_gflops") or 0) / 1e3,
                   "comm_exposed_ms": j.get("comm_exposed_ms"),
                   "bytes_sent": j["bytes_sent"], "bytes_sent_min": j["bytes_sent_min"],
                   "device_peak_bytes": j["device_peak_bytes"], "kernel": j["kernel"],
                   "kernel_backward": j.get("kernel_backward"),
                   "emulated_device": j.get("emulated_device", False)}
            if p == 1:
                base = row
            elif base:
                row["fwd_vs_p1"] = base["fwd_ms"] / row["fwd_ms"]
                if row["bwd_ms"] and base["bwd_ms"]:
                    row["bwd_vs_p1"] = base["bwd_ms"] / row["bwd_ms"]
            results.append(row)

    # Block-sparse against the same kernel family's dense forward on one rank: the native
    # kernels, and the sm_90a ones (--kernel hopper, forward and backward) where
    # the device is an sm_90. local:window=W keeps key blocks within W / (2 * 128) blocks of
    # the query block: radius nb/20 is ~90 % sparse, nb/40 ~95 %.
    dense = {"native": next((r for r in results if r["config"] == "dense" and r["ranks"] == 1),
                            None)}
    if "hopper" in kernels and time.time() - t0 <= a.budget_s:
        j, err = run_cli(a.cli, ["--seq-len", str(n), "--kernel", "hopper", "--warmup", "1",
                                 "--iters", str(a.iters)], timeout=240)
        if err:
            errors.append(err)
        elif j["kernel"] != "hopper":
            skipped.append("the hopper rows: " + "; ".join(j.get("notes", [])))
        else:
            dense["hopper"] = {"fwd_ms": j["fwd_ms"], "bwd_ms": j.get("bwd_ms")}
            results.append({"bench": "ring", "config": "dense (hopper)", "ranks": 1,
                            "seq_len": n, "device": j["device"], "fwd_ms": j["fwd_ms"],
                            "bwd_ms": j.get("bwd_ms"), "fwd_tflops": j["fwd_gflops"] / 1e3,
                            "bwd_tflops": (j.get("bwd_gflops") or 0) / 1e3,
                            "comm_exposed_ms": None, "bytes_sent": 0, "bytes_sent_min": 0,
                            "device_peak_bytes": j["device_peak_bytes"], "kernel": "hopper",
                            "emulated_device": j.get("emulated_device", False)})
    nb = n // 128
    for kernel in [k for k in ("native", "hopper") if k in dense and k in kernels]:
        for window in sorted({2 * 128 * max(1, nb // 20), 2 * 128 * max(1, nb // 40)}, reverse=True):
            if time.time() - t0 > a.budget_s:
                skipped.append(f"block-sparse window {window} ({kernel})")
                continue
            j, err = run_cli(a.cli, ["--seq-len", str(n), "--attention", "block-sparse",
                                     "--pattern", f"local:window={window}", "--kernel", kernel,
                                     "--warmup", "1", "--iters", str(a.iters)], timeout=240)
            if err:
                errors.append(err)
                continue
            density = 1.0 - j["sparsity"]
            row = {"bench": "block-sparse", "config": f"local:window={window}", "ranks": 1,
                   "seq_len": n, "device": j["device"], "sparsity": j["sparsity"],
                   "kernel": j["kernel"], "fwd_ms": j["fwd_ms"], "bwd_ms": j.get("bwd_ms"),
                   "device_peak_bytes": j["device_peak_bytes"],
                   "emulated_device": j.get("emulated_device", False)}
            base = dense[kernel]
            if base:
                row["fwd_vs_ideal"] = base["fwd_ms"] * density / j["fwd_ms"]
                if j.get("bwd_ms") and base["bwd_ms"]:
                    row["bwd_vs_ideal"] = base["bwd_ms"] * density / j["bwd_ms"]
            results.append(row)

    with open(os.path.join(a.out, "ring_bench_rows.jsonl"), "w") as f:
        for r in results:
            f.write(json.dumps(r) + "\n")
        for e in errors:
            f.write(json.dumps({"error": e}) + "\n")
    device = device_name() or (results[0]["device"] if results else "unknown")
    if any(r.get("emulated_device") for r in results):
        device += " (EMULATED: not GPU timings)"
    lines = [f"ringattn GPU ring / block-sparse benchmark on {device}, bf16, B=1 H={H} D={D} "
             f"N={n}, {time.strftime('%Y-%m-%d %H:%M:%S')}",
             "ring ranks share the one GPU (virtual ranks, in-process device copies): vs P1 is "
             "engine overhead, not multi-GPU scaling",
             f"{'config':<22}{'kernel':>7}{'P':>3}{'fwd ms':>10}{'bwd ms':>10}{'fwd TF/s':>9}{'bwd TF/s':>9}"
             f"{'exposed f/b ms':>16}{'vs P1 f/b':>12}{'sent MiB':>9}{'bytes==min':>11}"
             f"{'dev peak MiB':>13}"]
    for r in results:
        if r["bench"] == "ring":
            ex = r["comm_exposed_ms"] or {}
            exs = f"{ex.get('fwd_ms', 0):.2f}/{ex.get('bwd_ms', 0):.2f}" if ex else "-"
            vs = f"{r.get('fwd_vs_p1', 1):.2f}/{r.get('bwd_vs_p1', 1):.2f}"
            lines.append(f"{r['config']:<22}{r['kernel']:>7}{r['ranks']:>3}{r['fwd_ms']:>10.2f}"
                         f"{(r['bwd_ms'] or 0):>10.2f}{r['fwd_tflops']:>9.1f}{r['bwd_tflops']:>9.1f}"
                         f"{exs:>16}{vs:>12}{r['bytes_sent'] / 2**20:>9.1f}"
                         f"{str(r['bytes_sent'] == r['bytes_sent_min']):>11}"
                         f"{r['device_peak_bytes'] / 2**20:>13.0f}")
    for r in results:
        if r["bench"] == "block-sparse":
            lines.append(f"block-sparse {r['config']} ({r['kernel']}): sparsity "
                         f"{100 * r['sparsity']:.1f}%, fwd "
                         f"{r['fwd_ms']:.2f} ms, bwd {(r['bwd_ms'] or 0):.2f} ms; of the ideal "
                         f"1/density speed-up over the same kernel's dense: fwd {r.get('fwd_vs_ideal', 0):.2f}, "
                         f"bwd {r.get('bwd_vs_ideal', 0):.2f}")
    for e in errors:
        lines.append(f"error: {e[:400]}")
    if skipped:
        lines.append(f"skipped for the time budget: {', '.join(skipped)}")
    table = "\n".join(lines)
    with open(os.path.join(a.out, "ring_bench_table.txt"), "w") as f:
        f.write(table + "\n")
    print(table)
    return 1 if errors else 0


if __name__ == "__main__":
    raise SystemExit(main())
