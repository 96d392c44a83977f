"""ringattn.attention on one process: forward and gradients against the float64 reference
(reference.py) and the golden cases, autograd behaviour, plan caching, and errors that must
carry the library's messages in the keywords' words."""
import json
import math
import pathlib

import warnings
import zlib

import numpy as np
import pytest
import torch

import ringattn
import reference

TOLERANCE = 1e-5
GOLDEN = pathlib.Path(__file__).resolve().parents[2] / "tests" / "data" / "golden"


def make_inputs(shape, kv_heads=None, seed=0):
    b, n, h, d = shape
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, n, h, d, generator=g)
    k = torch.randn(b, n, kv_heads or h, d, generator=g)
    v = torch.randn(b, n, kv_heads or h, d, generator=g)
    dout = torch.randn(b, n, h, d, generator=g)
    return q, k, v, dout


def local_mask(n, heads, block_size, window_tokens):
    nb = n // block_size
    i = torch.arange(nb)
    reach = window_tokens // (2 * block_size)
    return ((i[:, None] - i[None, :]).abs() <= reach).expand(heads, nb, nb).clone()


# (id, shape [B, N, H, D], kv_heads, ringattn keywords)
CASES = [
    ("dense", (2, 64, 2, 16), None, {}),
    ("dense_causal", (1, 96, 3, 32), None, dict(causal=True)),
    ("dense_scale", (1, 64, 2, 16), None, dict(scale=0.4)),
    ("grouped", (1, 64, 4, 16), None,
     dict(attention="dilated", segments=[16, 32], dilations=[1, 2])),
    ("grouped_causal_uneven", (2, 96, 5, 8), None,
     dict(attention="dilated", segments=[24, 48, 96], dilations=[1, 2, 4], causal=True)),
    ("mixture", (1, 64, 4, 16), None,
     dict(attention="dilated", segments=[16, 64], dilations=[1, 2], combine="mixture")),
    ("mixture_causal", (1, 96, 3, 8), None,
     dict(attention="dilated", segments=[8, 16, 32], dilations=[1, 2, 4], combine="mixture",
          causal=True)),
    ("gqa_causal", (1, 64, 4, 16), 2, dict(causal=True)),
    ("mqa_grouped", (1, 64, 4, 16), 1,
     dict(attention="dilated", segments=[32, 64], dilations=[1, 2])),
    ("window", (1, 96, 2, 16), None, dict(window=8)),
    ("window_causal", (1, 96, 2, 16), None, dict(window=[12, 0], causal=True)),
    ("window_asymmetric_gqa", (1, 64, 4, 16), 2, dict(window=(4, 20))),
    ("block_local", (1, 128, 2, 16), None,
     dict(attention="block-sparse", pattern="local:window=48", block_size=16)),
    ("block_local_causal", (1, 128, 2, 16), None,
     dict(attention="block-sparse", pattern="local:window=48", block_size=16, causal=True)),
    ("block_gqa_window_packed_causal", (1, 128, 4, 16), 2,
     dict(attention="block-sparse", pattern="local:window=48", block_size=16, causal=True,
          window=20, seqlens=[1, 50, 77])),
    ("block_mqa_window_two_sided", (2, 96, 3, 8), 1,
     dict(attention="block-sparse", pattern="local:window=64", block_size=16, window=(5, 11))),
]


def reference_pattern(kw, shape):
    """The reference's description of a case's keys (block-sparse patterns as masks)."""
    pattern = {k: v for k, v in kw.items() if k not in ("scale", "pattern", "block_size")}
    if kw.get("attention") == "block-sparse":
        window = int(kw["pattern"].split("=")[1])
        pattern["block_mask"] = local_mask(shape[1], shape[2], kw["block_size"], window)
        pattern["block_size"] = kw["block_size"]
    if "window" in pattern:
        w = pattern["window"]
        pattern["window"] = w if isinstance(w, int) else tuple(w)
    return pattern


@pytest.mark.parametrize("name,shape,kv_heads,kw", CASES, ids=[c[0] for c in CASES])
def test_forward_and_gradients_match_float64_reference(name, shape, kv_heads, kw):
    q, k, v, dout = make_inputs(shape, kv_heads, seed=hash(name) % 1000)
    q.requires_grad_()
    k.requires_grad_()
    v.requires_grad_()
    out, lse = ringattn.attention(q, k, v, return_lse=True, **kw)
    out.backward(dout)
    want = reference.forward_backward(q, k, v, dout, scale=kw.get("scale"),
                                      **reference_pattern(kw, shape))
    assert lse.shape == (shape[0], shape[2], shape[1])
    for label, got, ref in zip(("out", "lse", "dq", "dk", "dv"),
                               (out, lse, q.grad, k.grad, v.grad), want):
        err = reference.relative_error(got, ref)
        assert err <= TOLERANCE, f"{name}: {label} relative error {err:.2e}"


