"""ringattn as a Hugging Face transformers attention implementation.

    import ringattn.integrations.transformers  # registers "ringattn"
    model = AutoModelForCausalLM.from_config(config, attn_implementation="ringattn")

Importing this module registers ``"ringattn"`` with transformers' ``AttentionInterface`` (the
attention itself) and ``AttentionMaskInterface`` (no mask tensor: causality and the model's
sliding window are ringattn's own options). A layer's call becomes ``ringattn.attention``
on the head-major q, k, v transformers hands over (read in place, whatever their strides),
with the layer's causality and scaling, grouped-query attention on the model's K/V heads
(never repeated), the model's sliding window (a query at i sees keys (i - W, i], i.e.
``window=(W - 1, 0)``) and its attention sinks (gpt-oss's ``s_aux``, with their gradient).
Exact and differentiable, in the model's own precision on a GPU (a bf16 or fp16 model runs
the bf16/fp16 kernels); on the CPU, whose kernels compute in float32, other dtypes are
computed in float32 and returned in theirs.

What it refuses, naming why (ValueError): padded batches (an attention mask with padding:
pack the documents with ``seqlens`` instead), attention dropout in training, a chunk of
several queries over a longer cache, and every model feature it does not carry: a layer
argument or attribute it does not know (attention sinks, logit soft-capping, an attention
bias, ALiBi slopes, sparse-attention indices, flash-attention's packed ``cu_seq_lens``, ...)
is named in the error rather than dropped, and so is a mask that is more than causality and
the sliding window (sequences packed through ``position_ids``, bidirectional overlays). A
single decoding query over a cache goes to transformers' own ``sdpa`` (one row of attention is
not what ringattn is for), or, for a layer with sinks (which sdpa drops), to a few torch
operations that carry them.
``register(comm=..., ulysses=U)`` spreads every layer over a ``ringattn.Comm``'s ranks, each
passing its shard of the sequence (``ringattn.shard``) and its positions.
"""
from __future__ import annotations

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface

from ..functional import attention as _attention

NAME = "ringattn"
_COMM = None
_ULYSSES = 1

# Keywords transformers passes every attention implementation that carry no attention
# semantics: positions are already in q and k (RoPE), the cache has already been updated,
# and the rest steer outputs of the model, not of this layer's attention. Every other keyword
# with a value (not None or False) is a model feature ringattn would otherwise drop: it is
# refused by name. An allow-list, so that a feature a future model adds is refused too.
_NEUTRAL_KWARGS = frozenset({
    "position_ids", "cache_position", "past_key_values", "past_key_value", "use_cache",
    "output_hidden_states", "output_router_logits", "num_items_in_batch", "return_dict",
    "layer_idx", "position_embeddings", "max_length_q", "max_length_k", "target_dtype",
})
# Attention sinks: carried (ringattn's sinks option).
_SINK_KWARGS = ("s_aux", "sinks")
# What the known features are, for the error message.
_FEATURE_NAMES = {
    "softcap": "logit soft-capping",
    "position_bias": "an additive attention bias (relative position bias)",
    "alibi": "ALiBi slopes",
    "alibi_slopes": "ALiBi slopes",
    "indices": "sparse-attention indices",
    "block_indices": "block-sparse attention indices",
    "cu_seq_lens_q": "packed sequences (flash-attention's cu_seq_lens)",
    "cu_seq_lens_k": "packed sequences (flash-attention's cu_seq_lens)",
    "seq_idx": "packed sequences (seq_idx)",
}
# Layer attributes that change attention when set, though some models read them inside the
# layer rather than passing them on.
_FEATURE_ATTRIBUTES = {
    "attn_logit_softcapping": "logit soft-capping",
    "alibi": "ALiBi slopes",
    "alibi_slopes": "ALiBi slopes",
}


class _MaskNotCarried:
    """Returned by the mask interface for a mask ringattn's options cannot express; the
    attention refuses it, naming why."""

    def __bool__(self):
        return True


_MASK_NOT_CARRIED = _MaskNotCarried()


def _present(value) -> bool:
    return value is not None and value is not False


def _refuse_features(module, kwargs) -> None:
    for key, value in kwargs.items():
        if (key in _NEUTRAL_KWARGS or key in _SINK_KWARGS or key == "output_attentions" or
                not _present(value)):
            continue
        what = _FEATURE_NAMES.get(key, "a model feature ringattn does not know")
        raise ValueError(f"ringattn: the layer passes {key!r} ({what}), which ringattn does "
                         "not carry; it refuses rather than compute another model's attention "
                         "(use attn_implementation='eager' for this model)")
    for attr, what in _FEATURE_ATTRIBUTES.items():
        if _present(getattr(module, attr, None)):
            raise ValueError(f"ringattn: the layer has {attr!r} ({what}), which ringattn does "
                             "not carry; it refuses rather than compute another model's "
                             "attention (use attn_implementation='eager' for this model)")
    if not any(_present(kwargs.get(k)) for k in _SINK_KWARGS) and _present(
            getattr(module, "sinks", None)):
        raise ValueError("ringattn: the layer has 'sinks' (attention sinks) but does not pass "
                         "them to its attention (as s_aux), so ringattn cannot tell how the "
                         "model uses them; it refuses rather than drop them")


