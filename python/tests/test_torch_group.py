"""ringattn.Comm.from_torch over a torch.distributed gloo group: two processes (env://
rendezvous on localhost) each run torch_group_job.py, the ring's K/V and the Ulysses
all-to-alls travelling through the group's isend/irecv, and both match the single-process
answer. Skipped, with the reason, where torch.distributed has no gloo."""
import os

import pytest
import torch.distributed as dist

from gloo_jobs import run_two_ranks

pytestmark = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(),
                                reason="torch.distributed with gloo is not available")


def test_a_gloo_group_carries_the_ring_and_ulysses():
    run_two_ranks(os.path.join(os.path.dirname(__file__), "torch_group_job.py"))
