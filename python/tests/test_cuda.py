"""ringattn on CUDA tensors (a lent GPU; skipped, with the reason, elsewhere): forward and
gradients against the float64 reference in bf16, fp16 and fp32 (dense causal GQA, sliding
window, dilated), results in the inputs' dtype and on their device; the caller's stream
(pending work writing q, k, v on a side stream is waited for); nn.RingAttention with
autograd; torch.compile(fullgraph=True) on the GPU; head-major inputs copied with a warning.
The emulated-GPU test of the same path is test_device_arrays.py."""
import pytest
import torch

import ringattn
import reference
from ringattn import _ops

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available() or not ringattn._core.has_cuda,
    reason="needs a CUDA device and a CUDA build of ringattn (torch.cuda.is_available(): "
           f"{torch.cuda.is_available()}, ringattn built with CUDA: {ringattn._core.has_cuda})")

TOLERANCE = {torch.float32: 2e-5, torch.bfloat16: 2e-2, torch.float16: 5e-3}
CASES = [
    ("causal_gqa", 2, dict(causal=True)),
    ("window", None, dict(window=(32, 8))),
    ("dilated", None, dict(attention="dilated", segments=[64, 128], dilations=[1, 2])),
]


def inputs(dtype, kv_heads=None, shape=(2, 128, 4, 64), seed=0):
    g = torch.Generator().manual_seed(seed)
    b, n, h, d = shape
    host = [torch.randn(b, n, h, d, generator=g), torch.randn(b, n, kv_heads or h, d, generator=g),
            torch.randn(b, n, kv_heads or h, d, generator=g), torch.randn(b, n, h, d, generator=g)]
    # What the device holds (its dtype's values), as the reference's inputs.
    return [x.to(dtype).float() for x in host]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32],
                         ids=["bf16", "fp16", "fp32"])
@pytest.mark.parametrize("name,kv_heads,kw", CASES, ids=[c[0] for c in CASES])
def test_cuda_tensors_match_the_float64_reference(dtype, name, kv_heads, kw):
    q, k, v, dout = inputs(dtype, kv_heads)
    want = reference.forward_backward(q, k, v, dout, **kw)
    dev = [x.to("cuda", dtype).requires_grad_() for x in (q, k, v)]
    out, lse = ringattn.attention(*dev, return_lse=True, **kw)
    assert out.device == dev[0].device and out.dtype == dtype
    out.backward(dout.to("cuda", dtype))
    assert all(x.grad.dtype == dtype for x in dev)
    for label, got, ref in zip(("out", "lse", "dq", "dk", "dv"),
                               (out, lse, dev[0].grad, dev[1].grad, dev[2].grad), want):
        err = reference.relative_error(got.detach().float().cpu(), ref)
        assert err <= TOLERANCE[dtype], f"{label}: {err:.2e}"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_softcap_and_a_value_head_dim_on_cuda_tensors_match_the_float64_reference(dtype):
    """One GPU's native kernels compute both (no GPU had run them when this was written: the
    emulated GPU's test is test_device_arrays.py): v of 32 columns beside q and k of 64, and
    scores capped at 30 (scaled so that the cap changes the answer)."""
    q, k, v, dout = inputs(dtype, 2)
    v, dout = v[..., :32].contiguous(), dout[..., :32].contiguous()
    kw = dict(causal=True, softcap=30.0, scale=30.0 / 8)
    want = reference.forward_backward(q, k, v, dout, **kw)
    dev = [x.to("cuda", dtype).requires_grad_() for x in (q, k, v)]
    out, lse = ringattn.attention(*dev, return_lse=True, **kw)
    assert out.shape[-1] == 32
    out.backward(dout.to("cuda", dtype))
    for label, got, ref in zip(("out", "lse", "dq", "dk", "dv"),
                               (out, lse, dev[0].grad, dev[1].grad, dev[2].grad), want):
        err = reference.relative_error(got.detach().float().cpu(), ref)
        assert err <= TOLERANCE[dtype], f"{label}: {err:.2e}"


def test_pending_writes_on_the_callers_stream_are_waited_for():
    q, k, v, _ = inputs(torch.bfloat16, seed=3)
    want = ringattn.attention(*(x.cuda().bfloat16() for x in (q, k, v)), causal=True)
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        dq, dk, dv = (torch.zeros_like(x, device="cuda", dtype=torch.bfloat16) for x in (q, k, v))
        torch.cuda._sleep(50_000_000)  # the writes below land long after the call is queued
        for d, x in ((dq, q), (dk, k), (dv, v)):
            d.copy_(x.cuda().bfloat16())
        got = ringattn.attention(dq, dk, dv, causal=True)  # queued on `side`, no host sync
    side.synchronize()
    assert torch.equal(got, want)


