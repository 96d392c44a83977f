"""What a transformers attention mask says, read from the mask itself.

transformers composes a layer's mask from named functions of (batch, head, query index, key
index): causality, a sliding window, chunks, padding, packed sequences, bidirectional
overlays, and/or compositions (``transformers.masking_utils``). This module turns such a mask
(the composed function, or a mask tensor a model built or edited) into ringattn's options:

- the valid tokens of each batch row (a token that does not attend itself is padding),
- documents (runs of valid tokens that attend nothing outside themselves: packed sequences,
  Llama 4's chunks, the rows of a padded batch),
- causality, and a window ``(left, right)`` counted in positions within a document,

by evaluating the mask where these are decided (each token against itself and its valid
neighbour, whole rows at the ends of documents), and then checking the derived options
against the mask: every row where the mask is small (``_FULL_CHECK`` valid tokens per batch
row), else sampled rows (the ends of documents and random rows) for a composition of
transformers' own functions and every row for anything else. A mask the options cannot
express is refused, naming what the composition holds (``NotCarried``); it is never
approximated.
"""
from __future__ import annotations

import math

import torch

# Valid tokens per batch row up to which every row of the mask is checked.
_FULL_CHECK = 4096
# Rows checked at random beyond that (plus the first and last rows of documents).
_SAMPLED_ROWS = 256
# Rows of the mask evaluated at once (bounds the memory of a check to this many x N).
_ROW_BLOCK = 256


class NotCarried(ValueError):
    """A mask ringattn's options cannot express; the message names why."""


# transformers' mask functions, by qualified name: what each means.
_KINDS = {
    "causal_mask_function": "causal",
    "bidirectional_mask_function": "bidirectional",
    "sliding_window_overlay.<locals>.inner_mask": "sliding window",
    "sliding_window_bidirectional_overlay.<locals>.inner_mask": "bidirectional sliding window",
    "chunked_overlay.<locals>.inner_mask": "chunked attention",
    "padding_mask_function.<locals>.inner_mask": "padding",
    "packed_sequence_mask_function.<locals>.inner_mask": "packed sequences",
    "remap_positions_for_packed_sequence.<locals>.inner_mask": "packed sequences (positions)",
    "add_offsets_to_mask_function.<locals>.inner_mask": "offsets",
    "and_masks.<locals>.and_mask": "and",
    "or_masks.<locals>.or_mask": "or",
    "blockwise_overlay.<locals>.inner_mask": "a blockwise overlay (bidirectional blocks of "
                                             "image or other non-text tokens)",
}
# Kinds that depend on tensors of this call's inputs (indexed by token, not computed from
# positions alone).
_TENSOR_KINDS = {"padding", "packed sequences", "packed sequences (positions)",
                 "a blockwise overlay (bidirectional blocks of image or other non-text tokens)"}


def _cells(fn):
    names = getattr(getattr(fn, "__code__", None), "co_freevars", ())
    cells = getattr(fn, "__closure__", None) or ()
    out = {}
    for name, cell in zip(names, cells):
        try:
            out[name] = cell.cell_contents
        except ValueError:  # an empty cell
            pass
    return out


def kind_of(fn) -> str:
    return _KINDS.get(getattr(fn, "__qualname__", ""), "")


def components(fn):
    """Every function of a composition, depth first: (kind, function); kind "" for a
    function transformers does not define (a model's own)."""
    kind = kind_of(fn)
    yield kind, fn
    cells = _cells(fn)
    if kind in ("and", "or"):
        for inner in cells.get("mask_functions", ()):
            yield from components(inner)
    elif kind in ("offsets", "packed sequences (positions)"):
        inner = cells.get("mask_function")
        if inner is not None:
            yield from components(inner)


def describe(fn) -> str:
    """The composition in words, for messages: e.g. "causal and a blockwise overlay ..."."""
    names = []
    for kind, f in components(fn):
        if kind in ("and", "or", "offsets", "packed sequences (positions)"):
            if kind == "or":
                names.append("an or-composition (a model's overlay on top of causality)")
            continue
        names.append(kind or f"the model's own mask function {getattr(f, '__qualname__', f)!r}")
    seen = []
    for n in names:
        if n not in seen:
            seen.append(n)
    return ", ".join(seen)


def all_known(fn) -> bool:
    return all(kind for kind, _ in components(fn))