def test_block_mask_argument_matches_reference():
    shape = (1, 64, 2, 16)
    q, k, v, dout = make_inputs(shape, seed=5)
    g = torch.Generator().manual_seed(9)
    mask = torch.rand(2, 4, 4, generator=g) < 0.5
    mask[:, 1, :] = False  # a query block with no keys: zeros, lse -inf
    for x in (q, k, v):
        x.requires_grad_()
    out, lse = ringattn.attention(q, k, v, attention="block-sparse", block_mask=mask,
                                  block_size=16, return_lse=True)
    out.backward(dout)
    want = reference.forward_backward(q, k, v, dout, attention="block-sparse",
                                      block_mask=mask, block_size=16)
    assert torch.isinf(lse[:, :, 16:32]).all()
    for got, ref in zip((out, lse, q.grad, k.grad, v.grad), want):
        assert reference.relative_error(got, ref) <= TOLERANCE


def golden_cases():
    return sorted(p for p in GOLDEN.iterdir() if (p / "case.json").exists())


@pytest.mark.parametrize("case", golden_cases(), ids=lambda p: p.name)
def test_golden_case_numpy(case):
    meta = json.loads((case / "case.json").read_text())
    arrays = {name: np.load(case / f"{name}.npy")
              for name in ("q", "k", "v", "dout", "out", "dq", "dk", "dv")}
    kw = dict(causal=meta["causal"], scale=meta["scale"])
    if meta["mode"] == "blockmask":
        kw.update(attention="block-sparse", block_size=meta["block_size"],
                  block_mask=np.load(case / "block_mask.npy"))
    else:
        kw.update(attention="dilated", segments=meta["segments"], dilations=meta["dilations"],
                  combine="mixture" if meta["mode"] == "mixture" else "grouped")
    q, k, v = arrays["q"], arrays["k"], arrays["v"]
    out, lse = ringattn.attention(q, k, v, return_lse=True, **kw)
    assert isinstance(out, np.ndarray) and out.dtype == np.float32
    dq, dk, dv = ringattn.attention_backward(q, k, v, out, lse, arrays["dout"], **kw)
    for label, got in (("out", out), ("dq", dq), ("dk", dk), ("dv", dv)):
        err = reference.relative_error(torch.from_numpy(got), torch.from_numpy(arrays[label]))
        assert err <= TOLERANCE, f"{case.name}: {label} relative error {err:.2e}"


def test_golden_case_torch_autograd_equals_numpy_path():
    case = GOLDEN / "g02_three_groups_causal"
    meta = json.loads((case / "case.json").read_text())
    q, k, v, dout = (torch.from_numpy(np.load(case / f"{n}.npy")) for n in ("q", "k", "v", "dout"))
    for x in (q, k, v):
        x.requires_grad_()
    out = ringattn.attention(q, k, v, attention="dilated", segments=meta["segments"],
                             dilations=meta["dilations"], causal=True, scale=meta["scale"])
    out.backward(dout)
    for label, got in (("out", out), ("dq", q.grad), ("dk", k.grad), ("dv", v.grad)):
        want = torch.from_numpy(np.load(case / f"{label}.npy"))
        assert reference.relative_error(got, want) <= TOLERANCE, label


# --- autograd behaviour ----------------------------------------------------------------

def test_no_grad_and_inputs_without_grad_give_plain_tensors():
    q, k, v, _ = make_inputs((1, 32, 2, 16))
    out = ringattn.attention(q, k, v)
    assert not out.requires_grad and out.grad_fn is None
    q.requires_grad_()
    with torch.no_grad():
        out = ringattn.attention(q, k, v, causal=True)
    assert not out.requires_grad


def test_only_some_inputs_require_grad():
    q, k, v, dout = make_inputs((1, 32, 2, 16), seed=3)
    k.requires_grad_()
    out = ringattn.attention(q, k, v, causal=True)
    out.backward(dout)
    assert q.grad is None and v.grad is None
    want = reference.forward_backward(q, k, v, dout, causal=True)
    assert reference.relative_error(k.grad, want[3]) <= TOLERANCE


def test_lse_is_not_differentiable_and_out_is():
    q, k, v, _ = make_inputs((1, 32, 2, 16))
    q.requires_grad_()
    out, lse = ringattn.attention(q, k, v, return_lse=True)
    assert out.requires_grad and not lse.requires_grad


def test_ring_attention_module_trains_inside_a_model():
    torch.manual_seed(0)

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.qkv = torch.nn.Linear(32, 96)
            self.attn = ringattn.nn.RingAttention(attention="dilated", segments=[16, 32],
                                                  dilations=[1, 2], causal=True)

        def forward(self, x):
            q, k, v = self.qkv(x).view(x.shape[0], x.shape[1], 3, 2, 16).unbind(2)
            return self.attn(q.contiguous(), k.contiguous(), v.contiguous()).flatten(2)

    model = Block()
    assert "dilated" in repr(model)
    x = torch.randn(2, 32, 32)
    loss = model(x).square().mean()
    loss.backward()
    assert model.qkv.weight.grad is not None and torch.isfinite(model.qkv.weight.grad).all()