def test_ring_attention_module_trains_on_the_gpu():
    torch.manual_seed(0)
    proj = torch.nn.Linear(64, 3 * 64).cuda().bfloat16()
    attn = ringattn.nn.RingAttention(causal=True)
    x = torch.randn(2, 128, 64, device="cuda", dtype=torch.bfloat16)
    q, k, v = proj(x).view(2, 128, 3, 4, 16).unbind(2)
    attn(q, k, v).float().square().mean().backward()
    assert proj.weight.grad is not None and torch.isfinite(proj.weight.grad).all()


@pytest.mark.skipif(not _ops.AVAILABLE, reason="torch.compile of the custom op needs torch 2.4+")
def test_compiled_attention_on_the_gpu_matches_eager():
    q, k, v, _ = (x.cuda().bfloat16() for x in inputs(torch.bfloat16, kv_heads=2, seed=4))
    f = lambda q, k, v: ringattn.attention(q, k, v, causal=True).float().square().sum()
    torch._dynamo.reset()
    assert torch.allclose(torch.compile(f, fullgraph=True)(q, k, v), f(q, k, v), rtol=1e-3)


def test_head_major_cuda_inputs_are_copied_with_a_warning():
    q, k, v, _ = (x.cuda() for x in inputs(torch.float32, seed=6))
    hm = [x.transpose(1, 2).contiguous().transpose(1, 2) for x in (q, k, v)]
    ringattn.functional._COPIES_SAID.clear()
    with pytest.warns(UserWarning, match="the GPU engines read"):
        got = ringattn.attention(*hm, causal=True)
    assert torch.allclose(got, ringattn.attention(q, k, v, causal=True), atol=1e-6)


def test_train_tiny_on_the_gpu_follows_the_cpu_loss_curve(tmp_path):
    import pathlib
    import subprocess
    import sys
    example = pathlib.Path(__file__).resolve().parents[2] / "examples" / "train_tiny.py"
    cpu = tmp_path / "cpu.json"
    subprocess.run([sys.executable, str(example), "--losses-out", str(cpu)], check=True)
    for dtype, tolerance in (("fp32", "1e-3"), ("bf16", "3e-2")):
        subprocess.run([sys.executable, str(example), "--device", "cuda", "--dtype", dtype,
                        "--compare", str(cpu), "--tolerance", tolerance], check=True)


def test_sinks_on_cuda_tensors_match_the_float64_reference():
    q, k, v, dout = inputs(torch.bfloat16, 2)
    sinks = torch.tensor([1.0, -0.5, float("-inf"), 2.0])
    want = reference.forward_backward(q, k, v, dout, sinks=sinks, causal=True)
    dev = [x.to("cuda", torch.bfloat16).requires_grad_() for x in (q, k, v)]
    s = sinks.to("cuda").requires_grad_()
    out, lse = ringattn.attention(*dev, sinks=s, causal=True, return_lse=True)
    out.backward(dout.to("cuda", torch.bfloat16))
    for label, got, ref in zip(("out", "lse", "dq", "dk", "dv", "dsinks"),
                               (out, lse, dev[0].grad, dev[1].grad, dev[2].grad, s.grad), want):
        assert got.is_cuda, label
        assert reference.relative_error(got.float().cpu(), ref) <= 2e-2, label


# transformers models in bf16 on the GPU through the integration: the bf16 kernels (no float32
# copy), against the model's eager attention in the same precision.
@pytest.mark.parametrize("family", ["llama", "gpt_oss"])
def test_bf16_transformers_models_on_the_gpu_match_eager(family):
    transformers = pytest.importorskip("transformers", reason="transformers is not installed")
    import ringattn.integrations.transformers  # noqa: F401  registers "ringattn"
    small = dict(vocab_size=128, hidden_size=256, intermediate_size=256, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                 max_position_embeddings=512)
    if family == "llama":
        cls, config = transformers.LlamaForCausalLM, transformers.LlamaConfig(**small)
    else:
        cls = transformers.GptOssForCausalLM
        config = transformers.GptOssConfig(num_local_experts=2, num_experts_per_tok=1,
                                           sliding_window=64, **small)
    ids = torch.randint(0, 128, (2, 256), generator=torch.Generator().manual_seed(2)).cuda()
    got = {}
    for impl in ("eager", "ringattn"):
        torch.manual_seed(1)
        model = cls._from_config(config, attn_implementation=impl).cuda().to(torch.bfloat16)
        out = model(ids, labels=ids)
        out.loss.backward()
        got[impl] = out.logits.float(), {n: p.grad.float() for n, p in model.named_parameters()}
    (want_logits, want_grads), (logits, grads) = got["eager"], got["ringattn"]
    assert ((logits - want_logits).norm() / want_logits.norm()).item() < 3e-2
    for n, g in want_grads.items():
        assert ((grads[n] - g).norm() / g.norm().clamp_min(1e-12)).item() < 0.1, n
