"""ringattn as a transformers attention implementation (ringattn.integrations.transformers):
tiny random models with attn_implementation="ringattn" give the eager implementation's logits
and every gradient, and its tokens and decoding steps, on the same weights:

- Llama (GQA), Mistral (MQA, sliding window), gpt-oss (sinks, sliding and full layers),
  Gemma 3 (sliding and full layers), Llama 4 (chunked attention), Qwen2-MoE (a window that
  lives only in the mask), with the model's KV cache in use;
- padded batches (left and right), sequences packed through position_ids, a user's
  block-diagonal 4D mask, ModernBERT's bidirectional local window over a padded batch;
- generate(), also left-padded, and hand-written decoding loops over a plain DynamicCache
  past the window (window, chunks, sinks, padding);
- DeepSeek V3 (multi-head latent attention: values of their own head dim), Gemma 2 and
  VaultGemma (logit soft-capping, sliding and full layers), also padded, packed, generating
  and decoding past the window;
- features ringattn does not carry refused by name (a dynamic mask, a soft-cap the layer holds
  but does not pass, a relative-position bias passed as the mask by a model that computes with
  its mask); two processes over gloo (transformers_ranks_job.py).

Skipped, with the reason, where transformers (which needs a recent torch) is not installed:
CI runs it in the PyPI-torch venv (scripts/test.sh). The sweep over every model family is
test_transformers_sweep.py.
"""
import copy
import os

import pytest
import torch

transformers = pytest.importorskip(
    "transformers", reason="transformers is not installed (CI's .venv-torch has it)")
import ringattn.integrations.transformers as ra_hf  # noqa: E402  registers "ringattn"
from transformers import DynamicCache  # noqa: E402

TOLERANCE = 1e-5
SMALL = dict(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
             num_attention_heads=4, max_position_embeddings=256)
ONE_EXPERT = dict(num_experts_per_tok=1)  # no routing decision flips on a last-bit difference


def _spec(cls_name, config_name, **extra):
    return getattr(transformers, cls_name), getattr(transformers, config_name)(**SMALL, **extra)


MODELS = {
    "llama_gqa": lambda: _spec("LlamaForCausalLM", "LlamaConfig", num_key_value_heads=2),
    "mistral_mqa_window": lambda: _spec("MistralForCausalLM", "MistralConfig",
                                        num_key_value_heads=1, sliding_window=16),
    # Attention sinks (s_aux), sliding and full layers alternating, GQA.
    "gpt_oss_sinks": lambda: _spec("GptOssForCausalLM", "GptOssConfig", num_key_value_heads=2,
                                   head_dim=16, num_local_experts=1, sliding_window=16,
                                   **ONE_EXPERT),
    "gemma3_sliding": lambda: _spec("Gemma3ForCausalLM", "Gemma3TextConfig",
                                    num_key_value_heads=2, head_dim=16, sliding_window=8,
                                    layer_types=["sliding_attention", "full_attention"]),
    # Llama 4's chunked attention: chunks of 16 tokens are documents.
    "llama4_chunked": lambda: _spec("Llama4ForCausalLM", "Llama4TextConfig",
                                    num_key_value_heads=2, attention_chunk_size=16,
                                    num_local_experts=1, **ONE_EXPERT),
    # The window lives only in the mask (the layer passes no sliding_window).
    "qwen2_moe_mask_window": lambda: _spec("Qwen2MoeForCausalLM", "Qwen2MoeConfig",
                                           num_key_value_heads=2, use_sliding_window=True,
                                           sliding_window=8, max_window_layers=0, num_experts=1,
                                           moe_intermediate_size=64,
                                           shared_expert_intermediate_size=64, **ONE_EXPERT),
    # DeepSeek V3's multi-head latent attention: queries and keys of 24 (16 + 8 rotary),
    # values of 16.
    "deepseek_v3_mla": lambda: _spec("DeepseekV3ForCausalLM", "DeepseekV3Config",
                                     num_key_value_heads=4, q_lora_rank=None, kv_lora_rank=32,
                                     qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16,
                                     n_routed_experts=1, first_k_dense_replace=2, **ONE_EXPERT),
    # Gemma 2's logit soft-capping on sliding and full layers, GQA. Caps of 1 and 2, a scale
    # of 1/4 (query_pre_attn_scalar 16) and weights of 0.1 (not 0.02), so that the cap changes
    # a tiny model's scores (test_the_soft_cap_changes_the_tiny_gemmas...).
    "gemma2_softcap": lambda: _spec("Gemma2ForCausalLM", "Gemma2Config", num_key_value_heads=2,
                                    head_dim=16, sliding_window=8, query_pre_attn_scalar=16,
                                    attn_logit_softcapping=1.0, initializer_range=0.1,
                                    layer_types=["sliding_attention", "full_attention"]),
    "vaultgemma_softcap": lambda: _spec("VaultGemmaForCausalLM", "VaultGemmaConfig",
                                        num_key_value_heads=2, head_dim=16, sliding_window=8,
                                        query_pre_attn_scalar=16, attn_logit_softcapping=2.0,
                                        initializer_range=0.1,
                                        layer_types=["sliding_attention", "full_attention"]),
}


