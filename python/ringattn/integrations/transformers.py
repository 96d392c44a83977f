"""ringattn as a Hugging Face transformers attention implementation.

    import ringattn.integrations.transformers  # registers "ringattn"
    model = AutoModelForCausalLM.from_config(config, attn_implementation="ringattn")

Importing this module registers ``"ringattn"`` with transformers' ``AttentionInterface`` (the
attention itself) and ``AttentionMaskInterface`` (no mask tensor: causality and the model's
sliding window are ringattn's own options). A layer's call becomes ``ringattn.attention``
on the head-major q, k, v transformers hands over (read in place, whatever their strides),
with the layer's causality and scaling, grouped-query attention on the model's K/V heads
(never repeated), and the model's sliding window: a query at i sees keys (i - W, i], i.e.
``window=(W - 1, 0)``. Exact, differentiable, float32 on the CPU (other dtypes are computed
in float32 and returned in theirs).

What it refuses, naming why (ValueError): padded batches (an attention mask with padding:
pack the documents with ``seqlens`` instead), attention dropout in training, and a chunk of
several queries over a longer cache. A single decoding query over a cache goes to
transformers' own ``sdpa`` (one row of attention is not what ringattn is for).
``register(comm=...)`` spreads every layer over a ``ringattn.Comm``'s ranks, each passing
its shard of the sequence (``ringattn.shard``).
"""
from __future__ import annotations

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface

from ..functional import attention as _attention

NAME = "ringattn"
_COMM = None


def ringattn_attention_forward(module, query, key, value, attention_mask, dropout=0.0,
                               scaling=None, is_causal=None, sliding_window=None, **kwargs):
    """transformers' attention interface: q [B, H, N, D], k and v [B, HKV, N, D] (head-major)
    in, the output [B, N, H, D] and no attention weights out."""
    q_len, kv_len = query.shape[2], key.shape[2]
    if q_len == 1 and kv_len > 1:  # a decoding step over the cache
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                      scaling=scaling, is_causal=is_causal, **kwargs)
    if q_len != kv_len:
        raise ValueError(f"ringattn: {q_len} queries over {kv_len} cached keys: ringattn attends "
                         "a whole sequence (run the prompt in one call, or decode one token at "
                         "a time)")
    if attention_mask is not None:
        raise ValueError("ringattn: the batch has padding (an attention mask); ringattn takes "
                         "whole sequences, or packed documents through its seqlens option")
    if dropout:
        raise ValueError("ringattn: attention dropout is not supported (set the model's "
                         "attention_dropout to 0)")
    if kwargs.get("output_attentions"):
        raise ValueError("ringattn: output_attentions=True needs the attention weights, which "
                         "ringattn never forms (use attn_implementation='eager')")
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    window = None
    if sliding_window is not None:
        window = (int(sliding_window) - 1, 0) if causal else int(sliding_window) - 1
    dtype = query.dtype
    q, k, v = (x.transpose(1, 2).float() for x in (query, key, value))
    out = _attention(q, k, v, causal=bool(causal), scale=scaling, window=window, comm=_COMM)
    return out.to(dtype), None


def _mask(batch_size, q_length, kv_length, q_offset=0, kv_offset=0, mask_function=None,
          attention_mask=None, **kwargs):
    """No mask tensor unless the batch has padding (which the attention then refuses)."""
    if attention_mask is not None:
        attention_mask = attention_mask[:, -kv_length:]
        if attention_mask.shape[1] == kv_length and bool(attention_mask.all()):
            return None
    return attention_mask


def register(comm=None) -> None:
    """Registers "ringattn" (again), on `comm`'s ranks (default: this process alone)."""
    global _COMM
    _COMM = comm
    AttentionInterface.register(NAME, ringattn_attention_forward)
    AttentionMaskInterface.register(NAME, _mask)


register()
