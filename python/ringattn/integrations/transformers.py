"""ringattn as a Hugging Face transformers attention implementation.

    import ringattn.integrations.transformers  # registers "ringattn"
    model = AutoModelForCausalLM.from_config(config, attn_implementation="ringattn")

Importing this module registers ``"ringattn"`` with transformers' ``AttentionInterface`` (the
attention itself) and ``AttentionMaskInterface`` (the mask). A layer's call becomes
``ringattn.attention`` on the head-major q, k, v transformers hands over, with the layer's
scaling, grouped-query attention on the model's K/V heads (never repeated), its attention
sinks (gpt-oss's ``s_aux``, with their gradient), its logit soft-cap (Gemma 2's ``softcap``)
and values of their own head dim (DeepSeek's multi-head latent attention). Exact and
differentiable, in the model's own precision on a GPU; on the CPU, whose kernels compute in
float32, other dtypes are computed in float32 and returned in theirs.

**The mask decides, not the layer's keywords.** transformers composes each layer's mask from
named functions (causal, sliding window, chunked, padding, packed sequences, bidirectional,
and/or overlays). The mask interface hands the attention that composition unevaluated; the
attention reads from it (``_hf_masks``) which tokens are valid, the documents (packed
sequences, Llama 4's chunks, the rows of a padded batch), causality and the window (either
side), checks them against the mask, and runs ringattn with them:

- a padded batch: each row's valid tokens are gathered into one packed batch of documents,
  run, and scattered back (rows of padding get zeros and no gradient; left or right padding);
- packed sequences (``position_ids`` that restart, or a block-diagonal 4D mask): documents;
- chunked attention (Llama 4): documents of the chunk size;
- a window that lives only in the mask (Qwen2-MoE, PhiMoE) and bidirectional local windows
  (ModernBERT): the window;
- a model that edits its mask gets a real tensor (transformers' own ``eager_mask``) and its
  attention is carried or refused by what that tensor is.

Queries over a longer cache (decoding one token, a second prompt chunk, a static cache) are
computed exactly by torch operations over the rows transformers' mask gives (window, chunks,
sinks, padding, the soft-cap), as eager computes them; one decoding row is not what ringattn's
kernels are for.

What it refuses, naming why (ValueError): attention dropout in training, ``output_attentions``,
a mask that is not causality, windows, documents and padding (e.g. bidirectional blocks of
image tokens, a dynamic or top-k sparse mask), queries and keys of different head dims, and
every model feature it does not carry: a layer argument or attribute it does not know (an
attention bias, ALiBi slopes, sparse-attention indices, ...) is named in the error rather than
dropped.

``register(comm=..., ulysses=U)`` spreads every layer over a ``ringattn.Comm``'s ranks, each
passing its shard of the sequence (``ringattn.shard``) and its positions (``position_ids``);
for a padded or packed batch, ``shard_inputs`` packs it and gives each rank its shard. A
decoding step on the ranks attends every rank's cache shard (each rank's part merged by
log-sum-exp, one collective per layer).
"""
from __future__ import annotations

import torch
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface, eager_mask

from ..functional import _layout
from ..functional import attention as _attention
from . import _hf_masks as hm

NAME = "ringattn"
_COMM = None
_ULYSSES = 1
# Set by shard_inputs: the packed batch every rank holds a shard of (documents, length, and
# this rank's rows in it).
_PACKED = None

# Keywords transformers passes every attention implementation that carry no attention
# semantics: positions are already in q and k (RoPE), the cache has already been updated,
# the mask carries the window, and the rest steer outputs of the model, not of this layer's
# attention. Every other keyword with a value (not None or False) is a model feature ringattn
# would otherwise drop: it is refused by name. An allow-list, so that a feature a future
# model adds is refused too.
_NEUTRAL_KWARGS = frozenset({
    "position_ids", "cache_position", "past_key_values", "past_key_value", "use_cache",
    "output_hidden_states", "output_router_logits", "num_items_in_batch", "return_dict",
    "layer_idx", "position_embeddings", "max_length_q", "max_length_k", "target_dtype",
    "attention_chunk_size",
})
# Attention sinks: carried (ringattn's sinks option).
_SINK_KWARGS = ("s_aux", "sinks")
# Logit soft-capping (Gemma 2's eager: c * tanh(s / c) of the scaled scores, before the mask):
# carried (ringattn's softcap option). The layer attribute that holds it, where a model keeps
# one: a layer that holds a cap but passes none may cap inside itself, so it is refused.
_SOFTCAP_KWARG = "softcap"
_SOFTCAP_ATTRIBUTE = "attn_logit_softcapping"
# What the known features are, for the error message.
_FEATURE_NAMES = {
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
    "alibi": "ALiBi slopes",
    "alibi_slopes": "ALiBi slopes",
}


