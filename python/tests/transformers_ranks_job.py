"""One rank of test_transformers.py's distributed test: torch.distributed (gloo, env://),
ringattn.Comm.from_torch(), and tiny models with attn_implementation="ringattn" registered on
the group's ranks, against the single-process eager model on the same weights:

- gpt-oss (attention sinks, sliding and full layers, GQA), DeepSeek V3 (multi-head latent
  attention: values of their own head dim) and Gemma 2 (logit soft-capping, sliding and full
  layers), each rank running its shard of the sequence with its positions, on the ring and
  with Ulysses (U = the world): logits at the rank's positions, and the ranks' parameter
  gradients (the sinks' included) sum to eager's;
- a padded batch (left and right padding) and a batch packed through position_ids, through
  shard_inputs (one packed row of documents, sharded): logits at every valid position, and
  summed gradients;
- decoding: Llama, Mistral (a window shorter than the prompt), DeepSeek V3 and Gemma 2 (the
  cap in each rank's partial rows) prefilled on each rank's shard, then one-token steps over
  a DynamicCache holding each rank's shard: every step's logits are eager's on every rank.
"""
import copy
import os
import sys

import torch
import torch.distributed as dist
from transformers import (DeepseekV3Config, DeepseekV3ForCausalLM, DynamicCache, Gemma2Config,
                          Gemma2ForCausalLM, GptOssConfig, GptOssForCausalLM, LlamaConfig,
                          LlamaForCausalLM, MistralConfig, MistralForCausalLM)

sys.path.insert(0, os.path.dirname(__file__))
import ringattn  # noqa: E402
import ringattn.integrations.transformers as ra_hf  # noqa: E402

SMALL = dict(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
GPT_OSS = (GptOssForCausalLM, GptOssConfig(head_dim=16, num_local_experts=1,
                                           num_experts_per_tok=1, sliding_window=16, **SMALL))
LLAMA = (LlamaForCausalLM, LlamaConfig(**SMALL))
MISTRAL = (MistralForCausalLM, MistralConfig(sliding_window=12, **SMALL))
# Queries and keys of 24 (16 + 8 rotary), values of 16; as many K/V heads as query heads.
DEEPSEEK = (DeepseekV3ForCausalLM, DeepseekV3Config(
    q_lora_rank=None, kv_lora_rank=32, qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16,
    n_routed_experts=1, num_experts_per_tok=1, first_k_dense_replace=2,
    **dict(SMALL, num_key_value_heads=4)))
# A cap of 1 that changes a tiny model's scores (test_transformers.py's gemma2_softcap).
GEMMA2 = (Gemma2ForCausalLM, Gemma2Config(
    head_dim=16, sliding_window=16, query_pre_attn_scalar=16, attn_logit_softcapping=1.0,
    initializer_range=0.1, layer_types=["sliding_attention", "full_attention"], **SMALL))


def model(spec, impl):
    cls, config = spec
    torch.manual_seed(1)
    # A copy: a model keeps its config, whose _attn_implementation the next model would set.
    return cls._from_config(copy.deepcopy(config), attn_implementation=impl)


def relative(a, b):
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def check_grads(m, eager, comm, what):
    for (name, p), (_, q) in zip(m.named_parameters(), eager.named_parameters()):
        err = relative(ringattn.all_reduce_sum(p.grad, comm), q.grad)
        assert err < 1e-5, f"{what}: {name}: {err:.2e}"


def sharded_sequence(comm):
    ids = torch.randint(0, 128, (1, 96), generator=torch.Generator().manual_seed(2))
    weights = torch.randn(1, 96, 128, generator=torch.Generator().manual_seed(3))
    for name, spec in (("gpt-oss", GPT_OSS), ("deepseek-v3", DEEPSEEK), ("gemma2", GEMMA2)):
        eager = model(spec, "eager")
        want = eager(ids).logits
        (want * weights).sum().backward()
        for ulysses in (1, comm.size):
            ra_hf.register(comm=comm, ulysses=ulysses)
            m = model(spec, "ringattn")
            part = lambda x: ringattn.shard(x, comm, causal=True, ulysses=ulysses, heads=4)
            positions = part(torch.arange(96)[None])
            logits = m(part(ids), position_ids=positions).logits
            (logits * part(weights)).sum().backward()
            assert relative(logits, part(want)) < 1e-5, f"{name}, U={ulysses}: logits"
            check_grads(m, eager, comm, f"{name}, U={ulysses}")


def packed_batches(comm):
    ra_hf.register(comm=comm)
    ids = torch.randint(0, 128, (2, 40), generator=torch.Generator().manual_seed(4))
    weights = torch.randn(2, 40, 128, generator=torch.Generator().manual_seed(5))
    padded = torch.ones(2, 40, dtype=torch.long)
    padded[0, :7] = 0   # left padding
    padded[1, 33:] = 0  # right padding
    packed = torch.cat([torch.arange(15), torch.arange(25)])[None].expand(2, 40)
    for name, spec, kw in (("padded", GPT_OSS, dict(attention_mask=padded)),
                           ("packed", LLAMA, dict(position_ids=packed))):
        valid = padded[..., None] if name == "padded" else torch.ones(2, 40, 1)
        eager = model(spec, "eager")
        want = eager(ids, use_cache=False, **kw).logits * valid
        (want * weights).sum().backward()
        m = model(spec, "ringattn")
        sharded = ra_hf.shard_inputs(ids, comm=comm, heads=4, **kw)
        logits = m(**sharded.inputs, use_cache=False).logits
        full = sharded.unshard(logits.detach())
        assert relative(full * valid, want.detach()) < 1e-5, f"{name}: logits"
        (logits * sharded.local(weights * valid)).sum().backward()
        check_grads(m, eager, comm, name)


def decoding(comm):
    ra_hf.register(comm=comm)
    ids = torch.randint(0, 128, (1, 48), generator=torch.Generator().manual_seed(6))
    for name, spec, window in (("llama", LLAMA, None), ("mistral", MISTRAL, (11, 0)),
                               ("deepseek-v3", DEEPSEEK, None), ("gemma2", GEMMA2, None)):
        eager, m = model(spec, "eager"), model(spec, "ringattn")
        with torch.no_grad():
            cache = DynamicCache()
            want = [eager(ids[:, :40], cache=cache).logits[:, -1]]
            for t in range(40, 48):
                want.append(eager(ids[:, t:t + 1], cache=cache).logits[:, -1])
            cache = DynamicCache()
            part = lambda x: ringattn.shard(x, comm, causal=True, window=window)
            m(part(ids[:, :40]), position_ids=part(torch.arange(40)[None]), cache=cache)
            got = [None]
            for t in range(40, 48):
                got.append(m(ids[:, t:t + 1], position_ids=torch.tensor([[t]]),
                             cache=cache).logits[:, -1])
        for t in range(1, 9):
            err = relative(got[t], want[t])
            assert err < 1e-5, f"{name}: decoding step {t}: {err:.2e}"


def main():
    dist.init_process_group("gloo")
    comm = ringattn.Comm.from_torch(timeout=120)
    sharded_sequence(comm)
    packed_batches(comm)
    decoding(comm)
    ra_hf.register()
    print(f"rank {comm.rank}: OK", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
