#!/usr/bin/env python3
"""A two-layer causal transformer trained for a few steps on random tokens, with its
attention computed by ringattn.nn.RingAttention.

    python3 examples/train_tiny.py                     # one process
    mpirun -n 2 python3 examples/train_tiny.py --mpi   # the sequence split over 2 ranks
    python3 examples/train_tiny.py --device cuda       # on the GPU (bf16 with --dtype bf16)

Sequence parallelism: every rank holds the whole model (same seed, same initial weights) and
its shard of the sequence (ringattn.shard: the zigzag layout causal attention balances
work with); attention runs over the ring, everything else is per token. Each rank's loss and
weight gradients are sums over its own tokens, so they are summed over the ranks
(ringattn.all_reduce_sum) before the optimizer step, and every rank takes the same step. The
loss curve is therefore the single-process one, up to float32 summation order:
--compare FILE checks that against a curve written by --losses-out.
"""
import argparse
import json
import math
import os
import sys

import torch

import ringattn
import ringattn.nn


class Layer(torch.nn.Module):
    def __init__(self, dim, heads, comm):
        super().__init__()
        self.heads = heads
        self.norm1 = torch.nn.LayerNorm(dim)
        self.q = torch.nn.Linear(dim, dim)
        self.k = torch.nn.Linear(dim, dim)
        self.v = torch.nn.Linear(dim, dim)
        self.proj = torch.nn.Linear(dim, dim)
        self.attn = ringattn.nn.RingAttention(causal=True, comm=comm)
        self.norm2 = torch.nn.LayerNorm(dim)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(dim, 4 * dim), torch.nn.GELU(),
                                       torch.nn.Linear(4 * dim, dim))

    def forward(self, x):
        b, n, dim = x.shape
        h = self.norm1(x)
        split = lambda t: t.view(b, n, self.heads, dim // self.heads)  # contiguous views
        a = self.attn(split(self.q(h)), split(self.k(h)), split(self.v(h)))
        x = x + self.proj(a.reshape(b, n, dim))
        return x + self.mlp(self.norm2(x))


class TinyTransformer(torch.nn.Module):
    def __init__(self, vocab, seq_len, dim, heads, layers, comm):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, dim)
        self.position = torch.nn.Embedding(seq_len, dim)
        self.layers = torch.nn.ModuleList(Layer(dim, heads, comm) for _ in range(layers))
        self.norm = torch.nn.LayerNorm(dim)
        self.head = torch.nn.Linear(dim, vocab)

    def forward(self, tokens, positions):
        x = self.embed(tokens) + self.position(positions)
        for layer in self.layers:
            x = layer(x)
        return self.head(self.norm(x))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mpi", action="store_true", help="use Comm.from_mpi() (under mpirun)")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--seq-len", type=int, default=96)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=50)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"],
                    help="cuda: the model and the attention on the GPU (one per rank, by "
                         "node-local rank)")
    ap.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"],
                    help="the model's parameters and activations (bf16 needs --device cuda)")
    ap.add_argument("--losses-out", help="write the loss curve (JSON) here (rank 0)")
    ap.add_argument("--compare", help="fail unless the loss curve matches this JSON file")
    ap.add_argument("--tolerance", type=float, default=1e-4, help="relative, per step")
    args = ap.parse_args()

    comm = ringattn.Comm.from_mpi() if args.mpi else ringattn.Comm()
    if args.dtype == "bf16" and args.device != "cuda":
        ap.error("--dtype bf16 needs --device cuda (the CPU kernels compute in float32)")
    device = torch.device("cpu")
    if args.device == "cuda":
        local = int(next((os.environ[v] for v in ("OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID",
                                                   "LOCAL_RANK") if v in os.environ), 0))
        device = torch.device("cuda", local % max(1, torch.cuda.device_count()))
        torch.cuda.set_device(device)
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    torch.manual_seed(0)  # the same weights and data on every rank
    model = TinyTransformer(args.vocab, args.seq_len, args.dim, args.heads, 2, comm)
    model = model.to(device, dtype)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    data = torch.randint(0, args.vocab, (args.batch, args.seq_len + 1))
    tokens, targets = data[:, :-1], data[:, 1:]  # next-token prediction
    positions = torch.arange(args.seq_len).expand(args.batch, -1)
    mine = lambda t: ringattn.shard(t, comm, causal=True)  # this rank's positions
    tokens, targets, positions = (mine(t).to(device) for t in (tokens, targets, positions))
    total_tokens = args.batch * args.seq_len

    losses = []
    for step in range(args.steps):
        opt.zero_grad()
        logits = model(tokens, positions)
        local = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1),
                                                  targets.flatten(), reduction="sum") / total_tokens
        local.backward()
        # Sum the gradients (one collective for all of them, in float32 on the host) and the
        # loss over the ranks.
        grads = [p.grad for p in model.parameters()]
        flat = torch.cat([g.flatten() for g in grads]).float().cpu()
        flat = ringattn.all_reduce_sum(flat, comm)
        for g, part in zip(grads, flat.split([g.numel() for g in grads])):
            g.copy_(part.view_as(g))
        loss = float(ringattn.all_reduce_sum(local.detach().float().cpu().view(1), comm))
        opt.step()
        losses.append(loss)
        if comm.rank == 0:
            print(f"step {step}  loss {loss:.6f}", flush=True)

    if comm.rank == 0:
        print(f"ranks {comm.size}, [B, N] = [{args.batch}, {args.seq_len}], "
              f"loss {losses[0]:.4f} -> {losses[-1]:.4f}")
        if args.losses_out:
            with open(args.losses_out, "w") as f:
                json.dump(losses, f)
    status = 0
    if args.compare:
        with open(args.compare) as f:
            want = json.load(f)
        worst = max(abs(a - b) / abs(b) for a, b in zip(losses, want))
        ok = len(want) == len(losses) and worst <= args.tolerance
        if comm.rank == 0:
            print(f"loss curve vs {args.compare}: largest relative difference {worst:.2e} "
                  f"(tolerance {args.tolerance:.0e}) -> {'OK' if ok else 'NOT OK'}")
        status = 0 if ok else 1
    if not all(math.isfinite(x) for x in losses) or losses[-1] >= losses[0]:
        if comm.rank == 0:
            print("the loss did not decrease", file=sys.stderr)
        status = 1
    return status


if __name__ == "__main__":
    sys.exit(main())
