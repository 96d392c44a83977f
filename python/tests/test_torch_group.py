"""ringattn.Comm.from_torch over a torch.distributed gloo group: two processes (env://
rendezvous on localhost) each run torch_group_job.py, the ring's K/V and the Ulysses
all-to-alls travelling through the group's isend/irecv, and both match the single-process
answer. Skipped, with the reason, where torch.distributed has no gloo."""
import os
import socket
import subprocess
import sys

import pytest
import torch.distributed as dist

pytestmark = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(),
                                reason="torch.distributed with gloo is not available")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_gloo_group_carries_the_ring_and_ulysses():
    job = os.path.join(os.path.dirname(__file__), "torch_group_job.py")
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), WORLD_SIZE="2",
               OMP_NUM_THREADS="1")
    procs = [subprocess.Popen([sys.executable, job], env=dict(env, RANK=str(r), LOCAL_RANK="0"),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for r in range(2)]
    outs = [p.communicate(timeout=240)[0] for p in procs]
    for r, (p, out) in enumerate(zip(procs, outs)):
        assert p.returncode == 0, f"rank {r}:\n{out}"
        assert f"rank {r}: OK" in out
