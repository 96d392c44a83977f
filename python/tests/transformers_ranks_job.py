"""One rank of test_transformers.py's distributed test: torch.distributed (gloo, env://),
ringattn.Comm.from_torch(), and a tiny gpt-oss model (attention sinks, sliding and full
layers, GQA) with attn_implementation="ringattn" registered on the group's ranks, each rank
running its shard of the sequence with its positions, on the ring and with Ulysses (U = the
world). Its logits are the single-process eager model's at its positions, and the ranks'
parameter gradients (the sinks' included) sum to eager's."""
import os
import sys

import torch
import torch.distributed as dist
from transformers import GptOssConfig, GptOssForCausalLM

sys.path.insert(0, os.path.dirname(__file__))
import ringattn  # noqa: E402
import ringattn.integrations.transformers as ra_hf  # noqa: E402

SMALL = dict(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, head_dim=16,
             max_position_embeddings=256, num_local_experts=1, num_experts_per_tok=1,
             sliding_window=16)


def model(impl):
    torch.manual_seed(1)
    return GptOssForCausalLM._from_config(GptOssConfig(**SMALL), attn_implementation=impl)


def relative(a, b):
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def main():
    dist.init_process_group("gloo")
    comm = ringattn.Comm.from_torch(timeout=120)
    ids = torch.randint(0, 128, (1, 96), generator=torch.Generator().manual_seed(2))
    weights = torch.randn(1, 96, 128, generator=torch.Generator().manual_seed(3))
    eager = model("eager")
    want = eager(ids).logits
    (want * weights).sum().backward()
    for ulysses in (1, comm.size):
        ra_hf.register(comm=comm, ulysses=ulysses)
        m = model("ringattn")
        part = lambda x: ringattn.shard(x, comm, causal=True, ulysses=ulysses, heads=4)
        positions = part(torch.arange(96)[None])
        logits = m(part(ids), position_ids=positions).logits
        (logits * part(weights)).sum().backward()
        assert relative(logits, part(want)) < 1e-5, f"U={ulysses}: logits"
        for (name, p), (_, q) in zip(m.named_parameters(), eager.named_parameters()):
            err = relative(ringattn.all_reduce_sum(p.grad, comm), q.grad)
            assert err < 1e-5, f"U={ulysses}: {name}: {err:.2e}"
    ra_hf.register()
    print(f"rank {comm.rank}: OK", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
