"""Run by test_watchdog.py under mpiexec -n 2: rank 1 fails in the forward at ring step 1
(RINGATTN_FAULT_INJECT), so rank 0's backward exchange never completes and its watchdog
must end the call with a RuntimeError; each rank prints what it raised."""
import sys
import time

import torch

import ringattn

comm = ringattn.Comm.from_mpi(timeout=float(sys.argv[1]))
q = torch.randn(1, 64 // comm.size, 2, 16, requires_grad=True)
start = time.monotonic()
try:
    ringattn.attention(q, q, q, comm=comm).sum().backward()
    print(f"rank {comm.rank}: NO ERROR", flush=True)
except RuntimeError as e:
    print(f"rank {comm.rank}: RuntimeError after {time.monotonic() - start:.1f} s: {e}",
          flush=True)