def _present(value) -> bool:
    return value is not None and value is not False


def _refuse(what):
    raise ValueError(f"ringattn: {what}; it refuses rather than compute another model's "
                     "attention (use attn_implementation='eager' for this model)")


def _refuse_features(module, kwargs) -> None:
    for key, value in kwargs.items():
        if (key in _NEUTRAL_KWARGS or key in _SINK_KWARGS or key == _SOFTCAP_KWARG or
                key == "output_attentions" or not _present(value)):
            continue
        what = _FEATURE_NAMES.get(key, "a model feature ringattn does not know")
        _refuse(f"the layer passes {key!r} ({what}), which ringattn does not carry")
    for attr, what in _FEATURE_ATTRIBUTES.items():
        if _present(getattr(module, attr, None)):
            _refuse(f"the layer has {attr!r} ({what}), which ringattn does not carry")
    if not any(_present(kwargs.get(k)) for k in _SINK_KWARGS) and _present(
            getattr(module, "sinks", None)):
        _refuse("the layer has 'sinks' (attention sinks) but does not pass them to its "
                "attention (as s_aux), so ringattn cannot tell how the model uses them")


def _softcap_of(module, kwargs):
    """The layer's logit soft-cap (0: none): the ``softcap`` it passes, which must be the one it
    holds (``attn_logit_softcapping``) where it holds one."""
    passed = kwargs.get(_SOFTCAP_KWARG)
    held = getattr(module, _SOFTCAP_ATTRIBUTE, None)
    passed = float(passed) if _present(passed) else 0.0
    if _present(held) and float(held) != passed:
        _refuse(f"the layer has {_SOFTCAP_ATTRIBUTE!r} = {held} (logit soft-capping) but passes "
                f"softcap={kwargs.get(_SOFTCAP_KWARG)!r} to its attention, so ringattn cannot "
                "tell how the model caps its scores")
    if not (passed >= 0 and passed < float("inf")):
        _refuse(f"the layer's softcap={kwargs.get(_SOFTCAP_KWARG)!r} is not a finite cap >= 0")
    return passed


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