def without_tensor_parts(fn):
    """The composition without its padding and packing parts (those index this process's
    inputs, which under a communicator are one rank's shard): the function of positions
    alone, or None where a part is not transformers' own or is some other tensor-backed part
    (then it cannot be evaluated at a whole sequence's positions)."""
    kind = kind_of(fn)
    cells = _cells(fn)
    if kind in ("padding", "packed sequences"):
        return True  # no constraint
    if kind == "packed sequences (positions)":
        return without_tensor_parts(cells.get("mask_function"))
    if kind in ("causal", "bidirectional", "sliding window", "bidirectional sliding window",
                "chunked attention"):
        return fn
    if kind == "and":
        parts = [without_tensor_parts(f) for f in cells.get("mask_functions", ())]
        if any(p is None for p in parts):
            return None
        parts = [p for p in parts if p is not True]
        if not parts:
            return True

        def and_mask(b, h, q, k):
            out = None
            for p in parts:
                r = p(b, h, q, k)
                out = r if out is None else out & r
            return out
        return and_mask
    return None


def _as_bool(x, shape):
    x = torch.as_tensor(x)
    return torch.broadcast_to(x.to(torch.bool), shape)


class FunctionOracle:
    """A mask function evaluated at token indices (offsets added as transformers adds them),
    and with the padding mask as sdpa_mask joins it."""

    def __init__(self, fn, q_offset=0, kv_offset=0):
        self.fn, self.q_offset, self.kv_offset = fn, int(q_offset), int(kv_offset)
        self.head = torch.tensor(0)

    def pairs(self, b, qi, ki):
        return _as_bool(self.fn(torch.tensor(b), self.head, qi + self.q_offset,
                                ki + self.kv_offset), qi.shape)

    def rows(self, b, qi, ki):
        return _as_bool(self.fn(torch.tensor(b), self.head, qi[:, None] + self.q_offset,
                                ki[None, :] + self.kv_offset), (qi.numel(), ki.numel()))


class TensorOracle:
    """A boolean mask [B, Q, KV] (True: attend)."""

    def __init__(self, mask):
        self.mask = mask

    def pairs(self, b, qi, ki):
        return self.mask[b, qi, ki]

    def rows(self, b, qi, ki):
        return self.mask[b][qi][:, ki]


class DocumentsOracle:
    """A function of positions within documents (transformers' packed-sequence semantics)
    over a whole sequence cut into documents: tokens of different documents never attend
    each other; within one, the function sees positions counted from the document's start."""

    def __init__(self, fn, doc_lengths, total):
        self.fn = fn
        lengths = torch.as_tensor(list(doc_lengths), dtype=torch.long)
        starts = torch.cumsum(lengths, 0) - lengths
        self.doc = torch.repeat_interleave(torch.arange(len(lengths)), lengths)
        self.start = torch.repeat_interleave(starts, lengths)
        assert self.doc.numel() == total
        self.head = torch.tensor(0)

    def pairs(self, b, qi, ki):
        same = self.doc[qi] == self.doc[ki]
        r = _as_bool(self.fn(torch.tensor(b), self.head, qi - self.start[qi],
                             ki - self.start[ki]), qi.shape)
        return same & r

    def rows(self, b, qi, ki):
        same = self.doc[qi][:, None] == self.doc[ki][None, :]
        r = _as_bool(self.fn(torch.tensor(b), self.head, (qi - self.start[qi])[:, None],
                             (ki - self.start[ki])[None, :]), (qi.numel(), ki.numel()))
        return same & r


def tensor_mask(mask, batch, q_len, kv_len) -> torch.Tensor:
    """A model's 4D mask tensor as booleans [batch, Q, KV] (dimensions of size 1 broadcast,
    as the eager addition broadcasts them), or NotCarried naming why."""
    if mask.dim() != 4:
        raise NotCarried(f"an attention-mask tensor of shape {list(mask.shape)} (ringattn reads "
                         "4D masks [B, 1, Q, KV])")
    if mask.requires_grad:
        raise NotCarried("a learned attention bias in the mask tensor (it requires a gradient, "
                         "e.g. a relative position bias table)")
    if mask.dtype == torch.bool:
        allowed = mask
    elif mask.is_floating_point():
        allowed = mask == 0
        blocked = mask <= torch.finfo(mask.dtype).min / 2
        if not bool((allowed | blocked).all()):
            raise NotCarried("an additive attention bias in the mask tensor (values other than "
                             "0 and the dtype's minimum)")
    else:
        allowed = mask != 0
    if allowed.shape[1] != 1:
        if not bool((allowed == allowed[:, :1]).all()):
            raise NotCarried("a mask tensor that differs between heads")
    allowed = allowed[:, 0]
    try:
        return torch.broadcast_to(allowed, (batch, q_len, kv_len))
    except RuntimeError:
        raise NotCarried(f"a mask tensor of shape {list(mask.shape)} for a batch of {batch} "
                         f"with {q_len} queries over {kv_len} keys") from None


