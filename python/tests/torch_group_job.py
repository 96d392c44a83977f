"""One rank of test_torch_group.py's job: torch.distributed (gloo, env:// rendezvous), then
ringattn.Comm.from_torch() and this rank's shard of a causal GQA problem, with the plain ring
and with Ulysses (U = the world), forward and gradients against the single-process answer."""
import os
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(__file__))
import ringattn  # noqa: E402
import reference  # noqa: E402


def main():
    dist.init_process_group("gloo")
    comm = ringattn.Comm.from_torch(timeout=60)
    assert (comm.rank, comm.size) == (dist.get_rank(), dist.get_world_size())
    g = torch.Generator().manual_seed(11)
    q = torch.randn(2, 96, 4, 16, generator=g)
    k, v = (torch.randn(2, 96, 2, 16, generator=g) for _ in range(2))
    dout = torch.randn(2, 96, 4, 16, generator=g)
    full = [x.clone().requires_grad_() for x in (q, k, v)]
    want = ringattn.attention(*full, causal=True)
    want.backward(dout)
    for kw in (dict(causal=True), dict(causal=True, ulysses=comm.size)):
        part = lambda x: ringattn.shard(x, comm, heads=4, **kw)
        local = [part(x).requires_grad_() for x in (q, k, v)]
        out = ringattn.attention(*local, comm=comm, **kw)
        out.backward(part(dout))
        for label, got, ref in (("out", out, part(want)), ("dq", local[0].grad, part(full[0].grad)),
                                ("dk", local[1].grad, part(full[1].grad)),
                                ("dv", local[2].grad, part(full[2].grad))):
            err = reference.relative_error(got.detach(), ref.detach())
            assert err < 1e-5, f"{kw}: {label}: {err:.2e}"
    print(f"rank {comm.rank}: OK", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
