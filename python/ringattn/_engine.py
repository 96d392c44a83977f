"""The calls into the engine that ringattn.attention's autograd Function (functional.py) and
its torch custom op (_ops.py) both make: the plan from the communicator's cache, the forward
and backward into fresh outputs, the block mask and the sinks as the engine reads them. Below
both, so neither imports the other for them.
"""
from __future__ import annotations

import numpy as np

from . import _core

try:
    import torch
except ImportError as e:
    # Only torch being absent means numpy-only use. torch installed but failing to import (a
    # missing dependency, a library clash) is an error to see, not a reason to run without it.
    if not (isinstance(e, ModuleNotFoundError) and e.name == "torch"):
        raise ImportError(f"ringattn: torch is installed but failed to import: {e}") from e
    torch = None


def _is_torch(x) -> bool:
    return torch is not None and isinstance(x, torch.Tensor)


def _mask_array(block_mask):
    if block_mask is None:
        return None
    if _is_torch(block_mask):
        block_mask = block_mask.detach().cpu().numpy()
    mask = np.ascontiguousarray(np.asarray(block_mask))
    if mask.dtype != np.bool_:
        raise ValueError(f"block_mask: must be a bool array, got dtype {mask.dtype}")
    return mask


def _sinks_array(sinks, q, use_torch, check_values=True):
    """The sink logits as the engine reads them: float32 [H], contiguous, where q is (a copy
    only where needed); None stays None. check_values: refuse NaN and +inf (host values only:
    a device check would wait for the GPU, and torch.compile cannot trace one)."""
    if sinks is None:
        return None
    heads = q.shape[2]
    if use_torch:
        if not isinstance(sinks, torch.Tensor):
            raise ValueError(f"sinks: expected a torch.Tensor like q, got {type(sinks).__name__}")
        if not sinks.is_floating_point():
            raise ValueError(f"sinks: must be a floating-point tensor, got {sinks.dtype}")
        if sinks.device != q.device:
            raise ValueError(f"sinks: is on {sinks.device}, q on {q.device}")
        s = sinks.detach().to(torch.float32).contiguous()
    else:
        s = np.ascontiguousarray(np.asarray(sinks), dtype=np.float32)
    if tuple(s.shape) != (heads,):
        raise ValueError(f"sinks: must have shape [{heads}] (one logit per query head), got "
                         f"{list(s.shape)}")
    if check_values and (not use_torch or not s.is_cuda):
        bad = np.isnan(s).any() or np.isposinf(s).any() if not use_torch else bool(
            torch.isnan(s).any() or torch.isposinf(s).any())
        if bad:
            raise ValueError("sinks: a sink is NaN or +inf; each is a finite logit, or -inf for "
                             "none")
    return s


def _plan(q, k, comm, options, mask, layout="bnhd", kv_layout="bnhd"):
    key = (tuple(q.shape), tuple(k.shape), layout, kv_layout, str(getattr(q, "device", "cpu")),
           str(q.dtype)) + tuple(
        (name, tuple(value) if isinstance(value, list) else value)
        for name, value in options.items())
    if mask is not None:
        key += (mask.shape, mask.tobytes())

    def make():
        return _core.AttentionOp(q, k, block_mask=mask, comm=comm._handle, **options)

    return comm._plan(key, make)


def _empty_like(x, layout, use_torch, head_dim=None):
    """An uninitialised float32 tensor of x's [B, N, H, D] shape in `layout`, on x's device;
    with head_dim, of that last dim instead (the output has v's head dim, not q's)."""
    b, n, h, d = x.shape
    d = d if head_dim is None else head_dim
    if use_torch:
        if layout == "bhnd":
            return x.new_empty((b, h, n, d), dtype=torch.float32).transpose(1, 2)
        return x.new_empty((b, n, h, d), dtype=torch.float32)
    if layout == "bhnd":
        return np.swapaxes(np.empty((b, h, n, d), dtype=np.float32), 1, 2)
    return np.empty((b, n, h, d), dtype=np.float32)


def _in_layout(x, layout):
    """x (torch, [B, N, H, D], any strides) laid out as `layout` says, copied only if needed."""
    if layout == "bhnd":
        return x.transpose(1, 2).contiguous().transpose(1, 2)
    return x.contiguous()


def _stream(x) -> int:
    """The caller's stream for x's device (its cudaStream_t), 0 for host tensors: the engine's
    work is ordered after what the stream holds and before what it is given next."""
    return torch.cuda.current_stream(x.device).cuda_stream if x.is_cuda else 0


def _forward(op, q, k, v, use_torch, sinks=None):
    """(out, lse) of the engine, float32 (on a GPU engine, q, k, v are in its dtype), out of
    v's head dim; with sinks (any float dtype, [H]), lse includes them."""
    b, n, h, _ = q.shape
    out = _empty_like(q, op.layout, use_torch, v.shape[3])
    s = _sinks_array(sinks, q, use_torch)
    if not use_torch:
        lse = np.empty((b, h, n), dtype=np.float32)
        op.forward(q, k, v, out, lse, sinks=s)
        return out, lse
    lse = q.new_empty((b, h, n), dtype=torch.float32)
    op.forward(q.detach(), k.detach(), v.detach(), out, lse, sinks=s, stream=_stream(q))
    return out, lse


def _backward(op, q, k, v, out, lse, grad_out, sinks=None):
    """(dq, dk, dv, dsinks) of the engine for torch tensors, in q's, k's, v's and the sinks'
    dtypes (dsinks None without sinks); grad_out (any strides, any float dtype) is read in the
    engine's layout and dtype."""
    g = _in_layout(grad_out, op.layout).to(q.dtype)
    dq = _empty_like(q, op.layout, True)
    dk, dv = (_empty_like(x, op.kv_layout, True) for x in (k, v))
    s = _sinks_array(sinks, q, True)
    ds = None if s is None else torch.empty_like(s)
    op.backward(q.detach(), k.detach(), v.detach(), out.detach(), lse.detach(), g, dq, dk, dv,
                sinks=s, dsinks=ds, stream=_stream(q))
    return (dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype),
            None if ds is None else ds.to(sinks.dtype))