class _MaskSpec:
    """The mask transformers composed for this call, unevaluated: what the attention reads
    its options from. Model code that treats it as a tensor (slices it, edits it, passes it
    to a torch function) gets the real mask tensor, made by transformers' own eager_mask."""

    def __init__(self, batch_size, q_length, kv_length, q_offset, kv_offset, mask_function,
                 attention_mask, use_vmap, device, dtype=torch.float32):
        self.batch_size, self.q_length, self.kv_length = batch_size, q_length, kv_length
        self.q_offset, self.kv_offset = int(q_offset), int(kv_offset)
        self.mask_function, self.attention_mask = mask_function, attention_mask
        self.use_vmap, self.device, self.mask_dtype = use_vmap, device, dtype
        self.padding = None
        if attention_mask is not None:
            pad = kv_length + self.kv_offset - attention_mask.shape[-1]
            self.padding = (torch.nn.functional.pad(attention_mask, (0, pad)) if pad > 0
                            else attention_mask).bool().cpu()
        self._tensor = None
        self._structure = None
        self._ranks = {}

    def function(self):
        """The composition with the padding mask joined, as sdpa_mask joins it."""
        if self.padding is None:
            return self.mask_function
        padding, fn = self.padding, self.mask_function

        def with_padding(b, h, q, k):
            return fn(b, h, q, k) & padding[b, k]
        return with_padding

    def tensor(self):
        """The mask as eager gets it (transformers' eager_mask: 0 where a key is attended,
        the dtype's minimum where not): every model handles eager's mask, and some read it
        outside attention (NLLB-MoE's router takes its padding from it)."""
        if self._tensor is None:
            self._tensor = eager_mask(
                batch_size=self.batch_size, q_length=self.q_length, kv_length=self.kv_length,
                q_offset=self.q_offset, kv_offset=self.kv_offset,
                mask_function=self.mask_function, attention_mask=self.attention_mask,
                dtype=self.mask_dtype, use_vmap=self.use_vmap, device=self.device)
        return self._tensor

    def rows(self, q_len, kv_len):
        """transformers' mask for this call as booleans [B, Q, KV]."""
        oracle = hm.FunctionOracle(self.function(), self.q_offset, self.kv_offset)
        try:
            return torch.stack([oracle.rows(b, torch.arange(q_len), torch.arange(kv_len))
                                for b in range(self.batch_size)])
        except Exception:  # a function that only vmap evaluates: transformers' own tensor
            return hm.tensor_mask(self.tensor().cpu(), self.batch_size, q_len, kv_len)

    def structure(self):
        """The options this call's mask means (Q = KV, the same tokens), cached: every layer
        of the call shares the mask."""
        if self._structure is None:
            fn = self.function()
            what = f"the model's attention mask ({hm.describe(self.mask_function)})"
            try:
                oracle = hm.FunctionOracle(fn, self.q_offset, self.kv_offset)
                oracle.pairs(0, torch.arange(1), torch.arange(1))
            except hm.NotCarried:
                raise
            except Exception:
                oracle = hm.TensorOracle(hm.tensor_mask(self.tensor().cpu(), self.batch_size,
                                                        self.q_length, self.kv_length))
            self._structure = hm.infer(oracle, self.batch_size, self.q_length,
                                       full_check=not hm.all_known(self.mask_function),
                                       what=what)
        return self._structure

    # What a 4D mask tensor would say about itself, without making it.
    @property
    def shape(self):
        return torch.Size((self.batch_size, 1, self.q_length, self.kv_length))

    ndim = property(lambda self: 4)
    dtype = property(lambda self: self.mask_dtype)

    def dim(self):
        return 4

    # Model code that uses the mask as a tensor gets transformers' tensor.
    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        def real(x):
            if isinstance(x, _MaskSpec):
                return x.tensor()
            if isinstance(x, (list, tuple)):
                return type(x)(real(y) for y in x)
            return x
        return func(*real(args), **{k: real(v) for k, v in (kwargs or {}).items()})

    def __getattr__(self, name):
        if name.startswith("__") or name.startswith("_"):
            raise AttributeError(name)
        return getattr(self.tensor(), name)

    def __getitem__(self, index):
        return self.tensor()[index]

    # Operators are looked up on the class, never through __getattr__: each is the tensor's
    # (a comparison too: Nemotron ASR streaming tests `attention_mask == 0.0`, which the
    # object's own equality would answer with one bool).
    __hash__ = object.__hash__


def _tensor_operator(name):
    def operator(self, *args):
        return getattr(self.tensor(), name)(*args)
    operator.__name__ = name
    return operator


for _name in ("__invert__", "__neg__", "__and__", "__rand__", "__or__", "__ror__", "__xor__",
              "__rxor__", "__add__", "__radd__", "__sub__", "__rsub__", "__mul__", "__rmul__",
              "__truediv__", "__rtruediv__", "__eq__", "__ne__", "__lt__", "__le__", "__gt__",
              "__ge__"):
    setattr(_MaskSpec, _name, _tensor_operator(_name))


def _structure_of_tensor(mask, batch, length):
    """The options a 4D mask tensor the layer received means (Q = KV = length), cached on
    it."""
    cached = getattr(mask, "_ringattn_structure", None)
    if cached is not None and cached[0] == (mask._version, batch, length):
        return cached[1]
    allowed = hm.tensor_mask(mask, batch, length, length).cpu()
    structure = hm.infer(hm.TensorOracle(allowed), batch, length,
                         full_check=True, what="the attention-mask tensor the layer receives "
                         "(the model builds or edits it)")
    try:
        mask._ringattn_structure = ((mask._version, batch, length), structure)
    except (AttributeError, RuntimeError):
        pass
    return structure


def _engine_qkv(query, key, value):
    """The layer's head-major q, k, v as ringattn.attention reads them ([B, N, H, D] views).
    The GPU kernels read the model's precision; the CPU's compute in float32. A tensor in
    strides the engine cannot read (MLA's values, split off the keys' projection), or a v laid
    out unlike k (the engine reads them alike), is copied here as the engine would copy it,
    without its warning: the model's layout is no user's choice."""
    views = []
    for x in (query, key, value):
        x = x.transpose(1, 2)
        if not (x.is_contiguous() or x.transpose(1, 2).is_contiguous()):
            x = x.contiguous()
        views.append(x)
    q, k, v = views
    if k.is_contiguous() != v.is_contiguous():
        v = v.contiguous() if k.is_contiguous() else \
            v.transpose(1, 2).contiguous().transpose(1, 2)
    return tuple(x if x.is_cuda else x.float() for x in (q, k, v))


