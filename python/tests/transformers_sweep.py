"""A sweep of every transformers model family against attn_implementation="ringattn".

    .venv-torch/bin/python python/tests/transformers_sweep.py [--families REGEX] [--workers 2]

Discovers every model family of the installed transformers whose attention dispatches
through ``AttentionInterface`` (its modeling file refers to ``ALL_ATTENTION_FUNCTIONS``; read
from the source text, nothing imported eagerly), builds a tiny random model of each (its
``*ForCausalLM``, else its base model, else a model class its module exports; the next class
where the first never calls the attention) by a generic shrinking of the default config
(recursively into the sub-configs: 2 layers, hidden 64, 4 heads of 16, 2 KV heads, vocab 128,
one expert, windows and chunks of 16 kept under the sequence, no dropout; multi-head latent
attention's queries and keys of 24 against values of 16; a logit soft-cap of 1 with weights of
0.1, so that the cap changes the scores; FAMILY_CONFIG for defaults that do not build), makes
its inputs by name (input_recipes; FAMILY_INPUTS for a family whose inputs are tied to each
other or to its config; FAMILY_FORWARD for a model not run by one call, a video session's
frames in turn), and compares eager (FAMILY_REFERENCE: another implementation transformers
offers where eager is wrong, named in the row) against ringattn in float32, in eval mode, with
the same weights: every floating-point output
(logits, last_hidden_state, a VLM's nested outputs) and every parameter's gradient (of the
outputs weighted by fixed random weights), relative Frobenius error < 1e-4 (a gradient
relative to at least GRAD_FLOOR of the largest one). Where eager fails on the tiny config,
config variants are tried in turn (VARIANTS: two experts, no grouped-query attention, the
default windows, the default widths), and the row says which one ran.

A representative set of models (REPRESENTATIVE) is also run in more modes (MODES): a padded
batch (left and right padding; valid positions compared, padding weighted zero), sequences
packed through position_ids (use_cache=False), generate() (greedy, 6 tokens, with and without
left padding; tokens equal) and a decoding loop over a plain DynamicCache past the sliding
window (prefill 40, then 8 one-token steps; each step's logits).

Each case is one of

- ``exact``: the same as eager (and ringattn was called);
- ``refused``: a ValueError starting "ringattn:" naming the feature ringattn does not carry;
- ``different``: silently wrong (a failure);
- ``crash``: any other exception in the ringattn run, eager running fine, or a hang past the
  per-case timeout in the ringattn run (a failure);
- ``not built``: the tiny model or its inputs could not be made, or eager itself fails (the
  reason printed; every try in the row's detail);
- ``not applicable``: the model cannot take a custom attention implementation (it looks the
  implementation up in a fixed table of its own), ringattn was never called, or the mode does
  not apply (generation for an encoder).

Prints a table, the slowest cases and a summary; exits nonzero if any case is ``different``
or ``crash``. Cases run in worker processes (spawn), by default 2, one torch thread each.
Importable: ``run_sweep()`` returns the rows (python/tests/test_transformers_sweep.py).
RINGATTN_SWEEP_DEBUG=1 prints every failed try of the config variants and input recipes.
"""
from __future__ import annotations

import argparse
import dataclasses
import multiprocessing as mp
import os
import queue
import re
import sys
import time
import traceback

TOLERANCE = 1e-4
TIMEOUT_S = 60
# A gradient is compared relative to its norm or this fraction of the largest gradient's,
# whichever is larger: a gradient that is zero in exact arithmetic (a key bias's, as softmax
# ignores a constant per query; a one-expert router's; a q/k projection's whose only output
# token attends itself alone) holds only rounding, which has no relative error to speak of.
GRAD_FLOOR = 1e-3
# ... and a gradient eager computes as exactly zero (softmax over a single key: eager's
# backward cancels exactly, ringattn's leaves rounding) against this fraction.
ZERO_GRAD_FLOOR = 1e-2
BATCH, SEQ = 2, 48
VOCAB = 128
# Token ids the random inputs use: [FIRST_ID, VOCAB); special ids are moved below FIRST_ID.
FIRST_ID = 32
FAILURES = ("different", "crash")
RESULTS = ("exact", "refused", "different", "crash", "not built", "not applicable")


@dataclasses.dataclass
class Family:
    name: str          # the models/ directory (plus the modeling file's suffix if several)
    module: str        # transformers.models.<dir>.modeling_<x>
    classes: list      # candidate class names, best first (empty: resolved from the module)
    config: dict = dataclasses.field(default_factory=dict)  # overrides of the tiny config
    mrope: bool = False  # the modeling file reads multimodal RoPE sections (mrope_section)


@dataclasses.dataclass
class Case:
    family: Family
    mode: str = "forward"


@dataclasses.dataclass
class Row:
    family: str
    cls: str
    mode: str
    result: str
    error: float | None = None
    message: str = ""
    detail: str = ""   # a traceback, for crash rows
    seconds: float = 0.0


# ----- Discovery ---------------------------------------------------------------------------

def _names(value):
    return list(value) if isinstance(value, (list, tuple)) else [value]


def discover(pattern: str | None = None) -> list[Family]:
    """Every modeling file of the installed transformers that refers to
    ALL_ATTENTION_FUNCTIONS, with the classes to test, from the source text alone."""
    import transformers
    from transformers.models.auto.modeling_auto import (MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
                                                        MODEL_MAPPING_NAMES)
    root = os.path.join(os.path.dirname(transformers.__file__), "models")
    families = []
    for folder in sorted(os.listdir(root)):
        path = os.path.join(root, folder)
        if not os.path.isdir(path):
            continue
        files = []
        for name in sorted(os.listdir(path)):
            if not (name.startswith("modeling_") and name.endswith(".py")) or \
                    name.startswith(("modeling_tf_", "modeling_flax_")):
                continue
            with open(os.path.join(path, name), encoding="utf-8") as f:
                source = f.read()
            if "ALL_ATTENTION_FUNCTIONS" in source:
                files.append((name[:-3], set(re.findall(r"^class (\w+)\(", source, re.M)),
                              "mrope_section" in source))
        for stem, defined, mrope in files:
            family = folder
            if len(files) > 1 and stem != f"modeling_{folder}":
                family = f"{folder}/{stem[len('modeling_'):]}"
            classes = []
            for mapping in (MODEL_FOR_CAUSAL_LM_MAPPING_NAMES, MODEL_MAPPING_NAMES):
                found = [(t, n) for t, v in mapping.items() for n in _names(v) if n in defined]
                # A *ForCausalLM (a text model) before a multimodal one; the folder's own
                # model type first.
                found.sort(key=lambda tn: (not tn[1].endswith("ForCausalLM"), tn[0] != folder))
                classes += [n for _, n in found if n not in classes]
            families.append(Family(family, f"transformers.models.{folder}.{stem}", classes,
                                   dict(FAMILY_CONFIG.get(family, {})), mrope))
    if pattern:
        families = [f for f in families if re.search(pattern, f.name)]
    return families