def test_plans_are_cached_by_configuration():
    comm = ringattn.Comm()
    q, k, v, dout = make_inputs((1, 64, 2, 16))
    q.requires_grad_()
    for _ in range(3):
        out = ringattn.attention(q, k, v, causal=True, comm=comm)
        out.backward(dout)
    assert comm.cached_plans() == 1
    ringattn.attention(q, k, v, causal=False, comm=comm)
    assert comm.cached_plans() == 2
    ringattn.attention(q[:, :32].contiguous(), k[:, :32].contiguous(), v[:, :32].contiguous(),
                       causal=True, comm=comm)
    assert comm.cached_plans() == 3


def test_numpy_inputs_give_numpy_outputs():
    q, k, v, _ = (x.numpy() for x in make_inputs((1, 32, 2, 16)))
    out, lse = ringattn.attention(q, k, v, return_lse=True)
    assert isinstance(out, np.ndarray) and isinstance(lse, np.ndarray)
    assert lse.shape == (1, 2, 32)


# --- errors ------------------------------------------------------------------------------

def raises_value_error(message, **kw):
    q, k, v, _ = make_inputs(kw.pop("shape", (1, 64, 4, 16)), kw.pop("kv_heads", None))
    with pytest.raises(ValueError) as e:
        ringattn.attention(q, k, v, **kw)
    assert str(e.value) == message
    return e


def test_bad_options_raise_messages_naming_the_keyword():
    raises_value_error("attention: unknown value 'sparse' (choose one of: dense, dilated, "
                       "block-sparse, auto)", attention="sparse")
    raises_value_error("combine: unknown value 'sum' (choose one of: grouped, mixture)",
                       attention="dilated", segments=[64], dilations=[1], combine="sum")
    raises_value_error('segments: only applies to attention="dilated" (or block-sparse\'s '
                       "dilated-blocks)", segments=[32])
    raises_value_error("window: reaches must be >= 0, got -1", window=-1)
    raises_value_error('block_size: only applies to attention="block-sparse" or "auto"',
                       block_size=64)
    raises_value_error("pattern: block-sparse attention needs a pattern: pattern=TEXT or "
                       "block_mask=ARRAY", attention="block-sparse", block_size=16)


def test_bad_configurations_raise_the_librarys_validation_messages():
    e = raises_value_error_prefix("segments", attention="dilated", segments=[48],
                                  dilations=[1])
    assert "48" in str(e.value)
    raises_value_error_prefix("kv_heads", kv_heads=3)
    raises_value_error_prefix("window", attention="dilated", segments=[64], dilations=[1],
                              window=4)
    raises_value_error_prefix("segments", attention="dilated", segments=[32, 64],
                              dilations=[1])
    raises_value_error_prefix("pattern", attention="block-sparse", block_size=16,
                              pattern="nonsense")


def test_library_messages_name_fields_as_keywords():
    # The library's texts name JobSpec fields in its words (config.shape.heads,
    # config.causal=true, config.attention=dilated, sinks=false); the extension says them as
    # the keywords (python/src/attention_op.cpp, keyword_words).
    raises_value_error("kv_heads: 3 K/V heads cannot be shared by 4 query heads (heads): "
                       "kv_heads must divide heads", kv_heads=3)
    raises_value_error("window: with causal=True a query sees no later key: the right reach "
                       "must be 0 or omitted, got 2", causal=True, window=(4, 2))
    raises_value_error('sinks: attention sinks join one softmax per row, and attention="dilated" '
                       "has one per pattern: use dense or block-sparse attention (attention), or "
                       "sinks=None", attention="dilated", segments=[32, 64], dilations=[1, 2],
                       sinks=torch.zeros(4))


def raises_value_error_prefix(option, **kw):
    q, k, v, _ = make_inputs((1, 64, 4, 16), kw.pop("kv_heads", None))
    with pytest.raises(ValueError) as e:
        ringattn.attention(q, k, v, **kw)
    assert str(e.value).startswith(option + ": "), str(e.value)
    return e


