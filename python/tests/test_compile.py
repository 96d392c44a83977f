"""torch.library registration and torch.compile (torch 2.4+; skipped, with the reason, on
older torch such as Debian's 1.13, whose autograd.Function path the other tests cover).

torch.ops.ringattn.attention passes torch.library.opcheck (schema, fake implementation,
registered autograd), and torch.compile(fullgraph=True) of a model using
ringattn.nn.RingAttention traces without a graph break and gives eager's outputs and
gradients, token-major and head-major, also with values of their own head dim and a soft-cap
(the fake output has v's head dim)."""
import pytest
import torch

import ringattn
from ringattn import _ops

pytestmark = pytest.mark.skipif(
    not _ops.AVAILABLE,
    reason=f"torch {torch.__version__} has no torch.library.custom_op (2.4+): the "
           "autograd.Function path serves it")


def test_the_op_passes_opcheck():
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 64, 4, 16, generator=g, requires_grad=True) for _ in range(3))
    options = ringattn.functional._options("dense", None, None, "grouped", True, None, None,
                                           None, None, 128)
    spec = _ops.encode(options, "bnhd", "bnhd", 0)
    torch.library.opcheck(torch.ops.ringattn.attention.default, (q, k, v, None, None, spec))
    # With attention sinks (a differentiable input of their own).
    sinks = torch.tensor([0.5, -1.0, 2.0, float("-inf")], requires_grad=True)
    spec = _ops.encode(dict(options, sinks=True), "bnhd", "bnhd", 0)
    torch.library.opcheck(torch.ops.ringattn.attention.default, (q, k, v, None, sinks, spec))
    # v of its own head dim (the fake output has it) and soft-capped scores.
    v8 = torch.randn(1, 64, 4, 8, generator=g, requires_grad=True)
    spec = _ops.encode(dict(options, head_dim_v=8, softcap=2.0), "bnhd", "bnhd", 0)
    torch.library.opcheck(torch.ops.ringattn.attention.default, (q, k, v8, None, None, spec))


class Block(torch.nn.Module):
    """Projections, causal GQA ring attention, output projection: what a decoder layer's
    attention does, with q, k, v token-major or as head-major views."""

    def __init__(self, heads=4, kv_heads=2, head_dim=16, head_major=False, head_dim_v=None,
                 softcap=None):
        super().__init__()
        self.h, self.hkv, self.d, self.head_major = heads, kv_heads, head_dim, head_major
        self.dv = head_dim_v or head_dim
        width = heads * head_dim
        self.q = torch.nn.Linear(width, width)
        self.k = torch.nn.Linear(width, kv_heads * head_dim)
        self.v = torch.nn.Linear(width, kv_heads * self.dv)
        self.o = torch.nn.Linear(heads * self.dv, width)
        self.attn = ringattn.nn.RingAttention(causal=True, sink_heads=heads, softcap=softcap)

    def forward(self, x):
        b, n, _ = x.shape
        q = self.q(x).view(b, n, self.h, self.d)
        k = self.k(x).view(b, n, self.hkv, self.d)
        v = self.v(x).view(b, n, self.hkv, self.dv)
        if self.head_major:  # [B, H, N, D] tensors, handed over as transpose(1, 2) views
            q, k, v = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in (q, k, v))
        return self.o(self.attn(q, k, v).reshape(b, n, -1))


@pytest.mark.parametrize("head_major", [False, True], ids=["bnhd", "bhnd"])
@pytest.mark.parametrize("mla", [False, True], ids=["plain", "mla_softcap"])
def test_compiled_model_has_no_graph_break_and_matches_eager(head_major, mla):
    """mla_softcap: values of another head dim (24 against 16) and a soft-cap of 2."""
    torch.manual_seed(0)
    model = Block(head_major=head_major, **(dict(head_dim_v=24, softcap=2.0) if mla else {}))
    x = torch.randn(2, 64, 64)
    eager = model(x)
    eager.square().mean().backward()
    want = {name: p.grad.clone() for name, p in model.named_parameters()}
    model.zero_grad()
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True)  # a graph break raises here
    got = compiled(x)
    got.square().mean().backward()
    assert torch.allclose(got, eager, rtol=1e-5, atol=1e-6)
    for name, p in model.named_parameters():
        assert torch.allclose(p.grad, want[name], rtol=1e-4, atol=1e-6), name
