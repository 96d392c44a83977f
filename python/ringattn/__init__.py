"""ringattn: exact attention over sequences too long for one device.

    out = ringattn.attention(q, k, v, attention="dilated", segments=[2048, 4096],
                             dilations=[1, 2], causal=True)

Dense, LongNet-style dilated and block-sparse attention, forward and backward, on one
process or over MPI ranks (``ringattn.Comm.from_mpi()``), with torch autograd
(``ringattn.nn.RingAttention``). See docs/API.md.
"""
from ._core import __version__
from . import _nccl
_nccl.hand_over()  # before anything can open NCCL: torch's, if the wheel is installed
from ._comm import Comm, default_comm
from .functional import (all_reduce_sum, attention, attention_backward, shard, unshard)

__all__ = ["Comm", "all_reduce_sum", "attention", "attention_backward", "default_comm", "shard",
           "unshard", "__version__"]


def __getattr__(name):
    # ringattn.nn needs torch; import it on first use so numpy-only users need no torch.
    if name == "nn":
        import importlib
        return importlib.import_module(".nn", __name__)
    raise AttributeError(f"module 'ringattn' has no attribute {name!r}")