# Config overrides a family needs beyond the generic shrinking (its default config does not
# build a model).
FAMILY_CONFIG = {
    "dbrx": dict(attn_config=dict(rope_theta=10000.0, clip_qkv=8.0)),
    "chameleon": dict(vocabulary_map={"<image>": 8}),
    "moonshine_streaming": dict(num_key_value_heads=4),
    # Hybrids whose default (or 2-layer) layout has no attention layer.
    "bamba": dict(attn_layer_indices=[1]),
    "granitemoehybrid": dict(layer_types=["linear_attention", "full_attention"]),
    "recurrent_gemma": dict(block_types=["recurrent", "attention"]),
    "layoutlmv3": dict(coordinate_size=12, shape_size=8),  # 4 * 12 + 2 * 8 = hidden 64
    "esm": dict(pad_token_id=1),
    # Two hybrid layers (they share one transformer's weights), a Mamba layer before each.
    "zamba": dict(num_hidden_layers=4, attn_layer_period=2, attn_layer_offset=1,
                  layer_types=["linear_attention", "hybrid"] * 2,
                  # its attention is over [hidden, embeddings]: 2 x 64
                  attention_hidden_size=128, attention_head_dim=32),
    # 64 / 16 windows % 4 == 0; one projector level (the default, none, builds no encoder
    # output for the decoder).
    "lw_detr": dict(backbone_config=dict(image_size=64), projector_scale_factors=[1.0]),
    "patchtsmixer": dict(self_attn=True),  # its (optional) self-attention through the interface
    "fun_asr_nano": dict(adaptor_config=dict(intermediate_size=16)),  # text hidden // 4
    "molmo2": dict(adapter_config=dict(vision_feature_layer=[-1, -2])),  # of 2 vision layers
    "informer": dict(prediction_length=8, context_length=16),
    "time_series_transformer": dict(prediction_length=8, context_length=16),
    "pix2struct": dict(initializer_range=0.02),
    "dots1": dict(n_shared_experts=1),
    # An image placeholder token (None by default) and 8 query tokens per image.
    "blip_2": dict(image_token_index=5, num_query_tokens=8),
    "instructblip": dict(image_token_index=5, num_query_tokens=8),
    "instructblipvideo": dict(video_token_index=5, num_query_tokens=8),
    "step3p7": dict(text_config=dict(sliding_window=16,
                                     layer_types=["sliding_attention", "full_attention"])),
    "cohere_compass": dict(
        layer_types=["sliding_attention", "full_attention"], sliding_window=16,
        rope_parameters={"sliding_attention": dict(rope_type="default", rope_theta=10000.0,
                                                   mrope_section=[2, 3, 3]),
                         "full_attention": None}),
    "deepseek_ocr2": dict(text_config=dict(mlp_layer_types=["dense", "sparse"])),
    "lfm2_moe": dict(layer_types=["conv", "full_attention"], num_dense_layers=1),
    "granite4_vision": dict(deepstack_layer_map=[[0, 0], [1, 1]], downsample_rate="1/2",
                            spatial_target_layers=[0, 1, 0, 1]),
    # The text's projection to the image embedding's width (EfficientNet's 320 x 2 channels);
    # one stage of the EfficientNet (a random one of 55 blocks in 7 stages decays the image to
    # zero, whose normalized embedding is NaN).
    "align": dict(projection_dim=640, vision_config=dict(
        in_channels=[32], out_channels=[320], kernel_sizes=[3], strides=[1],
        num_block_repeats=[1], expand_ratios=[1], depth_coefficient=1.0)),
    # HTSAT: a 64 x 64 spectrogram image of 16 mels (spec_size / mels = 4 crops); the last of
    # its 2 stages 32 x 2 wide (the hidden size its projection takes).
    "clap": dict(audio_config=dict(patch_embeds_hidden_size=32, spec_size=64, num_mel_bins=16)),
    "kosmos2": dict(latent_query_num=8),  # image features at 8 of the 48 text positions
    # SAM 2 at 256 pixels (its feature sizes, fixed in the config for 1024, scaled: a stride 4
    # patch embedding, then / 2 per stage; 256 / 16 for the prompt encoder); its Hiera backbone
    # at its default widths (the stages' own lists), one block per stage but two in the third,
    # whose second is the global one (a stage's first block pools its queries: no global).
    "sam2": dict(
        vision_config=dict(backbone_config=dict(hidden_size=96, image_size=[256, 256],
                                                blocks_per_stage=[1, 1, 2, 1],
                                                global_attention_blocks=[3]),
                           backbone_feature_sizes=[[64, 64], [32, 32], [16, 16]]),
        prompt_encoder_config=dict(image_size=256, patch_size=16)),
    # SAM 3's tracker at 32 pixels: a 4 x 4 ViT grid of windows of 2, its FPN's 4, 2, 1 x
    # scales (the feature sizes, fixed in the config for 1152 pixels).
    "sam3_tracker": dict(vision_config=dict(backbone_config=dict(window_size=2),
                                            backbone_feature_sizes=[[16, 16], [8, 8], [4, 4]])),
    # EdgeTAM at 256 pixels, as SAM 2: its timm RepViT backbone as its checkpoints name it (the
    # default config's misspelt key leaves a ResNet-50) with every stage's features out (the
    # default's model_args, which the shrunk config would revert to none), their sizes scaled.
    "edgetam": dict(
        vision_config=dict(backbone_config=dict(
            architecture="repvit_m1",
            model_args=dict(in_chans=3, features_only=True, out_indices=[0, 1, 2, 3])),
            backbone_feature_sizes=[[64, 64], [32, 32], [16, 16]]),
        prompt_encoder_config=dict(image_size=256, patch_size=16)),
    # ESMFold 2's folding trunk (its forward; the diffusion sampler runs only in fold()): the
    # single inputs' width from the atom encoder's (64) plus two residue one-hots and the
    # profile (2 x 33 + 1); a 3D RoPE of 3 x 2 spatial and 2 UID pairs in a head of 16 (10 UID
    # pairs by default, for 128 wide heads); one recycling loop over 2 pair layers (10 over 24);
    # the atom features' width derived from their one-hots (not a width to shrink).
    "esmfold2": dict(
        single_inputs_size=64 + 2 * 33 + 1, num_loops=1, folding_trunk_num_hidden_layers=2,
        atom_feature_dim=None,
        pair_transition_intermediate_size=128,
        atom_encoder=dict(num_uid_rope_pairs=2),
        structure_head=dict(diffusion_module=dict(atom_encoder=dict(num_uid_rope_pairs=2)))),
    # Muse Glimmer's vision windows of 4 x 4 patches (its position table's side; 32 by default,
    # which an 8 x 8 grid never reaches); its adapter takes 2 x 2 merged patches, 4 x 64 wide.
    "muse_glimmer": dict(out_hidden_size=4 * 64,
                         vision_config=dict(pos_emb_height=4, pos_emb_width=4)),
    # Its speech encoders' values have as many heads as the queries (only the keys are grouped,
    # which eager's repeat_kv does not follow): no grouped keys there. Its Nemotron-H text
    # model's router takes the top 2 experts of a group (two, both chosen), and its 2 key/value
    # heads are the text sub-config's own (the class default, 8, would come back where the
    # shrunk value equals the sub-config's).
    "nemotron3_5_transcribe": dict(
        text_config=dict(n_routed_experts=2, num_experts_per_tok=2, num_key_value_heads=2),
        audio_config=dict(asr_config=dict(num_key_value_heads=4),
                          diarization_config=dict(audio_config=dict(num_key_value_heads=4))),
        word_timestamp_config=dict(num_key_value_heads=4)),
    # The quantizer's width: the acoustic and the semantic hidden sizes together (2 x 64). The
    # semantic w2v-BERT encoder with rotary positions: its default relative-key bias is refused
    # (the wav2vec2_bert row), which would leave the codec's own attention untried.
    "neucodec": dict(quantization_dim=128,
                     semantic_model_config=dict(position_embeddings_type="rotary")),
    "xcodec2": dict(quantization_dim=128,
                    semantic_model_config=dict(position_embeddings_type="rotary")),
    # Multimodal RoPE sections whose height and width parts are as wide (Ernie interleaves
    # them), for head dim 16.
    "ernie4_5_vl_moe": dict(text_config=dict(rope_parameters=dict(
        rope_type="default", rope_theta=500000.0, mrope_section=[3, 3, 2]))),
    # The queries join (and the masked attention starts) in the last of the 2 layers, not 4
    # layers before the end (which 2 layers never reach, leaving the queries out).
    "eomt": dict(num_blocks=1),
    "eomt_dinov3": dict(num_blocks=1),
    # The decoder's cross-attention: 4 heads of 16 over 2 key/value heads (16 of 64 by default:
    # widths the generic shrinking does not know).
    "dia": dict(decoder_config=dict(cross_num_attention_heads=4, cross_num_key_value_heads=2,
                                    cross_head_dim=16)),
    "qwen4_exp": dict(indexer_n_heads=4, indexer_kv_heads=1, indexer_head_dim=16,
                      indexer_budget=32, indexer_compress_ratio=4),
}

# The video models as SAM 2 (EdgeTAM's video model too: its default backbone is SAM 2's
# Hiera), with the memory attention's RoPE grid (fixed in the config for the full-size image)
# at the image's stride 16 features. Their memory attention reads memories 64 wide whatever
# the config says, and an object pointer (hidden size wide) is split into memory tokens only
# where it is wider: the "default widths" variant builds them.
FAMILY_CONFIG["sam2_video"] = FAMILY_CONFIG["edgetam_video"] = dict(
    FAMILY_CONFIG["sam2"], image_size=256, memory_attention_rope_feat_sizes=[16, 16])
# (SAM 3's tracker derives the feature sizes and the RoPE grid from its image size.)
FAMILY_CONFIG["sam3_tracker_video"] = dict(FAMILY_CONFIG["sam3_tracker"], image_size=32)

# The representative set, run in every mode: (family, class, config overrides).
REPRESENTATIVE = [
    ("llama", "LlamaForCausalLM", {}),
    ("mistral", "MistralForCausalLM", dict(sliding_window=16)),
    ("gemma3", "Gemma3ForCausalLM",
     dict(sliding_window=16, layer_types=["sliding_attention", "full_attention"])),
    ("qwen2_moe", "Qwen2MoeForCausalLM",
     dict(use_sliding_window=True, sliding_window=16, max_window_layers=2)),
    ("llama4", "Llama4ForCausalLM", dict(attention_chunk_size=16)),
    ("gpt_oss", "GptOssForCausalLM", dict(sliding_window=16)),
    # Logit soft-capping on sliding and full layers; multi-head latent attention (values of
    # their own head dim).
    ("gemma2", "Gemma2ForCausalLM",
     dict(sliding_window=16, layer_types=["sliding_attention", "full_attention"])),
    ("deepseek_v3", "DeepseekV3ForCausalLM", {}),
    ("modernbert", "ModernBertModel", dict(local_attention=16, global_attn_every_n_layers=2)),
    ("bert", "BertModel", {}),
]
MODES = ("padded-left", "padded-right", "packed", "generate", "generate-left-padded",
         "decode-cache")


def representative_cases() -> list[Case]:
    cases = []
    for family, cls, overrides in REPRESENTATIVE:
        fam = Family(family, "", [cls], overrides)
        cases += [Case(fam, mode) for mode in MODES]
    return cases


# ----- Tiny configs ------------------------------------------------------------------------

_LAYERS = {"num_hidden_layers", "num_layers", "n_layer", "n_layers", "encoder_layers",
           "decoder_layers", "num_encoder_layers", "num_decoder_layers", "decoder_num_layers",
           "decoder_num_hidden_layers", "depth", "num_text_layers", "num_vision_layers",
           "text_num_hidden_layers", "vision_num_hidden_layers", "encoder_num_hidden_layers"}
_HEADS = {"num_attention_heads", "n_head", "n_heads", "num_heads", "encoder_attention_heads",
          "decoder_attention_heads", "attention_heads", "decoder_num_attention_heads",
          "encoder_num_attention_heads", "swa_num_attention_heads"}
_KV_HEADS = {"num_key_value_heads", "num_kv_heads", "n_kv_heads", "n_head_kv",
             "swa_num_key_value_heads", "num_key_value_groups_"}
_HEAD_DIM = {"head_dim", "attention_head_dim", "dim_head", "kv_channels", "swa_head_dim",
             "attention_head_size", "v_head_dim", "index_head_dim"}
_INTERMEDIATE = {"intermediate_size", "ffn_dim", "encoder_ffn_dim", "decoder_ffn_dim", "n_inner",
                 "moe_intermediate_size", "shared_expert_intermediate_size", "mlp_dim",
                 "decoder_intermediate_size", "shared_intermediate_size", "ffn_hidden_size",
                 "expert_intermediate_size", "dense_intermediate_size"}
_EXPERTS = {"num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts",
            "num_routed_experts", "n_experts"}
_EXPERTS_PER_TOKEN = {"num_experts_per_tok", "moe_topk", "num_experts_per_token", "top_k", "moe_k",
                      "top_k_experts",
                      "n_group", "topk_group", "moe_top_k", "num_selected_experts"}
_POSITIONS = {"max_position_embeddings", "n_positions", "max_target_positions",
              "max_sequence_length", "max_seq_len", "seq_length", "n_ctx"}
_WINDOWS = {"sliding_window", "sliding_window_size", "local_attention", "attention_window",
            "window"}
_CHUNKS = {"attention_chunk_size"}
# Integer fields that are widths of the model (kept consistent between sub-configs by making
# them all the hidden size).
_WIDTH = re.compile(r"^hidden_size_global$|"
                    r"(^|_)(hidden_size|d_model|n_embd|embed_dim|hidden_dim|emb_dim|dim|"
                    r"embedding_size|embedding_dim|out_hidden_size|projection_dim|"
                    r"text_hidden_size|vision_hidden_size|audio_hidden_size|output_dim|"
                    r"projector_hidden_size|kv_lora_rank|q_lora_rank|d_kv|hidden_dim|codebook_dim|"
                    r"vector_quantization_hidden_dimension)$")


class _Ids:
    """Special token ids remapped below FIRST_ID, the same original id to the same new id
    across the config tree."""

    def __init__(self):
        self.map = {}
        self.next = 3

    def __call__(self, value):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            return value
        if value < FIRST_ID:
            return value
        if value not in self.map:
            while self.next in self.map.values() or self.next in (0, 1, 2):
                self.next += 1
            self.map[value] = min(self.next, FIRST_ID - 1)
            self.next += 1
        return self.map[value]


def _is_token_key(key):
    return (key.endswith("_token_id") or key.endswith("_token_index") or
            key.endswith("_token_ids") or key in ("pad_token_id", "bos_token_id", "eos_token_id",
                                                    "decoder_start_token_id", "sep_token_id",
                                                    "cls_token_id", "mask_token_id",
                                                    "image_token_id", "video_token_id"))


def _layer_keep(layer_types, count):
    """Indices of the layers kept: the first of each kind of layer (in order), at least 2."""
    keep = []
    seen = set()
    for i, kind in enumerate(layer_types):
        key = repr(kind)
        if key not in seen:
            seen.add(key)
            keep.append(i)
    for i in range(count):
        if len(keep) >= 2:
            break
        if i not in keep:
            keep.append(i)
    return sorted(keep)


# The config variants tried in turn until eager runs (tiny_config).
VARIANTS = ("", "two experts", "no grouped-query attention", "default windows", "default widths")

# Variant 2 (default widths) is not tried for a model larger than this (seconds, memory).
MAX_PARAMETERS = 60_000_000