def test_bad_tensors_raise_value_errors_naming_the_argument():
    q, k, v, _ = make_inputs((1, 32, 2, 16))
    with pytest.raises(ValueError, match=r"^q: must be float32"):
        ringattn.attention(q.double(), k, v)
    with pytest.raises(ValueError, match=r"^k: shape \[1, 32, 2, 8\] differs from q's"):
        ringattn.attention(q, k[..., :8].contiguous(), v)
    # v's head dim is its own; its batch, length and heads are k's.
    with pytest.raises(ValueError, match=r"^v: shape \[1, 16, 2, 16\] differs from k's"):
        ringattn.attention(q, k, v[:, :16].contiguous())
    with pytest.raises(ValueError, match=r"^q: must have 4 dimensions"):
        ringattn.attention(q[0], k, v)
    with pytest.raises(ValueError, match=r"^k: expected a torch.Tensor"):
        ringattn.attention(q, k.numpy(), v)
    with pytest.raises(ValueError, match=r"^block_mask: block mask shape \[3, 3\]"):
        ringattn.attention(q, k, v, attention="block-sparse", block_size=16,
                           block_mask=np.ones((3, 3), dtype=bool))


# [B, N, H, D] views of contiguous [B, H, N, D] tensors (PyTorch SDPA's convention) are read
# in place (the engine's bhnd layout): out comes back laid out the same way, and out, lse and
# dq are the same bits as from contiguous copies (dk, dv agree to rounding).
@pytest.mark.parametrize("kw,kv_heads", [
    (dict(causal=True), 2),
    (dict(attention="dilated", segments=[16, 64], dilations=[1, 2], combine="mixture"), None),
    (dict(window=[8, 3]), None),
    (dict(attention="block-sparse", pattern="local:window=32", block_size=16, causal=True,
          window=20), 2),
], ids=["gqa_causal", "mixture", "window", "block_sparse_gqa_window_causal"])
def test_head_major_views_are_read_in_place(kw, kv_heads):
    q, k, v, dout = make_inputs((2, 64, 4, 16), kv_heads, seed=5)
    leaves = [x.transpose(1, 2).contiguous().requires_grad_() for x in (q, k, v)]
    out_h, lse_h = ringattn.attention(*(x.transpose(1, 2) for x in leaves), return_lse=True,
                                      **kw)
    assert out_h.transpose(1, 2).is_contiguous()
    out_h.backward(dout)
    rows = [x.clone().requires_grad_() for x in (q, k, v)]
    out, lse = ringattn.attention(*rows, return_lse=True, **kw)
    out.backward(dout)
    assert torch.equal(out_h, out) and torch.equal(lse_h, lse)
    assert torch.equal(leaves[0].grad.transpose(1, 2), rows[0].grad)
    if kw.get("attention") == "block-sparse":  # only the strides differ: every bit agrees
        for got, ref in zip(leaves[1:], rows[1:]):
            assert torch.equal(got.grad.transpose(1, 2), ref.grad)
    want = reference.forward_backward(q, k, v, dout, **reference_pattern(kw, q.shape))
    got = (out_h, lse_h) + tuple(x.grad.transpose(1, 2) for x in leaves)
    for g, ref in zip(got, want):
        assert reference.relative_error(g, ref) <= TOLERANCE


# Each tensor its own layout: token-major queries beside a head-major KV cache (what a
# transformers model with its default cache hands over), and the reverse. Gradients come back
# laid out as their tensors; results match float64 and the all-contiguous call's.
@pytest.mark.parametrize("kw,kv_heads", [
    (dict(causal=True), 2),
    (dict(attention="dilated", segments=[16, 64], dilations=[1, 2]), None),
    (dict(attention="block-sparse", pattern="local:window=32", block_size=16, causal=True), 2),
], ids=["gqa_causal", "dilated", "block_sparse_gqa_causal"])
@pytest.mark.parametrize("head_major", ["kv", "q"])
def test_q_and_kv_may_each_have_their_own_layout(kw, kv_heads, head_major):
    q, k, v, dout = make_inputs((2, 64, 4, 16), kv_heads, seed=9)
    def view(x, is_head_major):
        return (x.transpose(1, 2).contiguous().transpose(1, 2) if is_head_major
                else x.clone()).requires_grad_()
    mq = view(q, head_major == "q")
    mk, mv = (view(x, head_major == "kv") for x in (k, v))
    out, lse = ringattn.attention(mq, mk, mv, return_lse=True, **kw)
    out.backward(dout)
    assert mq.grad.is_contiguous() == (head_major != "q")
    assert mk.grad.is_contiguous() == (head_major != "kv")
    rows = [x.clone().requires_grad_() for x in (q, k, v)]
    out_c, lse_c = ringattn.attention(*rows, return_lse=True, **kw)
    out_c.backward(dout)
    assert reference.relative_error(out, out_c) <= 1e-6
    want = reference.forward_backward(q, k, v, dout, **reference_pattern(kw, q.shape))
    for g, ref in zip((out, lse, mq.grad, mk.grad, mv.grad), want):
        assert reference.relative_error(g, ref) <= TOLERANCE


