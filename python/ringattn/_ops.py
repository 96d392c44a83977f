"""ringattn's attention as a torch custom op (``torch.ops.ringattn.attention`` and its
backward), registered with ``torch.library`` where torch has it (2.4+): a fake implementation
gives torch.compile the outputs' shapes and strides, and the registered autograd runs the
engine's backward from the saved out and lse. So ``torch.compile(fullgraph=True)`` traces a
model using ``ringattn.attention`` or ``nn.RingAttention`` without graph breaks. Older torch
(Debian's 1.13) keeps functional's ``autograd.Function``.

An op's arguments are tensors and plain values: the keywords, the tensors' layouts and the
communicator (by id, ``_comm.comm_by_id``) travel as one ``spec`` string, which the real and
fake implementations decode; the plan is looked up in the communicator's cache as before.
"""
from __future__ import annotations

import ast
from typing import Optional

import torch

from . import _comm, _engine

AVAILABLE = hasattr(torch, "library") and hasattr(torch.library, "custom_op")


def encode(options: dict, layout: str, kv_layout: str, comm_id: int) -> str:
    """The spec string of one call (plain Python on constants, so that tracing folds it)."""
    items = sorted(options.items())
    return repr((tuple((name, tuple(v) if isinstance(v, list) else v) for name, v in items),
                 layout, kv_layout, comm_id))


def decode(spec: str):
    """(options, layout, kv_layout, comm_id) from encode()'s string."""
    items, layout, kv_layout, comm_id = ast.literal_eval(spec)
    options = {name: list(v) if isinstance(v, tuple) else v for name, v in items}
    return options, layout, kv_layout, comm_id


def _new_like(x: torch.Tensor, layout: str, head_dim=None) -> torch.Tensor:
    """An uninitialised float32 tensor of x's [B, N, H, D] shape in `layout`, on x's device
    (fake tensors under tracing); with head_dim, of that last dim (the output has v's)."""
    b, n, h, d = x.shape
    d = d if head_dim is None else head_dim
    if layout == "bhnd":
        return x.new_empty((b, h, n, d), dtype=torch.float32).transpose(1, 2)
    return x.new_empty((b, n, h, d), dtype=torch.float32)


if AVAILABLE:
    @torch.library.custom_op("ringattn::attention", mutates_args=())
    def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                  block_mask: Optional[torch.Tensor], sinks: Optional[torch.Tensor],
                  spec: str) -> tuple[torch.Tensor, torch.Tensor]:
        options, layout, kv_layout, comm_id = decode(spec)
        comm = _comm.comm_by_id(comm_id)
        op = _engine._plan(q, k, comm, options, _engine._mask_array(block_mask), layout, kv_layout)
        return _engine._forward(op, q, k, v, True, sinks)

    @attention.register_fake
    def _(q, k, v, block_mask, sinks, spec):
        _, layout, _, _ = decode(spec)
        lse = q.new_empty((q.shape[0], q.shape[2], q.shape[1]), dtype=torch.float32)
        return _new_like(q, layout, v.shape[3]), lse  # out has v's head dim

    # The sinks' gradient is an empty tensor when there are no sinks (an op returns tensors).
    @torch.library.custom_op("ringattn::attention_backward", mutates_args=())
    def attention_backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                           out: torch.Tensor, lse: torch.Tensor, grad_out: torch.Tensor,
                           block_mask: Optional[torch.Tensor], sinks: Optional[torch.Tensor],
                           spec: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor,
                                               torch.Tensor]:
        options, layout, kv_layout, comm_id = decode(spec)
        comm = _comm.comm_by_id(comm_id)
        op = _engine._plan(q, k, comm, options, _engine._mask_array(block_mask), layout, kv_layout)
        dq, dk, dv, dsinks = _engine._backward(op, q, k, v, out, lse, grad_out, sinks)
        return dq, dk, dv, q.new_empty((0,)) if dsinks is None else dsinks

    @attention_backward.register_fake
    def _(q, k, v, out, lse, grad_out, block_mask, sinks, spec):
        _, layout, kv_layout, _ = decode(spec)
        dq = _new_like(q, layout).to(q.dtype)
        dsinks = q.new_empty((0,)) if sinks is None else torch.empty_like(sinks)
        return (dq, _new_like(k, kv_layout).to(k.dtype), _new_like(v, kv_layout).to(v.dtype),
                dsinks)

    def _setup_context(ctx, inputs, output):
        q, k, v, block_mask, sinks, spec = inputs
        out, lse = output
        ctx.save_for_backward(q, k, v, out, lse, sinks)
        ctx.block_mask, ctx.spec = block_mask, spec
        ctx.mark_non_differentiable(lse)

    def _backward(ctx, grad_out, _grad_lse):
        q, k, v, out, lse, sinks = ctx.saved_tensors
        dq, dk, dv, dsinks = attention_backward(q, k, v, out, lse, grad_out, ctx.block_mask,
                                                sinks, ctx.spec)
        return dq, dk, dv, None, None if sinks is None else dsinks, None

    attention.register_autograd(_backward, setup_context=_setup_context)
