"""torch.nn modules over ringattn.attention."""
from __future__ import annotations

import torch

from ._comm import Comm
from .functional import attention


class RingAttention(torch.nn.Module):
    """Holds the attention pattern's options; ``forward(q, k, v)`` is
    ``ringattn.attention(q, k, v, **options, comm=comm)``: exact, differentiable, on this
    rank's shard when ``comm`` spans several ranks. The projections are the caller's; with
    ``sink_heads=H`` the module holds one parameter, ``sinks`` [H] (attention sinks: a learned
    logit per query head in every row's softmax normaliser, initialised to 0), whose gradient
    is this rank's part (its rows), summed over the ranks like any parameter's. ``softcap``:
    logit soft-capping, as ringattn.attention takes it; v may have a head dim of its own."""

    def __init__(self, *, attention: str = "dense", segments=None, dilations=None,
                 combine: str = "grouped", causal: bool = False, scale=None, window=None,
                 seqlens=None, pattern=None, block_mask=None, block_size: int = 128,
                 ulysses=1, deterministic=False, sink_heads: int = 0, softcap=None,
                 comm: Comm | None = None):
        super().__init__()
        self.sinks = torch.nn.Parameter(torch.zeros(sink_heads)) if sink_heads else None
        self.options = dict(attention=attention, segments=segments, dilations=dilations,
                            combine=combine, causal=causal, scale=scale, window=window,
                            seqlens=seqlens, pattern=pattern, block_mask=block_mask,
                            block_size=block_size, ulysses=ulysses,
                            deterministic=deterministic, softcap=softcap)
        self.comm = comm

    def forward(self, q, k, v, return_lse: bool = False):
        sinks = None if self.sinks is None else self.sinks.to(q.device)
        return attention(q, k, v, **self.options, sinks=sinks, return_lse=return_lse,
                         comm=self.comm)

    def extra_repr(self) -> str:
        shown = {k: v for k, v in self.options.items()
                 if v is not None and k != "block_mask"}
        return ", ".join(f"{k}={v!r}" for k, v in shown.items())
