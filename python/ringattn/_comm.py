"""Communicators: one process alone, or MPI_COMM_WORLD under mpirun/srun.

A ``Comm`` also owns the cache of attention plans built on it, so that a training loop's
repeated calls with one configuration reuse one plan (tiles, schedule, workspace, ring
buffers) and allocate nothing new in the engine.
"""
from __future__ import annotations

import atexit
import collections
import ctypes
import gc
import itertools
import os
import weakref

from . import _core

_DEFAULT_TIMEOUT = 300.0
# Plans kept per communicator (least recently used dropped first).
_PLAN_CACHE_SIZE = 32
_LIVE_COMMS: "weakref.WeakSet[Comm]" = weakref.WeakSet()
# Communicators by id: the torch custom op (ringattn._ops) names its Comm by an integer,
# since an op's arguments are tensors and plain values. Id 0 is default_comm().
_BY_ID: "weakref.WeakValueDictionary[int, Comm]" = weakref.WeakValueDictionary()
_NEXT_ID = itertools.count(1)


class Comm:
    """The ranks an attention call is spread over.

    ``Comm()`` is a single process (``rank == 0``, ``size == 1``); ``Comm.from_mpi()`` is
    ``MPI_COMM_WORLD`` of a job started by ``mpirun``/``mpiexec``/``srun``. ``timeout`` is the
    watchdog's: the longest a ring step waits for its exchange (seconds, as the CLI's
    ``--timeout``); past it the call raises ``RuntimeError`` naming the step and peers,
    instead of hanging.
    """

    def __init__(self, *, timeout: float = _DEFAULT_TIMEOUT):
        self._init(_core.CommHandle(float(timeout)))

    @classmethod
    def from_mpi(cls, *, timeout: float = _DEFAULT_TIMEOUT) -> "Comm":
        """MPI_COMM_WORLD (MPI is initialised on the first call and finalised at exit)."""
        if not _core.has_mpi:
            raise RuntimeError("this build of ringattn has no MPI (install libopenmpi-dev and "
                               "reinstall)")
        comm = cls.__new__(cls)
        comm._init(_core.CommHandle.from_mpi(float(timeout)))
        ntasks = os.environ.get("SLURM_NTASKS", "")
        if ntasks.isdigit() and int(ntasks) > 1 and comm.size == 1:
            # The CLI's launch check: a job meant to be parallel that sees one rank.
            raise ValueError(
                f"launch: SLURM_NTASKS={ntasks} but MPI reports 1 rank: start the script with "
                "'srun --mpi=pmix' (or mpirun) inside the allocation, not directly (see launch/)")
        return comm

    @classmethod
    def from_torch(cls, group=None, *, timeout: float = _DEFAULT_TIMEOUT) -> "Comm":
        """The ranks of a ``torch.distributed`` process group (default: the world), which
        must be initialised. Setup collectives go through the group (any backend: the NCCL
        unique id of a GPU job travels over it, so a gloo group works too); a CPU job's K/V
        travel through the group's isend/irecv (gloo); a GPU job's over NCCL among the
        ranks' GPUs (one per rank, by the tensors' device). The group's own timeout bounds
        its collectives; ``timeout`` is ringattn's watchdog for ring steps."""
        import torch.distributed as dist
        if not dist.is_available() or not dist.is_initialized():
            raise ValueError("group: torch.distributed is not initialised "
                             "(call torch.distributed.init_process_group first)")
        comm = cls.__new__(cls)
        comm._init(_core.CommHandle.from_torch_group(_TorchGroup(group), float(timeout)))
        return comm

    def _init(self, handle) -> None:
        self._handle = handle
        self._id = next(_NEXT_ID)
        _BY_ID[self._id] = self
        self._plans: "collections.OrderedDict" = collections.OrderedDict()
        _LIVE_COMMS.add(self)

    @property
    def rank(self) -> int:
        return self._handle.rank

    @property
    def size(self) -> int:
        return self._handle.size

    @property
    def timeout(self) -> float:
        return self._handle.timeout

    def barrier(self) -> None:
        self._handle.barrier()

    def __repr__(self) -> str:
        kind = "mpi" if self._handle.is_mpi else "local"
        return f"Comm({kind}, rank={self.rank}, size={self.size}, timeout={self.timeout})"

    def _plan(self, key, make):
        plan = self._plans.get(key)
        if plan is None:
            plan = make()
            self._plans[key] = plan
            if len(self._plans) > _PLAN_CACHE_SIZE:
                self._plans.popitem(last=False)
        else:
            self._plans.move_to_end(key)
        return plan

    def cached_plans(self) -> int:
        """How many attention plans this communicator holds (one per configuration)."""
        return len(self._plans)


class _TorchGroup:
    """What the extension's group communicator (python/src/group_comm.cpp) calls: rank and
    size in the group, collectives on bytes, and isend/irecv of raw host buffers (address,
    length) with tags."""

    def __init__(self, group):
        import torch
        import torch.distributed as dist
        self._torch, self._dist = torch, dist
        self.group = group if group is not None else dist.group.WORLD
        self.rank = dist.get_rank(self.group)
        self.size = dist.get_world_size(self.group)
        self.backend = str(dist.get_backend(self.group))
        self.local_rank = int(os.environ.get("LOCAL_RANK", "0"))

    def describe(self) -> str:
        return f"torch.distributed {self._torch.__version__} ({self.backend} group)"

    def _global(self, peer):
        c10d = self._dist.distributed_c10d
        to_global = getattr(self._dist, "get_global_rank", None) or c10d._get_global_rank
        return to_global(self.group, peer)

    def _buffer(self, address, length):
        return self._torch.frombuffer((ctypes.c_char * length).from_address(address),
                                      dtype=self._torch.uint8)

    def isend(self, peer, address, length, tag):
        return self._dist.isend(self._buffer(address, length), dst=self._global(peer),
                                group=self.group, tag=tag)

    def irecv(self, peer, address, length, tag):
        return self._dist.irecv(self._buffer(address, length), src=self._global(peer),
                                group=self.group, tag=tag)

    def barrier(self):
        self._dist.barrier(group=self.group)

    def allgather(self, data: bytes) -> list:
        out = [None] * self.size
        self._dist.all_gather_object(out, data, group=self.group)
        return out

    def broadcast(self, data: bytes, root: int) -> bytes:
        box = [data if self.rank == root else None]
        self._dist.broadcast_object_list(box, src=self._global(root), group=self.group)
        return box[0]


_local = None


def default_comm() -> Comm:
    """The single-process communicator used when ``comm=None``."""
    global _local
    if _local is None:
        _local = Comm()
    return _local


def comm_by_id(comm_id: int) -> Comm:
    """The Comm a custom op's argument names (0: default_comm())."""
    if comm_id == 0:
        return default_comm()
    comm = _BY_ID.get(comm_id)
    if comm is None:
        raise ValueError(f"comm: communicator {comm_id} no longer exists")
    return comm


def _shutdown() -> None:
    # Plans first (their communication threads use MPI), then MPI itself.
    for comm in list(_LIVE_COMMS):
        comm._plans.clear()
    gc.collect()
    _core.shutdown()


atexit.register(_shutdown)
