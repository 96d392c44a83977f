"""Run under `mpiexec -n P python -m pytest python/tests/test_distributed.py` (P = 2, 3):
each rank passes its shard (ringattn.shard) through Comm.from_mpi() and must get its rows of
the single-process answer, forward and gradients. Skipped without an MPI launcher."""
import os

import pytest
import torch

import ringattn
import reference

LAUNCHED = any(v in os.environ for v in ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"))
pytestmark = pytest.mark.skipif(not LAUNCHED, reason="needs an MPI launcher (mpiexec -n P)")
TOLERANCE = 1e-5


@pytest.fixture(scope="module")
def comm():
    return ringattn.Comm.from_mpi(timeout=60)


# N = 96 splits over 2 and 3 ranks, zigzag too (N % 2P == 0), and in whole 16-token blocks.
CASES = [
    ("dense", None, {}),
    ("causal", None, dict(causal=True)),
    ("grouped", None, dict(attention="dilated", segments=[24, 48, 96], dilations=[1, 2, 4])),
    ("mixture_causal", None, dict(attention="dilated", segments=[32, 96], dilations=[1, 2],
                                  combine="mixture", causal=True)),
    ("gqa_causal", 2, dict(causal=True)),
    ("window", None, dict(window=10)),
    ("block_local_causal", None, dict(attention="block-sparse", pattern="local:window=48",
                                      block_size=16, causal=True)),
    # Packed documents of mixed lengths (where the core has --seqlens; the core may then lay
    # the sequence out by work, which shard() must follow).
    ("packed_causal", None, dict(seqlens=[40, 8, 48], causal=True)),
]


@pytest.mark.parametrize("name,kv_heads,kw", CASES, ids=[c[0] for c in CASES])
def test_sharded_results_equal_single_process(comm, name, kv_heads, kw):
    g = torch.Generator().manual_seed(len(name))  # the same full tensors on every rank
    shape = (2, 96, 4, 16)
    q = torch.randn(*shape, generator=g)
    k = torch.randn(2, 96, kv_heads or 4, 16, generator=g)
    v = torch.randn(2, 96, kv_heads or 4, 16, generator=g)
    dout = torch.randn(*shape, generator=g)

    # Single process (this rank alone) on the full tensors.
    full = [x.clone().requires_grad_() for x in (q, k, v)]
    out_full, lse_full = ringattn.attention(*full, return_lse=True, **kw)
    out_full.backward(dout)

    # The layout of the plan for these keywords (heads: q's, also for k/v under GQA).
    part = lambda x: ringattn.shard(x, comm, heads=4, **kw)
    local = [part(x).requires_grad_() for x in (q, k, v)]
    out, lse = ringattn.attention(*local, return_lse=True, comm=comm, **kw)
    out.backward(part(dout))

    assert out.shape[1] == 96 // comm.size
    for label, got, want in (("out", out, part(out_full)),
                             ("lse", lse, part(lse_full.transpose(1, 2)).transpose(1, 2)),
                             ("dq", local[0].grad, part(full[0].grad)),
                             ("dk", local[1].grad, part(full[1].grad)),
                             ("dv", local[2].grad, part(full[2].grad))):
        err = reference.relative_error(got, want)
        assert err <= TOLERANCE, f"rank {comm.rank}: {name}: {label} relative error {err:.2e}"
    gathered = ringattn.unshard(out.detach(), comm, **kw)
    assert reference.relative_error(gathered, out_full.detach()) <= TOLERANCE


# Ulysses x ring with the whole world as one all-to-all group (U = P; 6 heads split over 2 or
# 3 ranks): the same rows of the single-process answer, forward and gradients; the K/V head
# of an MQA job goes to every rank and its dK/dV come back summed.
@pytest.mark.parametrize("kv_heads,kw", [(None, dict(causal=True)),
                                         (1, dict(causal=True, window=(20, 0)))],
                         ids=["causal", "mqa_window"])
def test_ulysses_equals_single_process(comm, kv_heads, kw):
    g = torch.Generator().manual_seed(7)
    q = torch.randn(2, 96, 6, 16, generator=g)
    k = torch.randn(2, 96, kv_heads or 6, 16, generator=g)
    v = torch.randn(2, 96, kv_heads or 6, 16, generator=g)
    dout = torch.randn(2, 96, 6, 16, generator=g)
    full = [x.clone().requires_grad_() for x in (q, k, v)]
    out_full = ringattn.attention(*full, **kw)
    out_full.backward(dout)

    kw = dict(kw, ulysses=comm.size)
    part = lambda x: ringattn.shard(x, comm, heads=6, **kw)
    local = [part(x).requires_grad_() for x in (q, k, v)]
    out = ringattn.attention(*local, comm=comm, **kw)
    out.backward(part(dout))
    for label, got, want in (("out", out, part(out_full)),
                             ("dq", local[0].grad, part(full[0].grad)),
                             ("dk", local[1].grad, part(full[1].grad)),
                             ("dv", local[2].grad, part(full[2].grad))):
        err = ((got - want).norm() / want.norm()).item()
        assert err < TOLERANCE, f"{label}: relative error {err:.2e}"


# Attention sinks over ranks: the ring, block-sparse and Ulysses (U = P, 6 heads, the sinks
# sliced with them inside the engine) give the single-process rows, and the ranks' sinks
# gradients (each through its own rows) sum to the single-process one, as for any parameter
# every rank holds.
@pytest.mark.parametrize("kw", [dict(causal=True), dict(causal=True, ulysses="P"),
                                dict(attention="block-sparse", pattern="local:window=48",
                                     block_size=16, causal=True)],
                         ids=["ring", "ulysses", "block_sparse"])
def test_sinks_over_ranks_equal_single_process(comm, kw):
    if kw.get("ulysses") == "P":
        kw = dict(kw, ulysses=comm.size)
    g = torch.Generator().manual_seed(17)
    q, k, v, dout = (torch.randn(2, 96, 6, 16, generator=g) for _ in range(4))
    sinks = torch.tensor([1.0, -2.0, float("-inf"), 0.5, 3.0, -0.25])
    full = [x.clone().requires_grad_() for x in (q, k, v, sinks)]
    single = {key: val for key, val in kw.items() if key != "ulysses"}
    ringattn.attention(*full[:3], sinks=full[3], **single).backward(dout)
    part = lambda x: ringattn.shard(x, comm, heads=6, **kw)
    local = [part(x).requires_grad_() for x in (q, k, v)] + [sinks.clone().requires_grad_()]
    out = ringattn.attention(*local[:3], sinks=local[3], comm=comm, **kw)
    out.backward(part(dout))
    for label, got, want in (("dq", local[0].grad, part(full[0].grad)),
                             ("dk", local[1].grad, part(full[1].grad)),
                             ("dv", local[2].grad, part(full[2].grad)),
                             ("dsinks", ringattn.all_reduce_sum(local[3].grad, comm),
                              full[3].grad)):
        err = reference.relative_error(got, want)
        assert err <= TOLERANCE, f"rank {comm.rank}: {label} relative error {err:.2e}"


def test_shard_then_unshard_is_the_identity_in_every_layout(comm):
    x = torch.arange(2 * 96 * 3, dtype=torch.float32).view(2, 96, 3)
    for causal in (False, True):
        local = ringattn.shard(x, comm, causal=causal)
        assert local.shape == (2, 96 // comm.size, 3)
        assert torch.equal(ringattn.unshard(local, comm, causal=causal), x)
    # zigzag: rank r holds chunks r and 2P-1-r
    c = 96 // (2 * comm.size)
    local = ringattn.shard(x, comm, causal=True)
    r, p = comm.rank, comm.size
    assert torch.equal(local[:, :c], x[:, r * c:(r + 1) * c])
    assert torch.equal(local[:, c:], x[:, (2 * p - 1 - r) * c:(2 * p - r) * c])


# Each rank's [B, N/P, H, D] view of a contiguous [B, H, N/P, D] shard is read in place, by
# the ring and by block-sparse, and gives what the contiguous shard gives: the same bits for
# block-sparse; out, lse and dq bits for the ring, whose dk and dv agree to rounding (its
# local step sums a contiguous head's pairs in place, a strided one's in scratch).
@pytest.mark.parametrize("kw", [
    dict(causal=True),
    dict(attention="dilated", segments=[32, 96], dilations=[1, 2], combine="mixture"),
    dict(attention="block-sparse", pattern="local:window=48", block_size=16, causal=True),
], ids=["causal", "mixture", "block_sparse"])
def test_head_major_views_on_several_ranks(comm, kw):
    g = torch.Generator().manual_seed(3)
    q, k, v, dout = (torch.randn(2, 96, h, 16, generator=g) for h in (4, 2, 2, 4))
    part = lambda x: ringattn.shard(x, comm, heads=4, **kw)
    rows = [part(x).requires_grad_() for x in (q, k, v)]
    out, lse = ringattn.attention(*rows, return_lse=True, comm=comm, **kw)
    out.backward(part(dout))
    leaves = [part(x).transpose(1, 2).contiguous().requires_grad_() for x in (q, k, v)]
    out_h, lse_h = ringattn.attention(*(x.transpose(1, 2) for x in leaves), return_lse=True,
                                      comm=comm, **kw)
    assert out_h.transpose(1, 2).is_contiguous()
    out_h.backward(part(dout))
    assert torch.equal(out_h, out) and torch.equal(lse_h, lse)
    assert torch.equal(leaves[0].grad.transpose(1, 2), rows[0].grad)
    for got, want in zip(leaves[1:], rows[1:]):
        if kw.get("attention") == "block-sparse":
            assert torch.equal(got.grad.transpose(1, 2), want.grad)
        else:
            assert reference.relative_error(got.grad.transpose(1, 2), want.grad) <= 1e-6


# A head-major KV cache beside token-major queries on every rank: the ring packs K/V rows
# from their own layout and returns dK/dV partials into it.
@pytest.mark.parametrize("kw", [
    dict(causal=True),
    dict(attention="block-sparse", pattern="local:window=48", block_size=16, causal=True),
], ids=["causal", "block_sparse"])
def test_token_major_queries_with_head_major_kv_on_several_ranks(comm, kw):
    g = torch.Generator().manual_seed(4)
    q, k, v, dout = (torch.randn(2, 96, h, 16, generator=g) for h in (4, 2, 2, 4))
    part = lambda x: ringattn.shard(x, comm, heads=4, **kw)
    rows = [part(x).requires_grad_() for x in (q, k, v)]
    out, lse = ringattn.attention(*rows, return_lse=True, comm=comm, **kw)
    out.backward(part(dout))
    mq = part(q).requires_grad_()
    mk, mv = (part(x).transpose(1, 2).contiguous().requires_grad_() for x in (k, v))
    out_m, lse_m = ringattn.attention(mq, mk.transpose(1, 2), mv.transpose(1, 2),
                                      return_lse=True, comm=comm, **kw)
    out_m.backward(part(dout))
    assert reference.relative_error(out_m, out) <= 1e-6
    assert reference.relative_error(lse_m, lse) <= 1e-6
    assert reference.relative_error(mq.grad, rows[0].grad) <= 1e-6
    for got, want in zip((mk, mv), rows[1:]):
        assert reference.relative_error(got.grad.transpose(1, 2), want.grad) <= 1e-6


def test_all_reduce_sum(comm):
    x = torch.full((3,), float(comm.rank + 1))
    total = ringattn.all_reduce_sum(x, comm)
    assert torch.equal(total, torch.full((3,), float(comm.size * (comm.size + 1) // 2)))


def test_a_bad_option_on_one_rank_raises_on_every_rank(comm):
    q = torch.randn(1, 32, 2, 16)
    # Only the last rank asks for segments that do not divide N: every rank must raise the
    # same ValueError (no rank may be left waiting in the ring).
    segments = [7 * 32] if comm.rank == comm.size - 1 else [32 * comm.size]
    with pytest.raises(ValueError) as e:
        ringattn.attention(q, q, q, attention="dilated", segments=segments, dilations=[1],
                           comm=comm)
    assert str(e.value).startswith(f"rank {comm.size - 1}: segments: ")


def test_ranks_and_size(comm):
    assert comm.size == int(os.environ.get("OMPI_COMM_WORLD_SIZE", comm.size))
    assert 0 <= comm.rank < comm.size


# Values of their own head dim (40 against 24) and a soft-cap of 30 on scores that reach past
# it, over ranks: the ring (causal GQA, a window), block-sparse and Ulysses (U = P, 6 heads),
# each rank's rows against the float64 reference, forward and gradients.
MLA_CASES = [
    ("ring_causal_gqa", 2, dict(causal=True)),
    ("ring_window", None, dict(window=(10, 3))),
    ("block_local_causal", None, dict(attention="block-sparse", pattern="local:window=48",
                                      block_size=16, causal=True)),
    ("ulysses_causal", None, dict(causal=True, ulysses="world")),
]


@pytest.mark.parametrize("name,kv_heads,kw", MLA_CASES, ids=[c[0] for c in MLA_CASES])
def test_softcap_and_value_head_dim_over_ranks_match_float64(comm, name, kv_heads, kw):
    if kw.get("ulysses") == "world":
        kw = dict(kw, ulysses=comm.size)
    g = torch.Generator().manual_seed(11)
    heads, softcap = 6, 30.0
    q = torch.randn(2, 96, heads, 40, generator=g) * 5.5  # scaled scores of about the cap
    k = torch.randn(2, 96, kv_heads or heads, 40, generator=g) * 5.5
    v = torch.randn(2, 96, kv_heads or heads, 24, generator=g)
    dout = torch.randn(2, 96, heads, 24, generator=g)
    pattern = {key: value for key, value in kw.items() if key not in ("pattern", "ulysses")}
    if kw.get("attention") == "block-sparse":
        blocks = torch.arange(96 // 16)
        pattern["block_mask"] = (blocks[:, None] - blocks[None, :]).abs() <= 1  # 48 tokens
    want = reference.forward_backward(q, k, v, dout, softcap=softcap, **pattern)

    part = lambda x: ringattn.shard(x, comm, heads=heads, **kw)
    local = [part(x).requires_grad_() for x in (q, k, v)]
    out, lse = ringattn.attention(*local, softcap=softcap, return_lse=True, comm=comm, **kw)
    out.backward(part(dout))
    assert out.shape == (2, 96 // comm.size, heads, 24)
    for label, got, ref in (("out", out, part(want[0])),
                            ("lse", lse, part(want[1].transpose(1, 2)).transpose(1, 2)),
                            ("dq", local[0].grad, part(want[2])),
                            ("dk", local[1].grad, part(want[3])),
                            ("dv", local[2].grad, part(want[4]))):
        err = reference.relative_error(got, ref)
        assert err <= TOLERANCE, f"rank {comm.rank}: {name}: {label} relative error {err:.2e}"
