"""ringattn.attention and its helpers: options → cached plan → engine, with autograd.

Tensors cross into C++ without copies (DLPack for torch, the buffer protocol for numpy);
the engine writes into outputs allocated here. Every option means what the CLI's option of
the same name means, and is checked by the library's own code (a bad one raises ValueError
with the library's message, its fields said as these keywords).
"""
from __future__ import annotations

import math
import operator
import warnings

import numpy as np

from . import _core
from ._comm import Comm, default_comm
from ._engine import (_backward, _empty_like, _forward, _in_layout, _is_torch, _mask_array, _plan,
                      _sinks_array, torch)

if torch is not None:
    from . import _ops  # the torch custom op, where torch has torch.library (2.4+)
else:
    _ops = None


def _int_list(name, values):
    if values is None:
        return None
    if isinstance(values, (int, np.integer)):
        values = [values]
    try:
        return [operator.index(v) for v in values]
    except TypeError:
        raise TypeError(f"{name}: expected a list of integers, got {values!r}") from None


def _window(window):
    if window is None:
        return None
    return _int_list("window", window)


def _check_tensor(name, x, want_torch):
    """The layout the engine reads x in: "bnhd" (contiguous [B, N, H, D]), "bhnd" (the
    transpose(1, 2) of a contiguous [B, H, N, D]), or None (other strides: a copy is needed)."""
    if want_torch != _is_torch(x):
        kind = "a torch.Tensor" if want_torch else "a numpy array"
        raise ValueError(f"{name}: expected {kind} like q, got {type(x).__name__}")
    if want_torch:
        if x.device.type == "cuda":
            if not _core.has_cuda:
                raise ValueError(f"{name}: is on {x.device}, and this build of ringattn has no "
                                 "CUDA kernels (pip install it where the CUDA toolkit is)")
            if x.dtype not in (torch.bfloat16, torch.float16, torch.float32):
                raise ValueError(f"{name}: a CUDA tensor must be bfloat16, float16 or float32, "
                                 f"got {x.dtype}")
        elif x.device.type != "cpu":
            raise ValueError(f"{name}: is on {x.device}; ringattn computes on the CPU or on CUDA "
                             "devices")
        elif x.dtype != torch.float32:
            raise ValueError(f"{name}: must be float32 (the CPU kernels compute in float32), "
                             f"got {x.dtype}")
    else:
        if not isinstance(x, np.ndarray):
            raise ValueError(f"{name}: expected a torch.Tensor or numpy array, got "
                             f"{type(x).__name__}")
        if x.dtype != np.float32:
            raise ValueError(f"{name}: must be float32 (the CPU kernels compute in float32), "
                             f"got {x.dtype}")
    if x.ndim != 4:
        raise ValueError(f"{name}: must have 4 dimensions [B, N, H, D], got shape "
                         f"{list(x.shape)}")
    if want_torch:
        contiguous = x.is_contiguous()
        head_major = x.transpose(1, 2).is_contiguous()
    else:
        contiguous = x.flags.c_contiguous
        head_major = np.swapaxes(x, 1, 2).flags.c_contiguous
    if contiguous:
        return "bnhd"
    if head_major:  # x.transpose(1, 2) of a contiguous [B, H, N, D] tensor: read in place
        return "bhnd"
    return None


_COPIES_SAID: set = set()


def _copied(name, x, layout, why):
    """x laid out as `layout` (a copy; differentiable for torch), saying so once per reason."""
    key = (name, why)
    if key not in _COPIES_SAID:
        _COPIES_SAID.add(key)
        warnings.warn(f"ringattn: {name}: {why}; copying it into [B, N, H, D] "
                      f"{'rows' if layout == 'bnhd' else 'head-major rows'} for the engine "
                      "(said once)", stacklevel=4)
    if _is_torch(x):
        return _in_layout(x, layout)
    if layout == "bhnd":
        return np.swapaxes(np.ascontiguousarray(np.swapaxes(x, 1, 2)), 1, 2)
    return np.ascontiguousarray(x)