class Structure:
    """What a mask of one call's tokens says (Q = KV, the same tokens)."""

    def __init__(self, valid, doc_lengths, causal, window, batch, length):
        self.valid = valid            # per batch row: LongTensor of valid token indices
        self.doc_lengths = doc_lengths  # per batch row: list of document lengths
        self.causal = causal
        self.window = window          # None or (left, right); right 0 when causal
        self.batch, self.length = batch, length
        # Per batch row: tokens that do not attend themselves but attend some key (eager
        # defines their rows, e.g. a key-padding mask's padded queries), computed over the
        # oracle's own rows; tokens that attend no key get zeros.
        self.extra_rows = [torch.zeros(0, dtype=torch.long) for _ in range(batch)]
        self.oracle = None

    @property
    def all_valid(self):
        return all(v.numel() == self.length for v in self.valid)

    @property
    def same_documents(self):
        return all(d == self.doc_lengths[0] for d in self.doc_lengths)

    def ringattn_window(self):
        if self.window is None:
            return None
        left, right = self.window
        return (left, 0) if self.causal else (left, right)


def _derived_rows(rows, n, doc, causal, left, right):
    """The mask the derived options mean for the given compact rows over all n compact
    columns."""
    cols = torch.arange(n)
    r = rows[:, None]
    allowed = doc[rows][:, None] == doc[None, :]
    if causal:
        allowed &= cols[None, :] <= r
    if left is not None:
        allowed &= r - cols[None, :] <= left
    if right is not None:
        allowed &= cols[None, :] - r <= right
    return allowed


def infer(oracle, batch, length, *, full_check=False, what="the mask") -> Structure:
    """The structure of a mask over `length` tokens (query i and key i are the same token),
    checked against the mask; NotCarried where the options cannot express it."""
    idx = torch.arange(length)
    valid_rows, starts_rows = [], []
    causal = True
    for b in range(batch):
        valid = oracle.pairs(b, idx, idx).nonzero().flatten()
        if valid.numel() > 1:
            a, c = valid[:-1], valid[1:]
            sub, sup = oracle.pairs(b, c, a), oracle.pairs(b, a, c)
            if bool(sup.any()):
                causal = False
            start = torch.cat([torch.ones(1, dtype=torch.bool), ~(sub | sup)])
        else:
            start = torch.ones(valid.numel(), dtype=torch.bool)
        valid_rows.append(valid)
        starts_rows.append(start.nonzero().flatten())
    # The window: whole rows at the ends of the longest documents.
    left = right = None
    generator = torch.Generator().manual_seed(0)
    for b in range(batch):
        valid, starts = valid_rows[b], starts_rows[b]
        n = valid.numel()
        if n == 0:
            continue
        ends = torch.cat([starts[1:], torch.tensor([n])])
        order = torch.argsort(ends - starts, descending=True)[:8]
        for d in order.tolist():
            s, e = int(starts[d]), int(ends[d])
            cols = valid[s:e]
            probes = [e - 1] if causal else [e - 1, s]
            for t in probes:
                row = oracle.rows(b, valid[t:t + 1], cols)[0].nonzero().flatten()
                if row.numel() == 0:
                    continue
                lo, hi = s + int(row.min()), s + int(row.max())
                if lo > s and left is None:
                    left = t - lo
                if not causal and hi < e - 1 and right is None:
                    right = hi - t
    window = None if left is None and right is None else (
        left if left is not None else length, right if right is not None else length)
    structure = Structure(valid_rows, [], causal, window, batch, length)
    structure.oracle = oracle
    for b in range(batch):
        invalid = torch.ones(length, dtype=torch.bool)
        invalid[valid_rows[b]] = False
        invalid = invalid.nonzero().flatten()
        keep = [invalid[i:i + _ROW_BLOCK][oracle.rows(b, invalid[i:i + _ROW_BLOCK], idx).any(1)]
                for i in range(0, invalid.numel(), _ROW_BLOCK)]
        if keep:
            structure.extra_rows[b] = torch.cat(keep)
    # Check the derived options against the mask, row by row.
    for b in range(batch):
        valid, starts = valid_rows[b], starts_rows[b]
        n = valid.numel()
        ends = torch.cat([starts[1:], torch.tensor([n])]) if n else starts
        structure.doc_lengths.append((ends - starts).tolist())
        if n == 0:
            continue
        doc = torch.repeat_interleave(torch.arange(starts.numel()), ends - starts)
        if full_check or n <= _FULL_CHECK:
            rows = torch.arange(n)
        else:
            picked = [starts[:64], (ends - 1)[:64], starts[-64:], (ends - 1)[-64:],
                      torch.randint(0, n, (_SAMPLED_ROWS,), generator=generator)]
            rows = torch.unique(torch.cat(picked))
        invalid = torch.ones(length, dtype=torch.bool)
        invalid[valid] = False
        invalid_cols = invalid.nonzero().flatten()
        for i in range(0, rows.numel(), _ROW_BLOCK):
            block = rows[i:i + _ROW_BLOCK]
            got = oracle.rows(b, valid[block], valid)
            want = _derived_rows(block, n, doc, causal, left, None if causal else right)
            if not torch.equal(got, want):
                raise NotCarried(f"{what} is more than causality, a window, documents and "
                                 "padding")
            if invalid_cols.numel() and bool(oracle.rows(b, valid[block], invalid_cols).any()):
                raise NotCarried(f"{what} lets tokens attend keys that do not attend "
                                 "themselves (not padding ringattn can gather out)")
    return structure


