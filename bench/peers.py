#!/usr/bin/env python3
"""ringattn against PyTorch on this CPU, in one run (bench/run_peers.sh calls this).

Rows, each timed as the median of --iters after one warm-up, implementations alternating per
configuration so that both see the same machine state:
  - dense and causal, forward and backward: PyTorch scaled_dot_product_attention (fp32, CPU)
    on contiguous [B,H,N,D] tensors (its own convention) and `ringattn run --device cpu`
    on [B,N,H,D] (its default), or on [B,H,N,D] like SDPA with --ringattn-layout bhnd; with
    --sdpa-bnhd also SDPA on [B,N,H,D] views (rows torch_sdpa_bnhd), the bytes ringattn
    reads by default. Every row's JSON says its layout;
  - block-sparse local band (--window tokens, blocks of --block): FlexAttention compiled with
    torch.compile on the CPU (forward; its backward where the CPU backend has one) and
    `ringattn run --attention block-sparse --pattern local:window=W`, on the layout(s)
    --ringattn-layout names, like the dense rows;
  - the same run's SGEMM rate, the machine's FMA peak and ringattn's forward tile products
    alone (cpu_bench --sgemm-only), measured first and last; %peak is each row's GFLOP/s over
    the FMA peak at the start.
Both implementations get the same thread count (torch.set_num_threads, ringattn --threads).
FLOPs: forward 4*B*H*D*(attended pairs), backward 2.5x that; the ratio column is PyTorch's
time over ringattn's on the same row (> 1: ringattn is faster): the ratio of the two medians,
then each side's best round over the other's, then the median of the per-round ratios (both
sides of a round run back to back).

Without torch the ringattn rows and the SGEMM rate still run and the output says how to get
torch. Writes <prefix>.txt (table) and <prefix>.jsonl (one JSON object per row)."""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HOW_TO_GET_TORCH = """PyTorch >= 2.0 is not importable from this Python ({exe}).
To add the peer rows: make a venv outside the repository and install torch from PyPI,
  /usr/bin/python3 -m venv ~/torch-venv
  ~/torch-venv/bin/pip install torch
(PyPI's Linux wheel is the CUDA build; with only PyPI reachable and no GPU, the CPU code
still runs: see bench/README.md for the smaller set of packages that was enough here), then
  TORCH_PYTHON=~/torch-venv/bin/python bench/run_peers.sh"""


def sh(cmd, env=None):
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if r.returncode != 0:
        sys.exit(f"peers.py: {' '.join(cmd)} failed ({r.returncode}):\n{r.stdout}\n{r.stderr}")
    return r.stdout


def ringattn_row(args, extra, backward):
    cmd = [args.ringattn, "run", "--device", "cpu", "--batch", "1", "--seq-len", str(args.n),
           "--heads", str(args.heads), "--head-dim", str(args.dim), "--threads",
           str(args.threads), "--iters", str(args.iters), "--warmup", "1", "--json"] + extra
    if backward:
        cmd.append("--backward")
    out = sh(cmd)
    return json.loads([line for line in out.splitlines() if line.startswith("{")][-1]), cmd


def sgemm_rate(args):
    """(SGEMM, FMA peak, forward tile products alone) in GFLOP/s on args.threads threads."""
    out = sh([args.cpu_bench, "--sgemm-only", "--threads", str(args.threads)])
    j = json.loads([line for line in out.splitlines() if line.startswith("{")][-1])
    return j["sgemm_gflops"], j.get("fma_peak_gflops") or None, j.get("tile_products_gflops")


def median_ms(fn, iters):
    fn()  # warm-up
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