def build(name, impl):
    cls, config = MODELS[name]()
    torch.manual_seed(1)  # the same weights for every implementation
    return cls._from_config(copy.deepcopy(config), attn_implementation=impl)


def relative(a, b):
    """Relative Frobenius error; 0 when both are zero (a one-expert router's gradient)."""
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


@pytest.fixture
def calls(monkeypatch):
    """Counts the ringattn implementation's calls."""
    seen = []
    forward = ra_hf.ringattn_attention_forward
    monkeypatch.setattr(transformers.AttentionInterface, "_global_mapping",
                        dict(transformers.AttentionInterface._global_mapping,
                             ringattn=lambda *a, **k: seen.append(1) or forward(*a, **k)))
    return seen


def logits_and_grads(name, ids, valid=None, **inputs):
    """Each implementation's logits (zero at padding) and parameter gradients of a fixed
    random loss over the valid positions."""
    got = {}
    for impl in ("eager", "ringattn"):
        model = build(name, impl)
        logits = model(ids, **inputs).logits
        weights = torch.randn(logits.shape, generator=torch.Generator().manual_seed(5))
        if valid is not None:
            weights = weights * valid[..., None]
            logits = logits * valid[..., None]
        (logits * weights).sum().backward()
        got[impl] = logits.detach(), {n: p.grad for n, p in model.named_parameters()
                                      if p.grad is not None}
    return got["eager"], got["ringattn"]


def assert_same(want, got):
    (want_logits, want_grads), (logits, grads) = want, got
    assert relative(logits, want_logits) < TOLERANCE
    assert want_grads.keys() == grads.keys()
    for n, g in want_grads.items():
        assert relative(grads[n], g) < TOLERANCE, n


@pytest.mark.parametrize("name", list(MODELS))
def test_logits_and_gradients_match_eager_with_the_kv_cache(name, calls):
    ids = torch.randint(0, 128, (2, 96), generator=torch.Generator().manual_seed(2))
    assert_same(*logits_and_grads(name, ids, use_cache=True))
    assert calls, "the ringattn implementation was never called"


def test_the_soft_cap_changes_the_tiny_gemmas_and_mla_has_its_own_value_head_dim():
    """The models below would not see a dropped cap or a mixed-up head dim otherwise."""
    ids = torch.randint(0, 128, (1, 32), generator=torch.Generator().manual_seed(2))
    for name in ("gemma2_softcap", "vaultgemma_softcap"):
        cls, config = MODELS[name]()
        uncapped = copy.deepcopy(config)
        uncapped.attn_logit_softcapping = None
        with torch.no_grad():
            torch.manual_seed(1)
            want = cls._from_config(config, attn_implementation="eager")(ids).logits
            torch.manual_seed(1)
            other = cls._from_config(uncapped, attn_implementation="eager")(ids).logits
        assert relative(other, want) > 1e-2, name
    layer = build("deepseek_v3_mla", "ringattn").model.layers[0].self_attn
    assert (layer.qk_head_dim, layer.v_head_dim) == (24, 16)