def _whole_tokens(query, key, value, st, scale, sinks, softcap):
    """Attention of a call's tokens over themselves with the options of `st`: padding
    gathered out into documents and scattered back. [B, N, H, Dv]."""
    b, h, n, _ = query.shape
    if (st.batch, st.length) != (b, n):  # never: a mask read for other tokens
        raise AssertionError(f"ringattn: a mask read for {st.batch} x {st.length} tokens, "
                             f"applied to {b} x {n}")
    window = st.ringattn_window()
    if st.all_valid and st.same_documents:  # (then no extra rows: every token is valid)
        docs = st.doc_lengths[0]
        out = _attention(*_engine_qkv(query, key, value),
                         causal=st.causal, scale=scale, window=window,
                         seqlens=None if len(docs) <= 1 else docs, sinks=sinks,
                         softcap=softcap)
        return out.to(query.dtype)
    flat = torch.cat([i * n + st.valid[i] for i in range(b)]).to(query.device)
    out = query.new_zeros((b * n, h, value.shape[-1]))
    if flat.numel():
        def gather(x):
            rows = x.transpose(1, 2).reshape(b * n, x.shape[1], x.shape[3])[flat][None]
            return rows if rows.is_cuda else rows.float()
        docs = [d for row in st.doc_lengths for d in row]
        packed = _attention(gather(query), gather(key), gather(value), causal=st.causal,
                            scale=scale, window=window, seqlens=None if len(docs) <= 1 else docs,
                            sinks=sinks, softcap=softcap)
        out = out.index_copy(0, flat, packed[0].to(out.dtype))
    # Rows of tokens that do not attend themselves but attend some key, as eager defines
    # them (a key-padding mask's padded queries): torch operations over the mask's rows.
    keys = torch.arange(n)
    for i, rows in enumerate(st.extra_rows):
        for j in range(0, rows.numel(), 256):
            block = rows[j:j + 256]
            allowed = st.oracle.rows(i, block, keys)[None]
            part = hm.attend_rows(query[i:i + 1, :, block.to(query.device)], key[i:i + 1],
                                  value[i:i + 1], allowed.to(query.device), scale, sinks,
                                  softcap)
            out = out.index_copy(0, (i * n + block).to(query.device), part[0].to(out.dtype))
    return out.reshape(b, n, h, value.shape[-1])


def _over_cache(query, key, value, allowed, scale, sinks, softcap):
    return hm.attend_rows(query, key, value, allowed.to(query.device), scale, sinks, softcap)


def ringattn_attention_forward(module, query, key, value, attention_mask, dropout=0.0,
                               scaling=None, is_causal=None, sliding_window=None, **kwargs):
    """transformers' attention interface: q [B, H, Q, D], k [B, HKV, KV, D] and v [B, HKV,
    KV, Dv] (head-major; Dv may differ from D, as in multi-head latent attention) in, the output
    [B, Q, H, Dv] and no attention weights out. A shape or option
    ringattn's core refuses (a head dim past its kernels', say) is a ValueError starting
    "ringattn:" too."""
    try:
        return _forward(module, query, key, value, attention_mask, dropout, scaling, is_causal,
                        sliding_window, kwargs)
    except ValueError as e:
        if str(e).startswith("ringattn:"):
            raise
        raise ValueError(f"ringattn: {e} (this layer's attention, which ringattn does not "
                         "carry; use attn_implementation='eager' for this model)") from e