def _readable(q, k, v):
    """q, k, v as the engine reads them, each in its own strides where it can (q and k may
    differ: a head-major KV cache beside token-major queries); copied where it cannot (other
    strides, or v laid out unlike k), said once. Returns (use_torch, layout, kv_layout, q, k,
    v)."""
    use_torch = _is_torch(q)
    layout = _check_tensor("q", q, use_torch)
    kv_layout = _check_tensor("k", k, use_torch)
    v_layout = _check_tensor("v", v, use_torch)
    qs, ks, vs = tuple(q.shape), tuple(k.shape), tuple(v.shape)
    if (ks[0], ks[1], ks[3]) != (qs[0], qs[1], qs[3]):
        raise ValueError(f"k: shape {list(ks)} differs from q's {list(qs)} in batch, length or "
                         "head dim (q and k share theirs)")
    # v may have a head dim of its own (multi-head latent attention); out then has it.
    if vs[:3] != ks[:3]:
        raise ValueError(f"v: shape {list(vs)} differs from k's {list(ks)} in batch, length or "
                         "heads (v's head dim may differ: out has v's)")
    if use_torch:
        for name, x in (("k", k), ("v", v)):
            if x.device != q.device:
                raise ValueError(f"{name}: is on {x.device}, q on {q.device}")
            if x.dtype != q.dtype:
                raise ValueError(f"{name}: is {x.dtype}, q {q.dtype}; give all three one dtype")
        if q.is_cuda:  # the GPU engines read [B, N, H, D] rows only
            gpu_rows = "is head-major, and the GPU engines read [B, N, H, D] rows"
            if layout == "bhnd":
                q, layout = _copied("q", q, "bnhd", gpu_rows), "bnhd"
            if kv_layout == "bhnd":
                k, kv_layout = _copied("k", k, "bnhd", gpu_rows), "bnhd"
            if v_layout == "bhnd":
                v, v_layout = _copied("v", v, "bnhd", gpu_rows), "bnhd"
    unreadable = "has strides the engine cannot read in place"
    if layout is None:
        layout = "bnhd"
        q = _copied("q", q, layout, unreadable)
    if kv_layout is None:
        kv_layout = v_layout or "bnhd"
        k = _copied("k", k, kv_layout, unreadable)
    if v_layout != kv_layout:
        v = _copied("v", v, kv_layout, unreadable if v_layout is None else
                    "is laid out unlike k (the engine reads k and v alike)")
    return use_torch, layout, kv_layout, q, k, v


def _ulysses(ulysses):
    if ulysses == "auto":
        return 0
    if isinstance(ulysses, bool) or not isinstance(ulysses, int) or ulysses < 1:
        raise ValueError(f"ulysses: must be a positive integer or 'auto', got {ulysses!r}")
    return ulysses


def _softcap(softcap):
    """The soft-cap as the engine takes it (0: none). Checked here as the library checks it,
    because a NaN or infinity would not survive the custom op's spec string."""
    if softcap is None:
        return 0.0
    if isinstance(softcap, (bool, str, bytes)):  # float() would take them
        raise TypeError(f"softcap: expected a number (0 or None: no soft-capping), got "
                        f"{softcap!r}")
    try:
        c = float(softcap)
    except (TypeError, ValueError):
        raise TypeError(f"softcap: expected a number (0 or None: no soft-capping), got "
                        f"{softcap!r}") from None
    if not (math.isfinite(c) and c >= 0):
        raise ValueError(f"softcap: must be a finite number >= 0 (0: no soft-capping), got {c!r}")
    return c


def _value_keywords(options, q, v, softcap):
    """options with what v's head dim and the soft-cap ask of the plan (head_dim_v only where
    v's head dim is not q's, as the library leaves it unset then)."""
    d, dv = q.shape[3], v.shape[3]
    options["head_dim_v"] = None if dv == d else int(dv)
    options["softcap"] = _softcap(softcap)
    return options


def _options(attention, segments, dilations, combine, causal, scale, window, seqlens, pattern,
             block_size, ulysses=1, deterministic=False):
    return dict(attention=str(attention), segments=_int_list("segments", segments),
                dilations=_int_list("dilations", dilations), combine=str(combine),
                causal=bool(causal), scale=None if scale is None else float(scale),
                window=_window(window), seqlens=_int_list("seqlens", seqlens),
                pattern=None if pattern is None else str(pattern),
                block_size=operator.index(block_size), ulysses=_ulysses(ulysses),
                deterministic=bool(deterministic))