# Each tensor in its own strides (FlashAttention's contract, wider): what the engine cannot
# read in place (any other strides, or v laid out unlike k) is copied, said once per reason,
# and the answer and the gradients are the reference's.
@pytest.mark.parametrize("strides", ["q_sliced", "v_unlike_k", "k_head_dim_strided"])
def test_tensors_in_any_strides_are_copied_once_with_a_warning(strides):
    q, k, v, dout = make_inputs((1, 64, 2, 16), seed=5)
    want = reference.forward_backward(q, k, v, dout)
    # A leaf holding the values in other strides, and the [B, N, H, D] view of it passed in.
    if strides == "q_sliced":  # every other row of a 2N-row tensor
        base = torch.zeros(1, 128, 2, 16)
        base[:, ::2] = q
        view = lambda b: b[:, ::2]
    elif strides == "v_unlike_k":  # v head-major, k token-major
        base = v.transpose(1, 2).contiguous()
        view = lambda b: b.transpose(1, 2)
    else:  # k with a strided head dim
        base = k.permute(0, 1, 3, 2).contiguous()
        view = lambda b: b.permute(0, 1, 3, 2)
    slot = {"q_sliced": 0, "v_unlike_k": 2, "k_head_dim_strided": 1}[strides]
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    leaves[slot] = base.requires_grad_()
    args = [view(x) if i == slot else x for i, x in enumerate(leaves)]
    ringattn.functional._COPIES_SAID.clear()
    with pytest.warns(UserWarning, match="copying it"):
        out, lse = ringattn.attention(*args, return_lse=True)
    out.backward(dout)
    grads = [view(x.grad) if i == slot else x.grad for i, x in enumerate(leaves)]
    for got, ref in zip([out, lse] + grads, want):
        assert reference.relative_error(got, ref) <= TOLERANCE
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # said once: the second call is quiet
        ringattn.attention(*(x.detach() for x in args))


def test_packed_sequences_match_reference():
    shape = (1, 64, 2, 16)
    q, k, v, dout = make_inputs(shape, seed=11)
    for x in (q, k, v):
        x.requires_grad_()
    out, lse = ringattn.attention(q, k, v, seqlens=[24, 8, 32], causal=True, return_lse=True)
    out.backward(dout)
    want = reference.forward_backward(q, k, v, dout, causal=True, seqlens=[24, 8, 32])
    for got, ref in zip((out, lse, q.grad, k.grad, v.grad), want):
        assert reference.relative_error(got, ref) <= TOLERANCE


def test_comm_timeout_is_checked_naming_the_keyword():
    with pytest.raises(ValueError, match=r"^timeout: must be a number of seconds"):
        ringattn.Comm(timeout=-1)
    assert ringattn.Comm(timeout=5).timeout == 5


def test_single_process_comm_and_sharding_are_identities():
    comm = ringattn.Comm()
    assert (comm.rank, comm.size) == (0, 1)
    x = torch.randn(1, 8, 2, 4)
    assert ringattn.shard(x, comm, causal=True) is x
    assert ringattn.unshard(x, comm, causal=True) is x


def test_from_torch_needs_an_initialised_group():
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        pytest.skip("this process has a torch.distributed group")
    with pytest.raises(ValueError, match="^group: torch.distributed is not initialised"):
        ringattn.Comm.from_torch(None)


def test_auto_is_dense_or_dilated_below_the_sparse_threshold():
    q, k, v, _ = make_inputs((1, 64, 4, 16), seed=21)
    assert torch.equal(ringattn.attention(q, k, v, attention="auto", causal=True),
                       ringattn.attention(q, k, v, causal=True))
    dilated = dict(segments=[32, 64], dilations=[1, 2])
    assert torch.equal(ringattn.attention(q, k, v, attention="auto", **dilated),
                       ringattn.attention(q, k, v, attention="dilated", **dilated))


def test_inputs_are_left_in_place_and_untouched():
    q, k, v, _ = make_inputs((1, 32, 2, 16), seed=4)
    before = [x.clone() for x in (q, k, v)]
    pointers = [x.data_ptr() for x in (q, k, v)]
    out = ringattn.attention(q, k, v)
    assert [x.data_ptr() for x in (q, k, v)] == pointers
    assert all(torch.equal(a, b) for a, b in zip((q, k, v), before))
    assert out.is_contiguous() and out.dtype == torch.float32


def test_threads_sharing_one_cached_plan_get_the_right_answers():
    import threading

    comm = ringattn.Comm()
    inputs = [make_inputs((1, 128, 2, 32), seed=s)[:3] for s in range(4)]
    results = [None] * 4

    def run(i):
        for _ in range(5):
            results[i] = ringattn.attention(*inputs[i], causal=True, comm=comm)

    def threads(parallel):
        ts = [threading.Thread(target=run, args=(i,)) for i in range(4)]
        for t in ts:
            t.start()
            if not parallel:
                t.join()
        for t in ts:
            t.join()
        return list(results)

    # One thread at a time, then all at once on the same plan: the same bits. (A thread other
    # than the main one was measured to differ from it in the last bits, so like is compared
    # with like.)
    want = threads(parallel=False)
    got = threads(parallel=True)
    assert comm.cached_plans() == 1
    assert all(torch.equal(g, w) for g, w in zip(got, want))