def _forward(module, query, key, value, attention_mask, dropout, scaling, is_causal,
             sliding_window, kwargs):
    _refuse_features(module, kwargs)
    softcap = _softcap_of(module, kwargs)
    # Values may have a head dim of their own (multi-head latent attention: the output has
    # theirs); queries and keys share one, as every score is their dot product.
    if key.shape[-1] != query.shape[-1]:
        _refuse(f"the layer's queries have head dim {query.shape[-1]} and its keys "
                f"{key.shape[-1]}: queries and keys of different head dims have no dot product "
                "ringattn knows")
    if dropout:
        raise ValueError("ringattn: attention dropout is not supported (set the model's "
                         "attention_dropout to 0)")
    if kwargs.get("output_attentions"):
        raise ValueError("ringattn: output_attentions=True needs the attention weights, which "
                         "ringattn never forms (use attn_implementation='eager')")
    sinks = _sinks_of(kwargs, query.shape[1])
    if sinks is not None:
        sinks = sinks.to(query.device)
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    q_len, kv_len = query.shape[2], key.shape[2]
    if _COMM is not None and _COMM.size > 1:
        out = _on_ranks(module, query, key, value, attention_mask, scale, sinks, softcap,
                        kwargs)
        return out, None
    mask = attention_mask
    try:
        if isinstance(mask, _MaskSpec):
            if (mask.q_length, mask.kv_length) != (q_len, kv_len):
                _refuse(f"the layer attends {q_len} queries over {kv_len} keys but its mask was "
                        f"made for {mask.q_length} over {mask.kv_length} (the layer adds keys or "
                        "queries the mask does not describe, e.g. compressed KV entries)")
            if q_len == kv_len and mask.q_offset == mask.kv_offset:
                return _whole_tokens(query, key, value, mask.structure(), scale, sinks,
                                     softcap), None
            return _over_cache(query, key, value, mask.rows(q_len, kv_len), scale, sinks,
                               softcap), None
        if isinstance(mask, torch.Tensor):
            if q_len == kv_len:
                st = _structure_of_tensor(mask, query.shape[0], q_len)
                return _whole_tokens(query, key, value, st, scale, sinks, softcap), None
            allowed = hm.tensor_mask(mask, query.shape[0], q_len, kv_len).cpu()
            return _over_cache(query, key, value, allowed, scale, sinks, softcap), None
    except hm.NotCarried as e:
        _refuse(f"{e}, which ringattn does not carry")
    if mask is not None:
        _refuse(f"the layer's attention mask is a {type(mask).__name__}, which ringattn does not "
                "read")
    # No mask: every key, as eager attends (the mask interface gives None only for one
    # query over its whole cache, so this is also a model that passes no mask itself: eager
    # reads neither is_causal nor sliding_window, which are sdpa's and flash-attention's).
    if q_len == kv_len:
        out = _attention(*_engine_qkv(query, key, value), causal=False,
                         scale=scale, sinks=sinks, softcap=softcap)
        return out.to(query.dtype), None
    allowed = torch.ones(query.shape[0], q_len, kv_len, dtype=torch.bool)
    return _over_cache(query, key, value, allowed, scale, sinks, softcap), None


# ----- Over a communicator's ranks ---------------------------------------------------------

class _PackedBatch:
    def __init__(self, seqlens, total, rows):
        self.seqlens, self.total, self.rows = seqlens, total, rows


def _positions_function(mask):
    """The layer's mask as a function of positions alone (under a communicator, padding and
    packing come from shard_inputs, not from this rank's inputs)."""
    if isinstance(mask, _MaskSpec):
        if mask.padding is not None and not bool(mask.padding.all()):
            _refuse("a padded batch on ranks passes each rank's padding mask; pack it with "
                    "ringattn.integrations.transformers.shard_inputs(input_ids, "
                    "attention_mask) instead")
        fn = hm.without_tensor_parts(mask.mask_function)
        if fn is None:
            _refuse(f"the model's attention mask ({hm.describe(mask.mask_function)}) under "
                    "register(comm=...), which ringattn does not carry: on ranks it carries "
                    "causality, windows, chunks and the documents of shard_inputs")
        if fn is True:
            return lambda b, h, q, k: torch.ones((), dtype=torch.bool)
        return fn
    if mask is not None:
        _refuse("an attention-mask tensor under register(comm=...) (each rank's tensor covers "
                "its shard only); ringattn carries the masks transformers composes")
    # No mask: every key, as eager attends (as on one process).
    return lambda b, h, q, k: torch.ones((), dtype=torch.bool)


def _rank_positions(kwargs, batch, what):
    positions = kwargs.get("position_ids")
    if positions is None:
        _refuse(f"{what} under register(comm=...) without position_ids (pass each rank's "
                "positions, ringattn.shard(torch.arange(N)[None], comm, causal=True), or use "
                "shard_inputs)")
    positions = positions.detach().cpu().long()
    if positions.dim() == 1:
        positions = positions[None]
    if positions.shape[0] > 1 and not bool((positions == positions[:1]).all()):
        _refuse("batch rows with different positions under register(comm=...) (pack them "
                "with shard_inputs)")
    return positions[0]