if torch is not None:

    class _AttentionFunction(torch.autograd.Function):
        """Forward and backward through the engine (torch before 2.4); saves out (float32)
        and lse, never an N x N matrix."""

        @staticmethod
        def forward(ctx, q, k, v, sinks, op):
            out, lse = _forward(op, q, k, v, True, sinks)
            ctx.save_for_backward(q, k, v, out, lse, sinks)
            ctx.op = op
            ctx.mark_non_differentiable(lse)
            return out, lse

        @staticmethod
        @torch.autograd.function.once_differentiable
        def backward(ctx, grad_out, _grad_lse):
            q, k, v, out, lse, sinks = ctx.saved_tensors
            return _backward(ctx.op, q, k, v, out, lse, grad_out, sinks) + (None,)


def attention(q, k, v, *, attention="dense", segments=None, dilations=None, combine="grouped",
              causal=False, scale=None, window=None, seqlens=None, pattern=None, block_mask=None,
              block_size=128, ulysses=1, deterministic=False, sinks=None, softcap=None,
              return_lse=False, comm: Comm | None = None):
    """Exact attention of this rank's queries over the whole sequence.

    q: ``[B, N_local, H, D]``; k: ``[B, N_local, HKV, D]`` (``HKV = k.shape[2]``, grouped-
    query attention when it is less than H); v: ``[B, N_local, HKV, Dv]``, its head dim its
    own (multi-head latent attention: 192 against 128), the output ``[B, N_local, H, Dv]``;
    float32, contiguous, torch tensors or numpy arrays (outputs are of the same kind). Or all
    three the ``transpose(1, 2)`` of contiguous ``[B, H, N, D]`` tensors (PyTorch SDPA's
    convention; with P ranks, of this rank's shard): the engine reads them in place, and out
    and the gradients come back laid out the same way. With ``comm`` spanning P ranks, each
    rank passes its shard in the engine's layout (``ringattn.shard``) and gets its rows of
    the output.

    Keywords mean what the CLI's options mean (docs/SEMANTICS.md):
      attention: "dense" | "dilated" | "block-sparse" | "auto"   (--attention)
      segments, dilations: lists of ints, dilated patterns        (--segments, --dilations)
      combine: "grouped" | "mixture"                              (--combine)
      causal: bool                                                (--causal)
      scale: float, default 1/sqrt(D)                             (--scale)
      window: L or (L, R), sliding window                         (--window)
      seqlens: packed sequence lengths                            (--seqlens, if the core has it)
      pattern: block-sparse pattern text, e.g. "local+global"     (--pattern)
      block_mask: bool [H, nb, nb] or [nb, nb] mask               (--block-mask)
      block_size: tokens per block (block-sparse)                 (--block-size)
      ulysses: U ranks per all-to-all group, the ring across the    (--ulysses)
               groups (Ulysses x ring; 1: the ring alone; "auto")
      deterministic: bitwise-reproducible results run to run      (--deterministic)
      sinks: attention sinks, [H] (a tensor on q's device, any      (--sinks)
             float dtype, differentiable; or a numpy array): a learned logit per query head
             joining every row's softmax normaliser, attending no value (-inf: none for that
             head). Dense and block-sparse attention. With several ranks, its gradient is this
             rank's part (its rows): sum it over the ranks, as for any parameter every rank
             holds
      softcap: c > 0, logit soft-capping (Gemma 2): each scaled     (--softcap)
             score s becomes c * tanh(s / c) before the mask and the softmax (a sink's
             logit is not capped); 0 or None: none
      return_lse: also return lse ``[B, H, N_local]`` (natural log; -inf for empty rows)
      comm: ringattn.Comm (default: this process alone)

    Bad options raise ValueError naming the keyword (the library's messages say its fields
    with these keywords too); a failed ring (watchdog, dead peer) raises RuntimeError. With
    torch tensors that require grad, the result is differentiable: the backward runs the
    engine's backward from the saved out and lse.
    """
    if comm is not None and not isinstance(comm, Comm):
        raise TypeError(f"comm: expected a ringattn.Comm, got {type(comm).__name__}")
    use_torch, layout, kv_layout, q, k, v = _readable(q, k, v)
    options = _options(attention, segments, dilations, combine, causal, scale, window, seqlens,
                       pattern, block_size, ulysses, deterministic)
    _value_keywords(options, q, v, softcap)
    if sinks is not None:
        options["sinks"] = True
        _sinks_array(sinks, q, use_torch, check_values=False)  # before any plan is made
    if use_torch and _ops.AVAILABLE:
        # torch.ops.ringattn.attention: autograd and torch.compile through torch.library.
        spec = _ops.encode(options, layout, kv_layout, 0 if comm is None else comm._id)
        mask = None if block_mask is None else torch.as_tensor(block_mask)
        out, lse = torch.ops.ringattn.attention(q, k, v, mask, sinks, spec)
        out = out.to(q.dtype)  # the engine writes float32; a bf16 model gets bf16
        return (out, lse) if return_lse else out
    comm = default_comm() if comm is None else comm
    op = _plan(q, k, comm, options, _mask_array(block_mask), layout, kv_layout)
    tensors = (q, k, v) if sinks is None or not use_torch else (q, k, v, sinks)
    if use_torch and torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
        out, lse = _AttentionFunction.apply(q, k, v, sinks, op)
    else:
        out, lse = _forward(op, q, k, v, use_torch, sinks)
    if use_torch:
        out = out.to(q.dtype)  # the engine writes float32; a bf16 model gets bf16
    return (out, lse) if return_lse else out