def _sinks_of(kwargs, heads):
    """The layer's attention sinks ([H] logits) or None."""
    for key in _SINK_KWARGS:
        sinks = kwargs.get(key)
        if _present(sinks):
            if tuple(sinks.shape) != (heads,):
                raise ValueError(f"ringattn: the layer's {key!r} has shape {list(sinks.shape)}; "
                                 f"ringattn's attention sinks are one logit per query head "
                                 f"([{heads}])")
            return sinks
    return None


def _decode_with_sinks(query, key, value, scaling, sinks, sliding_window):
    """One decoding query per sequence [B, H, 1, D] over the cache [B, HKV, L, D], with the
    sink in each row's softmax (and the sliding window's last W keys): [B, 1, H, D]."""
    if sliding_window is not None and key.shape[2] > int(sliding_window):
        key, value = key[:, :, -int(sliding_window):], value[:, :, -int(sliding_window):]
    groups = query.shape[1] // key.shape[1]
    key, value = (x.repeat_interleave(groups, dim=1) for x in (key, value))
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    logits = torch.matmul(query.float(), key.float().transpose(2, 3)) * scale
    sink = sinks.float().reshape(1, -1, 1, 1).expand(logits.shape[0], -1, logits.shape[2], 1)
    probs = torch.softmax(torch.cat([logits, sink], dim=-1), dim=-1)[..., :-1]
    return torch.matmul(probs, value.float()).to(query.dtype).transpose(1, 2)


def ringattn_attention_forward(module, query, key, value, attention_mask, dropout=0.0,
                               scaling=None, is_causal=None, sliding_window=None, **kwargs):
    """transformers' attention interface: q [B, H, N, D], k and v [B, HKV, N, D] (head-major)
    in, the output [B, N, H, D] and no attention weights out."""
    q_len, kv_len = query.shape[2], key.shape[2]
    _refuse_features(module, kwargs)
    if attention_mask is _MASK_NOT_CARRIED:
        raise ValueError("ringattn: the model's attention mask is more than causality and its "
                         "sliding window (sequences packed through position_ids, or a "
                         "bidirectional or blockwise overlay), which ringattn does not carry; "
                         "pack documents with ringattn's seqlens option instead")
    sinks = _sinks_of(kwargs, query.shape[1])
    if q_len == 1 and kv_len > 1 and sinks is not None:  # sdpa would drop the sinks
        if attention_mask is not None:
            raise ValueError("ringattn: a decoding step of a layer with sinks over a masked "
                             "cache (padding or a static cache) is not carried")
        return _decode_with_sinks(query, key, value, scaling, sinks, sliding_window), None
    if q_len == 1 and kv_len > 1:  # a decoding step over the cache
        for k in _SINK_KWARGS:
            kwargs.pop(k, None)
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
    # The GPU kernels read the model's precision; the CPU's compute in float32.
    q, k, v = (x.transpose(1, 2) if x.is_cuda else x.transpose(1, 2).float()
               for x in (query, key, value))
    if sinks is not None:
        sinks = sinks.to(q.device)
    out = _attention(q, k, v, causal=bool(causal), scale=scaling, window=window, sinks=sinks,
                     ulysses=_ULYSSES, comm=_COMM)
    return out.to(dtype), None


def _mask(batch_size, q_length, kv_length, q_offset=0, kv_offset=0, mask_function=None,
          attention_mask=None, allow_is_causal_skip=True, **kwargs):
    """No mask tensor unless the batch has padding (which the attention then refuses), or
    transformers composed more than causality and the window (packing found in position_ids,
    an or/and overlay): then a marker the attention refuses. transformers clears
    allow_is_causal_skip for exactly those compositions, for bidirectional masks (carried:
    is_causal=False), and for one-query decoding over a compiled cache (transformers' own sdpa
    computes those steps)."""
    bidirectional = getattr(mask_function, "__name__", "") == "bidirectional_mask_function"
    if not allow_is_causal_skip and q_length > 1 and not bidirectional:
        return _MASK_NOT_CARRIED
    if attention_mask is not None:
        attention_mask = attention_mask[:, -kv_length:]
        if attention_mask.shape[1] == kv_length and bool(attention_mask.all()):
            return None
    return attention_mask


def register(comm=None, ulysses=1) -> None:
    """Registers "ringattn" (again), on `comm`'s ranks (default: this process alone), each
    passing its shard of the sequence (``ringattn.shard``, with ``ulysses`` too) and its
    positions (``position_ids``); ``ulysses``: Ulysses x ring groups (``ringattn.attention``'s
    keyword). Gradients of the model's parameters (the sinks' included) are each rank's part:
    sum them over the ranks."""
    global _COMM, _ULYSSES
    _COMM, _ULYSSES = comm, ulysses
    AttentionInterface.register(NAME, ringattn_attention_forward)
    AttentionMaskInterface.register(NAME, _mask)


register()