@pytest.mark.parametrize("name", ["llama_gqa", "gpt_oss_sinks", "llama4_chunked",
                                  "deepseek_v3_mla", "gemma2_softcap"])
@pytest.mark.parametrize("side", ["left", "right"])
def test_a_padded_batch_matches_eager_at_every_valid_position(name, side, calls):
    ids = torch.randint(0, 128, (3, 48), generator=torch.Generator().manual_seed(2))
    mask = torch.ones(3, 48, dtype=torch.long)
    if side == "left":
        mask[1, :7], mask[2, :30] = 0, 0
    else:
        mask[1, 41:], mask[2, 18:] = 0, 0
    assert_same(*logits_and_grads(name, ids, valid=mask, attention_mask=mask))
    assert calls


@pytest.mark.parametrize("name", ["llama_gqa", "mistral_mqa_window", "gpt_oss_sinks",
                                  "deepseek_v3_mla", "gemma2_softcap"])
def test_sequences_packed_through_position_ids_are_documents(name, calls):
    ids = torch.randint(0, 128, (1, 64), generator=torch.Generator().manual_seed(5))
    position_ids = torch.cat([torch.arange(20), torch.arange(30), torch.arange(14)])[None]
    assert_same(*logits_and_grads(name, ids, position_ids=position_ids, use_cache=False))
    assert calls


def test_a_block_diagonal_4d_mask_is_documents(calls):
    """A user's own 4D mask (additive, as eager reads it): two causal documents per row."""
    allowed = torch.zeros(2, 1, 48, 48, dtype=torch.bool)
    for begin, end in ((0, 20), (20, 48)):
        allowed[:, 0, begin:end, begin:end] = torch.tril(torch.ones(end - begin, end - begin,
                                                                    dtype=torch.bool))
    mask = torch.zeros(allowed.shape).masked_fill(~allowed, torch.finfo(torch.float32).min)
    ids = torch.randint(0, 128, (2, 48), generator=torch.Generator().manual_seed(2))
    assert_same(*logits_and_grads("llama_gqa", ids, attention_mask=mask))
    assert calls


def test_modernbert_bidirectional_local_window_over_a_padded_batch(calls):
    config = transformers.ModernBertConfig(
        vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
        num_attention_heads=4, local_attention=8, global_attn_every_n_layers=3,
        max_position_embeddings=256, pad_token_id=0, bos_token_id=1, eos_token_id=2,
        cls_token_id=1, sep_token_id=2)
    ids = torch.randint(3, 128, (2, 48), generator=torch.Generator().manual_seed(2))
    mask = torch.ones(2, 48, dtype=torch.long)
    mask[1, 40:] = 0
    got = {}
    for impl in ("eager", "ringattn"):
        torch.manual_seed(1)
        model = transformers.ModernBertModel._from_config(copy.deepcopy(config),
                                                          attn_implementation=impl)
        hidden = model(ids, attention_mask=mask).last_hidden_state * mask[..., None]
        # A random linear loss (a sum of squares after the final LayerNorm is nearly
        # constant: its gradients would be rounding noise).
        weights = torch.randn(hidden.shape, generator=torch.Generator().manual_seed(5))
        (hidden * weights).sum().backward()
        got[impl] = hidden.detach(), {n: p.grad for n, p in model.named_parameters()
                                      if p.grad is not None}
    assert_same(got["eager"], got["ringattn"])
    assert calls


@pytest.mark.parametrize("name", ["llama_gqa", "mistral_mqa_window", "gpt_oss_sinks",
                                  "deepseek_v3_mla", "gemma2_softcap"])