def _on_ranks(module, query, key, value, mask, scale, sinks, softcap, kwargs):
    comm, heads = _COMM, query.shape[1]
    q_len, kv_len = query.shape[2], key.shape[2]
    fn = _positions_function(mask)
    if q_len == kv_len:
        if _PACKED is not None:
            docs, total, rows = _PACKED.seqlens, _PACKED.total, _PACKED.rows
            if rows.numel() != q_len:
                _refuse(f"this rank holds {q_len} tokens but shard_inputs gave it "
                        f"{rows.numel()} (call the model on shard_inputs' inputs)")
        else:
            total = q_len * comm.size
            docs, rows = [total], _rank_positions(kwargs, query.shape[0], "a layer")
        key_ = (id(fn), tuple(docs), total)
        st = mask._ranks.get(key_) if isinstance(mask, _MaskSpec) else None
        if st is None:
            try:
                st = hm.infer(hm.DocumentsOracle(fn, docs, total), 1, total,
                              what="the model's attention mask over the whole sequence")
            except hm.NotCarried as e:
                _refuse(f"{e}, which ringattn does not carry")
            if isinstance(mask, _MaskSpec):
                mask._ranks[key_] = st
        seqlens = st.doc_lengths[0]
        window = st.ringattn_window()
        keywords = dict(window=window, seqlens=None if len(seqlens) <= 1 else seqlens,
                        ulysses=_ULYSSES)
        chunks = _layout(comm, (1, total, heads), total, st.causal, None, heads,
                         keywords)[comm.rank]
        expected = torch.cat([torch.arange(b, b + n) for b, n in chunks])
        if not torch.equal(expected, rows):
            how = ", ".join(f"{k}={v!r}" for k, v in keywords.items()
                            if v is not None and k != "seqlens" and not (k == "ulysses" and v == 1))
            _refuse("this rank's tokens are not the ones ringattn's layout gives it for this "
                    f"layer's attention (causal={st.causal}{', ' + how if how else ''}): shard "
                    "the inputs with ringattn.shard(x, comm, causal=..., window=..., "
                    "ulysses=...) as the layer attends, or with shard_inputs(..., window=...) "
                    "for a padded or packed batch; a model whose layers lay the sequence out "
                    "differently (a window on some layers only) runs on one layout only where "
                    "those layouts agree")
        out = _attention(*_engine_qkv(query, key, value),
                         causal=st.causal, scale=scale, sinks=sinks, softcap=softcap,
                         comm=comm, **keywords)
        module._ringattn_cache = None if _PACKED is not None else dict(
            positions=rows.clone(), owned=torch.ones(rows.numel(), dtype=torch.bool))
        return out.to(query.dtype)
    return _decode_on_ranks(module, query, key, value, fn, scale, sinks, softcap, kwargs)


def _decode_on_ranks(module, query, key, value, fn, scale, sinks, softcap, kwargs):
    """Queries over every rank's cache shard: each rank's part, merged by log-sum-exp (one
    all-gather per layer). The queries' own keys are in every rank's cache; rank 0's count."""
    comm = _COMM
    q_len, kv_len = query.shape[2], key.shape[2]
    record = getattr(module, "_ringattn_cache", None)
    if record is None:
        _refuse("a decoding step under register(comm=...) after a packed prefill or with no "
                "prefill on the ranks")
    if record["positions"].numel() + q_len != kv_len:
        _refuse(f"a decoding step under register(comm=...) over a cache of {kv_len} keys where "
                f"{record['positions'].numel()} + {q_len} were expected (a cache that drops "
                "keys, e.g. a sliding-window cache, keeps each rank's last keys, not the "
                "window's: use a DynamicCache() that keeps them all)")
    if torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value)):
        _refuse("gradients through a decoding step under register(comm=...)")
    q_pos = _rank_positions(kwargs, query.shape[0], "a decoding step")
    kv_pos = torch.cat([record["positions"], q_pos])
    owned = torch.cat([record["owned"], torch.full((q_len,), comm.rank == 0)])
    allowed = hm._as_bool(fn(torch.tensor(0), torch.tensor(0), q_pos[:, None], kv_pos[None, :]),
                          (q_len, kv_len)) & owned[None, :]
    allowed = allowed[None].expand(query.shape[0], -1, -1).to(query.device)
    m, l, o = hm.partial_rows(query.detach(), key.detach(), value.detach(), allowed, scale,
                              softcap)
    local = torch.cat([m[..., None], l[..., None], o], dim=-1).cpu().contiguous()
    gathered = torch.empty((comm.size,) + tuple(local.shape), dtype=local.dtype)
    comm._handle.allgather(local, gathered)
    gathered = gathered.to(query.device)
    out = hm.merge_partials(gathered[..., 0], gathered[..., 1], gathered[..., 2:],
                            None if sinks is None else sinks.detach())
    record["positions"], record["owned"] = kv_pos, owned
    return out.to(query.dtype)


