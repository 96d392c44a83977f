"""PyTorch baselines for the GPU benchmark, timed like gpu_bench (CUDA events, warm-up,
median): `torch_sdpa` is torch.nn.functional.scaled_dot_product_attention on [B, H, N, D];
`torch_seed` is grouped dilated attention in plain PyTorch written from
docs/SEMANTICS.md: per head group, gather the dilated rows of every segment, run SDPA on
[B*S, Hg, m, D], scatter back, divide by the number of groups. Used by run_bench.py."""
import math

import torch
import torch.nn.functional as F


def _inputs(batch, seq_len, heads, head_dim, dtype, requires_grad):
    g = torch.Generator(device="cuda").manual_seed(0)
    def one():
        x = torch.randn(batch, seq_len, heads, head_dim, device="cuda", dtype=dtype, generator=g)
        return x.requires_grad_(requires_grad)
    return one(), one(), one()


def dense_sdpa(q, k, v, causal):
    # [B, N, H, D] -> [B, H, N, D] views, as a model would hand them over.
    o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                       is_causal=causal)
    return o.transpose(1, 2)


def group_heads(heads, groups, g):
    base, extra = divmod(heads, groups)
    first = g * base + min(g, extra)
    return first, base + (1 if g < extra else 0)


def dilated_grouped(q, k, v, segments, dilations, causal):
    """Grouped dilated attention in plain PyTorch: gather, SDPA, scatter."""
    b, n, h, d = q.shape
    groups = len(segments)
    out = torch.zeros_like(q)
    for g, (w, r) in enumerate(zip(segments, dilations)):
        first, count = group_heads(h, groups, g)
        off = g % r
        if count == 0 or off >= w:
            continue
        s = n // w
        def gather(x):
            x = x[:, :, first:first + count].reshape(b, s, w, count, d)[:, :, off::r]
            m = x.shape[2]
            return x.permute(0, 1, 3, 2, 4).reshape(b * s, count, m, d), m
        qg, m = gather(q)
        kg, _ = gather(k)
        vg, _ = gather(v)
        og = F.scaled_dot_product_attention(qg, kg, vg, is_causal=causal)
        og = og.reshape(b, s, count, m, d).permute(0, 1, 3, 2, 4)
        view = out[:, :, first:first + count].reshape(b, s, w, count, d)
        view[:, :, off::r] = og.to(out.dtype)
    return out / groups


def time_ms(fn, warmup, iters):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(iters):
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    s = sorted(times)
    return s[len(s) // 2], times


def run(row, warmup, iters):
    """Times forward and backward of the torch implementations for one benchmark row: dense
    rows once per SDPA backend that runs them (torch_flash, torch_cudnn), dilated rows as
    the plain-PyTorch gather/SDPA/scatter (torch_seed, default backend). Returns result
    dicts (one per implementation and pass) with ms, or an error string (OOM, a backend that
    refuses the row)."""
    if row["attention"] != "dense":
        fwd = lambda q, k, v: dilated_grouped(q, k, v, row["segments"], row["dilations"],
                                              row["causal"])
        return _run_one(row, "torch_seed", fwd, warmup, iters)
    from torch.nn.attention import SDPBackend, sdpa_kernel
    results = []
    for impl, backend in (("torch_flash", SDPBackend.FLASH_ATTENTION),
                          ("torch_cudnn", SDPBackend.CUDNN_ATTENTION)):
        def fwd(q, k, v, backend=backend):
            with sdpa_kernel(backend):
                return dense_sdpa(q, k, v, row["causal"])
        results += _run_one(row, impl, fwd, warmup, iters)
    return results


def _run_one(row, impl, fwd, warmup, iters):
    batch, n, heads, d = row["batch"], row["seq_len"], row["heads"], row["head_dim"]
    dtype = torch.bfloat16
    results = []
    try:
        with torch.no_grad():
            q, k, v = _inputs(batch, n, heads, d, dtype, False)
            ms, all_ms = time_ms(lambda: fwd(q, k, v), warmup, iters)
            results.append({"impl": impl, "pass": "fwd", "ms": ms, "ms_all": all_ms})
            del q, k, v
        q, k, v = _inputs(batch, n, heads, d, dtype, True)
        o = fwd(q, k, v)
        dout = torch.randn_like(o)
        def bwd():
            q.grad = k.grad = v.grad = None
            torch.autograd.grad(o, (q, k, v), dout, retain_graph=True)
        ms, all_ms = time_ms(bwd, warmup, iters)
        results.append({"impl": impl, "pass": "bwd", "ms": ms, "ms_all": all_ms})
    except torch.cuda.OutOfMemoryError as e:
        results.append({"impl": impl, "pass": "fwd", "error": "out of memory: " + str(e)[:200]})
    except RuntimeError as e:  # a backend that cannot run the row
        results.append({"impl": impl, "pass": "fwd", "error": str(e)[:300]})
    finally:
        torch.cuda.empty_cache()
    return results
