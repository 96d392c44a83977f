"""Which NCCL ringattn's NCCL transport opens when none is loaded yet.

ringattn links no NCCL: a GPU job over several processes opens it on first use, taking the
one already in the process if there is one (torch's). Otherwise it opens the file handed over
here: the nvidia-nccl wheel's libnccl.so.2, the one PyPI's torch loads, found without
importing torch. So ringattn and torch share one NCCL whichever is imported or used first.
"""
from __future__ import annotations

import importlib.util
import os

from . import _core


def wheel_nccl() -> str | None:
    """The nvidia-nccl-cu* wheel's libnccl.so.2 in this environment, or None."""
    try:
        spec = importlib.util.find_spec("nvidia")  # a namespace package: nothing is imported
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for base in spec.submodule_search_locations:
        # nvidia/nccl/lib, or the one-folder-per-CUDA layout some wheels use.
        for sub in ("nccl", "cu13", "cu12"):
            path = os.path.join(base, sub, "lib", "libnccl.so.2")
            if os.path.isfile(path):
                return path
    return None


def hand_over() -> None:
    """Tells _core the wheel's NCCL, if this build has the NCCL transport and the wheel is here."""
    if _core.has_nccl:
        path = wheel_nccl()
        if path:
            _core.set_nccl_library(path)