class ShardedBatch:
    """What shard_inputs gives a rank: ``inputs`` for the model (``input_ids`` and
    ``position_ids``, [1, T_local]); ``batch_index`` ([T_local], this rank's rows as flat
    indices ``b * N + t`` into the batch, -1 for filler rows); ``unshard(x)``: this rank's
    [1, T_local, ...] output (logits) back as the batch's [B, N, ...] on every rank (a
    collective; zeros at padding); ``local(x)``: this rank's rows of a batch tensor
    [B, N, ...] (zeros for filler rows), e.g. a loss's weights or labels."""

    def __init__(self, inputs, batch_index, batch, length, comm, keywords, heads):
        self.inputs, self.batch_index = inputs, batch_index
        self._batch, self._length, self._comm = batch, length, comm
        self._keywords, self._heads = keywords, heads
        self._batch_positions = None  # every row's batch_index, gathered on first unshard

    def local(self, x):
        flat = x.reshape((self._batch * self._length,) + tuple(x.shape[2:]))
        index = self.batch_index.clamp_min(0).to(x.device)
        rows = flat[index] * (self.batch_index >= 0).to(x.device).reshape(
            (-1,) + (1,) * (x.dim() - 2)).to(x.dtype)
        return rows[None]

    def unshard(self, x):
        from ..functional import unshard as _unshard
        full = _unshard(x, self._comm, causal=True, heads=self._heads, **self._keywords)[0]
        if self._batch_positions is None:
            self._batch_positions = _unshard(
                self.batch_index[None, :, None].float(), self._comm, causal=True,
                heads=self._heads, **self._keywords)[0, :, 0].long()
        index = self._batch_positions
        out = full.new_zeros((self._batch * self._length,) + tuple(full.shape[1:]))
        keep = index >= 0
        out[index[keep].to(full.device)] = full[keep.to(full.device)]
        return out.reshape((self._batch, self._length) + tuple(full.shape[1:]))


def shard_inputs(input_ids, attention_mask=None, position_ids=None, *, comm=None, ulysses=None,
                 heads=None, window=None) -> ShardedBatch:
    """A padded (``attention_mask``) or packed (restarting ``position_ids``) batch as one
    packed row of documents, and this rank's shard of it (a ShardedBatch: its ``inputs`` go
    to the model registered on ``comm``, default register's). The positions are those eager
    gives the padded batch (``position_ids``, else 0..N-1 in every row); ``heads``: the
    model's query heads (for Ulysses' layout); ``window``: the layers' window, as
    ringattn.attention takes it (the layout follows the work). The documents hold for the model's calls until
    the next shard_inputs or register()."""
    global _PACKED
    comm = _COMM if comm is None else comm
    ulysses = _ULYSSES if ulysses is None else ulysses
    if comm is None:
        raise ValueError("shard_inputs: no communicator (register(comm=...) first, or pass comm)")
    batch, n = input_ids.shape
    valid = (torch.ones(batch, n, dtype=torch.bool) if attention_mask is None
             else attention_mask.detach().cpu().bool())
    if position_ids is None:
        positions = torch.arange(n).expand(batch, n)
    else:
        positions = position_ids.detach().cpu().long().expand(batch, n)
    ids, pos, seqlens, where = [], [], [], []
    for b in range(batch):
        keep = valid[b].nonzero().flatten()
        if keep.numel() == 0:
            continue
        row_pos = positions[b, keep]
        cuts = [0]
        if attention_mask is None and position_ids is not None:
            cuts += (torch.diff(row_pos) != 1).nonzero().flatten().add(1).tolist()
        cuts.append(keep.numel())
        seqlens += [e - s for s, e in zip(cuts[:-1], cuts[1:]) if e > s]
        ids.append(input_ids[b, keep.to(input_ids.device)])
        pos.append(row_pos)
        where.append(b * n + keep)
    total = sum(seqlens)
    unit = 2 * comm.size * (ulysses if isinstance(ulysses, int) else 1)
    filler = (-total) % unit
    if filler:  # a document of filler tokens, so that every rank holds as many rows
        seqlens.append(filler)
        ids.append(input_ids.new_zeros(filler))
        pos.append(torch.arange(filler))
        where.append(torch.full((filler,), -1))
    ids, pos, where = torch.cat(ids), torch.cat(pos), torch.cat(where)
    total += filler
    keywords = dict(seqlens=seqlens if len(seqlens) > 1 else None, ulysses=ulysses,
                    window=window)
    layouts = _layout(comm, (1, total, heads or 1), total, True, None, heads, keywords)
    rows = torch.cat([torch.arange(b, b + k) for b, k in layouts[comm.rank]])
    _PACKED = _PackedBatch(seqlens, total, rows)
    inputs = dict(input_ids=ids[rows.to(ids.device)][None],
                  position_ids=pos[rows][None].to(input_ids.device))
    return ShardedBatch(inputs, where[rows], batch, n, comm, keywords, heads)