SINK_CASES = [c for c in CASES if c[3].get("attention", "dense") != "dilated"]


def make_sinks(heads, seed):
    """Logits of both signs, with one head without a sink (-inf)."""
    g = torch.Generator().manual_seed(seed)
    sinks = torch.randn(heads, generator=g) * 2
    sinks[heads // 2] = -math.inf
    return sinks


def sink_gradient_error(got, want_dsinks, want_out, want_lse, dout, sinks):
    """The sinks' gradient error per head, relative to the size of the terms it sums
    (sum_rows |e^{sink - lse} D|, D = rowsum(dout * out)): the sum cancels, so its own norm
    says little about the accuracy a float32 engine can reach."""
    d = (dout.double() * want_out).sum(-1).transpose(1, 2)  # [B, H, N]
    terms = torch.exp(sinks.detach().double().view(1, -1, 1) - want_lse) * d
    scale = terms.abs().sum((0, 2)).clamp_min(1e-30)
    return ((got.detach().double() - want_dsinks).abs() / scale).max().item()


@pytest.mark.parametrize("name,shape,kv_heads,kw", SINK_CASES, ids=[c[0] for c in SINK_CASES])
def test_sinks_match_float64_reference_with_their_gradient(name, shape, kv_heads, kw):
    q, k, v, dout = make_inputs(shape, kv_heads, seed=zlib.crc32(name.encode()) % 1000 + 7)
    sinks = make_sinks(shape[2], seed=3)
    for x in (q, k, v, sinks):
        x.requires_grad_()
    out, lse = ringattn.attention(q, k, v, sinks=sinks, return_lse=True, **kw)
    out.backward(dout)
    want = reference.forward_backward(q, k, v, dout, scale=kw.get("scale"), sinks=sinks,
                                      **reference_pattern(kw, shape))
    for label, got, ref in zip(("out", "lse", "dq", "dk", "dv"),
                               (out, lse, q.grad, k.grad, v.grad), want):
        err = reference.relative_error(got, ref)
        assert err <= TOLERANCE, f"{name}: {label} relative error {err:.2e}"
    err = sink_gradient_error(sinks.grad, want[5], want[0], want[1], dout, sinks)
    assert err <= TOLERANCE, f"{name}: dsinks error {err:.2e} of its terms' size"
    assert sinks.grad[shape[2] // 2] == 0, "a head without a sink has no sink gradient"


def test_sinks_on_numpy_inputs_and_attention_backward():
    q, k, v, dout = make_inputs((1, 64, 4, 16), 2, seed=11)
    sinks = make_sinks(4, seed=5)
    out, lse = ringattn.attention(q.numpy(), k.numpy(), v.numpy(), sinks=sinks.numpy(),
                                  causal=True, return_lse=True)
    dq, dk, dv, dsinks = ringattn.attention_backward(
        q.numpy(), k.numpy(), v.numpy(), out, lse, dout.numpy(), sinks=sinks.numpy(), causal=True)
    want = reference.forward_backward(q, k, v, dout, sinks=sinks, causal=True)
    for label, got, ref in zip(("out", "lse", "dq", "dk", "dv", "dsinks"),
                               (out, lse, dq, dk, dv, dsinks), want):
        assert isinstance(got, np.ndarray), label
        assert reference.relative_error(got, ref) <= TOLERANCE, label


def test_sinks_are_refused_by_name_where_they_do_not_apply():
    q, k, v, _ = make_inputs((1, 64, 4, 16))
    with pytest.raises(ValueError, match='sinks: .*attention="dilated"'):
        ringattn.attention(q, k, v, attention="dilated", segments=[32, 64], dilations=[1, 2],
                           sinks=torch.zeros(4))
    with pytest.raises(ValueError, match=r"sinks: must have shape \[4\]"):
        ringattn.attention(q, k, v, sinks=torch.zeros(3))
    with pytest.raises(ValueError, match="sinks: .*NaN"):
        ringattn.attention(q, k, v, sinks=torch.tensor([0.0, math.nan, 0.0, 0.0]))


def test_ring_attention_module_learns_its_sinks():
    q, k, v, dout = make_inputs((1, 64, 4, 16), seed=13)
    attn = ringattn.nn.RingAttention(causal=True, sink_heads=4)
    assert [n for n, _ in attn.named_parameters()] == ["sinks"]
    attn(q, k, v).backward(dout)
    want = reference.forward_backward(q, k, v, dout, sinks=attn.sinks.detach(), causal=True)
    assert reference.relative_error(attn.sinks.grad, want[5]) <= TOLERANCE


# ----- Values of their own head dim and logit soft-capping --------------------------------

# (id, [B, N, H], kv_heads, keywords): patterns the CPU engines compute the cap and the values'
# head dim for, one process.
MLA_PATTERNS = [
    ("causal_gqa", (1, 64, 4), 2, dict(causal=True)),
    ("window_scale", (2, 48, 2), None, dict(window=(6, 9), scale=0.11)),
    ("dilated_grouped", (1, 64, 4), None,
     dict(attention="dilated", segments=[16, 32], dilations=[1, 2], causal=True)),
    ("packed_window_mqa", (1, 80, 3), 1, dict(seqlens=[30, 50], causal=True, window=12)),
    ("block_local", (1, 128, 2), None,
     dict(attention="block-sparse", pattern="local:window=48", block_size=16)),
]
# The head dims of q/k and of v: DeepSeek V3's MLA, and two smaller pairs (one not a power of
# two, as the kernels' tails must carry it).
HEAD_DIMS = [(192, 128), (64, 32), (40, 24)]
SOFTCAPS = [1.0, 30.0, 50.0]


def capped_inputs(shape, kv_heads, d, dv, softcap, seed):
    """q, k [.., D], v [.., Dv], dout [.., Dv], with q and k scaled so that the scaled scores
    reach well past the cap (their spread is about the cap, 4 for c = 1)."""
    b, n, h = shape
    g = torch.Generator().manual_seed(seed)
    amplitude = math.sqrt(max(softcap, 4.0))
    q = torch.randn(b, n, h, d, generator=g) * amplitude
    k = torch.randn(b, n, kv_heads or h, d, generator=g) * amplitude
    v = torch.randn(b, n, kv_heads or h, dv, generator=g)
    dout = torch.randn(b, n, h, dv, generator=g)
    return q, k, v, dout


def mla_cases():
    # Every pattern meets every head-dim pair and every cap, spread so that each pair meets
    # each cap (9 pairs x caps), with the patterns cycling through them.
    cases = []
    for i, (dims, cap) in enumerate((dims, cap) for dims in HEAD_DIMS for cap in SOFTCAPS):
        for j in (i, i + 2):
            name, shape, kv_heads, kw = MLA_PATTERNS[j % len(MLA_PATTERNS)]
            cases.append(pytest.param(name, shape, kv_heads, kw, dims, cap,
                                      id=f"{name}-{dims[0]}x{dims[1]}-c{cap:g}"))
    return cases


@pytest.mark.parametrize("name,shape,kv_heads,kw,dims,softcap", mla_cases())
def test_softcap_and_value_head_dim_match_float64_reference(name, shape, kv_heads, kw, dims,
                                                            softcap):
    d, dv = dims
    q, k, v, dout = capped_inputs(shape, kv_heads, d, dv, softcap,
                                  seed=zlib.crc32(f"{name}{d}{softcap}".encode()) % 1000)
    pattern = reference_pattern(kw, shape + (d,))
    want = reference.forward_backward(q, k, v, dout, scale=kw.get("scale"), softcap=softcap,
                                      **pattern)
    uncapped = reference.forward_backward(q, k, v, dout, scale=kw.get("scale"), **pattern)
    # The cap must change the answer, or this test would not see it dropped.
    for label, a, b in zip(("out", "dq"), (want[0], want[2]), (uncapped[0], uncapped[2])):
        assert reference.relative_error(b, a) > 0.05, f"the cap hardly changes {label}"
    for x in (q, k, v):
        x.requires_grad_()
    out, lse = ringattn.attention(q, k, v, softcap=softcap, return_lse=True, **kw)
    out.backward(dout)
    b, n, h = shape
    assert out.shape == (b, n, h, dv) and lse.shape == (b, h, n)
    assert q.grad.shape == q.shape and k.grad.shape == k.shape and v.grad.shape == v.shape
    for label, got, ref in zip(("out", "lse", "dq", "dk", "dv"),
                               (out, lse, q.grad, k.grad, v.grad), want):
        err = reference.relative_error(got, ref)
        assert err <= TOLERANCE, f"{name}: {label} relative error {err:.2e}"


def test_softcap_with_sinks_caps_the_scores_and_not_the_sinks():
    q, k, v, dout = capped_inputs((1, 64, 4), 2, 40, 24, 30.0, seed=21)
    sinks = torch.tensor([20.0, -3.0, float("-inf"), 45.0])  # 45: past the cap, kept
    for x in (q, k, v, sinks):
        x.requires_grad_()
    out, lse = ringattn.attention(q, k, v, causal=True, sinks=sinks, softcap=30.0,
                                  return_lse=True)
    out.backward(dout)
    want = reference.forward_backward(q, k, v, dout, sinks=sinks, softcap=30.0, causal=True)
    for label, got, ref in zip(("out", "lse", "dq", "dk", "dv"),
                               (out, lse, q.grad, k.grad, v.grad), want):
        err = reference.relative_error(got, ref)
        assert err <= TOLERANCE, f"{label} relative error {err:.2e}"
    err = sink_gradient_error(sinks.grad, want[5], want[0], want[1], dout, sinks)
    assert err <= TOLERANCE, f"dsinks error {err:.2e} of its terms' size"


def test_softcap_and_value_head_dim_on_numpy_head_major_and_attention_backward():
    """numpy in, numpy out (attention_backward takes softcap again), and head-major views read
    in place, all with v of its own head dim."""
    q, k, v, dout = capped_inputs((1, 64, 4), 2, 64, 32, 30.0, seed=22)
    out, lse = ringattn.attention(q.numpy(), k.numpy(), v.numpy(), causal=True, softcap=30.0,
                                  return_lse=True)
    grads = ringattn.attention_backward(q.numpy(), k.numpy(), v.numpy(), out, lse, dout.numpy(),
                                        causal=True, softcap=30.0)
    want = reference.forward_backward(q, k, v, dout, softcap=30.0, causal=True)
    assert out.shape == (1, 64, 4, 32) and grads[2].shape == (1, 64, 2, 32)
    for label, got, ref in zip(("out", "lse", "dq", "dk", "dv"), (out, lse) + grads, want):
        assert isinstance(got, np.ndarray), label
        assert reference.relative_error(got, ref) <= TOLERANCE, label
    views = [x.transpose(1, 2).contiguous().transpose(1, 2).requires_grad_() for x in (q, k, v)]
    out = ringattn.attention(*views, causal=True, softcap=30.0)
    out.backward(dout)
    assert out.transpose(1, 2).is_contiguous(), "out comes back head-major, as q"
    for label, got, ref in zip(("out", "dq", "dk", "dv"),
                               [out] + [x.grad for x in views], want[:1] + want[2:]):
        assert reference.relative_error(got, ref) <= TOLERANCE, label


def test_ring_attention_module_takes_softcap():
    q, k, v, dout = capped_inputs((1, 64, 4), None, 40, 24, 1.0, seed=23)
    attn = ringattn.nn.RingAttention(causal=True, softcap=1.0)
    assert "softcap=1.0" in repr(attn)
    v.requires_grad_()
    attn(q, k, v).backward(dout)
    want = reference.forward_backward(q, k, v, dout, softcap=1.0, causal=True)
    assert reference.relative_error(v.grad, want[4]) <= TOLERANCE


@pytest.mark.parametrize("bad", [-1.0, math.nan, math.inf, -math.inf])
def test_a_bad_softcap_is_refused_naming_the_keyword(bad):
    q, k, v, dout = make_inputs((1, 32, 2, 16))
    with pytest.raises(ValueError, match=r"^softcap: must be a finite number >= 0"):
        ringattn.attention(q, k, v, softcap=bad)
    with pytest.raises(ValueError, match=r"^softcap: must be a finite number >= 0"):
        ringattn.attention(q.numpy(), k.numpy(), v.numpy(), softcap=bad)
    out, lse = ringattn.attention(q.numpy(), k.numpy(), v.numpy(), return_lse=True)
    with pytest.raises(ValueError, match=r"^softcap: must be a finite number >= 0"):
        ringattn.attention_backward(q.numpy(), k.numpy(), v.numpy(), out, lse, dout.numpy(),
                                    softcap=bad)


def test_softcap_must_be_a_number_and_zero_or_none_is_no_cap():
    q, k, v, _ = make_inputs((1, 32, 2, 16))
    with pytest.raises(TypeError, match=r"^softcap: expected a number"):
        ringattn.attention(q, k, v, softcap="30")
    with pytest.raises(TypeError, match=r"^softcap: expected a number"):
        ringattn.attention(q, k, v, softcap=True)
    plain = ringattn.attention(q, k, v)
    assert torch.equal(ringattn.attention(q, k, v, softcap=0), plain)
    assert torch.equal(ringattn.attention(q, k, v, softcap=None), plain)


def test_value_head_dim_mismatches_are_said_clearly():
    q, k, v, dout = capped_inputs((1, 32, 2), None, 24, 8, 1.0, seed=24)
    out, lse = ringattn.attention(q.numpy(), k.numpy(), v.numpy(), return_lse=True)
    # grad_out must have v's head dim, as out has.
    with pytest.raises(ValueError, match=r"^grad_output: shape \[1, 32, 2, 24\] does not match "
                                         r"the expected \[1, 32, 2, 8\]"):
        ringattn.attention_backward(q.numpy(), k.numpy(), v.numpy(), out, lse,
                                    np.zeros((1, 32, 2, 24), np.float32))
    with pytest.raises(ValueError, match=r"^v: shape \[1, 32, 1, 8\] differs from k's"):
        ringattn.attention(q, k, v[:, :, :1].contiguous())