# Fields the "default widths" variant keeps (widths, heads).
_WIDTH_LIKE = _HEADS | _KV_HEADS | _HEAD_DIM | _INTERMEDIATE | {
    "qk_rope_head_dim", "qk_nope_head_dim", "qk_head_dim", "rotary_dim"}

# Fields a config may leave None that a model needs set (a default config that does not build).
_NONE_FILLED = {"vocab_size": VOCAB, **{k: 2 for k in _KV_HEADS}, **{k: 1 for k in _EXPERTS},
                **{k: 128 for k in _INTERMEDIATE},
                **{k: 1 for k in _EXPERTS_PER_TOKEN if k not in ("n_group", "topk_group")}}


def _shrink_value(key, value, ids):
    """The tiny value of one scalar config field, or the value itself."""
    if value is None:
        return _NONE_FILLED.get(key)
    if isinstance(value, bool):
        return value
    if _is_token_key(key):
        if isinstance(value, (list, tuple)):
            return type(value)(ids(v) for v in value)
        return ids(value)
    if isinstance(value, float):
        if "dropout" in key or "pdrop" in key or key.endswith("layerdrop") or \
                key in ("drop_path_rate", "attention_probs_dropout_prob",
                        "hidden_dropout_prob", "router_jitter_noise", "jitter_noise",
                        "router_z_loss_coef", "stochastic_depth_rate", "drop_rate",
                        "mask_time_prob", "mask_feature_prob",
                        # an expert capacity from the tokens (NLLB-MoE): expert_capacity holds
                        "moe_eval_capacity_token_fraction"):
            return 0.0
        return value
    if not isinstance(value, int):
        return value
    if key in _LAYERS:
        return min(value, 2)
    if key in _HEADS:
        return min(value, 4)
    if key in _KV_HEADS:
        return 1 if value <= 1 else 2
    for keys, tiny in ((_HEAD_DIM, 16), (_INTERMEDIATE, 128), (_EXPERTS, 1),
                       (_EXPERTS_PER_TOKEN, 1)):
        if key in keys:
            return tiny if value > 0 else value
    if key == "vocab_size" or (key.endswith("_vocab_size") or key.endswith("_vocab")) and \
            value > VOCAB:
        return VOCAB if value > 0 else value
    if key in _POSITIONS:
        return 256 if value > 256 else value
    if key in _WINDOWS or key in _CHUNKS:
        return 16 if value > 0 else value
    if key in ("qk_rope_head_dim", "qk_nope_head_dim"):
        return 8 if value > 0 else value
    if key == "qk_head_dim":
        return 16
    if key in ("rotary_dim", "rotary_emb_dim", "rope_dim"):
        return 8 if value > 8 else value
    if key == "max_window_layers":
        return 1
    if key in ("first_k_dense_replace", "decoder_sparse_step", "interleave_moe_layer_step",
               "moe_layer_freq", "global_attn_every_n_layers", "sliding_window_pattern",
               "full_attention_interval", "attn_layer_period"):
        return min(value, 2) if key != "first_k_dense_replace" else min(value, 1)
    if key == "attn_layer_offset":
        return min(value, 1)
    if key == "image_size":
        return 32
    if key == "patch_size":
        return 8 if value > 8 else value
    if key == "max_source_positions":
        return 32
    if key == "expert_capacity":
        return max(value, 4096)  # no token dropped by a full expert (a routing decision)
    if key in ("num_queries", "two_stage_num_proposals"):
        return min(value, 8)
    if key in ("context_length", "prediction_length") and value > 32:
        return 32
    if _WIDTH.search(key):
        return 64 if value > 64 else value
    return value


def _fields(config):
    """The config's own fields: its dataclass fields, else its __dict__ minus privates."""
    try:
        names = [f.name for f in dataclasses.fields(config)]
    except TypeError:
        names = list(vars(config))
    return [n for n in names if not n.startswith("_")]


def _get(config, key, default=None):
    """A config field, a per-layer one of a heterogeneous config included."""
    getter = getattr(config, "_getattr_without_heterogeneous_validation", None)
    try:
        return getter(key, default) if getter else getattr(config, key, default)
    except Exception:  # noqa: BLE001
        return default


def tiny_config(config_cls, overrides=None, variant="", ids=None, base=None, mrope=False):
    """A tiny config of `config_cls`: its default, shrunk field by field, rebuilt through the
    class (so that derived fields follow), sub-configs shrunk recursively. `variant` (one of
    VARIANTS): "" has one expert; "two experts" two, both chosen for every token (for routers
    that need two); "no grouped-query attention" as many key/value heads as heads (a model
    that does not repeat them); "default windows" the default windows and chunks (a model whose
    eager fails with a window under the sequence); "default widths" the default widths and
    heads (a model whose widths are tied in ways the generic shrinking does not see), with
    fewer layers still."""
    from transformers import PreTrainedConfig
    ids = ids or _Ids()
    base = config_cls() if base is None else base
    overrides = dict(overrides or {})
    if _get(base, "stage_names") is not None and _get(base, "depths") is not None:
        # A backbone of stages (ResNet, HGNetV2, Swin...): its stages' lists are tied to the
        # heads that read them; kept as they are, but for fewer blocks per stage.
        kwargs = {}
        for key in _fields(base):
            value = _get(base, key)
            if isinstance(value, float) and _shrink_value(key, value, ids) != value:
                value = 0.0
            if key != "stage_names":
                kwargs[key] = value
        kwargs.pop("_out_features", None)
        kwargs["out_indices"] = list(_get(base, "out_indices") or [])
        kwargs.pop("_out_indices", None)
        kwargs["depths"] = [1] * len(_get(base, "depths"))
        kwargs.update(overrides)
        config = _construct(config_cls, kwargs, base)
        config.dtype = "float32"
        return config
    kwargs = {}
    fields = _fields(base)
    sub_configs = getattr(base, "sub_configs", {}) or {}
    layer_key = next((k for k in ("num_hidden_layers", "num_layers", "n_layer", "n_layers")
                      if isinstance(_get(base, k), int) and not isinstance(_get(base, k), bool)),
                     None)
    layers = _get(base, layer_key) if layer_key else None
    keep = None
    layer_types = _get(base, "layer_types")
    if "layer_types" not in overrides and isinstance(layer_types, (list, tuple)) and layers and \
            len(layer_types) == layers:
        keep = _layer_keep(layer_types, layers)
    elif layers:
        keep = list(range(min(layers, 2)))
    for key in fields:
        value = _get(base, key)
        if key in overrides and not (isinstance(value, PreTrainedConfig) and
                                     isinstance(overrides[key], dict)):
            continue
        if isinstance(value, PreTrainedConfig) and value.model_type == "timm_backbone":
            kwargs[key] = _resnet_backbone(value)  # timm is not a dependency
            continue
        if isinstance(value, PreTrainedConfig):
            kwargs[key] = tiny_config(type(value), overrides.pop(key, None) or {}, variant, ids,
                                      value, mrope)
            continue
        if key in sub_configs and isinstance(value, dict):
            sub = _config_from_dict(sub_configs[key], value)  # a sub-config kept as a dict
            if sub is not None:
                kwargs[key] = tiny_config(type(sub), overrides.pop(key, None) or {}, variant,
                                          ids, sub, mrope)
            continue
        if isinstance(value, (list, tuple)) and keep is not None and layers and \
                len(value) == layers and layers > 1 and not _is_token_key(key):
            kwargs[key] = [value[i] for i in keep]
            continue
        if key == "image_size" and isinstance(value, (list, tuple)) and len(value) == 2 and \
                all(isinstance(v, int) for v in value):
            kwargs[key] = type(value)((32, 32))
            continue
        if isinstance(value, dict) and key in ("rope_parameters", "rope_scaling"):
            kwargs[key] = _shrink_rope(value, base)
            continue
        shrunk = _shrink_value(key, value, ids)
        if variant == "default widths" and (key in _WIDTH_LIKE or _WIDTH.search(key)) and \
                value is not None:
            shrunk = value  # widths kept: a model whose many widths are tied together
        if variant == "default windows" and (key in _WINDOWS or key in _CHUNKS):
            shrunk = value  # a model whose eager fails with a window under the sequence
        if variant == "two experts" and (key in _EXPERTS or key in _EXPERTS_PER_TOKEN and
                             key not in ("n_group", "topk_group")) and \
                isinstance(shrunk, int) and not isinstance(shrunk, bool) and shrunk >= 1 and \
                (value is None or value > 1):
            shrunk = 2
        if shrunk is not value:
            kwargs[key] = shrunk
    if keep is not None and layer_key:
        attribute_map = getattr(base, "attribute_map", {}) or {}
        kwargs[attribute_map.get(layer_key, layer_key)] = len(keep)
    hidden = _get(base, "hidden_size")
    if isinstance(hidden, int) and hidden > 64 and kwargs.get("hidden_size") == 64 and \
            variant != "default widths":
        # Fields the default ties to the hidden size (groups, widths of other parts).
        for key in fields:
            value = _get(base, key)
            if key not in kwargs and key not in overrides and value == hidden and \
                    isinstance(value, int) and not isinstance(value, bool) and \
                    not _is_token_key(key) and key not in _POSITIONS:
                kwargs[key] = 64
    if "head_dim" in fields and _get(base, "head_dim") is None and variant != "default widths":
        kwargs["head_dim"] = 16
    mla = (_get(base, "kv_lora_rank") or 0) > 0 or (_get(base, "qk_rope_head_dim") or 0) > 0
    if (mla or variant == "no grouped-query attention") and variant != "default widths":
        # Multi-head latent attention (or a model without grouped-query attention): keys and
        # values have as many heads as the queries.
        for key in _KV_HEADS:
            if key in kwargs or key in fields and _get(base, key) is not None:
                kwargs[key] = 4
    if mla and variant != "default widths" and "head_dim" in fields and \
            _get(base, "head_dim") == _get(base, "qk_rope_head_dim"):
        kwargs["head_dim"] = 8  # MLA: the rotary part's dim is the head dim
    if mla and variant != "default widths" and (_get(base, "qk_nope_head_dim") or 0) > 0 and \
            (_get(base, "v_head_dim") or 0) > 0:
        # MLA's values have a head dim of their own: queries and keys of 24 (16 + 8 rotary)
        # against values of 16, as DeepSeek's 192 against 128 (the generic shrinking would
        # make them equal, and the sweep would not see the values' head dim).
        kwargs["qk_nope_head_dim"] = 16
        rope_dim = kwargs.get("qk_rope_head_dim", _get(base, "qk_rope_head_dim"))
        if "qk_head_dim" in fields:
            kwargs["qk_head_dim"] = 16 + rope_dim
        rope = kwargs.get("rope_parameters")
        if isinstance(rope, dict) and "partial_rotary_factor" in rope:
            # The rotary part of the queries' and keys' head dim (Mistral 4 reads it).
            kwargs["rope_parameters"] = dict(rope, partial_rotary_factor=rope_dim / (16 + rope_dim))
    if (_get(base, "attn_logit_softcapping") or 0) > 0:
        # A logit soft-cap that a tiny model's scores reach: 1, with weights of 0.1 (the
        # default cap, 50, changes nothing at weights of 0.02: the sweep would not see it).
        kwargs["attn_logit_softcapping"] = 1.0
        if "initializer_range" in fields:
            kwargs["initializer_range"] = 0.1
    kept_types = kwargs.get("layer_types") or overrides.get("layer_types") or []
    if "sliding_window" in fields and not _get(base, "sliding_window") and \
            "sliding_window" not in overrides and \
            any("sliding" in str(t) for t in kept_types):
        kwargs["sliding_window"] = 16  # sliding layers with no window set
    if "use_sliding_window" in fields and _get(base, "use_sliding_window") is False:
        kwargs["use_sliding_window"] = True
        if not _get(base, "sliding_window"):
            kwargs["sliding_window"] = 16
    if _get(base, "use_timm_backbone"):
        kwargs["use_timm_backbone"] = False  # timm is not a dependency
    if _get(base, "mlp_only_layers"):
        kwargs["mlp_only_layers"] = []
    if (_get(base, "num_kv_shared_layers") or 0) > 0:
        kwargs["num_kv_shared_layers"] = 0
    spec = base.__dict__.get("_heterogeneity_spec")
    if spec is not None and keep is not None and "per_layer_config" not in overrides:
        # Per-layer fields (a heterogeneous config): those of the layers kept, shrunk.
        def per_layer(k, v):
            if mla and k in _KV_HEADS and v is not None:
                return 4  # as the global one (multi-head latent attention)
            return _shrink_value(k, v, ids)
        kwargs["per_layer_config"] = {
            new: {k: per_layer(k, v) for k, v in spec.per_layer_overrides[old].items()}
            for new, old in enumerate(keep) if spec.per_layer_overrides.get(old)}
    if mrope and "rope_parameters" in fields and "rope_parameters" not in overrides:
        kwargs["rope_parameters"] = _with_mrope(kwargs.get("rope_parameters") or
                                                _get(base, "rope_parameters"), base)
    kwargs.update(overrides)
    for key in list(kwargs):
        if key not in fields and key not in overrides and key != "per_layer_config":
            kwargs.pop(key)
    config = _construct(config_cls, kwargs, base)
    config.dtype = "float32"
    return config


