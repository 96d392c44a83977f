"""ringattn.integrations._hf_masks: the options read from a mask reproduce the mask exactly
(valid tokens, documents, causality, windows on either side), and a mask they cannot express
is refused, never approximated. Masks are boolean [B, N, N] tensors made here; the
transformers compositions are tested in test_transformers.py."""
import pytest
import torch

from ringattn.integrations import _hf_masks as hm


def make_mask(valid_rows, docs_rows, causal, left, right):
    """[B, N, N]: valid tokens in documents (in order), causal or not, a window."""
    batch, n = len(valid_rows), max(int(v.max()) + 1 for v in valid_rows if v.numel())
    mask = torch.zeros(batch, n, n, dtype=torch.bool)
    for b, (valid, docs) in enumerate(zip(valid_rows, docs_rows)):
        start = 0
        for length in docs:
            idx = valid[start:start + length]
            pos = torch.arange(length)
            allowed = torch.ones(length, length, dtype=torch.bool)
            if causal:
                allowed &= pos[None, :] <= pos[:, None]
            if left is not None:
                allowed &= pos[:, None] - pos[None, :] <= left
            if right is not None:
                allowed &= pos[None, :] - pos[:, None] <= right
            mask[b, idx[:, None], idx[None, :]] = allowed
            start += length
    return mask


def expand(st, n):
    """The mask the structure's options mean, [B, N, N]."""
    mask = torch.zeros(st.batch, n, n, dtype=torch.bool)
    left, right = (st.window if st.window is not None else (None, None))
    for b in range(st.batch):
        sub = make_mask([st.valid[b]], [st.doc_lengths[b]], st.causal,
                        left if left is not None and left < n else None,
                        None if st.causal or right is None or right >= n else right)
        mask[b, :sub.shape[1], :sub.shape[2]] = sub[0]
    return mask


CASES = {
    "causal": ([torch.arange(40)] * 2, [[40]] * 2, True, None, None),
    "causal window": ([torch.arange(40)] * 2, [[40]] * 2, True, 7, None),
    "bidirectional window": ([torch.arange(40)] * 2, [[40]] * 2, False, 4, 4),
    "lopsided window": ([torch.arange(40)] * 2, [[40]] * 2, False, 3, 6),
    "documents": ([torch.arange(40)] * 2, [[10, 25, 5], [40]], True, None, None),
    "chunks and window": ([torch.arange(40)] * 2, [[16, 16, 8]] * 2, True, 5, None),
    "left padding": ([torch.arange(40), torch.arange(9, 40)], [[40], [31]], True, None, None),
    "right padding, bidirectional": ([torch.arange(40), torch.arange(0, 33)], [[40], [33]],
                                     False, None, None),
    "one-token documents": ([torch.arange(12)], [[1] * 12], True, None, None),
}


@pytest.mark.parametrize("name", list(CASES))
def test_the_options_read_from_a_mask_reproduce_it(name):
    mask = make_mask(*CASES[name])
    n = mask.shape[-1]
    st = hm.infer(hm.TensorOracle(mask), mask.shape[0], n)
    assert torch.equal(expand(st, n), mask)


@pytest.mark.parametrize("name", list(CASES))
def test_a_sampled_check_reads_long_masks_the_same(name, monkeypatch):
    monkeypatch.setattr(hm, "_FULL_CHECK", 8)  # the sampled rows, not every row
    mask = make_mask(*CASES[name])
    st = hm.infer(hm.TensorOracle(mask), mask.shape[0], mask.shape[-1])
    assert torch.equal(expand(st, mask.shape[-1]), mask)


def test_masks_the_options_cannot_express_are_refused():
    n = 24
    causal = torch.ones(n, n, dtype=torch.bool).tril()
    strided = causal.clone()
    strided[:, 1::2] = False
    strided |= torch.eye(n, dtype=torch.bool)
    prefix_lm = causal.clone()
    prefix_lm[:8, :8] = True  # bidirectional prefix, then causal
    padding_attended = causal.clone()
    padding_attended[5, 5] = False  # token 5 does not attend itself, yet later rows attend it
    for mask in (strided, prefix_lm, padding_attended):
        with pytest.raises(hm.NotCarried):
            hm.infer(hm.TensorOracle(mask[None]), 1, n, full_check=True)


def test_a_mask_tensor_is_broadcast_and_additive_masks_are_read():
    key_padding = torch.zeros(2, 1, 1, 10)
    key_padding[1, ..., 8:] = torch.finfo(torch.float32).min
    allowed = hm.tensor_mask(key_padding, 2, 10, 10)
    assert allowed.shape == (2, 10, 10)
    assert bool(allowed[0].all()) and not bool(allowed[1, :, 8:].any())
    with pytest.raises(hm.NotCarried, match="additive attention bias"):
        hm.tensor_mask(torch.full((1, 1, 4, 4), 0.5), 1, 4, 4)
    with pytest.raises(hm.NotCarried, match="learned attention bias"):
        hm.tensor_mask(torch.zeros(1, 1, 4, 4, requires_grad=True), 1, 4, 4)
    with pytest.raises(hm.NotCarried, match="differs between heads"):
        heads = torch.ones(1, 2, 4, 4, dtype=torch.bool)
        heads[0, 1, 0, 0] = False
        hm.tensor_mask(heads, 1, 4, 4)


def test_rows_over_a_cache_and_the_ranks_merge_are_attention():
    """attend_rows against a float64 softmax; merging two halves' partials (keys split
    between two "ranks") gives the whole, with sinks."""
    torch.manual_seed(0)
    q = torch.randn(2, 4, 3, 8, dtype=torch.float64)
    k, v = torch.randn(2, 2, 20, 8, dtype=torch.float64), torch.randn(2, 2, 20, 8,
                                                                          dtype=torch.float64)
    allowed = torch.rand(2, 3, 20) < 0.6
    allowed[1, 2] = False  # a row that attends nothing: zeros
    sinks = torch.randn(4, dtype=torch.float64)
    logits = torch.matmul(q, k.repeat_interleave(2, 1).transpose(2, 3)) * 0.3
    logits = logits.masked_fill(~allowed[:, None], float("-inf"))
    full = torch.cat([logits, sinks.reshape(1, 4, 1, 1).expand(2, 4, 3, 1)], -1)
    want = torch.matmul(torch.softmax(full, -1)[..., :-1],
                        v.repeat_interleave(2, 1)).transpose(1, 2)
    got = hm.attend_rows(q, k, v, allowed, 0.3, sinks)
    assert torch.allclose(got, want, atol=1e-12)
    parts = [hm.partial_rows(q, k[:, :, s], v[:, :, s], allowed[..., s], 0.3)
             for s in (slice(0, 7), slice(7, 20))]
    merged = hm.merge_partials(*(torch.stack(x) for x in zip(*parts)), sinks)
    assert torch.allclose(merged.double(), want, atol=1e-5)