@pytest.mark.parametrize("padded", [False, True])
@pytest.mark.parametrize("cache", ["dynamic", "static"])
def test_generation_gives_eager_tokens(name, padded, cache):
    """generate(), greedy, with transformers' default cache and with a static one (its
    prepared 4D masks come back into the model as the attention mask; its unwritten keys past
    the query are masked): the tokens, and every step's scores (a tiny model's greedy tokens
    survive small errors)."""
    prompt = torch.randint(0, 128, (2, 24), generator=torch.Generator().manual_seed(3))
    mask = torch.ones(2, 24, dtype=torch.long)
    if padded:
        mask[1, :6] = 0
    extra = {} if cache == "dynamic" else dict(cache_implementation="static")
    runs = {impl: build(name, impl).generate(prompt, attention_mask=mask, max_new_tokens=8,
                                             do_sample=False, output_scores=True,
                                             return_dict_in_generate=True, **extra)
            for impl in ("eager", "ringattn")}
    assert torch.equal(runs["ringattn"].sequences, runs["eager"].sequences)
    for t, (got, want) in enumerate(zip(runs["ringattn"].scores, runs["eager"].scores)):
        assert relative(got, want) < TOLERANCE, f"step {t}"


@pytest.mark.parametrize("name", ["mistral_mqa_window", "gemma3_sliding", "llama4_chunked",
                                  "gpt_oss_sinks", "qwen2_moe_mask_window", "deepseek_v3_mla",
                                  "gemma2_softcap", "vaultgemma_softcap"])
@pytest.mark.parametrize("padded", [False, True])
def test_decoding_over_a_plain_cache_past_the_window_matches_eager(name, padded):
    """A hand-written decoding loop over DynamicCache() (it keeps every key, so each step's
    window, chunk and padding come from the mask): a 40-token prompt (longer than the
    windows and chunks), then 8 one-token steps, and a 4-token chunk over the cache."""
    ids = torch.randint(0, 128, (2, 52), generator=torch.Generator().manual_seed(7))
    mask = torch.ones(2, 52, dtype=torch.long)
    if padded:
        mask[0, :5] = 0
    steps = {}
    for impl in ("eager", "ringattn"):
        model, cache, out = build(name, impl), DynamicCache(), []
        with torch.no_grad():
            out.append(model(ids[:, :40], attention_mask=mask[:, :40], cache=cache).logits)
            for t in range(40, 48):
                out.append(model(ids[:, t:t + 1], attention_mask=mask[:, :t + 1],
                                 cache=cache).logits)
            out.append(model(ids[:, 48:52], attention_mask=mask, cache=cache).logits)
        steps[impl] = out
    valid = mask[:, :40, None]
    assert relative(steps["ringattn"][0] * valid, steps["eager"][0] * valid) < TOLERANCE
    for t, (got, want) in enumerate(zip(steps["ringattn"][1:], steps["eager"][1:])):
        assert relative(got, want) < TOLERANCE, f"step {t}"


def _tiny(cls_name, config_name, **extra):
    cls, config_cls = getattr(transformers, cls_name), getattr(transformers, config_name)
    torch.manual_seed(1)
    return cls._from_config(config_cls(**SMALL, **extra), attn_implementation="ringattn")