def _capped(logits, softcap):
    """Scaled scores soft-capped as ringattn's softcap (and Gemma 2's eager) caps them:
    c * tanh(s / c); unchanged for c = 0."""
    return logits if not softcap else torch.tanh(logits / softcap) * softcap


def attend_rows(query, key, value, allowed, scale, sinks=None, softcap=0.0, row_block=128):
    """Exact attention of a few query rows over keys, by torch operations in float32 (or
    float64 for float64 inputs): query [B, H, Q, D], key [B, HKV, KV, D], value [B, HKV, KV,
    Dv], allowed [B, Q, KV] booleans; the output [B, Q, H, Dv] in query's dtype. softcap: the
    scaled scores capped before the mask (a sink's logit is not). A row that attends no key
    is 0 (and with sinks, 0 too). Differentiable."""
    b, h, q_len, _ = query.shape
    groups = h // key.shape[1]
    compute = torch.float64 if query.dtype == torch.float64 else torch.float32
    k = key.to(compute).repeat_interleave(groups, dim=1)
    v = value.to(compute).repeat_interleave(groups, dim=1)
    outs = []
    for i in range(0, q_len, row_block):
        q = query[:, :, i:i + row_block].to(compute)
        logits = _capped(torch.matmul(q, k.transpose(2, 3)) * scale, softcap)
        logits = logits.masked_fill(~allowed[:, None, i:i + row_block], -math.inf)
        if sinks is not None:
            sink = sinks.to(compute).reshape(1, -1, 1, 1).expand(b, -1, q.shape[2], 1)
            logits = torch.cat([logits, sink], dim=-1)
        top = logits.amax(-1, keepdim=True)
        top = torch.where(torch.isfinite(top), top, torch.zeros_like(top))
        weights = torch.exp(logits - top)
        probs = weights / weights.sum(-1, keepdim=True).clamp_min(torch.finfo(compute).tiny)
        if sinks is not None:
            probs = probs[..., :-1]
        outs.append(torch.matmul(probs, v))
    return torch.cat(outs, dim=2).transpose(1, 2).to(query.dtype)


def partial_rows(query, key, value, allowed, scale, softcap=0.0):
    """One rank's part of attention rows over its keys, for a log-sum-exp merge: the row
    maxima m [B, H, Q], sums l [B, H, Q] and unnormalised outputs o [B, H, Q, Dv] (float32;
    m = -inf, l = 0, o = 0 for a row with no key here), of scores capped by softcap."""
    groups = query.shape[1] // key.shape[1]
    k = key.float().repeat_interleave(groups, dim=1)
    v = value.float().repeat_interleave(groups, dim=1)
    logits = _capped(torch.matmul(query.float(), k.transpose(2, 3)) * scale, softcap)
    logits = logits.masked_fill(~allowed[:, None], -math.inf)
    m = logits.amax(-1)
    safe = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    w = torch.exp(logits - safe[..., None])
    return m, w.sum(-1), torch.matmul(w, v)


def merge_partials(m, l, o, sinks=None):
    """Merges ranks' partials (stacked on a leading rank dimension) into [B, Q, H, Dv]; the
    sinks' logits join uncapped, as they join ringattn's softmax."""
    top = m.amax(0)
    if sinks is not None:
        top = torch.maximum(top, sinks.float().reshape(1, -1, 1).expand_as(top))
    top = torch.where(torch.isfinite(top), top, torch.zeros_like(top))
    scale = torch.exp(m - top[None])
    total = (l * scale).sum(0)
    if sinks is not None:
        total = total + torch.exp(sinks.float().reshape(1, -1, 1) - top)
    out = (o * scale[..., None]).sum(0) / total.clamp_min(torch.finfo(torch.float32).tiny)[..., None]
    return out.transpose(1, 2)