class Torch:
    def __init__(self, threads):
        import torch
        if not hasattr(torch.nn.functional, "scaled_dot_product_attention"):
            # e.g. Debian bookworm's python3-torch 1.13: SDPA arrived in torch 2.0
            raise ImportError(f"torch {torch.__version__} has no scaled_dot_product_attention")
        self.torch = torch
        torch.set_num_threads(threads)
        self.version = torch.__version__

    def inputs(self, b, h, n, d, grad, layout="bhnd"):
        """[B, H, N, D] tensors: contiguous (SDPA's own convention), or with layout "bnhd"
        views of contiguous [B, N, H, D] storage, as a model passes them after
        q.view(B, N, H, D).transpose(1, 2) (ringattn's layout, the same bytes it reads)."""
        t = self.torch
        g = t.Generator().manual_seed(0)
        if layout == "bnhd":
            base = [t.randn(b, n, h, d, generator=g, requires_grad=grad) for _ in range(3)]
            return [x.transpose(1, 2) for x in base]
        return [t.randn(b, h, n, d, generator=g, requires_grad=grad) for _ in range(3)]

    def sdpa(self, args, causal, backward, layout="bhnd"):
        t = self.torch
        F = t.nn.functional
        q, k, v = self.inputs(1, args.heads, args.n, args.dim, backward, layout)
        if not backward:
            with t.no_grad():
                return median_ms(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal),
                                 args.iters)
        dout = t.randn(1, args.heads, args.n, args.dim)

        def bwd_only():  # times the backward alone, the forward outside the clock
            out = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
            for x in (q, k, v):  # a view's gradient is its base's
                (x if x._base is None else x._base).grad = None
            t0 = time.perf_counter()
            out.backward(dout)
            return (time.perf_counter() - t0) * 1e3

        bwd_only()
        return statistics.median(bwd_only() for _ in range(args.iters))

    def flex(self, args, backward):
        t = self.torch
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
        reach = args.window // (2 * args.block)  # the same band as ringattn's local pattern

        def band(b, h, qi, ki):
            return (qi // args.block - ki // args.block).abs() <= reach

        if not hasattr(self, "_flex"):  # compiled once per process, reused by every round
            self._flex = (create_block_mask(band, None, None, args.n, args.n, device="cpu",
                                            BLOCK_SIZE=args.block),
                          t.compile(flex_attention, dynamic=False))
        mask, fa = self._flex
        q, k, v = self.inputs(1, args.heads, args.n, args.dim, backward)
        nb = args.n // args.block
        pairs = sum(min(nb - 1, i + reach) - max(0, i - reach) + 1 for i in range(nb))
        pairs *= args.block * args.block * args.heads
        if not backward:
            with t.no_grad():
                fa(q, k, v, block_mask=mask)  # compile outside the clock
                return median_ms(lambda: fa(q, k, v, block_mask=mask), args.iters), pairs
        dout = t.randn(1, args.heads, args.n, args.dim)

        def bwd_only():
            out = fa(q, k, v, block_mask=mask)
            for x in (q, k, v):
                x.grad = None
            t0 = time.perf_counter()
            out.backward(dout)
            return (time.perf_counter() - t0) * 1e3

        bwd_only()
        return statistics.median(bwd_only() for _ in range(args.iters)), pairs


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ringattn", required=True)
    ap.add_argument("--cpu-bench", required=True)
    ap.add_argument("--prefix", required=True, help="output path without .txt/.jsonl")
    ap.add_argument("--commit", default="unknown")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--n", type=int, default=16384)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--window", type=int, default=1536)
    ap.add_argument("--block", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3,
                    help="rounds per row, alternating which implementation runs first")
    ap.add_argument("--no-torch", action="store_true")
    ap.add_argument("--ringattn-layout", choices=("bnhd", "bhnd", "both"), default="bnhd",
                    help="ringattn's tensors (--layout): bhnd computes on [B,H,N,D], as "
                         "SDPA's and FlexAttention's rows do (rows ringattn_bhnd); both runs "
                         "each, and SDPA on each (implies --sdpa-bnhd)")
    ap.add_argument("--sdpa-bnhd", action="store_true",
                    help="also time SDPA on [B,N,H,D] views (torch_sdpa_bnhd rows): the same "
                         "tensors, in the same layout, as ringattn reads")
    args = ap.parse_args()

    lines, rows = [], []

    def say(s):
        print(s, flush=True)
        lines.append(s)

    torch = None
    if not args.no_torch:
        try:
            torch = Torch(args.threads)
        except ImportError as e:
            say(f"# ({e})")
            say("# " + HOW_TO_GET_TORCH.format(exe=sys.executable).replace("\n", "\n# "))
    machine = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo")
                    if ln.startswith("model name")), "unknown CPU")
    date = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    gemm_first, peak_first, products_first = sgemm_rate(args)
    say(f"# ringattn vs PyTorch on the CPU, one run; commit {args.commit}, {date}")
    say(f"# machine: {machine}, {args.threads} threads for every implementation")
    say(f"# torch: {torch.version if torch else 'not available'} ({sys.executable})")
    say(f"# shape B=1 N={args.n} H={args.heads} D={args.dim}, fp32, median of {args.iters} "
        f"after a warm-up, per round; {args.rounds} rounds alternating which side runs first, "
        "median of the rounds; FLOPs fwd 4*B*H*D*pairs, bwd 2.5x")
    say(f"# load average at the start: {open('/proc/loadavg').read().strip()}")
    say(f"# OPENBLAS_CORETYPE={os.environ.get('OPENBLAS_CORETYPE', '(unset: ringattn picks from CPUID)')}"
        f" OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', '(unset)')}")
    forced = [f"{k}={os.environ[k]}" for k in ("RINGATTN_CPU_KERNELS", "LIBXSMM_TARGET",
                                               "ATEN_CPU_CAPABILITY", "MKL_ENABLE_INSTRUCTIONS",
                                               "ONEDNN_MAX_CPU_ISA") if os.environ.get(k)]
    flags = next((ln.split(":", 1)[1].split() for ln in open("/proc/cpuinfo")
                  if ln.startswith("flags")), [])
    say("# CPU vector extensions: " + (" ".join(f for f in ("avx2", "fma", "avx512f") if f in flags)
                                       or "none of avx2, fma, avx512f"))
    say("# vector variants forced: " + (" ".join(forced) if forced else "none (each side picks "
                                          "from CPUID)")
        + (f"; torch's ATen CPU capability: {torch.torch.backends.cpu.get_cpu_capability()}"
           if torch else ""))
    say(f"# block-sparse: local band, window {args.window} tokens, blocks of {args.block}")
    say(f"# SGEMM (cpu_bench --sgemm-only, 512^3 per thread): {gemm_first:.1f} GFLOP/s at the start")
    say("# FMA peak (cpu_bench --sgemm-only, registers only): "
        + (f"{peak_first:.1f} GFLOP/s at the start" if peak_first else "not measured (no FMA build)"))
    if products_first:
        say(f"# ringattn's forward tile products alone (cpu_bench --sgemm-only, operands in "
            f"cache): {products_first:.1f} GFLOP/s at the start")
    header = (f"{'impl':<22} {'attention':<13} {'causal':<6} {'pass':<4} {'ms':>10} "
              f"{'GFLOP/s':>8} {'%gemm':>6} {'%peak':>6} {'torch/ours':>10} {'best/best':>9} "
              f"{'paired':>9}")

    def paired_ratio(peer_rounds, ours_rounds):
        # Both sides of a round run back to back, so a slow phase of the machine (other
        # tenants) mostly hits both: the median of the per-round ratios is steadier than the
        # ratio of the two medians when rounds drift.
        if len(peer_rounds) != len(ours_rounds):
            return None
        return statistics.median(p / o for p, o in zip(peer_rounds, ours_rounds))

    def emit(impl, attention, causal, pss, ms, pairs, ours_ms=None, note=None, best=None,
             paired=None):
        # pairs counts every (batch, head) row, like ringattn's attended_pairs
        flops = 4.0 * args.dim * pairs * (2.5 if pss == "bwd" else 1.0)
        gf = flops / (ms * 1e6) if ms else None
        row = {"impl": impl, "attention": attention, "causal": causal, "pass": pss, "N": args.n,
               "H": args.heads, "D": args.dim, "B": 1, "threads": args.threads, "ms": ms,
               "gflops": gf, "attended_pairs": pairs, "commit": args.commit, "date": date,
               "machine": machine}
        ratio = ""
        if ours_ms and ms and impl != "ringattn":
            row["ratio_vs_ringattn"] = ms / ours_ms
            ratio = f"{ms / ours_ms:.2f}x"
        if best:  # each side's least disturbed round: other load on the machine only adds time
            row["best_round_ratio_vs_ringattn"] = best
            ratio += f" {best:>8.2f}x"
        if paired:
            row["paired_round_ratio_vs_ringattn"] = paired
            ratio += f" {paired:>8.2f}x"
        if note:
            row["note"] = note
        row["layout"] = layout_of[impl]  # the tensors the row computed on
        rows.append(row)
        if ms is None:
            say(f"{impl:<22} {attention:<13} {str(causal):<6} {pss:<4} {'-':>10}  {note}")
        else:
            pk = f"{100 * gf / peak_first:>5.0f}%" if peak_first else f"{'-':>6}"
            say(f"{impl:<22} {attention:<13} {str(causal):<6} {pss:<4} {ms:>10.1f} {gf:>8.1f} "
                f"{100 * gf / gemm_first:>5.0f}% {pk} {ratio:>10}")

    # Rounds alternate which implementation goes first; a row's figure is the median of its
    # rounds' medians, so a burst of other load on the machine hits both sides alike.
    samples, pairs_of, notes, blas = {}, {}, {}, None
    # ringattn's dense rows per tensor layout: "ringattn" reads [B,N,H,D] (its default),
    # "ringattn_bhnd" [B,H,N,D] (--layout bhnd), dense and block-sparse alike.
    ours_impl = {"bnhd": "ringattn", "bhnd": "ringattn_bhnd"}
    our_layouts = (["bnhd", "bhnd"] if args.ringattn_layout == "both"
                   else [args.ringattn_layout])
    sdpa_layouts = ["bhnd"] + (["bnhd"] if args.sdpa_bnhd or args.ringattn_layout == "both"
                               else [])
    sdpa_impl = {"bhnd": "torch_sdpa", "bnhd": "torch_sdpa_bnhd"}
    layout_of = {"ringattn": "bnhd", "ringattn_bhnd": "bhnd", "torch_sdpa": "bhnd",
                 "torch_sdpa_bnhd": "bnhd", "torch_flex_compiled": "bhnd"}

    def add(key, ms, pairs):
        samples.setdefault(key, []).append(ms)
        pairs_of[key] = pairs

    sparse_extra = ["--attention", "block-sparse", "--block-size", str(args.block), "--pattern",
                    f"local:window={args.window}"]
    for rnd in range(args.rounds):
        for attention, causal in (("dense", False), ("dense", True), ("block-sparse", False)):
            def ours_side():
                nonlocal blas
                for layout in our_layouts:
                    extra = ["--layout", layout] + (
                        sparse_extra if attention == "block-sparse" else
                        ["--attention", "dense"] + (["--causal"] if causal else []))
                    j, _ = ringattn_row(args, extra, backward=True)
                    blas = blas or j.get("blas", {})
                    for pss in ("fwd", "bwd"):
                        add((ours_impl[layout], attention, causal, pss), j[f"{pss}_ms"],
                            j["attended_pairs"])

            def torch_side():
                if attention == "dense":
                    pairs = args.heads * (args.n * (args.n + 1) // 2 if causal else args.n ** 2)
                    for pss in ("fwd", "bwd"):
                        for layout in sdpa_layouts:
                            add((sdpa_impl[layout], attention, causal, pss),
                                torch.sdpa(args, causal, pss == "bwd", layout), pairs)
                    return
                # The backward (no CPU backward in torch 2.15) is tried once, in the last round:
                # a failed try changes the compiled function's guards, and the recompiled
                # forward of the next round materialised the 16K x 16K scores (24 GB, killed).
                for pss in ("fwd",) + (("bwd",) if rnd == args.rounds - 1 else ()):
                    key = ("torch_flex_compiled", attention, causal, pss)
                    if key in notes:
                        continue
                    try:
                        ms, pairs = torch.flex(args, pss == "bwd")
                        add(key, ms, pairs)
                    except Exception as e:  # noqa: BLE001 - a peer that cannot run says so
                        notes[key] = (f"failed: {type(e).__name__}: "
                                      f"{str(e).splitlines()[0][:120]}")

            sides = [ours_side] + ([torch_side] if torch else [])
            for side in (sides if rnd % 2 == 0 else sides[::-1]):
                side()
    b = blas or {}
    say("# tensors: torch_sdpa and FlexAttention [B,H,N,D] contiguous, torch_sdpa_bnhd "
        "[B,N,H,D] views; ringattn [B,N,H,D], ringattn_bhnd [B,H,N,D] (--layout bhnd); "
        "each PyTorch row's ratios are against the ringattn row on its layout when there is "
        "one (same_layout_as_ringattn in the JSON), else against the other")
    say(f"# ringattn BLAS: {b.get('config')}; kernels {b.get('core')}; "
        f"{b.get('threading')}, {b.get('threads_per_call')} thread(s) per call")
    say(f"# ringattn tile products: {b.get('small_gemm')}; softmax steps: "
        f"{b.get('vector_kernels', '(not reported by this build)')}")
    say(header)
    for attention, causal in (("dense", False), ("dense", True), ("block-sparse", False)):
        for pss in ("fwd", "bwd"):
            ours = [ours_impl[lay] for lay in our_layouts]
            for impl in ours:
                key = (impl, attention, causal, pss)
                emit(impl, attention, causal, pss, statistics.median(samples[key]),
                     pairs_of[key])
                rows[-1]["round_medians_ms"] = samples[key]
                rows[-1]["blas"] = {f: b.get(f)
                                    for f in ("file", "threading", "threads_per_call", "core",
                                              "small_gemm", "vector_kernels")}
            peers = ([sdpa_impl[lay] for lay in sdpa_layouts] if attention == "dense"
                     else ["torch_flex_compiled"])
            for peer in peers:
                same = [o for o in ours if layout_of[o] == layout_of[peer]]
                ours_key = (same or ours)[0], attention, causal, pss
                ours_ms = statistics.median(samples[ours_key])
                key = (peer, attention, causal, pss)
                if key in samples:
                    emit(peer, attention, causal, pss, statistics.median(samples[key]),
                         pairs_of[key], ours_ms, best=min(samples[key]) / min(samples[ours_key]),
                         paired=paired_ratio(samples[key], samples[ours_key]))
                    rows[-1]["round_medians_ms"] = samples[key]
                    rows[-1]["ratio_against"] = ours_key[0]
                    rows[-1]["same_layout_as_ringattn"] = bool(same)
                elif key in notes:
                    emit(peer, attention, causal, pss, None, pairs_of[ours_key], note=notes[key])
    pf = [k for k in pairs_of if k[0] == "torch_flex_compiled"]
    sparse_pairs = pairs_of[(ours_impl[our_layouts[0]], "block-sparse", False, "fwd")]
    if pf and pairs_of[pf[0]] != sparse_pairs:
        say(f"# note: FlexAttention's mask has {pairs_of[pf[0]]} pairs, ringattn's "
            f"{sparse_pairs}")

    gemm_last, peak_last, products_last = sgemm_rate(args)
    say(f"# SGEMM at the end: {gemm_last:.1f} GFLOP/s (start {gemm_first:.1f}); FMA peak "
        + (f"{peak_last:.1f} (start {peak_first:.1f})" if peak_first and peak_last else "-")
        + (f"; tile products {products_last:.1f} (start {products_first:.1f})"
           if products_first and products_last else "")
        + f"; load average at the end: {open('/proc/loadavg').read().strip()}")
    rows.append({"impl": "sgemm", "pass": "gemm", "threads": args.threads,
                 "gflops": gemm_first, "gflops_end": gemm_last, "commit": args.commit,
                 "date": date, "machine": machine, "tile_products_gflops": products_first,
                 "tile_products_gflops_end": products_last})
    if peak_first:
        rows.append({"impl": "fma_peak", "pass": "peak", "threads": args.threads,
                     "gflops": peak_first, "gflops_end": peak_last, "commit": args.commit,
                     "date": date, "machine": machine})
    with open(args.prefix + ".txt", "w") as f:
        f.write("\n".join(lines) + "\n")
    with open(args.prefix + ".jsonl", "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    print(f"saved {args.prefix}.txt and {args.prefix}.jsonl")


if __name__ == "__main__":
    main()
