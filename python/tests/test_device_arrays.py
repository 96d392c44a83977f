"""The device path of the extension (DLPack tensors on a CUDA device, the GPU engines, the
caller's stream) with device arrays the extension makes itself (_testing_device_array): under
the emulated GPU in CI (scripts/test.sh points RINGATTN_EMU_CORE at build-emu's _core), and
on a lent GPU. Against the same problem on the CPU engine, forward and gradients, in bf16,
fp16 and fp32. Skipped, with the reason, where no such extension is at hand."""
import importlib
import os
import sys

import numpy as np
import pytest

core_dir = os.environ.get("RINGATTN_EMU_CORE")
if core_dir:
    sys.path.insert(0, core_dir)
_core = importlib.import_module("_core") if core_dir else None
pytestmark = pytest.mark.skipif(
    _core is None or not _core.has_cuda,
    reason="needs an extension with CUDA kernels and a device (RINGATTN_EMU_CORE=<dir of "
           "build-emu's _core>; scripts/test.sh sets it for the emulated GPU)")

SHAPE = (2, 64, 4, 64)  # B, N, H, D
KV_HEADS = 2
TOLERANCE = {"fp32": 2e-5, "bf16": 2e-2, "fp16": 5e-3}
OPTIONS = dict(attention="dense", segments=None, dilations=None, combine="grouped",
               causal=True, scale=None, window=None, seqlens=None, pattern=None, block_mask=None,
               block_size=128, ulysses=1, deterministic=False)


def rounded(x, dtype):
    """x as the device holds it: bf16 or fp16 values, float32 storage."""
    if dtype == "fp16":
        return x.astype(np.float16).astype(np.float32)
    if dtype == "bf16":
        bits = x.astype(np.float32).view(np.uint32)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000  # round to nearest even
        return bits.astype(np.uint32).view(np.float32)
    return x.astype(np.float32)


def relative(a, b):
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def expect_device_arrays_match_the_cpu_engine(q, k, v, dout, dtype, **keywords):
    """Forward and backward of one problem on the CPU engine (host arrays) and on the GPU
    engine (the same values as device arrays of `dtype`): out, dq, dk and dv within the dtype's
    tolerance, lse within `lse_tolerance` (a keyword, default 1e-5). `keywords` go to both
    AttentionOps beside OPTIONS."""
    lse_tolerance = keywords.pop("lse_tolerance", 1e-5)
    options = dict(OPTIONS, **keywords)
    b, n, h, _ = q.shape
    comm = _core.CommHandle(60.0)
    cpu = _core.AttentionOp(q, k, comm=comm, **options)
    want_out = np.empty(dout.shape, np.float32)
    want_lse = np.empty((b, h, n), np.float32)
    cpu.forward(q, k, v, want_out, want_lse)
    want = [np.empty_like(x) for x in (q, k, v)]
    cpu.backward(q, k, v, want_out, want_lse, dout, *want)

    dev = {name: _core._testing_device_array(x, dtype) for name, x in
           (("q", q), ("k", k), ("v", v), ("dout", dout))}
    f32 = {name: _core._testing_device_array(np.zeros(shape, np.float32)) for name, shape in
           (("out", dout.shape), ("lse", (b, h, n)), ("dq", q.shape), ("dk", k.shape),
            ("dv", v.shape))}
    arr = dict(list(dev.items()) + list(f32.items()))  # DLPack objects, as torch's tensors
    gpu = _core.AttentionOp(arr["q"], arr["k"], comm=comm, **options)
    assert gpu.device == "cuda"
    gpu.forward(arr["q"], arr["k"], arr["v"], arr["out"], arr["lse"], stream=0)
    gpu.backward(arr["q"], arr["k"], arr["v"], arr["out"], arr["lse"], arr["dout"], arr["dq"],
                 arr["dk"], arr["dv"], stream=0)
    tol = TOLERANCE[dtype]
    assert relative(f32["out"].to_host(), want_out) < tol
    assert relative(f32["lse"].to_host(), want_lse) < lse_tolerance
    for name, w in zip(("dq", "dk", "dv"), want):
        assert relative(f32[name].to_host(), w) < tol, name


@pytest.mark.parametrize("dtype", ["bf16", "fp16", "fp32"])
def test_device_arrays_match_the_cpu_engine(dtype):
    rng = np.random.default_rng(5)
    b, n, h, d = SHAPE
    q, dout = (rounded(rng.standard_normal(SHAPE, dtype=np.float32), dtype) for _ in range(2))
    k, v = (rounded(rng.standard_normal((b, n, KV_HEADS, d), dtype=np.float32), dtype)
            for _ in range(2))
    expect_device_arrays_match_the_cpu_engine(q, k, v, dout, dtype)


def test_device_arrays_of_the_wrong_dtype_or_memory_are_refused_by_name():
    b, n, h, d = SHAPE
    x = np.zeros(SHAPE, np.float32)
    comm = _core.CommHandle(60.0)
    q = _core._testing_device_array(x, "bf16")
    gpu = _core.AttentionOp(q, q, comm=comm, **OPTIONS)
    out = _core._testing_device_array(x)
    lse = _core._testing_device_array(np.zeros((b, h, n), np.float32))
    with pytest.raises(ValueError, match="^k: must be bf16"):
        gpu.forward(q, _core._testing_device_array(x, "fp16"), q, out, lse)
    with pytest.raises(ValueError, match="^v: is not on a CUDA device"):
        gpu.forward(q, q, x, out, lse)


@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
def test_softcap_and_a_value_head_dim_match_the_cpu_engine(dtype):
    """One GPU's native kernels compute both: v, out, dout and dv of 32 columns beside q and k
    of 64, scores capped at 30 (scaled to the cap's size), against the CPU engine."""
    rng = np.random.default_rng(7)
    b, n, h, d = SHAPE
    dv_cols = 32
    q = rounded(rng.standard_normal(SHAPE, dtype=np.float32), dtype)
    dout = rounded(rng.standard_normal((b, n, h, dv_cols), dtype=np.float32), dtype)
    k = rounded(rng.standard_normal((b, n, KV_HEADS, d), dtype=np.float32), dtype)
    v = rounded(rng.standard_normal((b, n, KV_HEADS, dv_cols), dtype=np.float32), dtype)
    expect_device_arrays_match_the_cpu_engine(q, k, v, dout, dtype, scale=30.0 / 8, softcap=30.0,
                                              head_dim_v=dv_cols, lse_tolerance=1e-4)