def attention_backward(q, k, v, out, lse, grad_out, *, comm: Comm | None = None, block_mask=None,
                       sinks=None, **options):
    """Gradients ``(dq, dk, dv)`` of ``sum(out * grad_out)``, for callers without autograd
    (numpy); ``(dq, dk, dv, dsinks)`` with sinks. ``out`` and ``lse`` come from
    ``attention(..., return_lse=True)`` with the same inputs and the same keywords, which are
    passed here again."""
    comm = default_comm() if comm is None else comm
    use_torch, layout, kv_layout, q, k, v = _readable(q, k, v)
    for name, x in (("out", out), ("grad_out", grad_out)):
        if _check_tensor(name, x, use_torch) != layout:
            raise ValueError(f"{name}: must be laid out as q is")
    defaults = dict(attention="dense", segments=None, dilations=None, combine="grouped",
                    causal=False, scale=None, window=None, seqlens=None, pattern=None,
                    block_size=128, ulysses=1, deterministic=False)
    softcap = options.pop("softcap", None)
    unknown = set(options) - set(defaults)
    if unknown:
        raise TypeError(f"attention_backward() got unexpected keyword(s) {sorted(unknown)}")
    defaults.update(options)
    plan_options = _value_keywords(_options(**defaults), q, v, softcap)
    if sinks is not None:
        plan_options["sinks"] = True
    op = _plan(q, k, comm, plan_options, _mask_array(block_mask), layout, kv_layout)
    if use_torch:
        grads = _backward(op, q, k, v, out.float(), lse, grad_out, sinks)
        return grads if sinks is not None else grads[:3]
    dq = _empty_like(q, layout, use_torch)
    dk, dv = (_empty_like(x, kv_layout, use_torch) for x in (k, v))
    s = _sinks_array(sinks, q, False)
    ds = None if s is None else np.empty_like(s)
    op.backward(q, k, v, out, lse, grad_out, dq, dk, dv, sinks=s, dsinks=ds)
    return (dq, dk, dv) if ds is None else (dq, dk, dv, ds)


