"""ringattn as a transformers attention implementation (ringattn.integrations.transformers):
tiny Llama (GQA, RoPE), Mistral (MQA, sliding window) and gpt-oss (attention sinks, sliding
and full layers) models, random weights, with
attn_implementation="ringattn" give the eager implementation's logits and gradients, with
the model's default KV cache in use; generation (prompt through ringattn, decoding steps
through sdpa) gives eager's tokens. Skipped, with the reason, where transformers (which
needs a recent torch) is not installed: CI runs it in the PyPI-torch venv (scripts/test.sh).
"""
import pytest
import torch

transformers = pytest.importorskip(
    "transformers", reason="transformers is not installed (CI's .venv-torch has it)")
import ringattn.integrations.transformers as ra_hf  # noqa: E402  registers "ringattn"
from transformers import (GptOssConfig, GptOssForCausalLM, LlamaConfig,  # noqa: E402
                          LlamaForCausalLM, MistralConfig, MistralForCausalLM)

TOLERANCE = 1e-5
SMALL = dict(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
             num_attention_heads=4, max_position_embeddings=256)
MODELS = {
    "llama_gqa": (LlamaForCausalLM, LlamaConfig(num_key_value_heads=2, **SMALL)),
    "mistral_mqa_window": (MistralForCausalLM,
                           MistralConfig(num_key_value_heads=1, sliding_window=16, **SMALL)),
    # Attention sinks (s_aux), sliding and full layers alternating, GQA; one expert, so that
    # no routing decision can flip on a last-bit difference.
    "gpt_oss_sinks": (GptOssForCausalLM,
                      GptOssConfig(num_key_value_heads=2, head_dim=16, num_local_experts=1,
                                   num_experts_per_tok=1, sliding_window=16, **SMALL)),
}


def build(name, impl):
    cls, config = MODELS[name]
    torch.manual_seed(1)  # the same weights for every implementation
    return cls._from_config(config, attn_implementation=impl)


def relative(a, b):
    """Relative Frobenius error; 0 when both are zero (a one-expert router's gradient)."""
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


@pytest.mark.parametrize("name", list(MODELS))
def test_logits_and_gradients_match_eager_with_the_kv_cache(name, monkeypatch):
    calls = []
    forward = ra_hf.ringattn_attention_forward
    monkeypatch.setattr(transformers.AttentionInterface, "_global_mapping",
                        dict(transformers.AttentionInterface._global_mapping,
                             ringattn=lambda *a, **k: calls.append(1) or forward(*a, **k)))
    ids = torch.randint(0, 128, (2, 96), generator=torch.Generator().manual_seed(2))
    got = {}
    for impl in ("eager", "ringattn"):
        model = build(name, impl)
        out = model(ids, labels=ids, use_cache=True)
        out.loss.backward()
        got[impl] = out.logits.detach(), {n: p.grad for n, p in model.named_parameters()}
    assert calls, "the ringattn implementation was never called"
    (want_logits, want_grads), (logits, grads) = got["eager"], got["ringattn"]
    assert relative(logits, want_logits) < TOLERANCE
    for n, g in want_grads.items():
        assert relative(grads[n], g) < TOLERANCE, n


@pytest.mark.parametrize("name", list(MODELS))
def test_generation_gives_eager_tokens(name):
    prompt = torch.randint(0, 128, (1, 24), generator=torch.Generator().manual_seed(3))
    tokens = {impl: build(name, impl).generate(prompt, max_new_tokens=6, do_sample=False)
              for impl in ("eager", "ringattn")}
    assert torch.equal(tokens["ringattn"], tokens["eager"])


def test_padding_is_refused_naming_why():
    model = build("llama_gqa", "ringattn")
    ids = torch.randint(0, 128, (2, 16))
    mask = torch.ones(2, 16, dtype=torch.long)
    mask[1, :4] = 0
    with pytest.raises(ValueError, match="the batch has padding"):
        model(ids, attention_mask=mask)


def _tiny(cls_name, config_name, **extra):
    cls, config_cls = getattr(transformers, cls_name), getattr(transformers, config_name)
    torch.manual_seed(1)
    return cls._from_config(config_cls(**SMALL, **extra), attn_implementation="ringattn")


@pytest.mark.parametrize("cls_name, config_name, extra, named", [
    # Gemma 2's logit soft-capping: refused by name, never dropped.
    ("Gemma2ForCausalLM", "Gemma2Config",
     dict(num_key_value_heads=2, head_dim=16, attn_logit_softcapping=1.0), "soft-capping"),
])
def test_a_model_feature_ringattn_does_not_carry_is_refused_by_name(cls_name, config_name, extra,
                                                                  named):
    model = _tiny(cls_name, config_name, **extra)
    ids = torch.randint(0, 128, (1, 32), generator=torch.Generator().manual_seed(4))
    with pytest.raises(ValueError, match=named):
        model(ids)


def test_an_unknown_layer_keyword_is_refused_by_name():
    q = torch.randn(1, 4, 8, 16)
    k = v = torch.randn(1, 2, 8, 16)
    layer = torch.nn.Module()
    with pytest.raises(ValueError, match="'my_new_bias'"):
        ra_hf.ringattn_attention_forward(layer, q, k, v, None, my_new_bias=torch.zeros(1))
    out, _ = ra_hf.ringattn_attention_forward(layer, q, k, v, None, position_ids=None,
                                              my_flag=False)
    assert out.shape == (1, 8, 4, 16)


# Without a cache (training), transformers reads restarting position_ids as packed sequences
# and masks across them; ringattn's options cannot say that from a mask, so it refuses.
def test_sequences_packed_through_position_ids_are_refused_not_attended_across():
    model = build("llama_gqa", "ringattn")
    ids = torch.randint(0, 128, (1, 32), generator=torch.Generator().manual_seed(5))
    position_ids = torch.cat([torch.arange(20), torch.arange(12)])[None]
    with pytest.raises(ValueError, match="more than causality"):
        model(ids, position_ids=position_ids, use_cache=False)


def test_a_model_with_sinks_over_ranks_and_ulysses_matches_eager():
    """Two processes over a gloo group (python/tests/transformers_ranks_job.py)."""
    import os
    import torch.distributed as dist
    from gloo_jobs import run_two_ranks
    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available")
    run_two_ranks(os.path.join(os.path.dirname(__file__), "transformers_ranks_job.py"), 300)