@pytest.mark.parametrize("cls_name, config_name, extra, named", [
    # Doge edits transformers' mask tensor with a learned dynamic bias.
    ("DogeForCausalLM", "DogeConfig", dict(num_key_value_heads=2),
     "attention bias in the mask tensor"),
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


def test_a_soft_cap_the_layer_holds_but_does_not_pass_is_refused_by_name():
    """A layer that holds attn_logit_softcapping and passes another softcap (or none) may cap
    its scores inside itself: refused, naming it, rather than computed without the cap."""
    q = torch.randn(1, 4, 8, 24)
    k = torch.randn(1, 2, 8, 24)
    v = torch.randn(1, 2, 8, 16)
    layer = torch.nn.Module()
    layer.attn_logit_softcapping = 30.0
    with pytest.raises(ValueError, match="'attn_logit_softcapping' = 30.0 .*softcap=None"):
        ra_hf.ringattn_attention_forward(layer, q, k, v, None)
    with pytest.raises(ValueError, match="softcap=-1.0 is not a finite cap"):
        ra_hf.ringattn_attention_forward(torch.nn.Module(), q, k, v, None, softcap=-1.0)
    out, _ = ra_hf.ringattn_attention_forward(layer, q, k, v, None, softcap=30.0)
    assert out.shape == (1, 8, 4, 16)  # v's head dim
    with pytest.raises(ValueError, match="queries have head dim 24 and its keys 16"):
        ra_hf.ringattn_attention_forward(torch.nn.Module(), q, v, v, None)


def test_a_mask_that_is_not_documents_windows_or_padding_is_refused_naming_it():
    """A 4D mask that attends a strided set of keys: not carried, and said so."""
    allowed = torch.tril(torch.ones(16, 16, dtype=torch.bool))
    allowed[:, 1::2] = False
    allowed |= torch.eye(16, dtype=torch.bool)
    q = torch.randn(1, 4, 16, 16)
    k = v = torch.randn(1, 2, 16, 16)
    with pytest.raises(ValueError, match="more than causality, a window, documents and padding"):
        ra_hf.ringattn_attention_forward(torch.nn.Module(), q, k, v, allowed[None, None])


def test_model_code_that_computes_with_the_mask_gets_eager_tensors_answer():
    """The composition the attention reads stands in for transformers' mask tensor: model code
    that compares it or computes with it (Nemotron ASR streaming's `attention_mask == 0.0`) gets
    what eager's tensor gives, not the object's own equality (one bool)."""
    from transformers.masking_utils import causal_mask_function
    padding = torch.ones(2, 8, dtype=torch.bool)  # as transformers passes it on
    padding[1, :2] = False
    spec = ra_hf._mask(2, 8, 8, mask_function=causal_mask_function, attention_mask=padding)
    assert isinstance(spec, ra_hf._MaskSpec)
    want = spec.tensor()
    for got, expected in ((spec == 0.0, want == 0.0), (spec != 0.0, want != 0.0),
                          (spec < 0, want < 0), (spec >= 0, want >= 0), (-spec, -want),
                          (spec - 1, want - 1), (1 - spec, 1 - want), (spec / 2, want / 2)):
        assert torch.equal(got, expected)
    assert torch.equal(torch.all(spec == 0.0, dim=-1), torch.all(want == 0.0, dim=-1))
    assert len({spec}) == 1  # still hashable


def test_a_relative_position_bias_in_the_mask_is_refused_by_name_not_a_crash():
    """Nemotron ASR streaming's encoder tests its mask (`== 0.0`) and passes the attention a
    relative-position bias as the mask: refused, naming it."""
    config = transformers.NemotronAsrStreamingEncoderConfig(
        hidden_size=64, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=4,
        intermediate_size=128, subsampling_conv_channels=16, num_mel_bins=16, sliding_window=16,
        default_num_lookahead_tokens=3, dropout=0.0, layerdrop=0.0, activation_dropout=0.0,
        attention_dropout=0.0)
    model = transformers.NemotronAsrStreamingEncoder._from_config(
        config, attn_implementation="ringattn").eval()
    features = torch.randn(1, 96, 16, generator=torch.Generator().manual_seed(4))
    with pytest.raises(ValueError, match="learned attention bias in the mask tensor"):
        model(features)
    with torch.no_grad(), pytest.raises(ValueError, match="additive attention bias"):
        model(features)


def test_models_over_ranks_match_eager():
    """Two processes over a gloo group (python/tests/transformers_ranks_job.py): models with
    sinks, with MLA's head dims (DeepSeek V3) and with a soft-cap (Gemma 2) on the ring and
    with Ulysses, padded and packed batches through shard_inputs, and decoding over every
    rank's cache shard (the cap in each rank's partial rows)."""
    import torch.distributed as dist
    from gloo_jobs import run_two_ranks
    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available")
    run_two_ranks(os.path.join(os.path.dirname(__file__), "transformers_ranks_job.py"), 400)