def _layout(comm, x_shape, seq_len, causal, block_size, heads, keywords):
    """Every rank's chunks for a full sequence of seq_len positions, as the plan of
    attention(..., **keywords) lays them out."""
    unknown = set(keywords) - {"attention", "segments", "dilations", "combine", "scale", "window",
                               "seqlens", "pattern", "block_mask", "ulysses", "softcap"}
    if unknown:
        raise TypeError(f"unexpected keyword(s) {sorted(unknown)}: shard/unshard take "
                        "ringattn.attention's pattern keywords")
    keywords = dict(keywords)
    keywords.pop("block_mask", None)  # the layout needs only N and the block size
    keywords.pop("softcap", None)  # nor the scores' cap
    if block_size is not None:
        keywords.setdefault("attention", "block-sparse")
    defaults = dict(attention="dense", segments=None, dilations=None, combine="grouped",
                    scale=None, window=None, seqlens=None, pattern=None, ulysses=1)
    defaults.update(keywords)
    options = _options(causal=causal, block_size=128 if block_size is None else block_size,
                       **defaults)
    if heads is None:
        heads = x_shape[2] if len(x_shape) >= 3 else 1
    return comm._handle.layout(batch=1, seq_len=int(seq_len), heads=operator.index(heads),
                               **options)


def shard(x, comm: Comm | None = None, *, causal=False, block_size=None, heads=None, **keywords):
    """This rank's rows of a full ``[B, N, ...]`` tensor, in the layout the engine uses for
    the same attention: N/P consecutive positions per rank, or for causal runs the balanced
    zigzag (chunks r and 2P-1-r of 2P). Pass the keywords the attention call gets
    (``causal``, and ``block_size`` for block-sparse, whole blocks per rank; any other pattern
    keyword, e.g. ``seqlens``, where the core lays those runs out by their work) and, for
    tensors without a heads dimension and a dilated grouped pattern, ``heads``.
    Differentiable for torch tensors (it is slicing and concatenation)."""
    comm = default_comm() if comm is None else comm
    if comm.size == 1:
        return x
    chunks = _layout(comm, x.shape, x.shape[1], causal, block_size, heads, keywords)[comm.rank]
    parts = [x[:, begin:begin + length] for begin, length in chunks]
    if _is_torch(x):
        return torch.cat(parts, dim=1).contiguous()
    return np.ascontiguousarray(np.concatenate(parts, axis=1))


def unshard(x_local, comm: Comm | None = None, *, causal=False, block_size=None, heads=None,
            **keywords):
    """The full ``[B, N, ...]`` tensor on every rank, from every rank's shard (the inverse of
    ``shard``, with the same keywords; a collective: every rank calls it). Not
    differentiable."""
    comm = default_comm() if comm is None else comm
    if comm.size == 1:
        return x_local
    use_torch = _is_torch(x_local)
    # Gathered through host memory (the communicator's collectives take host buffers); a
    # CUDA shard comes back as a full tensor on its device.
    local = x_local.detach().cpu().contiguous() if use_torch else np.ascontiguousarray(x_local)
    shape = tuple(local.shape)
    if use_torch:
        gathered = torch.empty((comm.size,) + shape, dtype=local.dtype)
    else:
        gathered = np.empty((comm.size,) + shape, dtype=local.dtype)
    comm._handle.allgather(local, gathered)
    n = shape[1] * comm.size
    full_shape = (shape[0], n) + shape[2:]
    full = torch.empty(full_shape, dtype=local.dtype) if use_torch else np.empty(
        full_shape, dtype=local.dtype)
    for rank, chunks in enumerate(_layout(comm, shape, n, causal, block_size, heads, keywords)):
        row = 0
        for begin, length in chunks:
            full[:, begin:begin + length] = gathered[rank][:, row:row + length]
            row += length
    return full.to(x_local.device) if use_torch else full


def all_reduce_sum(x, comm: Comm | None = None):
    """The sum of ``x`` over every rank, on every rank (a collective; small tensors: it goes
    through an all-gather). Not differentiable. Used to average gradients of replicated
    parameters in sequence-parallel training."""
    comm = default_comm() if comm is None else comm
    if comm.size == 1:
        return x
    use_torch = _is_torch(x)
    local = x.detach().cpu().contiguous() if use_torch else np.ascontiguousarray(x)
    if use_torch:
        gathered = torch.empty((comm.size,) + tuple(local.shape), dtype=local.dtype)
    else:
        gathered = np.empty((comm.size,) + tuple(local.shape), dtype=local.dtype)
    comm._handle.allgather(local, gathered)
    return gathered.sum(0).to(x.device) if use_torch else gathered.sum(axis=0)