def _config_from_dict(config_cls, value):
    """A sub-config a config keeps as a dict, as a config (None where it cannot say which)."""
    from transformers import PreTrainedConfig
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING
    try:
        if "model_type" in value and value["model_type"] in CONFIG_MAPPING:
            config_cls = CONFIG_MAPPING[value["model_type"]]
        if not (isinstance(config_cls, type) and issubclass(config_cls, PreTrainedConfig)) or \
                config_cls is PreTrainedConfig:
            return None
        return config_cls(**{k: v for k, v in value.items() if k != "model_type"})
    except Exception:  # noqa: BLE001
        return None


def _shrink_rope(rope, base):
    """RoPE parameters for head_dim 16: multimodal sections scaled with the head dim."""
    rope = dict(rope)
    section = rope.get("mrope_section")
    if isinstance(section, (list, tuple)) and section:
        head_dim = _get(base, "qk_rope_head_dim") or _get(base, "head_dim") or (
            (_get(base, "hidden_size") or 0) // max(1, _get(base, "num_attention_heads") or 1))
        total = sum(section)
        tiny = 8 if _get(base, "qk_rope_head_dim") else 16
        target = max(len(section), round(total * tiny / head_dim)) if head_dim else tiny // 2
        new = [max(1, int(s * target / total)) for s in section]
        new[0] += target - sum(new)
        rope["mrope_section"] = new
    for key in ("sliding_attention", "full_attention", "chunked_attention"):
        if isinstance(rope.get(key), dict):
            rope[key] = _shrink_rope(rope[key], base)
    return rope


def _resnet_backbone(timm_config):
    """A tiny ResNet backbone in place of a timm one, with the same stages out."""
    from transformers import ResNetConfig
    indices = list(getattr(timm_config, "out_indices", None) or [1, 2, 3, 4])
    return ResNetConfig(embedding_size=16, hidden_sizes=[16, 32, 64, 64], depths=[1, 1, 1, 1],
                        out_indices=indices, num_channels=timm_config.num_channels)


def _with_mrope(rope, base):
    """RoPE parameters with multimodal sections (mrope_section) for head_dim 16, where the
    modeling file reads them (its default sections are for the full-size head dim)."""
    rope = dict(rope or {"rope_type": "default", "rope_theta": 10000.0})
    if any(isinstance(v, dict) for v in rope.values()):
        return {k: _with_mrope(v, base) if isinstance(v, dict) else v for k, v in rope.items()}
    if "mrope_section" not in rope:
        factor = rope.get("partial_rotary_factor") or _get(base, "partial_rotary_factor") or 1.0
        rotary = 8 if _get(base, "qk_rope_head_dim") else 16  # MLA: the rotary part's dim
        half = max(3, int(rotary * factor) // 2)
        rope["mrope_section"] = [half - 2 * (half // 3), half // 3, half // 3]
    return rope


_CORE = {"hidden_size", "num_attention_heads", "num_hidden_layers", "head_dim",
         "intermediate_size", "vocab_size"}


def _construct(config_cls, kwargs, base):
    """config_cls(**kwargs); where the class rejects them, named fields are given up one at a
    time (key/value heads first made equal to the heads, then fields other than the core
    sizes dropped, then those) until it accepts them."""
    last = None
    kwargs = dict(kwargs)
    for _ in range(10):
        try:
            return config_cls(**kwargs)
        except Exception as e:  # noqa: BLE001  a derived field out of line
            last = e
            text = str(e) + " " + str(getattr(e, "__cause__", "") or "")
            named = [k for k in kwargs if re.search(rf"\b{re.escape(k)}\b", text)]
            heads = kwargs.get("num_attention_heads", 4)
            kv = [k for k in named if k in _KV_HEADS and kwargs[k] != heads]
            if kv:
                kwargs[kv[0]] = heads  # a model without grouped-query attention
                continue
            named.sort(key=lambda k: k in _CORE)
            if not named:
                raise
            if os.environ.get("RINGATTN_SWEEP_DEBUG"):
                print(f"{config_cls.__name__}: dropping {named[0]}: {text[:300]}")
            kwargs.pop(named[0])
    raise last


# ----- Inputs ------------------------------------------------------------------------------

def _find(config, *keys, default=None):
    """The first of `keys` set in the config or its sub-configs (breadth first)."""
    todo = [config]
    while todo:
        c = todo.pop(0)
        for key in keys:
            value = getattr(c, key, None)
            if value is not None:
                return value
        for name in getattr(c, "sub_configs", {}) or {}:
            sub = getattr(c, name, None)
            if sub is not None:
                todo.append(sub)
    return default


def _image_tokens(config):
    """(image token id, tokens per image) of a VLM whose input ids hold placeholders for the
    image features, or None."""
    token = _find(config, "image_token_id", "image_token_index", "video_token_index")
    count = _find(config, "num_query_tokens", "image_seq_length", "mm_tokens_per_image")
    if isinstance(token, int) and isinstance(count, int) and 0 < count < SEQ - 8:
        return token, count
    return None


def _image_config(config):
    for name in ("vision_config", "image_config", "backbone_config"):
        sub = getattr(config, name, None)
        if sub is not None and not isinstance(sub, dict):
            return sub
    return config


# Inputs the sweep knows how to make, by name.
_KNOWN_INPUTS = ("input_ids", "pixel_values", "pixel_values_videos", "input_features",
                 "input_values", "past_values", "decoder_input_ids", "qformer_input_ids",
                 "mm_token_type_ids", "token_type_ids", "bbox", "states", "actions", "rewards",
                 "returns_to_go", "timesteps")


def input_recipes(model, config, family=None):
    """The ways of making the model's inputs, tried in order until eager runs: the family's
    own inputs (FAMILY_INPUTS) alone where it has them, else the main input (and the required
    ones) as they come, in other layouts, and with the other inputs the model takes (a dual
    encoder's pixels, every input the sweep can make)."""
    import inspect
    if family in FAMILY_INPUTS:
        return [dict(family=family, extra=())]
    params = inspect.signature(model.forward).parameters
    main = model.main_input_name
    takes = {main} | set(params)
    layouts = [{}]
    if "input_features" in takes:
        layouts += [dict(features="time-major"), dict(features="4d")]
    if {"pixel_values", "pixel_values_videos"} & takes:
        layouts.append(dict(pixels="5d"))
        if _find(config, "image_size") is None:
            layouts += [dict(pixels="text line"), dict(pixels="tall text line")]  # PP-OCR
    if "input_values" in takes:
        layouts += [dict(values="spectrogram"), dict(values="channels")]
    if main == "past_values":
        layouts.append(dict(series="3d"))
    if main == "input_ids" and _find(config, "num_codebooks"):
        layouts.append(dict(codebooks=True))
    extras = [()]
    if main != "pixel_values" and "pixel_values" in params:
        extras.append(("pixel_values",))  # a dual encoder (CLIP) needs both
    if "input_ids" in takes and {"pixel_values", "pixel_values_videos"} & takes and \
            _image_tokens(config):
        layouts.append(dict(image_tokens=True))  # a VLM's placeholders for the image
        if main in ("pixel_values", "pixel_values_videos"):
            layouts.append(dict(image_tokens=True, pixels="5d"))
    accepted = tuple(n for n in _KNOWN_INPUTS if n in params and n != main)
    if accepted and accepted not in extras:
        extras.append(accepted)
    recipes = [dict(layout, extra=extra) for extra in extras for layout in layouts]
    if "use_cache" in params:
        recipes.append(dict(no_cache=True, extra=()))  # a model whose cache does not build
    return recipes


def make_inputs(model, config, recipe=None, batch=BATCH, seq=SEQ, seed=2):
    """The model's inputs by its main_input_name, plus the required ones it also takes, made
    as `recipe` (input_recipes) says."""
    import inspect

    import torch
    recipe = recipe or {}
    g = torch.Generator().manual_seed(seed)
    main = model.main_input_name
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    vocab = min(getattr(text, "vocab_size", None) or VOCAB, VOCAB)
    positions = getattr(text, "max_position_embeddings", None)
    if isinstance(positions, int) and 0 < positions < seq:
        seq = positions  # a text encoder of few positions (OWL-ViT's 16)

    def ids():
        rows = batch * (_find(config, "num_codebooks") if recipe.get("codebooks") else 1)
        out = torch.randint(FIRST_ID, max(vocab, FIRST_ID + 1), (rows, seq), generator=g)
        if recipe.get("image_tokens"):
            token, count = _image_tokens(config)
            out[:, 1:1 + count] = token
        return out

    def pixels():
        vision = _image_config(config)
        size = getattr(vision, "image_size", None) or 32
        if isinstance(size, (list, tuple)):
            h, w = size[0], size[-1]
        elif isinstance(size, dict):
            h, w = size.get("height", 32), size.get("width", 32)
        else:
            h = w = size
        channels = getattr(vision, "num_channels", None) or 3
        if recipe.get("pixels") in ("text line", "tall text line"):
            h, w = (48 if recipe["pixels"] == "text line" else 96), 320
        if recipe.get("pixels") == "5d" or main == "pixel_values_videos":
            frames = _find(config, "num_frames", default=2) or 2
            return torch.randn(batch, frames, channels, h, w, generator=g)
        return torch.randn(batch, channels, h, w, generator=g)

    def features():
        mels = _find(config, "num_mel_bins", "feature_size", "input_feat_size", "input_dim",
                     default=80)
        frames = 2 * (_find(config, "max_source_positions", default=32) or 32)
        x = torch.randn(batch, mels, frames, generator=g)
        if recipe.get("features") == "time-major":
            return x.transpose(1, 2).contiguous()
        if recipe.get("features") == "4d":
            return x.transpose(1, 2)[:, None].contiguous()
        return x

    def values():
        if recipe.get("values") == "spectrogram":
            mels = _find(config, "num_mel_bins", default=128)
            frames = _find(config, "max_length", default=64)
            return torch.randn(batch, frames, mels, generator=g)
        if recipe.get("values") == "channels":
            return torch.randn(batch, _find(config, "audio_channels", default=1) or 1, 4000,
                               generator=g)
        return torch.randn(batch, 4000, generator=g)

    def past_values():
        length = _find(config, "context_length", default=32) or 32
        channels = _find(config, "num_input_channels", default=1) or 1
        three_d = channels > 1 or recipe.get("series") == "3d"
        shape = (batch, length, channels) if three_d else (batch, length)
        return torch.randn(*shape, generator=g)

    def bbox():
        corners = torch.randint(0, 500, (batch, seq, 2, 2), generator=g)
        return torch.cat([corners.min(2).values, corners.max(2).values], -1)

    def series(name):
        """A time-series transformer's inputs (Informer, TimeSeriesTransformer)."""
        context = _find(config, "context_length", default=16) or 16
        lags = max(_find(config, "lags_sequence", default=[1]) or [1])
        past, future = context + lags, _find(config, "prediction_length", default=8) or 8
        features = (_find(config, "num_time_features", default=0) or 0) + \
            (_find(config, "num_dynamic_real_features", default=0) or 0)
        size = _find(config, "input_size", default=1) or 1
        shape = (lambda n: (batch, n)) if size == 1 else (lambda n: (batch, n, size))
        return {"past_values": lambda: torch.randn(*shape(past), generator=g),
                "past_observed_mask": lambda: torch.ones(*shape(past)),
                "past_time_features": lambda: torch.randn(batch, past, features, generator=g),
                "future_values": lambda: torch.randn(*shape(future), generator=g),
                "future_time_features": lambda: torch.randn(batch, future, features,
                                                            generator=g)}[name]()

    def trajectory(name):
        """A decision transformer's inputs."""
        width = {"states": _find(config, "state_dim", default=4),
                 "actions": _find(config, "act_dim", default=4), "rewards": 1,
                 "returns_to_go": 1}
        if name == "timesteps":
            return torch.arange(seq).expand(batch, seq).contiguous()
        return torch.randn(batch, seq, width[name], generator=g)

    time_series = _find(config, "prediction_length") is not None and \
        _find(config, "lags_sequence") is not None
    makers = {"bbox": bbox, "token_index": ids,
              **{n: (lambda n=n: trajectory(n)) for n in ("states", "actions", "rewards",
                                                          "returns_to_go", "timesteps")},
              "past_values_padding": lambda: torch.zeros(batch, _find(
                  config, "context_length", default=32) or 32),
              "freq": lambda: torch.zeros(batch, 1, dtype=torch.long),
              "input_ids": ids, "decoder_input_ids": ids, "qformer_input_ids": ids,
              "labels": ids, "pixel_values": pixels, "pixel_values_videos": pixels,
              "input_features": features, "input_values": values, "past_values": past_values,
              "mm_token_type_ids": lambda: torch.zeros(batch, seq, dtype=torch.long),
              "token_type_ids": lambda: torch.zeros(batch, seq, dtype=torch.long)}
    if time_series:
        makers.update({n: (lambda n=n: series(n)) for n in (
            "past_values", "past_observed_mask", "past_time_features", "future_values",
            "future_time_features")})
    if recipe.get("family"):
        return FAMILY_INPUTS[recipe["family"]](
            _Make(makers, config, g, batch, seq, main))
    if main not in makers:
        raise NotImplementedError(f"main input {main!r}")
    params = inspect.signature(model.forward).parameters
    wanted = [main] + [p for p, v in params.items() if v.default is inspect.Parameter.empty and
                       v.kind in (v.POSITIONAL_OR_KEYWORD, v.KEYWORD_ONLY) and p != "self"]
    wanted += list(recipe.get("extra", ()))
    if getattr(config, "is_encoder_decoder", False) and "decoder_input_ids" in params:
        wanted.append("decoder_input_ids")
    inputs = {}
    for name in wanted:
        if name in inputs:
            continue
        if name not in makers:
            raise NotImplementedError(f"a required input {name!r}")
        inputs[name] = makers[name]()
    if recipe.get("no_cache"):
        inputs["use_cache"] = False
    return inputs


@dataclasses.dataclass
class _Make:
    """What a family's input maker (FAMILY_INPUTS) has: the generic makers by input name
    (make("input_ids")), the config, the random generator, the batch and sequence sizes."""
    makers: dict
    config: object
    g: object
    batch: int
    seq: int
    main: str

    def __call__(self, name):
        return self.makers[name]()


# Inputs of families whose inputs the generic makers cannot lay out (tied to each other: an
# image's patches and its shape, a placeholder mask and the image features): a function of a
# _Make to the whole inputs.
def _siglip2_inputs(make):
    """Patchified pixels of two images of 4 x 4 and 3 x 4 patches (the second padded to the
    first), their shapes and the patches' mask (NaFlex)."""
    import torch
    vision = make.config.vision_config
    width = vision.num_channels * vision.patch_size ** 2
    shapes = torch.tensor([[4, 4], [3, 4]][:make.batch])
    mask = torch.zeros(make.batch, 16, dtype=torch.long)
    for i, (h, w) in enumerate(shapes.tolist()):
        mask[i, :h * w] = 1
    return dict(input_ids=make("input_ids"), spatial_shapes=shapes, pixel_attention_mask=mask,
                pixel_values=torch.randn(make.batch, 16, width, generator=make.g))


def _kosmos2_inputs(make):
    """Pixels, and text ids whose positions 1..latent_query_num take the image features."""
    import torch
    ids = make("input_ids")
    where = torch.zeros_like(ids)
    where[:, 1:1 + make.config.latent_query_num] = 1
    return dict(pixel_values=make("pixel_values"), input_ids=ids,
                image_embeds_position_mask=where)


def _idefics_inputs(make):
    """One image per sample (pixels of batch x images x channels x h x w), each text token
    attending it but the first few of the second sample (a cross-attention mask with rows
    that attend no image: the gate zeroes them)."""
    import torch
    image = make.config.vision_config
    size = image.image_size
    pixels = torch.randn(make.batch, 1, image.num_channels, size, size, generator=make.g)
    seen = torch.ones(make.batch, make.seq, 1, dtype=torch.long)
    seen[-1, :5] = 0
    return dict(input_ids=make("input_ids"), pixel_values=pixels, image_attention_mask=seen)


def _dia_inputs(make):
    """Text bytes for the encoder; the decoder's audio codes, one id per codebook per step
    (batch x steps x codebooks), in the decoder's vocabulary."""
    import torch
    decoder = make.config.decoder_config
    codes = torch.randint(FIRST_ID, decoder.vocab_size, (make.batch, 24, decoder.num_channels),
                          generator=make.g)
    return dict(input_ids=make("input_ids"), decoder_input_ids=codes)


def _codec_inputs(make):
    """A codec of two branches (NeuCodec, X-Codec 2): the waveform (batch x 1 x samples) for
    the acoustic encoder and w2v-BERT features (batch x frames x width) for the semantic one
    (as many frames as the acoustic encoder makes of the waveform)."""
    import math

    import torch
    width = make.config.semantic_model_config.feature_projection_input_dim
    frames = 10
    samples = frames * math.prod(make.config.downsampling_ratios)
    return dict(input_values=torch.randn(make.batch, 1, samples, generator=make.g),
                input_features=torch.randn(make.batch, frames, width, generator=make.g))


def _voxtral_realtime_inputs(make):
    """Text ids and the audio of as many frames: the audio embeddings are added to the text
    embeddings position by position (8 mel frames to one: a stride 2 convolution, then 4
    frames to one)."""
    import torch
    mels = _find(make.config, "num_mel_bins")
    return dict(input_ids=make("input_ids"),
                input_features=torch.randn(make.batch, mels, 8 * make.seq, generator=make.g))


def _granite_speech5_inputs(make):
    """Time-major mel features of 4 x the mel bins (delta-expanded, then stacked in pairs by
    its feature extractor)."""
    import torch
    mels = _find(make.config, "num_mel_bins")
    return dict(input_features=torch.randn(make.batch, 64, 4 * mels, generator=make.g))


def _kyutai_speech_to_text_inputs(make):
    """Per step a text id and one audio code per codebook (batch x steps x 1 + codebooks),
    the codes in the codebooks' vocabulary (offset into the embedding by the model)."""
    import torch
    codes = torch.randint(FIRST_ID, make.config.codebook_vocab_size,
                          (make.batch, make.seq, make.config.num_codebooks), generator=make.g)
    return dict(input_ids=torch.cat([make("input_ids")[..., None], codes], -1))


def _nemotron3_5_transcribe_inputs(make):
    """Time-major mel features of 64 frames (a multiple of the subsampling, 8) and text ids
    whose positions 1..8 take the 8 audio embeddings of each sample."""
    import torch
    config = make.config
    mels = config.audio_config.asr_config.num_mel_bins
    frames = 8 * config.audio_config.asr_config.subsampling_factor
    ids = make("input_ids")
    ids[:, 1:1 + frames // config.audio_config.asr_config.subsampling_factor] = \
        config.audio_token_id
    return dict(input_ids=ids,
                input_features=torch.randn(make.batch, frames, mels, generator=make.g),
                input_features_mask=torch.ones(make.batch, frames, dtype=torch.long))


def _pe_audio_video_inputs(make):
    """Text ids, a video (batch x 2 frames x 3 x 32 x 32) and a waveform (batch x 1 x
    samples): the model's audio-video encoder and every contrastive head run only when all
    three are given."""
    import torch
    return dict(input_ids=make("input_ids"),
                pixel_values_videos=torch.randn(make.batch, 2, 3, 32, 32, generator=make.g),
                input_values=torch.randn(make.batch, 1, 4000, generator=make.g))


def _esmfold2_inputs(make):
    """A protein of 12 residues per sample (two chains of 6), 4 atoms each (48 atoms: the
    atom encoder's window of 16 slides over them), random coordinates, elements and atom
    names; the second sample's last residue is padding (its atoms too)."""
    import torch

    from transformers.models.esmfold2.modeling_esmfold2 import EsmFold2AtomInputs
    config, g, batch = make.config, make.g, make.batch
    tokens, per_token = 12, 4
    atoms = tokens * per_token
    token_mask = torch.ones(batch, tokens, dtype=torch.long)
    token_mask[-1, -1] = 0
    atom_to_token = torch.arange(atoms).div(per_token, rounding_mode="floor").expand(batch, atoms)
    atom_mask = token_mask.gather(1, atom_to_token).bool()
    index = torch.arange(tokens).expand(batch, tokens)
    chain = index.div(tokens // 2, rounding_mode="floor")
    zeros = torch.zeros(batch, tokens, dtype=torch.long)
    atom_inputs = EsmFold2AtomInputs(
        ref_pos=torch.randn(batch, atoms, 3, generator=g) * 3,
        ref_charge=torch.zeros(batch, atoms),
        atom_attention_mask=atom_mask,
        ref_element=torch.randint(1, config.max_atomic_number, (batch, atoms), generator=g),
        ref_atom_name_chars=torch.randint(0, config.char_vocab_size,
                                          (batch, atoms, config.max_chars), generator=g),
        ref_space_uid=atom_to_token.contiguous(), atom_to_token=atom_to_token.contiguous())
    return dict(token_index=index.contiguous(), residue_index=index.contiguous(), asym_id=chain,
                sym_id=zeros, entity_id=zeros, mol_type=zeros,
                res_type=torch.randint(0, 20, (batch, tokens), generator=g),
                token_bonds=torch.zeros(batch, tokens, tokens, 1), attention_mask=token_mask,
                atom_inputs=atom_inputs)


def _nemotron_asr_streaming_inputs(make):
    """Time-major mel features of 320 frames (40 encoder frames after the subsampling by 8:
    three chunks of its chunked attention: 41 frames, the causal convolutions' edge one more) and
    one decoder token per sample."""
    import torch
    encoder = make.config.encoder_config
    frames = 40 * encoder.subsampling_factor
    return dict(input_features=torch.randn(make.batch, frames, encoder.num_mel_bins,
                                           generator=make.g),
                decoder_input_ids=make("input_ids")[:, :1])


def _video_session_inputs(size, frames=3):
    """A video inference session of SAM 2's video models (SAM 2, SAM 3's tracker, EdgeTAM):
    `frames` random frames of `size` pixels and one object prompted by a point on the first
    (what their processors' add_inputs_to_inference_session leaves in it)."""
    def inputs(make):
        import torch
        module = sys.modules[type(make.config).__module__.replace(".configuration_",
                                                                   ".modeling_")]
        session_cls = next(getattr(module, n) for n in dir(module)
                           if n.endswith("VideoInferenceSession"))
        session = session_cls(video=torch.randn(frames, 3, size, size, generator=make.g),
                              video_height=size, video_width=size, dtype=torch.float32)
        obj = session.obj_id_to_idx(1)
        session.add_point_inputs(obj, 0, dict(
            point_coords=torch.tensor([[[[size * 0.4, size * 0.6]]]]),
            point_labels=torch.tensor([[[1]]], dtype=torch.int32)))
        session.obj_with_new_inputs = [1]
        return dict(inference_session=session)
    return inputs


def _video_session_forward(model, inputs):
    """Every frame of a copy of the session in turn (the first conditioned on its point, the
    others tracked through the memory attention over the frames before): each frame's masks
    and object scores. The models run under inference_mode: outputs only, no gradients."""
    import copy
    session = copy.deepcopy(inputs["inference_session"])
    outputs = {}
    for frame in range(session.num_frames):
        out = model(inference_session=session, frame_idx=frame)
        outputs[f"frame {frame} pred_masks"] = out.pred_masks
        outputs[f"frame {frame} object_score_logits"] = out.object_score_logits
    return outputs


def _muse_glimmer_inputs(make):
    """One image per sample of 8 x 8 patches (patch_temporal frames of patch_size squared
    pixels in 3 channels each, flattened as its processor does; windows of 4 x 4 patches) and
    text ids whose positions 1..16 take its 16 merged (2 x 2) image embeddings."""
    import torch
    config = make.config
    vision = config.vision_config
    grid = torch.tensor([[1, 8, 8]] * make.batch)
    width = vision.patch_temporal * 3 * vision.patch_size ** 2
    tokens = 64 // vision.merge_size ** 2
    ids = make("input_ids")
    ids[:, 1:1 + tokens] = config.image_token_id
    return dict(input_ids=ids, image_grid_thw=grid,
                pixel_values=torch.randn(make.batch * 64, width, generator=make.g))


def _muse_glimmer_assistant_inputs(make):
    """Muse Glimmer's drafter: a block of noise embeddings (block_size x hidden) that attends
    itself and the context of 32 accepted tokens (the target model's hidden states at
    target_layer_ids, concatenated); the mask spans both, 32 + block_size keys, the second
    sample's first 4 context tokens padding."""
    import torch
    config = make.config
    context = 32
    width = len(config.target_layer_ids) * config.hidden_size
    mask = torch.ones(make.batch, context + config.block_size, dtype=torch.long)
    mask[-1, :4] = 0
    return dict(noise_embeds=torch.randn(make.batch, config.block_size, config.hidden_size,
                                         generator=make.g),
                context_hidden_states=torch.randn(make.batch, context, width, generator=make.g),
                attention_mask=mask)


def _sam_inputs(size):
    """Images of `size` pixels a side (SAM 2's feature sizes are fixed in its config, not
    derived from the image)."""
    def inputs(make):
        import torch
        return dict(pixel_values=torch.randn(make.batch, 3, size, size, generator=make.g))
    return inputs


FAMILY_INPUTS = {"sam2": _sam_inputs(256), "edgetam": _sam_inputs(256),
                 "sam2_video": _video_session_inputs(256), "muse_glimmer": _muse_glimmer_inputs,
                 "muse_glimmer_assistant": _muse_glimmer_assistant_inputs,
                 "edgetam_video": _video_session_inputs(256),
                 "sam3_tracker_video": _video_session_inputs(32),
                 "pe_audio_video": _pe_audio_video_inputs, "esmfold2": _esmfold2_inputs,
                 "nemotron_asr_streaming": _nemotron_asr_streaming_inputs,
                 "nemotron3_5_transcribe": _nemotron3_5_transcribe_inputs,
                 "kyutai_speech_to_text": _kyutai_speech_to_text_inputs,
                 "granite_speech5": _granite_speech5_inputs,
                 "voxtral_realtime": _voxtral_realtime_inputs,
                 "neucodec": _codec_inputs, "xcodec2": _codec_inputs, "dia": _dia_inputs,
                 "siglip2": _siglip2_inputs, "kosmos2": _kosmos2_inputs,
                 "idefics": _idefics_inputs}


# How a family's model is run where model(**inputs) is not its forward pass: a function of
# the model and the inputs to its outputs.
FAMILY_FORWARD = {name: _video_session_forward
                  for name in ("sam2_video", "edgetam_video", "sam3_tracker_video")}


# ----- One case ----------------------------------------------------------------------------

_CALLS = [0]
_WRAPPED = [False]
# Told when a case's ringattn run starts (a worker tells its parent: a timeout before it is
# eager's or the harness's, not ringattn's).
_STAGE_HOOK = [lambda stage: None]


def _setup_worker():
    import logging
    import warnings

    import torch
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    import transformers
    transformers.logging.set_verbosity_error()
    logging.getLogger("transformers").setLevel(logging.ERROR)
    import ringattn.integrations.transformers as ra_hf  # noqa: F401  registers "ringattn"
    from transformers import AttentionInterface
    forward = AttentionInterface._global_mapping["ringattn"]
    if not _WRAPPED[0]:
        def counted(*args, **kwargs):
            _CALLS[0] += 1
            return forward(*args, **kwargs)
        AttentionInterface._global_mapping["ringattn"] = counted
        _WRAPPED[0] = True


def _candidates(family: Family):
    """The model classes of a family, best first: those the family names (its *ForCausalLM,
    else its base model), then the other model classes its module exports (those that
    declare _supports_attention_backend first)."""
    import importlib

    import transformers
    from transformers import PreTrainedModel
    module = importlib.import_module(family.module) if family.module else transformers
    named = [getattr(module, n, None) or getattr(transformers, n, None) for n in family.classes]
    named = [c for c in named if c is not None]
    if named and not family.module:
        return named
    exported = getattr(module, "__all__", None) or [n for n in dir(module) if n[:1].isupper()]
    found = []
    for name in exported:
        cls = getattr(module, name, None)
        if isinstance(cls, type) and issubclass(cls, PreTrainedModel) and \
                cls.__module__ == module.__name__ and not name.endswith("PreTrainedModel") and \
                getattr(cls, "config_class", None) is not None and cls not in named:
            found.append(cls)
    found.sort(key=lambda c: (not c._supports_attention_backend, "For" not in c.__name__ and
                              not c.__name__.endswith("Model"), len(c.__name__)))
    if not named and not found:
        raise LookupError(f"{family.module} exports no model class")
    return named + found


def _resolve(family: Family):
    """The model class a family is tested with (the first candidate)."""
    return _candidates(family)[0]


def relative(a, b, floor=0.0):
    """Relative Frobenius error ||a - b|| / max(||b||, floor) (0 when both are equal)."""
    a, b = a.detach().double(), b.detach().double()
    diff, norm = (a - b).norm().item(), max(b.norm().item(), floor)
    if diff == 0.0:
        return 0.0
    return diff / norm if norm > 0 else float("inf")


def _output_tensor(out, depth=0):
    import torch
    for key in ("logits", "last_hidden_state", "prediction_logits", "pred_masks",
                "reconstruction", "pooler_output"):
        value = out.get(key) if hasattr(out, "get") else None
        if isinstance(value, torch.Tensor) and value.is_floating_point():
            return key, value
    maps = out.get("feature_maps") if hasattr(out, "get") else None
    if maps:  # a backbone's
        return "feature_maps[-1]", maps[-1]
    items = out.to_tuple() if hasattr(out, "to_tuple") else (out if isinstance(out, tuple)
                                                             else (out,))
    for i, value in enumerate(items):
        if isinstance(value, torch.Tensor) and value.is_floating_point():
            return f"output[{i}]", value
    for i, value in enumerate(items):  # a model of models (a VLM's language model's output)
        if depth < 2 and (hasattr(value, "to_tuple") or isinstance(value, tuple)):
            try:
                key, tensor = _output_tensor(value, depth + 1)
                return f"output[{i}].{key}", tensor
            except TypeError:
                pass
    raise TypeError("the model returns no floating-point tensor")


def _build(cls, config, impl):
    import copy

    import torch
    torch.manual_seed(1)
    model = cls._from_config(copy.deepcopy(config), attn_implementation=impl,
                             dtype=torch.float32)
    from transformers import PreTrainedModel
    if any(isinstance(m, PreTrainedModel) and m.config._attn_implementation != impl and
           m._can_set_attn_implementation() for m in model.modules()):
        # A sub-model left on the default implementation (PE audio-video's sub-configs are
        # rebuilt while the model is made, which resets their implementation to none): set
        # through the whole model, as transformers offers, so that every attention runs.
        model.set_attn_implementation(impl)
    languages = getattr(config, "languages", None)
    if languages and hasattr(model, "set_default_language"):  # X-MOD's adapters
        model.set_default_language(languages[0])
    with torch.no_grad():
        for name, module in model.named_modules():
            if name.endswith("router.classifier") and hasattr(module, "weight"):
                # A top-1 dispatch between two experts (NLLB-MoE, which needs two) is a
                # routing decision a last-bit difference flips: router logits all zero, so
                # that the tie goes to the first expert in both runs.
                module.weight.zero_()
    # Eval mode: no dropout, batch norm on running statistics (a batch norm in training
    # couples the batch and leaves gradients that are zero in exact arithmetic, rounding
    # only), no training-only draws (SpecAugment, noise); gradients are computed all the same.
    model.eval()
    return model


def _parameters(cls, config):
    """How many parameters the model of `config` has (built on the meta device)."""
    import copy

    import torch
    with torch.device("meta"):
        model = cls._from_config(copy.deepcopy(config), attn_implementation="eager")
    return sum(p.numel() for p in model.parameters())


def _seed():
    """The same random state for both runs (a model that draws in training: SpecAugment
    masks, noise)."""
    import random

    import numpy
    import torch
    torch.manual_seed(0)
    numpy.random.seed(0)
    random.seed(0)


def _all_outputs(out, prefix="", found=None, depth=0):
    """Every floating-point tensor of a model's output (nested outputs too: a VLM's vision,
    Q-Former and language model outputs), by name, each once; the loss left out."""
    import torch
    found = {} if found is None else found
    items = out.items() if hasattr(out, "items") else enumerate(
        out if isinstance(out, (tuple, list)) else ())
    for key, value in items:
        name = f"{prefix}{key}"
        if key == "loss" or "attentions" in str(key):
            continue  # attention weights: ringattn returns none (as sdpa)
        if isinstance(value, torch.Tensor):
            if value.is_floating_point() and value.dim() > 0 and \
                    all(value is not t for t in found.values()):
                found[name] = value
        elif depth < 3 and (hasattr(value, "items") or isinstance(value, (tuple, list))):
            _all_outputs(value, f"{name}.", found, depth + 1)
    return found


def _forward_backward(model, inputs, valid=None, seed=3, forward=None):
    """({name: output}, {name: grad}) of one forward and the backward of the outputs weighted
    by fixed random weights: every floating-point output, or with `valid` (a padded batch)
    the main one (logits, else last_hidden_state) at its valid positions."""
    import torch
    _seed()
    out = forward(model, inputs) if forward else model(**inputs)
    if valid is None:
        outputs = _all_outputs(out) or dict([_output_tensor(out)])
    else:
        outputs = dict([_output_tensor(out)])
    generator = torch.Generator().manual_seed(seed)
    loss = 0
    for tensor in outputs.values():
        weights = torch.randn(tensor.shape, generator=generator)
        if valid is not None:
            weights = weights * valid.reshape(valid.shape + (1,) * (tensor.dim() - 2)).to(
                weights.dtype)
        if tensor.requires_grad:
            loss = loss + (tensor.float() * weights).sum()
    if torch.is_tensor(loss):
        loss.backward()
    grads = {n: (None if p.grad is None else p.grad.detach().clone())
             for n, p in model.named_parameters()}
    return {k: v.detach() for k, v in outputs.items()}, grads


def _compare(want, got, valid=None):
    """(max relative error, what has it) over the output (valid positions) and gradients."""
    (w_outs, w_grads), (g_outs, g_grads) = want, got
    worst, where = 0.0, "the output"
    for key, w_out in w_outs.items():
        g_out = g_outs.get(key)
        if g_out is None or g_out.shape != w_out.shape:
            return float("inf"), f"the output {key} (missing or of another shape with ringattn)"
        if valid is not None:
            w_out, g_out = w_out[valid], g_out[valid]
        err = relative(g_out, w_out)
        if not err <= worst:
            worst, where = err, f"the output {key}"
    where_output = worst
    # A gradient that is zero in exact arithmetic holds only rounding (GRAD_FLOOR).
    floor = GRAD_FLOOR * max((g.double().norm().item() for g in w_grads.values()
                              if g is not None), default=0.0)
    for name, wg in w_grads.items():
        gg = g_grads.get(name)
        if wg is None and gg is None:
            continue
        if (wg is None) != (gg is None) and bool((gg if wg is None else wg).any()):
            return float("inf"), f"the gradient of {name} ({'none' if gg is None else 'some'} " \
                                 f"with ringattn, {'none' if wg is None else 'some'} with eager)"
        if wg is None or gg is None:
            continue  # none on one side, zeros on the other (an expert no token reached)
        err = relative(gg, wg, floor if bool(wg.any()) else floor * ZERO_GRAD_FLOOR / GRAD_FLOOR)
        if not err <= worst:
            worst, where = err, f"the gradient of {name}"
    if not where.startswith("the output"):
        where += f" (the outputs' error {where_output:.2g})"
    return worst, where


def _attention_report(model):
    impls = {}
    for m in model.modules():
        config = getattr(m, "config", None)
        if config is not None and hasattr(config, "_attn_implementation"):
            impls[type(m).__name__] = config._attn_implementation
    attn = sorted({type(m).__name__ for m in model.modules() if "Attention" in type(m).__name__})
    return (f"attention modules {', '.join(attn) or 'none'}; implementation per sub-model "
            f"{impls}")


def _is_refusal(e):
    return isinstance(e, ValueError) and str(e).startswith("ringattn:")


def _message(e):
    lines = [line for line in str(e).splitlines() if line.strip()]
    return f"{type(e).__name__}: {lines[0] if lines else ''}"[:400]


def run_case(case: Case) -> Row:
    """One family in one mode; never raises."""
    start = time.time()
    family = case.family
    row = Row(family.name, "?", case.mode, "not built")
    try:
        return _run_case(case, row)
    except Exception as e:  # noqa: BLE001  anything the harness did not foresee
        row.result = "not built"
        row.message = f"harness: {_message(e)}"
        row.detail = traceback.format_exc()
        return row
    finally:
        row.seconds = time.time() - start


# The implementation a family's ringattn run is compared with where eager is not a correct
# reference, and why (the row says which it was).
FAMILY_REFERENCE = {
    # Its layers invert the mask with logical_not(), which is right for sdpa's boolean mask
    # but not for eager's additive one (0 where a key is attended): eager masks every attended
    # key and attends the others.
    "nemotron_asr_streaming": "sdpa",
}


def _prepare(case, row, cls):
    """(config, inputs, valid, extra, eager's result) of the first config variant and input
    recipe eager runs with; raises the last variant's failure with the plain inputs if none
    does."""
    last = None
    tried = set()
    tries = []
    for variant in range(len(VARIANTS)):
        stage = "config"
        try:
            config = tiny_config(cls.config_class, case.family.config, VARIANTS[variant],
                                 mrope=case.family.mrope)
            key = config.to_json_string()
            if key in tried:
                continue
            tried.add(key)
            stage = "build"
            if VARIANTS[variant] == "default widths" and \
                    _parameters(cls, config) > MAX_PARAMETERS:
                tries.append(f"{VARIANTS[variant]}: over {MAX_PARAMETERS:,} parameters, not tried")
                continue
            reference = FAMILY_REFERENCE.get(case.family.name, "eager")
            eager = _build(cls, config, reference)
            recipes = input_recipes(eager, config, case.family.name)
        except NotApplicable:
            raise
        except Exception as e:  # noqa: BLE001
            last = (stage, e, traceback.format_exc())
            continue
        for number, recipe in enumerate(recipes):
            stage = "inputs"
            try:
                if number:  # a failed run may have left gradients: a fresh model
                    eager = _build(cls, config, reference)
                inputs, valid, extra = _mode_inputs(case.mode, eager, config, recipe)
                stage = "eager fails"
                want = _run_mode(case.mode, eager, inputs, valid, extra, case.family.name)
                if _has_nan(want):
                    raise FloatingPointError("eager gives NaN or inf")
                how = [f"against {reference}"] if reference != "eager" else []
                how += [VARIANTS[variant]] if variant else []
                how += [f"{k} {v}" for k, v in recipe.items()
                        if v and k not in ("extra", "no_cache", "family")]
                how += ["the family's inputs"] if recipe.get("family") else []
                how += ["use_cache=False"] if recipe.get("no_cache") else []
                how += [f"with {', '.join(recipe['extra'])}"] if recipe.get("extra") else []
                return config, inputs, valid, extra, want, "; ".join(how)
            except NotApplicable:
                raise
            except Exception as e:  # noqa: BLE001
                if os.environ.get("RINGATTN_SWEEP_DEBUG"):
                    print(f"variant {variant} inputs {recipe}: {stage}: {_message(e)}\n" +
                          "".join(traceback.format_tb(e.__traceback__)[-2:]))
                tries.append(f"inputs {recipe}: {stage}: {_message(e)}")
                if number == 0:  # the plain inputs' failure says the most
                    last = (stage, e, traceback.format_exc())
    stage, error, detail = last
    raise _NotBuilt(f"{stage}: {_message(error)}",
                    detail + "\nevery try (variant 0 first):\n" + "\n".join(tries))


class _NotBuilt(Exception):
    def __init__(self, message, detail):
        super().__init__(message)
        self.message, self.detail = message, detail


# Further model classes of a family tried where the first never calls the attention (its
# attention layers live in a head the base model lacks).
MORE_CLASSES = 2


def _run_case(case, row):
    family = case.family
    try:
        candidates = _candidates(family)
    except Exception as e:  # noqa: BLE001
        row.message = f"class: {_message(e)}"
        row.detail = traceback.format_exc()
        return row
    first = None
    for cls in candidates[:1 + MORE_CLASSES]:
        attempt = Row(row.family, cls.__name__, row.mode, "not built")
        _run_class(case, attempt, cls)
        first = first or attempt
        if not (attempt.result == "not applicable" and "never called" in attempt.message or
                attempt.result == "not built" and first.result != "not built"):
            break
    else:
        attempt = first
    for field in ("cls", "result", "error", "message", "detail"):
        setattr(row, field, getattr(attempt, field))
    return row


def _run_class(case, row, cls):
    if not cls._can_set_attn_implementation():
        row.result = "not applicable"
        row.message = (f"{cls.__name__} cannot set a custom attention implementation (its "
                       "module has attention layers that do not use "
                       "ALL_ATTENTION_FUNCTIONS.get_interface)")
        return row
    mode = case.mode
    try:
        config, inputs, valid, extra, want, how = _prepare(case, row, cls)
    except NotApplicable as e:
        row.result, row.message = "not applicable", str(e)
        return row
    except _NotBuilt as e:
        row.message, row.detail = e.message, e.detail
        return row
    _CALLS[0] = 0
    _STAGE_HOOK[0]("ringattn")
    try:
        model = _build(cls, config, "ringattn")
    except KeyError as e:
        if e.args != ("ringattn",):
            raise
        # A module that picks its attention class from a fixed table of implementations.
        frame = traceback.extract_tb(e.__traceback__)[-1]
        row.result = "not applicable"
        row.message = (f"the model cannot take a custom attention implementation: "
                       f"{os.path.basename(frame.filename)}:{frame.lineno} looks "
                       f"'ringattn' up in a fixed table ({frame.line})")
        return row
    try:
        got = _run_mode(mode, model, inputs, valid, extra, case.family.name)
    except Exception as e:  # noqa: BLE001
        if _is_refusal(e):
            row.result, row.message = "refused", str(e)
            if how.startswith("against "):  # the reference is not eager (FAMILY_REFERENCE)
                row.message += f" ({how.split('; ')[0]})"
        else:
            row.result, row.message = "crash", _message(e)
            row.detail = traceback.format_exc()
        return row
    calls = _CALLS[0]
    error, where = _compare_mode(mode, want, got, valid)
    row.error = error
    if calls == 0:
        same = "the same as eager" if error <= TOLERANCE else "differs from eager"
        row.result = "not applicable"
        row.message = f"ringattn was never called ({same}): {_attention_report(model)}"
        return row
    if error <= TOLERANCE:
        row.result = "exact"
        row.message = f"{calls} ringattn calls" + (f" ({how})" if how else "")
    else:
        row.result = "different"
        row.message = f"{where}: relative error {error:.3g} ({calls} ringattn calls" + (
            f"; {how})" if how else ")")
    return row


class NotApplicable(Exception):
    pass


def _has_nan(result):
    import torch
    tensors = []
    if isinstance(result, tuple) and len(result) == 2 and isinstance(result[1], dict):
        tensors = list(result[0].values()) + [g for g in result[1].values() if g is not None]
    elif isinstance(result, list):
        tensors = [t for t in result if t.is_floating_point()]
    return any(not bool(torch.isfinite(t).all()) for t in tensors)


def _is_decoder(model, config):
    return getattr(config, "is_decoder", False) or model.can_generate() or \
        type(model).__name__.endswith("ForCausalLM")


def _mode_inputs(mode, model, config, recipe=None):
    """(inputs, valid positions or None, extra) of a mode."""
    import torch
    inputs = make_inputs(model, config, recipe)
    if mode == "forward":
        return inputs, None, None
    if model.main_input_name != "input_ids":
        raise NotApplicable(f"mode {mode} is for text models")
    ids = inputs["input_ids"]
    pad = getattr(config.get_text_config(), "pad_token_id", None)
    pad = 0 if pad is None else pad
    if mode in ("padded-left", "padded-right"):
        mask = torch.ones_like(ids)
        for row, count in enumerate((5, 12)):
            if mode == "padded-left":
                mask[row, :count] = 0
            else:
                mask[row, ids.shape[1] - count:] = 0
        ids = ids.masked_fill(mask == 0, pad)
        return dict(inputs, input_ids=ids, attention_mask=mask), mask.bool(), None
    if mode == "packed":
        ids = ids[:1]
        positions = torch.cat([torch.arange(20), torch.arange(16), torch.arange(12)])[None]
        return dict(input_ids=ids, position_ids=positions, use_cache=False), None, None
    if mode in ("generate", "generate-left-padded"):
        if not model.can_generate():
            raise NotApplicable(f"{type(model).__name__} does not generate (an encoder)")
        ids = ids[:, :24]
        mask = torch.ones_like(ids)
        if mode == "generate-left-padded":
            mask[1, :6] = 0
            ids = ids.masked_fill(mask == 0, pad)
        return dict(input_ids=ids, attention_mask=mask), None, pad
    if mode == "decode-cache":
        if not model.can_generate():
            raise NotApplicable(f"{type(model).__name__} does not decode (an encoder)")
        return dict(input_ids=ids), None, None
    raise ValueError(f"unknown mode {mode}")


def _run_mode(mode, model, inputs, valid, extra, family=None):
    import torch
    if mode in ("generate", "generate-left-padded"):
        model.eval()
        with torch.no_grad():
            return model.generate(**inputs, max_new_tokens=6, do_sample=False,
                                  pad_token_id=extra, min_new_tokens=6)
    if mode == "decode-cache":
        from transformers import DynamicCache
        model.eval()
        ids = inputs["input_ids"]
        cache = DynamicCache()
        steps = []
        with torch.no_grad():
            out = model(input_ids=ids[:, :40], past_key_values=cache, use_cache=True)
            steps.append(out.logits[:, -1:])
            for i in range(40, 48):
                out = model(input_ids=ids[:, i:i + 1], past_key_values=cache, use_cache=True)
                steps.append(out.logits)
        return steps
    return _forward_backward(model, inputs, valid, forward=FAMILY_FORWARD.get(family))


def _compare_mode(mode, want, got, valid):
    import torch
    if mode in ("generate", "generate-left-padded"):
        if want.shape == got.shape and torch.equal(want, got):
            return 0.0, ""
        return float("inf"), f"tokens {got.tolist()} where eager gives {want.tolist()}"
    if mode == "decode-cache":
        worst, where = 0.0, ""
        for i, (w, g) in enumerate(zip(want, got)):
            err = relative(g, w)
            if not err <= worst:
                worst, where = err, ("the prefill's logits" if i == 0 else
                                     f"decoding step {i}'s logits")
        return worst, where
    return _compare(want, got, valid)


# ----- Workers -----------------------------------------------------------------------------

def _worker(tasks, results, index):
    try:
        _setup_worker()
    except Exception:  # noqa: BLE001
        results.put(("dead", index, traceback.format_exc()))
        return
    results.put(("ready", index, None))
    while True:
        item = tasks.get()
        if item is None:
            return
        number, case = item
        results.put(("start", index, number))
        _STAGE_HOOK[0] = lambda stage: results.put(("stage", index, stage))
        row = run_case(case)
        results.put(("row", index, (number, row)))


def run_cases(cases, workers=2, timeout=TIMEOUT_S, log=None):
    """Rows of `cases` (in their order), run by `workers` spawned processes; a case past
    `timeout` seconds is a crash (its worker is killed and replaced)."""
    if workers <= 0:
        _setup_worker()
        rows = []
        for case in cases:
            rows.append(run_case(case))
            if log:
                log(rows[-1])
        return rows
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    slots = {}
    todo = list(enumerate(cases))
    rows = [None] * len(cases)
    started = {}

    def spawn(index):
        tasks = ctx.Queue()
        proc = ctx.Process(target=_worker, args=(tasks, results, index), daemon=True)
        proc.start()
        slots[index] = dict(proc=proc, tasks=tasks, case=None, since=None, ready=False)

    def assign(index):
        slot = slots[index]
        if todo:
            number, case = todo.pop(0)
            slot["case"], slot["since"] = number, None
            slot["tasks"].put((number, case))
        else:
            slot["case"], slot["since"] = None, None
            slot["tasks"].put(None)

    def finish(number, row):
        rows[number] = row
        if log:
            log(row)

    for i in range(min(workers, len(cases))):
        spawn(i)
    next_index = len(slots)
    while any(r is None for r in rows):
        try:
            kind, index, payload = results.get(timeout=1.0)
        except queue.Empty:
            kind = None
        if kind == "ready":
            slots[index]["ready"] = True
            assign(index)
        elif kind == "start" and index in slots:
            slots[index]["since"], slots[index]["stage"] = time.time(), "eager"
        elif kind == "stage" and index in slots:
            slots[index]["stage"] = payload
        elif kind == "row" and index in slots:
            number, row = payload
            finish(number, row)
            assign(index)
        elif kind == "dead":
            raise RuntimeError(f"a sweep worker could not start:\n{payload}")
        now = time.time()
        for index, slot in list(slots.items()):
            number = slot["case"]
            proc = slot["proc"]
            running = number is not None and rows[number] is None
            timed_out = running and slot["since"] is not None and now - slot["since"] > timeout
            died = not proc.is_alive() and number is not None and rows[number] is None
            if not (timed_out or died):
                continue
            if died:
                # A row may still be in the queue: drain briefly before calling it a crash.
                time.sleep(0.5)
                continue_outer = False
                try:
                    while True:
                        kind2, index2, payload2 = results.get_nowait()
                        if kind2 == "row":
                            finish(*payload2)
                            if index2 == index:
                                continue_outer = True
                        elif kind2 == "start" and index2 in slots:
                            slots[index2]["since"] = time.time()
                            slots[index2]["stage"] = "eager"
                        elif kind2 == "stage" and index2 in slots:
                            slots[index2]["stage"] = payload2
                        elif kind2 == "ready" and index2 in slots:
                            slots[index2]["ready"] = True
                            assign(index2)
                except queue.Empty:
                    pass
                if continue_outer or rows[number] is not None:
                    del slots[index]
                    if todo:
                        spawn(next_index)
                        next_index += 1
                    continue
            proc.kill()
            proc.join()
            case = cases[number]
            in_ringattn = slot.get("stage") == "ringattn"
            if timed_out:
                why = (f"timed out after {timeout:.0f} s in the ringattn run (a hang)"
                       if in_ringattn else f"timed out after {timeout:.0f} s building the "
                       "model or running eager")
            else:
                why = f"the worker process died (exit code {proc.exitcode})" + (
                    "" if in_ringattn else " building the model or running eager")
            finish(number, Row(case.family.name, "?", case.mode,
                               "crash" if in_ringattn else "not built", message=why))
            del slots[index]
            if todo:
                spawn(next_index)
                next_index += 1
    for slot in slots.values():
        try:
            slot["tasks"].put(None)
        except Exception:  # noqa: BLE001
            pass
    for slot in slots.values():
        slot["proc"].join(timeout=5)
        if slot["proc"].is_alive():
            slot["proc"].kill()
    return rows


# ----- Report ------------------------------------------------------------------------------

def format_row(row):
    error = "" if row.error is None else f"{row.error:.2e}"
    message = row.message.replace("\n", " ")
    return (f"{row.family:<24} {row.cls:<42} {row.mode:<20} {row.result:<14} {error:<9} "
            f"{message}")


def report(rows, seconds, out=sys.stdout):
    print(f"{'family':<24} {'class':<42} {'mode':<20} {'result':<14} {'max error':<9} message",
          file=out)
    for row in rows:
        print(format_row(row), file=out)
    failures = [r for r in rows if r.result in FAILURES]
    for row in failures:
        if row.detail:
            print(f"\n--- {row.family} ({row.cls}, {row.mode}): {row.result}\n{row.detail}",
                  file=out)
    counts = {k: sum(r.result == k for r in rows) for k in RESULTS}
    worst = max((r.error for r in rows if r.result == "exact" and r.error is not None),
                default=0.0)
    slowest = sorted(rows, key=lambda r: -r.seconds)[:5]
    print("\nslowest cases: " + ", ".join(f"{r.family} {r.mode} {r.seconds:.1f} s"
                                          for r in slowest), file=out)
    print(f"summary: {len(rows)} cases: " + ", ".join(f"{v} {k}" for k, v in counts.items()) +
          f"; max error of the exact cases {worst:.2e}; wall time {seconds:.0f} s", file=out)
    return counts


def run_sweep(pattern=None, workers=2, timeout=TIMEOUT_S, modes=True, forward=True, log=None):
    cases = []
    if forward:
        cases += [Case(f) for f in discover(pattern)]
    if modes:
        cases += [c for c in representative_cases()
                  if not pattern or re.search(pattern, c.family.name)]
    return run_cases(cases, workers=workers, timeout=timeout, log=log)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--families", help="a regular expression on the family names")
    parser.add_argument("--workers", type=int, default=2, help="processes (0: this one)")
    parser.add_argument("--timeout", type=float, default=TIMEOUT_S, help="seconds per case")
    parser.add_argument("--no-modes", action="store_true", help="only the forward sweep")
    parser.add_argument("--modes-only", action="store_true", help="only the representative modes")
    parser.add_argument("--progress", action="store_true", help="print each row as it comes")
    args = parser.parse_args(argv)
    start = time.time()
    log = (lambda row: print(format_row(row), flush=True)) if args.progress else None
    rows = run_sweep(args.families, args.workers, args.timeout, modes=not args.no_modes,
                     forward=not args.modes_only, log=log)
    counts = report(rows, time.time() - start)
    return 1 if any(counts[k] for k in FAILURES) else 0


if __name__ == "__main__":
    sys.exit(main())