# ----- The mask interface ------------------------------------------------------------------

def _mask(batch_size, q_length, kv_length, q_offset=0, kv_offset=0, mask_function=None,
          attention_mask=None, allow_is_causal_skip=True, allow_is_bidirectional_skip=False,
          local_size=None, use_vmap=False, device="cpu", dtype=torch.float32, **kwargs):
    """No mask where every query attends every key (on one process); transformers' own
    tensor for queries over a longer cache, and where the model asks for one
    to edit (it clears allow_is_causal_skip for a plain causal or windowed mask); else the
    composition unevaluated (_MaskSpec), which the attention reads."""
    if isinstance(attention_mask, _MaskSpec) or (isinstance(attention_mask, torch.Tensor) and
                                                 attention_mask.dim() == 4):
        # The mask made for this step already (generation prepares it and passes it back in
        # as the model's attention_mask).
        return attention_mask
    spec = _MaskSpec(batch_size, q_length, kv_length, q_offset, kv_offset, mask_function,
                     attention_mask, use_vmap, device, dtype)
    one_process = _COMM is None or _COMM.size == 1
    all_valid = spec.padding is None or bool(
        spec.padding[:, spec.kv_offset:spec.kv_offset + kv_length].all())
    local_ok = local_size is None or kv_length < local_size
    kinds = {k for k, _ in hm.components(mask_function)}
    # The query is the cache's last key: a static cache holds unwritten keys past it, which
    # causality masks (zeros there would otherwise join the softmax's normaliser).
    last = spec.q_offset + q_length == spec.kv_offset + kv_length
    if one_process and all_valid and local_ok and (
            (q_length == 1 and last and kinds <= {"causal", "sliding window",
                                                  "chunked attention", "and", "bidirectional"}) or
            (allow_is_bidirectional_skip and kinds <= {"bidirectional"})):
        # Every query attends every key (one query over its whole cache, or bidirectional
        # attention without padding): None, as transformers gives eager (some models size or
        # skip their own masks by it), and the attention reads None as every key.
        return None
    if one_process and (q_length != kv_length or spec.q_offset != spec.kv_offset):
        # Queries over a longer cache: the mask is as small as the work, and generation with
        # a static cache passes it back into the model as its attention_mask (a tensor).
        return spec.tensor()
    plain = kinds <= {"causal", "sliding window", "chunked attention", "and", "padding"}
    if not allow_is_causal_skip and plain and q_length > 1 and one_process and "or" not in kinds:
        return spec.tensor()  # the model asked for a tensor to edit
    return spec


def register(comm=None, ulysses=1) -> None:
    """Registers "ringattn" (again), on `comm`'s ranks (default: this process alone), each
    passing its shard of the sequence (``ringattn.shard``, with ``ulysses`` too, or
    ``shard_inputs``) and its positions (``position_ids``); ``ulysses``: Ulysses x ring groups
    (``ringattn.attention``'s keyword). Gradients of the model's parameters (the sinks'
    included) are each rank's part: sum them over the ranks."""
    global _COMM, _ULYSSES, _PACKED
    _COMM, _ULYSSES, _PACKED = comm, ulysses, None
    AttentionInterface.register(NAME, ringattn_attention_forward)
    AttentionMaskInterface.register(NAME, _mask)


register()
