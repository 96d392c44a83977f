"""A float64 reference for the tests, written from docs/SEMANTICS.md with dense masks.

Every mode is one formula: per (head, query) a multiplicity M[h, p, t] of each key (0 or 1,
or the number of mixture patterns selecting it), lse = log sum_t M exp(s q.k), out =
sum_t M exp(s q.k - lse) v; grouped divides out by the number of patterns. With a soft-cap c,
s q.k is c tanh(s q.k / c); v (and out) may have a head dim of their own. Gradients come
from torch autograd in float64. For small N only (it builds [H, N, N]).
"""
import math

import torch


def _selected(n, segment, dilation, offset):
    p = torch.arange(n)
    return ((p % segment) % dilation) == offset


def _pattern_mask(n, segment, dilation, offset):
    sel = _selected(n, segment, dilation, offset)
    p = torch.arange(n)
    same = (p[:, None] // segment) == (p[None, :] // segment)
    return sel[:, None] & sel[None, :] & same


def _group_heads(heads, groups, i):
    base, extra = divmod(heads, groups)
    first = i * base + min(i, extra)
    return range(first, first + base + (1 if i < extra else 0))


def multiplicity(n, heads, *, attention="dense", segments=None, dilations=None,
                 combine="grouped", causal=False, window=None, block_mask=None,
                 block_size=None, seqlens=None):
    """M [H, N, N] float64 and the output divisor (G for grouped, else 1)."""
    p = torch.arange(n)
    base = torch.ones(n, n, dtype=torch.bool)
    if causal:
        base &= p[None, :] <= p[:, None]
    if window is not None:
        left, right = (window, None) if isinstance(window, int) else (window[0], (
            window[1] if len(window) > 1 else None))
        if right is None:
            right = 0 if causal else left
        base &= (p[None, :] >= p[:, None] - left) & (p[None, :] <= p[:, None] + right)
    if seqlens is not None:
        seq_id = torch.repeat_interleave(torch.arange(len(seqlens)), torch.tensor(seqlens))
        base &= seq_id[:, None] == seq_id[None, :]
    m = torch.zeros(heads, n, n, dtype=torch.float64)
    divisor = 1
    if attention == "dense":
        m[:] = base.double()
    elif attention == "dilated":
        g = len(segments)
        if combine == "grouped":
            divisor = g
            for i, (w, r) in enumerate(zip(segments, dilations)):
                for h in _group_heads(heads, g, i):
                    m[h] = (_pattern_mask(n, w, r, i % r) & base).double()
        else:
            for h in range(heads):
                for w, r in zip(segments, dilations):
                    m[h] += (_pattern_mask(n, w, r, h % r) & base).double()
    elif attention == "block-sparse":
        bm = torch.as_tensor(block_mask)
        if bm.dim() == 2:
            bm = bm.expand(heads, -1, -1)
        blocks = p // block_size
        for h in range(heads):
            m[h] = (bm[h][blocks[:, None], blocks[None, :]] & base).double()
    else:
        raise ValueError(attention)
    return m, divisor


def attention(q, k, v, m, divisor, scale=None, sinks=None, softcap=0.0):
    """float64 out [B, N, H, Dv] (v's head dim) and lse [B, H, N] (-inf for rows with no key
    and no sink); differentiable. sinks [H]: attention sinks, one more term of each row's
    normaliser with no value (docs/SEMANTICS.md). softcap c > 0: each scaled score s becomes
    c * tanh(s / c) before the mask (a sink's logit is not capped)."""
    b, n, h, d = q.shape
    g = h // k.shape[2]
    kk = k.repeat_interleave(g, dim=2)
    vv = v.repeat_interleave(g, dim=2)
    s = scale if scale is not None else 1.0 / math.sqrt(d)
    scores = torch.einsum("bphd,bthd->bhpt", q, kk) * s
    if softcap:
        scores = softcap * torch.tanh(scores / softcap)
    allowed = m > 0
    # Finite stand-in for excluded keys so that empty rows give zero (not NaN) gradients.
    scores = scores.masked_fill(~allowed, -1e30) + torch.log(m.clamp_min(1.0))
    if sinks is None:
        lse = torch.logsumexp(scores, dim=-1)
    else:
        sink = sinks.view(1, h, 1, 1).expand(scores.shape[0], h, n, 1)
        lse = torch.logsumexp(torch.cat([scores, sink], dim=-1), dim=-1)
    prob = m * torch.exp(scores - lse[..., None]) / m.clamp_min(1.0)
    out = torch.einsum("bhpt,bthd->bphd", prob, vv) / divisor
    empty = ~allowed.any(-1).expand_as(lse)
    if sinks is not None:
        empty = empty & torch.isneginf(sinks).view(1, h, 1).expand_as(lse)
    lse = torch.where(empty, torch.full_like(lse, -math.inf), lse)
    return out, lse


def forward_backward(q, k, v, dout, scale=None, sinks=None, softcap=0.0, **pattern):
    """Reference out, lse, dq, dk, dv (float64) for float32/64 torch inputs, and dsinks with
    sinks."""
    n, heads = q.shape[1], q.shape[2]
    m, divisor = multiplicity(n, heads, **pattern)
    q64, k64, v64 = (x.detach().double().requires_grad_() for x in (q, k, v))
    s64 = None if sinks is None else torch.as_tensor(sinks).detach().double().requires_grad_()
    out, lse = attention(q64, k64, v64, m, divisor, scale, s64, softcap)
    (out * dout.double()).sum().backward()
    grads = (out.detach(), lse.detach(), q64.grad, k64.grad, v64.grad)
    return grads if s64 is None else grads + (s64.grad,)


def relative_error(got, want):
    got, want = torch.as_tensor(got).detach().double(), torch.as_tensor(want).detach().double()
    inf_got, inf_want = torch.isinf(got), torch.isinf(want)
    if not torch.equal(inf_got, inf_want) or not torch.equal(got[inf_got], want[inf_want]):
        return math.inf
    got, want = got[~inf_got], want[~inf_want]
    norm = torch.linalg.vector_norm(want)
    diff = torch.linalg.vector_norm(got - want)
    return float(diff / norm) if norm > 0 else float(diff)
