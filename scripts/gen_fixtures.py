#!/usr/bin/env python3
"""Generate the tiny random MoE model fixtures and their transformers reference outputs.

Writes, under tests/fixtures/models/:

  qwen3-moe-tiny/  Qwen3MoeForCausalLM, bf16 weights with per-expert tensors in the hub
                   layout (model.layers.L.mlp.experts.E.{gate,up,down}_proj.weight),
                   sharded in two files + model.safetensors.index.json.
  olmoe-tiny/      OlmoeForCausalLM, bf16 weights with fused 3-D expert tensors
                   (model.layers.L.mlp.experts.gate_up_proj [E, 2I, H], gate rows first,
                   and model.layers.L.mlp.experts.down_proj [E, H, I]) in one
                   model.safetensors.
  qwen2-moe-tiny/  Qwen2MoeForCausalLM: per-expert hub layout as qwen3-moe-tiny, plus the
                   gated shared expert (mlp.shared_expert.{gate,up,down}_proj.weight,
                   mlp.shared_expert_gate.weight [1, H]) and q/k/v biases.
  mixtral-tiny/    MixtralForCausalLM in Mixtral's hub names:
                   model.layers.L.block_sparse_moe.gate.weight and
                   model.layers.L.block_sparse_moe.experts.E.{w1,w3,w2}.weight (gate, up, down).
  mixtral-swa-tiny/    mixtral-tiny's layout with sliding_window 6 (every layer), a window that
                   bites within the prompts + 16 new tokens (the script checks it does).
  qwen2-moe-swa-tiny/  qwen2-moe-tiny's layout with use_sliding_window, sliding_window 5 and
                   max_window_layers 3: layers 0 and 2 slide, 1 and 3 attend in full.
  gpt-oss-tiny/    GptOssForCausalLM in the bf16 hub layout (unsloth/gpt-oss-20b-BF16's
                   tensors): attention sinks, q/k/v/o biases, alternating sliding (window 6)
                   and full layers, YaRN (truncate false), a biased top-k-then-softmax router
                   (mlp.router), experts mlp.experts.gate_up_proj [E, H, 2I] (gate/up
                   interleaved in the columns), gate_up_proj_bias, down_proj [E, I, H],
                   down_proj_bias, the clamped SwiGLU.
  glm4-moe-tiny/   Glm4MoeForCausalLM: partial rotary (0.5), q/k norms, q/k/v biases, sigmoid
                   group-limited routing with a random e_score_correction_bias, a shared
                   expert, a dense first layer, and an MTP layer's tensors that nothing reads.
  kimi-k2-tiny/    DeepseekV3ForCausalLM with Kimi K2's config values shrunk (KIMI_K2_CONFIG
                   says which were kept), two shards.
  minimax-m2-tiny/ MiniMaxM2ForCausalLM in MiniMax-M2's hub names (block_sparse_moe.gate,
                   block_sparse_moe.e_score_correction_bias, experts.E.{w1,w3,w2}): q/k norms
                   over the whole projection, partial rotary (rotary_dim), sigmoid routing
                   with a random bias, untied lm_head (MINIMAX_M2_CONFIG says what was kept).

Each directory gets config.json (hub layout, as the published checkpoints spell it),
generation_config.json, tokenizer.json (relative symlink to the shared tokenizer fixture),
tokenizer_config.json, reference.json (prompts, prompt ids, 16 greedy tokens, top-1/top-2
gaps, router choices of the first prompt) and logits_<i>.f32 (the full-vocabulary logits
after the last prompt token, raw little-endian float32).

The weights are random (not trained). The reference runs in float32 on the bf16-rounded
weights, with eager attention and eager experts, so an f32 engine can match it closely.
After writing, each directory is loaded back with AutoModelForCausalLM.from_pretrained and
must reproduce the recorded logits bit for bit: that proves transformers reads the layout
written here the way it was meant.

Deterministic: weights come from a seeded torch.Generator in sorted parameter-name order,
torch runs on one thread. If a candidate seed gives a greedy step whose top-1/top-2 logit
gap is below MIN_TOP_GAP, a router choice whose k-th/(k+1)-th logit margin is below
MIN_ROUTER_MARGIN, or too few distinct experts, the next seed is tried (and printed).

Usage: python3 scripts/gen_fixtures.py [FIXTURE ...]   (default: every fixture; CPU, a few
       minutes; needs torch, transformers). Naming fixtures regenerates only those;
       deepseek-v3-tiny stands for both DeepSeek directories (bf16 and fp8).
       Needs transformers 5.24 (the version the committed references record).
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import sys
from pathlib import Path

import numpy as np
import torch
import transformers
from safetensors.torch import load_file, save_file
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig

REPO = Path(__file__).resolve().parent.parent
OUT_ROOT = REPO / "tests" / "fixtures" / "models"
TOKENIZER_DIR = REPO / "tests" / "fixtures" / "tokenizer"
QWEN25_TEMPLATE = OUT_ROOT / "chat_template_qwen2.5.jinja"
COMMAND = "python3 scripts/gen_fixtures.py"

NEW_TOKENS = 16
MIN_TOP_GAP = 1e-3          # greedy top-1 minus top-2 logit, every step
MIN_ROUTER_MARGIN = 1e-4    # k-th minus (k+1)-th router logit, every routed position
MAX_SEED_TRIES = 50
# glm4-moe-tiny and kimi-k2-tiny (hidden 16, margins in sigmoid-score units, ~130 routed
# positions per layer): 1e-4 rejected seed after seed; 2e-5 is still far above the
# ~1e-6 by which an f32 engine's router scores differ from the reference's.
MIN_SIGMOID_ROUTER_MARGIN = 2e-5
NORM_WEIGHT_SPREAD = 0.25   # RMSNorm weights ~ 1 + N(0, spread): an engine ignoring them fails
EMBED_STD = 0.5             # larger than the layer std so the vocabulary logits are peaked

QWEN3_EOS = [151645, 151643]  # <|im_end|>, <|endoftext|>
OLMOE_EOS = 151643            # <|endoftext|>; a plain int, as OLMoE's own config has it

# config.json in the layout of the published hub checkpoints (Qwen/Qwen3-30B-A3B,
# allenai/OLMoE-1B-7B-0924): top-level rope_theta, num_experts, torch_dtype.
QWEN3_CONFIG = {
    "architectures": ["Qwen3MoeForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 151643,
    "decoder_sparse_step": 1,
    "eos_token_id": 151645,
    "head_dim": 16,
    "hidden_act": "silu",
    "hidden_size": 64,
    "initializer_range": 0.3,
    "intermediate_size": 128,
    "max_position_embeddings": 2048,
    "max_window_layers": 4,
    "mlp_only_layers": [1],
    "model_type": "qwen3_moe",
    "moe_intermediate_size": 32,
    "norm_topk_prob": True,
    "num_attention_heads": 4,
    "num_experts": 16,
    "num_experts_per_tok": 4,
    "num_hidden_layers": 4,
    "num_key_value_heads": 2,
    "output_router_logits": False,
    "rms_norm_eps": 1e-06,
    "rope_scaling": None,
    "rope_theta": 1000000.0,
    "router_aux_loss_coef": 0.001,
    "sliding_window": None,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
    "transformers_version": transformers.__version__,
    "use_cache": True,
    "use_sliding_window": False,
    "vocab_size": 151936,
}

OLMOE_CONFIG = {
    "architectures": ["OlmoeForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": None,
    "clip_qkv": 3.0,
    "eos_token_id": OLMOE_EOS,
    "hidden_act": "silu",
    "hidden_size": 32,
    "initializer_range": 0.3,
    "intermediate_size": 32,
    "max_position_embeddings": 4096,
    "model_type": "olmoe",
    "norm_topk_prob": False,
    "num_attention_heads": 4,
    "num_experts": 8,
    "num_experts_per_tok": 2,
    "num_hidden_layers": 3,
    "num_key_value_heads": 2,
    "output_router_logits": False,
    "pad_token_id": 151643,
    "rms_norm_eps": 1e-05,
    "rope_scaling": None,
    "rope_theta": 10000.0,
    "router_aux_loss_coef": 0.01,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "transformers_version": transformers.__version__,
    "use_cache": True,
    "vocab_size": 151936,
}

# --- Qwen2-MoE and Mixtral (issue 4) ---------------------------------------------------
# Hub layout of Qwen/Qwen1.5-MoE-A2.7B: no qkv_bias key (transformers' default true: q/k/v
# biased), use_sliding_window false with a sliding_window value present, no head_dim.
QWEN2_MOE_CONFIG = {
    "architectures": ["Qwen2MoeForCausalLM"],
    "attention_dropout": 0.0,
    "bos_token_id": 151643,
    "decoder_sparse_step": 1,
    "eos_token_id": 151643,
    "hidden_act": "silu",
    "hidden_size": 32,
    "initializer_range": 0.3,
    "intermediate_size": 96,
    "max_position_embeddings": 8192,
    "max_window_layers": 2,
    "mlp_only_layers": [1],
    "model_type": "qwen2_moe",
    "moe_intermediate_size": 16,
    "norm_topk_prob": False,
    "num_attention_heads": 4,
    "num_experts": 16,
    "num_experts_per_tok": 4,
    "num_hidden_layers": 4,
    "num_key_value_heads": 2,
    "output_router_logits": False,
    "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0,
    "router_aux_loss_coef": 0.001,
    "shared_expert_intermediate_size": 48,
    "sliding_window": 32768,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
    "transformers_version": transformers.__version__,
    "use_cache": True,
    "use_sliding_window": False,
    "vocab_size": 151936,
}

# Hub layout of mistralai/Mixtral-8x7B-v0.1: num_local_experts, experts of width
# intermediate_size, sliding_window null, rope_theta 1e6. Qwen token ids (shared tokenizer).
MIXTRAL_CONFIG = {
    "architectures": ["MixtralForCausalLM"],
    "attention_dropout": 0.0,
    "bos_token_id": 151643,
    "eos_token_id": 151643,
    "hidden_act": "silu",
    "hidden_size": 32,
    "initializer_range": 0.3,
    "intermediate_size": 24,
    "max_position_embeddings": 32768,
    "model_type": "mixtral",
    "num_attention_heads": 4,
    "num_experts_per_tok": 2,
    "num_hidden_layers": 3,
    "num_key_value_heads": 2,
    "num_local_experts": 8,
    "output_router_logits": False,
    "rms_norm_eps": 1e-05,
    "rope_theta": 1000000.0,
    "router_aux_loss_coef": 0.02,
    "sliding_window": None,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
    "transformers_version": transformers.__version__,
    "use_cache": True,
    "vocab_size": 151936,
}

# --- Sliding-window attention (issue 16 item 6) ------------------------------------------
# The same families with a window small enough to bite: the prompts are 1 to ~40 tokens and
# 16 more are generated, so a window of 5-6 drops keys for most positions.
MIXTRAL_SWA_CONFIG = {**MIXTRAL_CONFIG, "sliding_window": 6}
# Qwen2MoeConfig.__post_init__ makes layers i with (i + 1) odd and i < max_window_layers
# sliding: 0 and 2 here; 1 (a dense layer, mlp_only_layers) and 3 attend in full.
QWEN2_MOE_SWA_CONFIG = {**QWEN2_MOE_CONFIG, "use_sliding_window": True, "sliding_window": 5,
                        "max_window_layers": 3}

# --- gpt-oss (issue 16 item 3) ---------------------------------------------------------
# The hub layout of openai/gpt-oss-20b's config.json (rope_scaling with rope_type yarn and
# truncate false, rope_theta 150000, attention_bias, swiglu_limit, explicit
# layer_types alternating sliding / full from layer 0), shrunk. Changed: sliding_window
# 128 -> 6 so that it bites within the prompts; swiglu_limit 7.0 -> 2.5 so that the clamp
# changes a visible share of the experts' values (7.0 clamps ~0.02 % at these sizes; the
# reference records the share); num_experts_per_tok 4 -> 2 of 8; tied
# embeddings (the hub unties them) to keep the fixture small; the shared Qwen tokenizer
# and its ids instead of o200k_harmony (eos <|im_end|>, no pad token).
GPT_OSS_CONFIG = {
    "architectures": ["GptOssForCausalLM"],
    "attention_bias": True,
    "attention_dropout": 0.0,
    "eos_token_id": 151645,
    "head_dim": 16,
    "hidden_act": "silu",
    "hidden_size": 32,
    "initializer_range": 0.3,
    "intermediate_size": 24,
    "layer_types": ["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
    "max_position_embeddings": 131072,
    "model_type": "gpt_oss",
    "num_attention_heads": 4,
    "num_experts_per_tok": 2,
    "num_hidden_layers": 4,
    "num_key_value_heads": 2,
    "num_local_experts": 8,
    "output_router_logits": False,
    "rms_norm_eps": 1e-05,
    "rope_scaling": {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0,
                     "original_max_position_embeddings": 4096, "rope_type": "yarn",
                     "truncate": False},
    "rope_theta": 150000,
    "router_aux_loss_coef": 0.9,
    "sliding_window": 6,
    "swiglu_limit": 2.5,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
    "transformers_version": transformers.__version__,
    "use_cache": True,
    "vocab_size": 151936,
}

# --- GLM-4.5 MoE and Kimi K2 (issue 16) -------------------------------------------------
# glm4-moe-tiny: Glm4MoeForCausalLM in the hub layout of zai-org/GLM-4.5's config.json
# (top-level rope_theta and partial_rotary_factor, n_routed_experts, eos a list), shrunk.
# Kept from GLM-4.5: partial_rotary_factor 0.5, attention_bias true (q/k/v biases, none on
# o_proj), use_qk_norm true, first_k_dense_replace > 0, 1 shared expert, norm_topk_prob,
# routed_scaling_factor 2.5, rms_norm_eps 1e-5, rope_theta 1e6, num_nextn_predict_layers 1
# (its MTP layer's tensors are written as model.layers.4.*; nothing may read them), and
# hidden_size != heads * head_dim. Changed to exercise more: n_group 4 / topk_group 2
# (GLM-4.5 has 1 / 1), a random e_score_correction_bias. Shrunk: every size; the vocab
# is the shared Qwen tokenizer's padded 151936 (GLM's 151552 is below the tokenizer's
# <|im_start|>); tied embeddings (GLM-4.5 unties them) to keep the fixture small.
GLM4_MOE_CONFIG = {
    "architectures": ["Glm4MoeForCausalLM"],
    "attention_bias": True,
    "attention_dropout": 0.0,
    "eos_token_id": QWEN3_EOS,
    "first_k_dense_replace": 1,
    "head_dim": 16,
    "hidden_act": "silu",
    "hidden_size": 16,
    "initializer_range": 0.3,
    "intermediate_size": 48,
    "max_position_embeddings": 2048,
    "model_type": "glm4_moe",
    "moe_intermediate_size": 16,
    "n_group": 4,
    "n_routed_experts": 16,
    "n_shared_experts": 1,
    "norm_topk_prob": True,
    "num_attention_heads": 4,
    "num_experts_per_tok": 4,
    "num_hidden_layers": 4,
    "num_key_value_heads": 2,
    "num_nextn_predict_layers": 1,
    "pad_token_id": 151643,
    "partial_rotary_factor": 0.5,
    "rms_norm_eps": 1e-05,
    "rope_scaling": None,
    "rope_theta": 1000000.0,
    "routed_scaling_factor": 2.5,
    "tie_word_embeddings": True,
    "topk_group": 2,
    "torch_dtype": "bfloat16",
    "transformers_version": transformers.__version__,
    "use_cache": True,
    "use_qk_norm": True,
    "vocab_size": 151936,
}

# kimi-k2-tiny: DeepseekV3ForCausalLM with moonshotai/Kimi-K2-Instruct's config.json values
# (written from what we know of it; it could not be downloaded here), shrunk.
# Kept: model_type "kimi_k2" (transformers has no such type: charm must go by
# architectures; the script loads it as DeepseekV3Config), num_experts_per_tok 8,
# n_shared_experts 1, n_group 1, topk_group 1, routed_scaling_factor 2.827,
# first_k_dense_replace 1, norm_topk_prob true, scoring_func sigmoid, topk_method noaux_tc,
# moe_layer_freq 1, qk_rope_head_dim 64, rope_theta 50000, YaRN factor 32 with beta_fast 1,
# beta_slow 1, mscale 1, mscale_all_dim 1, original_max_position_embeddings 4096,
# max_position_embeddings 131072 (= 32 * 4096), vocab_size 163840, untied lm_head,
# rms_norm_eps 1e-6, attention_bias false, num_nextn_predict_layers 0, bos/eos fields.
# Shrunk: n_routed_experts 384 -> 24, hidden_size 7168 -> 8 (the two vocab x hidden
# matrices are most of the fixture), intermediate_size 18432 -> 48,
# moe_intermediate_size 2048 -> 16, num_hidden_layers 61 -> 3, num_attention_heads (and KV
# heads) 64 -> 2, q_lora_rank 1536 -> 24, kv_lora_rank 512 -> 16, qk_nope_head_dim 128 -> 16,
# v_head_dim 128 -> 16. Left out: quantization_config (Kimi K2 ships fp8 blocks of 128;
# deepseek-v3-tiny-fp8 covers fp8), auto_map (its remote code is not shipped). Token ids
# are the shared Qwen tokenizer's (Kimi's bos 163584 / eos 163585 have no token there).
KIMI_K2_CONFIG = {
    "architectures": ["DeepseekV3ForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
    "first_k_dense_replace": 1,
    "hidden_act": "silu",
    "hidden_size": 8,
    "initializer_range": 0.3,
    "intermediate_size": 48,
    "kv_lora_rank": 16,
    "max_position_embeddings": 131072,
    "model_type": "kimi_k2",
    "moe_intermediate_size": 16,
    "moe_layer_freq": 1,
    "n_group": 1,
    "n_routed_experts": 24,
    "n_shared_experts": 1,
    "norm_topk_prob": True,
    "num_attention_heads": 2,
    "num_experts_per_tok": 8,
    "num_hidden_layers": 3,
    "num_key_value_heads": 2,
    "num_nextn_predict_layers": 0,
    "q_lora_rank": 24,
    "qk_nope_head_dim": 16,
    "qk_rope_head_dim": 64,
    "rms_norm_eps": 1e-06,
    "rope_scaling": {"beta_fast": 1.0, "beta_slow": 1.0, "factor": 32.0, "mscale": 1.0,
                     "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096, "type": "yarn"},
    "rope_theta": 50000.0,
    "routed_scaling_factor": 2.827,
    "scoring_func": "sigmoid",
    "tie_word_embeddings": False,
    "topk_group": 1,
    "topk_method": "noaux_tc",
    "torch_dtype": "bfloat16",
    "transformers_version": transformers.__version__,
    "use_cache": True,
    "v_head_dim": 16,
    "vocab_size": 163840,
}

# minimax-m2-tiny: MiniMaxM2ForCausalLM in the hub layout of MiniMaxAI/MiniMax-M2's
# config.json (top-level rope_theta and the legacy rotary_dim, which MiniMaxM2Config turns
# into partial_rotary_factor = rotary_dim / head_dim), shrunk. Kept: rotary_dim = head_dim / 2
# (64 of 128), hidden_size != heads * head_dim (3072 vs 48 * 128), GQA, use_qk_norm with
# qk_norm_type per_layer (one RMSNorm over all heads' q, one over all of k), scoring_func
# sigmoid with use_routing_bias (e_score_correction_bias, random here), no shared expert
# (shared_intermediate_size 0), every layer MoE, attn_type_list all 1 (full attention),
# rms_norm_eps 1e-6, rope_theta 5e6, max_position_embeddings, untied lm_head,
# num_mtp_modules 3 and mtp_transformer_layers 1 (transformers builds no MTP module; no MTP
# tensors are written). Shrunk: every size (hidden 8 as kimi-k2-tiny, so the two vocab x
# hidden matrices stay small). Left out: quantization_config (the hub ships fp8 blocks of
# 128), auto_map, and use_mtp true, which transformers 5.24 copies into the generation
# config, where it turns generate() into MTP-assisted decoding that fails ("Could not find
# `num_mtp_layers`"). Token ids are the shared Qwen tokenizer's (MiniMax's bos
# 200034 / eos 200020 are past its vocabulary, which is the padded Qwen 151936).
MINIMAX_M2_CONFIG = {
    "architectures": ["MiniMaxM2ForCausalLM"],
    "attention_dropout": 0.0,
    "attn_type_list": [1, 1, 1],
    "bos_token_id": 151643,
    "eos_token_id": 151645,
    "head_dim": 16,
    "hidden_act": "silu",
    "hidden_size": 8,
    "initializer_range": 0.3,
    "intermediate_size": 16,
    "max_position_embeddings": 196608,
    "model_type": "minimax_m2",
    "mtp_transformer_layers": 1,
    "num_attention_heads": 4,
    "num_experts_per_tok": 4,
    "num_hidden_layers": 3,
    "num_key_value_heads": 2,
    "num_local_experts": 16,
    "num_mtp_modules": 3,
    "output_router_logits": False,
    "qk_norm_type": "per_layer",
    "rms_norm_eps": 1e-06,
    "rope_theta": 5000000,
    "rotary_dim": 8,
    "router_aux_loss_coef": 0.001,
    "router_jitter_noise": 0.0,
    "scoring_func": "sigmoid",
    "shared_intermediate_size": 0,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "transformers_version": transformers.__version__,
    "use_cache": True,
    "use_qk_norm": True,
    "use_routing_bias": True,
    "vocab_size": 151936,
}

PROMPTS = [
    {"name": "english", "text": "The quick brown fox jumps over the lazy dog. In 2024, "
                                "the village by the sea held its 17th annual festival, and"},
    {"name": "chinese", "text": "人工智能正在改变我们的生活方式。今天天气很好，我们去公园散步吧！"},
    {"name": "code", "text": "def fibonacci(n):\n    if n < 2:\n        return n\n"
                             "    return fibonacci(n - 1) + "},
    # No system message: the Qwen2.5 template then inserts its default system prompt and
    # the Qwen3 template none, so the two templates render differently.
    {"name": "chat", "messages": [
        {"role": "user", "content": "What is the capital of France?"},
        {"role": "assistant", "content": "The capital of France is Paris."},
        {"role": "user", "content": "And of Germany? Answer in one word."},
    ]},
    {"name": "one_token", "text": "Hello"},
]

# --- GLM-5 with DeepSeek Sparse Attention (issue 16 item 2) ------------------------------
# glm-moe-dsa-tiny: GlmMoeDsaForCausalLM with GlmMoeDsaConfig's fields (written from
# transformers' configuration_glm_moe_dsa.py; zai-org/GLM-5's config.json could not be
# downloaded here), shrunk. MLA attention (q_lora_rank is required: the indexer reads the
# query latent) with interleaved RoPE, the lightning indexer (index_n_heads x index_head_dim
# keys and queries, LayerNorm'd keys, per-head weights), group-limited sigmoid routing with
# a random e_score_correction_bias, a shared expert, a dense first layer. Changed to bite:
# index_topk 2048 -> 5, so the indexer drops keys for most positions of the prompts (1 to
# ~40 tokens) and the 16 generated ones (the script checks it does: "indexer_bites");
# indexer_types with one "shared" layer, which reuses the previous layer's selection;
# n_group 4 / topk_group 2 (GLM-5 has 1 / 1). Tied embeddings to keep the fixture small.
GLM_MOE_DSA_CONFIG = {
    "architectures": ["GlmMoeDsaForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
    "first_k_dense_replace": 1,
    "hidden_act": "silu",
    "hidden_size": 32,
    "index_head_dim": 16,
    "index_n_heads": 8,
    "index_topk": 5,
    "indexer_types": ["full", "full", "shared", "full"],
    "initializer_range": 0.3,
    "intermediate_size": 64,
    "kv_lora_rank": 32,
    "max_position_embeddings": 2048,
    "model_type": "glm_moe_dsa",
    "moe_intermediate_size": 16,
    "n_group": 4,
    "n_routed_experts": 16,
    "n_shared_experts": 1,
    "norm_topk_prob": True,
    "num_attention_heads": 4,
    "num_experts_per_tok": 4,
    "num_hidden_layers": 4,
    "num_key_value_heads": 4,
    "q_lora_rank": 24,
    "qk_nope_head_dim": 16,
    "qk_rope_head_dim": 8,
    "rms_norm_eps": 1e-05,
    "rope_scaling": None,
    "rope_theta": 1000000.0,
    "routed_scaling_factor": 2.5,
    "tie_word_embeddings": True,
    "topk_group": 2,
    "torch_dtype": "bfloat16",
    "transformers_version": transformers.__version__,
    "use_cache": True,
    "v_head_dim": 16,
    "vocab_size": 151936,
}

# deepseek-v32-tiny: DeepseekV32ForCausalLM, GLM-5's tiny shapes with DeepseekV32Config's
# layout (no indexer_types: an indexer on every layer), YaRN as deepseek-v3-tiny's, and
# index_topk 5 so the selection bites; its indexer turns RoPE halves, not interleaved pairs.
DEEPSEEK_V32_CONFIG = {k: v for k, v in GLM_MOE_DSA_CONFIG.items() if k != "indexer_types"}
DEEPSEEK_V32_CONFIG.update({
    "architectures": ["DeepseekV32ForCausalLM"], "model_type": "deepseek_v32", "rms_norm_eps": 1e-06,
    "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 4.0, "mscale": 1.0, "mscale_all_dim": 0.8,
                     "original_max_position_embeddings": 64, "type": "yarn"},
    "rope_theta": 10000.0, "max_position_embeddings": 256})
MIN_INDEXER_MARGIN = 1e-4

# --- Qwen3-Next: gated DeltaNet linear attention (issue 16 item 5) ---------------------------
# qwen3-next-tiny: Qwen3NextForCausalLM in the hub layout of Qwen/Qwen3-Next-80B-A3B's
# config.json (written from what we know of it; it could not be downloaded here), shrunk.
# Kept: full_attention_interval 4 (layers 0-2 gated DeltaNet, layer 3 gated full attention),
# partial_rotary_factor 0.25, linear_conv_kernel_dim 4, two value heads per key head
# (16 key / 32 value heads on the hub), a gated shared expert, norm_topk_prob, rope_theta
# 1e7, zero-centred RMSNorm weights (Qwen3NextRMSNorm scales by 1 + weight). Shrunk: every
# size; tied embeddings (the hub unties them) to keep the fixture small.
QWEN3_NEXT_CONFIG = {
    "architectures": ["Qwen3NextForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 151643,
    "decoder_sparse_step": 1,
    "eos_token_id": 151645,
    "full_attention_interval": 4,
    "head_dim": 16,
    "hidden_act": "silu",
    "hidden_size": 32,
    "initializer_range": 0.3,
    "intermediate_size": 64,
    "linear_conv_kernel_dim": 4,
    "linear_key_head_dim": 8,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "linear_value_head_dim": 8,
    "max_position_embeddings": 262144,
    "mlp_only_layers": [],
    "model_type": "qwen3_next",
    "moe_intermediate_size": 16,
    "norm_topk_prob": True,
    "num_attention_heads": 4,
    "num_experts": 16,
    "num_experts_per_tok": 4,
    "num_hidden_layers": 4,
    "num_key_value_heads": 2,
    "output_router_logits": False,
    "partial_rotary_factor": 0.25,
    "rms_norm_eps": 1e-06,
    "rope_scaling": None,
    "rope_theta": 10000000,
    "router_aux_loss_coef": 0.001,
    "shared_expert_intermediate_size": 16,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
    "transformers_version": transformers.__version__,
    "use_cache": True,
    "vocab_size": 151936,
}

# qwen3.5-moe-tiny: Qwen3_5MoeForCausalLM (the text model of Qwen/Qwen3.5-35B-A3B and
# -397B-A17B; their hub checkpoints are Qwen3_5MoeForConditionalGeneration, whose
# text_config this is) with qwen3-next-tiny's sizes: Qwen3_5MoeTextConfig has no
# decoder_sparse_step / mlp_only_layers (every layer MoE), and its DeltaNet has separate
# in_proj_qkv / in_proj_z / in_proj_b / in_proj_a.
QWEN3_5_MOE_CONFIG = {k: v for k, v in QWEN3_NEXT_CONFIG.items()
                      if k not in ("decoder_sparse_step", "mlp_only_layers", "intermediate_size")}
QWEN3_5_MOE_CONFIG.update({"architectures": ["Qwen3_5MoeForCausalLM"], "model_type": "qwen3_5_moe_text"})
  # k-th minus (k+1)-th index score, every query that drops keys

MODELS = [
    {"dir": "qwen3-moe-tiny", "config": QWEN3_CONFIG, "eos": QWEN3_EOS, "seed": 1000,
     "expert_layout": "per_expert", "shards": 2, "template": "qwen3"},
    {"dir": "olmoe-tiny", "config": OLMOE_CONFIG, "eos": OLMOE_EOS, "seed": 2000,
     "expert_layout": "fused", "shards": 1, "template": "qwen2.5"},
    {"dir": "qwen2-moe-tiny", "config": QWEN2_MOE_CONFIG, "eos": 151643, "seed": 3000,
     "expert_layout": "per_expert", "shards": 1, "template": "qwen2.5"},
    {"dir": "mixtral-tiny", "config": MIXTRAL_CONFIG, "eos": 151643, "seed": 4000,
     "expert_layout": "mixtral", "shards": 1, "template": "qwen3"},
    # A window that must change the reference ("window_bites": checked against the same
    # weights without it).
    {"dir": "mixtral-swa-tiny", "config": MIXTRAL_SWA_CONFIG, "eos": 151643, "seed": 7000,
     "expert_layout": "mixtral", "shards": 1, "template": "qwen3", "window_bites": True},
    {"dir": "qwen2-moe-swa-tiny", "config": QWEN2_MOE_SWA_CONFIG, "eos": 151643, "seed": 8000,
     "expert_layout": "per_expert", "shards": 1, "template": "qwen2.5", "window_bites": True},
    {"dir": "gpt-oss-tiny", "config": GPT_OSS_CONFIG, "eos": 151645, "seed": 9000,
     "expert_layout": "fused", "shards": 1, "template": "qwen3", "window_bites": True,
     "f64_conditioning": True},
    # Sigmoid routers with a random e_score_correction_bias ("router_bias"); GLM-4.5's MTP
    # layer written after the decoder layers ("mtp_layer"); Kimi K2 loaded through
    # DeepseekV3Config, since transformers does not know model_type kimi_k2 ("config_class").
    {"dir": "glm4-moe-tiny", "config": GLM4_MOE_CONFIG, "eos": QWEN3_EOS, "seed": 5000,
     "expert_layout": "per_expert", "shards": 1, "template": "qwen3", "router_bias": True,
     "mtp_layer": True, "min_router_margin": MIN_SIGMOID_ROUTER_MARGIN},
    {"dir": "kimi-k2-tiny", "config": KIMI_K2_CONFIG, "eos": 151645, "seed": 6000,
     "expert_layout": "per_expert", "shards": 2, "template": "qwen3", "router_bias": True,
     "config_class": "DeepseekV3Config", "model_class": "DeepseekV3ForCausalLM",
     "min_router_margin": MIN_SIGMOID_ROUTER_MARGIN},
    # MiniMax-M2: Mixtral's hub names (block_sparse_moe, w1/w3/w2), the router bias beside
    # the gate (block_sparse_moe.e_score_correction_bias, not gate.*).
    {"dir": "minimax-m2-tiny", "config": MINIMAX_M2_CONFIG, "eos": 151645, "seed": 7000,
     "expert_layout": "mixtral", "shards": 1, "template": "qwen3", "router_bias": True,
     "min_router_margin": MIN_SIGMOID_ROUTER_MARGIN},
    # GLM-5's DSA: the indexer's choice must bite ("indexer_bites": checked against the same
    # weights with index_topk beyond every length) and keep a margin at the k-th key.
    {"dir": "glm-moe-dsa-tiny", "config": GLM_MOE_DSA_CONFIG, "eos": QWEN3_EOS, "seed": 11000,
     "expert_layout": "per_expert", "shards": 1, "template": "qwen3", "router_bias": True,
     "min_router_margin": MIN_SIGMOID_ROUTER_MARGIN, "indexer_bites": True},
    {"dir": "deepseek-v32-tiny", "config": DEEPSEEK_V32_CONFIG, "eos": QWEN3_EOS, "seed": 14000,
     "expert_layout": "per_expert", "shards": 1, "template": "qwen3", "router_bias": True,
     "min_router_margin": MIN_SIGMOID_ROUTER_MARGIN, "indexer_bites": True},
    # Qwen3-Next: zero-centred norm weights ("zero_centred_norms": N(0, spread), as trained
    # offsets from 1, instead of 1 + N(0, spread)).
    # f64_conditioning: transformers' chunked f32 delta rule is itself 5.6e-4 from the
    # float64 value on seed 12000's chat prompt; 5e-5 keeps the engine's share of 1e-4.
    {"dir": "qwen3-next-tiny", "config": QWEN3_NEXT_CONFIG, "eos": QWEN3_EOS, "seed": 12000,
     "expert_layout": "per_expert", "shards": 1, "template": "qwen3", "zero_centred_norms": True,
     "f64_conditioning": True, "f64_max_diff": 5e-5},
    {"dir": "qwen3.5-moe-tiny", "config": QWEN3_5_MOE_CONFIG, "eos": QWEN3_EOS, "seed": 13000,
     "expert_layout": "per_expert", "shards": 1, "template": "qwen3", "zero_centred_norms": True,
     "f64_conditioning": True, "f64_max_diff": 5e-5},
]

LOAD_KW = {"dtype": torch.float32, "attn_implementation": "eager",
           "experts_implementation": "eager"}


# ----------------------------------------------------------------------------- weights

def init_weights(model: torch.nn.Module, seed: int, std: float, zero_centred_norms: bool = False) -> None:
    """Fill every parameter from one seeded generator (sorted names, so the draw order does
    not depend on module construction order), then round to bf16 and keep as f32. With
    zero_centred_norms the RMSNorm weights that the model scales by 1 + weight
    (Qwen3NextRMSNorm: all but the DeltaNet's gated norm) are drawn around 0."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in sorted(model.named_parameters()):
            if name.endswith("norm.weight"):
                centre = 0.0 if zero_centred_norms and not name.endswith("linear_attn.norm.weight") else 1.0
                value = centre + NORM_WEIGHT_SPREAD * torch.randn(param.shape, generator=gen)
            elif "embed_tokens" in name or name.startswith("lm_head"):
                value = EMBED_STD * torch.randn(param.shape, generator=gen)
            else:
                value = std * torch.randn(param.shape, generator=gen)
            param.copy_(value.to(torch.bfloat16).to(torch.float32))


def zero_padding_rows(model: torch.nn.Module, num_tokens: int) -> None:
    """Zero the embedding / lm_head rows past the tokenizer's vocabulary (vocab_size is
    padded to 151936; the tokenizer has num_tokens ids), as trained Qwen checkpoints have
    them near zero: their logits are then 0, far below the top, so greedy never emits an
    id the tokenizer cannot decode."""
    with torch.no_grad():
        model.model.embed_tokens.weight[num_tokens:] = 0
        model.lm_head.weight[num_tokens:] = 0


def hub_state_dict(model: torch.nn.Module, layout: str) -> dict[str, torch.Tensor]:
    """The bf16 tensors to write. transformers 5 holds experts fused in memory as
    experts.gate_up_proj [E, 2I, H] (gate rows then up rows) and experts.down_proj
    [E, H, I]; 'per_expert' splits them into the hub's experts.E.{gate,up,down}_proj.weight
    ([I, H], [I, H], [H, I]); 'fused' keeps them. Tied lm_head is not written."""
    tied = model.config.tie_word_embeddings
    out: dict[str, torch.Tensor] = {}
    for name, tensor in model.state_dict().items():
        if tied and name == "lm_head.weight":
            continue
        keep_f32 = name.endswith("e_score_correction_bias")  # f32 in DeepSeek-V3 checkpoints
        t = tensor.detach().to(torch.float32 if keep_f32 else torch.bfloat16).contiguous()
        if layout == "per_expert" and name.endswith("mlp.experts.gate_up_proj"):
            prefix = name[: -len("gate_up_proj")]
            inter = t.shape[1] // 2
            for e in range(t.shape[0]):
                out[f"{prefix}{e}.gate_proj.weight"] = t[e, :inter].clone()
                out[f"{prefix}{e}.up_proj.weight"] = t[e, inter:].clone()
        elif layout == "per_expert" and name.endswith("mlp.experts.down_proj"):
            prefix = name[: -len("down_proj")]
            for e in range(t.shape[0]):
                out[f"{prefix}{e}.down_proj.weight"] = t[e].clone()
        elif layout == "mixtral" and ".mlp." in name:
            out.update(mixtral_hub_tensors(name, t))
        else:
            out[name] = t
    return out


def mixtral_hub_tensors(name: str, t: torch.Tensor) -> dict[str, torch.Tensor]:
    """Mixtral's hub names for one in-memory MoE tensor: transformers 5 renames
    .block_sparse_moe. to .mlp. and fuses experts.{e}.w1/w3 (gate/up) into
    experts.gate_up_proj and experts.{e}.w2 (down) into experts.down_proj on load
    (conversion_mapping.py, "mixtral"); this undoes both."""
    hub = name.replace(".mlp.", ".block_sparse_moe.")
    if hub.endswith("experts.gate_up_proj"):
        prefix = hub[: -len("gate_up_proj")]
        inter = t.shape[1] // 2
        return {**{f"{prefix}{e}.w1.weight": t[e, :inter].clone() for e in range(t.shape[0])},
                **{f"{prefix}{e}.w3.weight": t[e, inter:].clone() for e in range(t.shape[0])}}
    if hub.endswith("experts.down_proj"):
        prefix = hub[: -len("down_proj")]
        return {f"{prefix}{e}.w2.weight": t[e].clone() for e in range(t.shape[0])}
    return {hub: t}  # the router, block_sparse_moe.gate.weight


def layer_of(name: str) -> int:
    """Layer index of a tensor name, -1 for tensors before the layers, 1e9 after."""
    parts = name.split(".")
    if len(parts) > 2 and parts[1] == "layers":
        return int(parts[2])
    return -1 if "embed_tokens" in name else 10**9


def write_safetensors(tensors: dict[str, torch.Tensor], out_dir: Path, shards: int,
                      num_layers: int) -> list[str]:
    """Write one model.safetensors, or `shards` files split by layer with the hub's
    model.safetensors.index.json. Returns the file names written."""
    meta = {"format": "pt"}
    if shards == 1:
        save_file(tensors, str(out_dir / "model.safetensors"), metadata=meta)
        return ["model.safetensors"]
    assert shards == 2, "only 1 or 2 shards are implemented"
    # Embeddings and the first half of the layers in shard 1, the rest (and norm) in 2.
    cut = num_layers // 2
    names = [f"model-0000{i + 1}-of-0000{shards}.safetensors" for i in range(shards)]
    parts: list[dict[str, torch.Tensor]] = [{}, {}]
    weight_map = {}
    for key in sorted(tensors):
        idx = 0 if layer_of(key) < cut else 1
        parts[idx][key] = tensors[key]
        weight_map[key] = names[idx]
    for name, part in zip(names, parts):
        save_file(part, str(out_dir / name), metadata=meta)
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (out_dir / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    return names + ["model.safetensors.index.json"]


# ----------------------------------------------------------------------------- tokenizer

def write_tokenizer_files(out_dir: Path, template: str) -> None:
    """tokenizer.json as a relative symlink to the shared fixture; tokenizer_config.json a
    real copy, with the Qwen2.5 chat template substituted when asked."""
    link = out_dir / "tokenizer.json"
    link.symlink_to(os.path.relpath(TOKENIZER_DIR / "tokenizer.json", out_dir))
    cfg = json.loads((TOKENIZER_DIR / "tokenizer_config.json").read_text())
    if template == "qwen2.5":
        cfg["chat_template"] = QWEN25_TEMPLATE.read_text()
    (out_dir / "tokenizer_config.json").write_text(
        json.dumps(cfg, indent=2, ensure_ascii=False) + "\n")


def encode_prompts(tok, base_tok) -> list[dict]:
    """Render and tokenize PROMPTS with the model directory's tokenizer (its own chat
    template); plain texts must tokenize identically with the shared tokenizer fixture."""
    out = []
    for p in PROMPTS:
        entry = {"name": p["name"]}
        if "messages" in p:
            text = tok.apply_chat_template(p["messages"], tokenize=False,
                                           add_generation_prompt=True)
            entry["messages"] = p["messages"]
            entry["add_generation_prompt"] = True
        else:
            text = p["text"]
        ids = tok(text, add_special_tokens=False)["input_ids"]
        assert ids == base_tok(text, add_special_tokens=False)["input_ids"], p["name"]
        entry["text"] = text
        entry["prompt_ids"] = ids
        out.append(entry)
    assert len(out[-1]["prompt_ids"]) == 1, "the one-token prompt must be one token"
    return out


# ----------------------------------------------------------------------------- reference

class RouterProbe:
    """Forward hooks on every MoE router (mlp.gate): records the selection of each call and
    the smallest k-th/(k+1)-th router-logit margin seen."""

    def __init__(self, model: torch.nn.Module):
        self.calls: list[tuple[int, torch.Tensor, torch.Tensor]] = []
        self.min_margin = float("inf")
        self.bias_changed = 0  # DeepSeek: routed positions whose expert set the bias changed
        self.positions = 0
        self.handles = []
        for idx, layer in enumerate(model.model.layers):
            gate = getattr(layer.mlp, "gate", None) or getattr(layer.mlp, "router", None)  # gpt-oss: router
            if gate is not None and hasattr(gate, "top_k"):
                self.handles.append(gate.register_forward_hook(self._hook(idx, gate.top_k)))

    def _hook(self, layer_idx: int, top_k: int):
        def hook(module, _inputs, output):
            logits, scores, indices = output
            if hasattr(module, "e_score_correction_bias"):
                margin, changed = deepseek_router_stats(module, logits.detach(), indices)
                self.bias_changed += changed
                self.positions += logits.shape[0]
            elif len(_inputs) > 1:  # MiniMaxM2TopKRouter: the block passes its bias in
                margin, changed = minimax_router_stats(logits.detach(), _inputs[1], indices, top_k)
                self.bias_changed += changed
                self.positions += logits.shape[0]
            else:
                ordered = logits.detach().sort(dim=-1, descending=True).values
                margin = (ordered[:, top_k - 1] - ordered[:, top_k]).min().item()
            self.min_margin = min(self.min_margin, margin)
            self.calls.append((layer_idx, indices.detach().clone(), scores.detach().clone()))
        return hook

    def reset(self) -> None:
        self.calls = []

    def remove(self) -> None:
        for h in self.handles:
            h.remove()


class IndexerProbe:
    """GLM-5's and DeepSeek-V3.2's lightning indexers: the smallest k-th minus (k+1)-th index
    score over every query with more than index_topk keys it may attend, and how many such
    queries there were (where the selection drops keys). The indexer returns only the
    indices, so its forward runs with Tensor.topk wrapped to see the scores."""

    def __init__(self, model: torch.nn.Module):
        self.min_margin = float("inf")
        self.dropping = 0
        self.indexers = [m for m in model.modules() if type(m).__name__ in ("GlmMoeDsaIndexer", "DeepseekV32Indexer")]
        self.saved = []
        for m in self.indexers:
            self.saved.append(m.forward)
            m.forward = self._wrapped(m.forward)

    def _wrapped(self, forward):
        def run(*args, **kwargs):
            original = torch.Tensor.topk
            def topk(scores, k, dim=-1, *rest, **kw):
                self._record(scores.detach(), k)
                return original(scores, k, dim, *rest, **kw)
            torch.Tensor.topk = topk
            try:
                return forward(*args, **kwargs)
            finally:
                torch.Tensor.topk = original
        return run

    def _record(self, scores: torch.Tensor, k: int) -> None:
        rows = scores.reshape(-1, scores.shape[-1])
        allowed = (rows > -1e30).sum(dim=-1)  # masked keys carry -inf or finfo.min
        for row, n in zip(rows, allowed.tolist()):
            if n > k:
                ordered = row.sort(descending=True).values
                self.min_margin = min(self.min_margin, float(ordered[k - 1] - ordered[k]))
                self.dropping += 1

    def remove(self) -> None:
        for m, forward in zip(self.indexers, self.saved):
            m.forward = forward


class ClipProbe:
    """For OLMoE's clip_qkv: counts q/k/v entries beyond the clip value (before the clamp)."""

    def __init__(self, model: torch.nn.Module, clip: float | None):
        self.clip = clip
        self.beyond = 0
        self.total = 0
        self.handles = []
        if clip is None:
            return
        for layer in model.model.layers:
            attn = layer.self_attn
            for mod in (attn.q_norm, attn.k_norm, attn.v_proj):
                self.handles.append(mod.register_forward_hook(self._hook))

    def _hook(self, _module, _inputs, output):
        self.beyond += int((output.abs() > self.clip).sum())
        self.total += output.numel()

    def remove(self) -> None:
        for h in self.handles:
            h.remove()


class HiddenProbe:
    """Root-mean-square of the residual stream per position: the embeddings, each decoder
    layer's output, and the final norm's output (what the lm_head sees)."""

    def __init__(self, model: torch.nn.Module):
        self.rms: list[list[float]] = []
        inner = model.model
        mods = [inner.embed_tokens, *inner.layers, inner.norm]
        self.handles = [m.register_forward_hook(self._hook) for m in mods]

    def _hook(self, _module, _inputs, output):
        h = output[0] if isinstance(output, tuple) else output
        self.rms.append([round(float(v), 5) for v in h[0].pow(2).mean(-1).sqrt()])

    def remove(self) -> None:
        for h in self.handles:
            h.remove()


def greedy_generate(model, ids: list[int]) -> tuple[list[int], list[torch.Tensor]]:
    """model.generate, greedy, exactly NEW_TOKENS tokens (no EOS stop). Returns new ids and
    the raw logits of each step."""
    gen_cfg = GenerationConfig(do_sample=False, max_new_tokens=NEW_TOKENS,
                               min_new_tokens=0, eos_token_id=None, pad_token_id=0,
                               bos_token_id=None, use_cache=True,
                               return_dict_in_generate=True, output_logits=True)
    inp = torch.tensor([ids])
    out = model.generate(inp, attention_mask=torch.ones_like(inp), generation_config=gen_cfg)
    new = out.sequences[0, len(ids):].tolist()
    assert len(new) == NEW_TOKENS, f"generate returned {len(new)} tokens"
    return new, [step[0].detach() for step in out.logits]


def no_cache_greedy(model, ids: list[int]) -> list[int]:
    """Greedy decoding by full forward passes without a KV cache: a cross-check of generate."""
    seq = list(ids)
    for _ in range(NEW_TOKENS):
        logits = model(torch.tensor([seq]), use_cache=False).logits[0, -1]
        seq.append(int(logits.argmax()))
    return seq[len(ids):]


def top_gap(logits: torch.Tensor) -> float:
    top2 = logits.topk(2).values
    return float(top2[0] - top2[1])


def compute_reference(model, prompts: list[dict], eos: list[int]) -> dict:
    """Runs every prompt: first-step logits, greedy continuation, gaps, router choices of
    the first prompt, routing diversity and clip statistics."""
    router = RouterProbe(model)
    indexer = IndexerProbe(model)
    clip = ClipProbe(model, getattr(model.config, "clip_qkv", None))
    results = []
    experts_used: dict[int, set] = {}
    first_routing = None
    for i, p in enumerate(prompts):
        ids = p["prompt_ids"]
        router.reset()
        hidden = HiddenProbe(model) if i == 0 else None
        out = model(torch.tensor([ids]), use_cache=False)
        if hidden is not None:
            hidden.remove()
            hidden_rms = hidden.rms
        first_logits = out.logits[0, -1].detach().clone()
        for layer_idx, indices, _ in router.calls:
            experts_used.setdefault(layer_idx, set()).update(indices.flatten().tolist())
        if i == 0:
            first_routing = {
                str(layer_idx): {"expert_ids": indices.tolist(),
                                 "weights": [[round(float(w), 6) for w in row] for row in scores]}
                for layer_idx, indices, scores in router.calls}
        new, step_logits = greedy_generate(model, ids)
        assert torch.allclose(step_logits[0], first_logits, atol=1e-4), "prefill mismatch"
        check = no_cache_greedy(model, ids)
        assert check == new, f"{p['name']}: cached {new} vs uncached {check} greedy differ"
        gaps = [top_gap(l) for l in step_logits]
        eos_at = next((j for j, t in enumerate(new) if t in eos), None)
        top5 = first_logits.topk(5)
        results.append({**p, "new_ids": new, "top_gaps": [round(g, 6) for g in gaps],
                        "first_top5": [[int(t), round(float(v), 5)]
                                       for v, t in zip(top5.values, top5.indices)],
                        "eos_stop_index": eos_at, "logits": first_logits})
    router.remove()
    indexer.remove()
    clip.remove()
    return {
        "prompts": results,
        "first_routing": first_routing,
        "hidden_rms": hidden_rms,
        "min_gap": min(min(r["top_gaps"]) for r in results),
        "min_router_margin": router.min_margin,
        "min_indexer_margin": indexer.min_margin if indexer.indexers else None,
        "indexer_dropping_queries": indexer.dropping,
        "experts_used": {k: sorted(v) for k, v in sorted(experts_used.items())},
        "clip_fraction": (clip.beyond / clip.total) if clip.total else None,
        "bias_changed_fraction": (router.bias_changed / router.positions) if router.positions else None,
    }


def acceptable(ref: dict, num_experts: int, min_router_margin: float = MIN_ROUTER_MARGIN) -> str | None:
    """Why a seed's reference is rejected, or None if it is fine."""
    if ref["min_gap"] < MIN_TOP_GAP:
        return f"min top-1/top-2 gap {ref['min_gap']:.2e} < {MIN_TOP_GAP}"
    if ref["min_router_margin"] < min_router_margin:
        return f"min router margin {ref['min_router_margin']:.2e} < {min_router_margin}"
    if ref["min_indexer_margin"] is not None and ref["min_indexer_margin"] < MIN_INDEXER_MARGIN:
        return f"min indexer margin {ref['min_indexer_margin']:.2e} < {MIN_INDEXER_MARGIN}"
    for layer, used in ref["experts_used"].items():
        if len(used) < num_experts // 2:
            return f"layer {layer} routes to only {len(used)} of {num_experts} experts"
    return None


# ----------------------------------------------------------------------------- per model

def num_experts_of(cfg: dict) -> int:
    """Routed experts per layer: num_experts, Mixtral's num_local_experts or DeepSeek-V3's
    n_routed_experts."""
    for key in ("num_experts", "num_local_experts", "n_routed_experts"):
        if key in cfg:
            return cfg[key]
    raise KeyError("no expert count in the config")


def check_config(config, cfg: dict) -> None:
    """transformers must read config.json (hub layout) into the intended values."""
    rope = config.rope_parameters
    scaling = cfg.get("rope_scaling") or {"type": "default"}
    kind = scaling.get("type", scaling.get("rope_type"))  # gpt-oss's hub config spells rope_type
    assert rope["rope_theta"] == cfg["rope_theta"] and rope["rope_type"] == kind, rope
    for key, want in scaling.items():
        assert key in ("type", "rope_type") or rope[key] == want, f"rope {key}: read {rope.get(key)!r}, wrote {want!r}"
    read = config.num_local_experts if "n_routed_experts" in cfg else config.num_experts
    assert read == num_experts_of(cfg), "number of experts not read"
    for key, want in cfg.items():
        if key in ("rope_theta", "rope_scaling", "torch_dtype", "transformers_version",
                   "architectures", "model_type", "num_experts", "quantization_config"):
            continue
        if key == "sliding_window" and cfg.get("use_sliding_window") is False:
            # Qwen2MoeConfig.__post_init__ sets it to 0 when use_sliding_window is false;
            # Qwen3MoeConfig keeps what was written (None).
            assert config.sliding_window in (0, want), config.sliding_window
            continue
        if key == "full_attention_interval":  # Qwen3NextConfig turns it into layer_types
            assert config.layer_types == ["full_attention" if (i + 1) % want == 0 else "linear_attention"
                                          for i in range(cfg["num_hidden_layers"])], config.layer_types
            continue
        if key == "partial_rotary_factor":  # transformers 5 keeps it in rope_parameters
            assert rope.get(key) == want, f"rope {key}: read {rope.get(key)!r}, wrote {want!r}"
            continue
        got = getattr(config, key)
        assert got == want, f"config {key}: transformers read {got!r}, wrote {want!r}"


def config_class(spec: dict | None):
    """The class that reads the fixture's config.json: AutoConfig, or the spec's
    "config_class" from transformers (Kimi K2's model_type is unknown to AutoConfig)."""
    name = (spec or {}).get("config_class")
    return getattr(transformers, name) if name else AutoConfig


def model_class(spec: dict | None):
    name = (spec or {}).get("model_class")
    return getattr(transformers, name) if name else AutoModelForCausalLM


def build_model(model_dir: Path, seed: int, std: float, num_tokens: int, spec: dict | None = None):
    config = config_class(spec).from_pretrained(model_dir)
    check_config(config, json.loads((model_dir / "config.json").read_text()))
    if (spec or {}).get("model_class"):
        model = model_class(spec)._from_config(config, dtype=torch.float32,
                                               attn_implementation="eager",
                                               experts_implementation="eager").eval()
    else:
        model = AutoModelForCausalLM.from_config(config, **LOAD_KW).eval()
    init_weights(model, seed, std, (spec or {}).get("zero_centred_norms", False))
    zero_padding_rows(model, num_tokens)
    if config.tie_word_embeddings:
        assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    return model


F64_MAX_DIFF = 3e-5  # "f64_conditioning": the f32 reference within this of float64's


def float64_delta_rule(query, key, value, g, beta, initial_state=None, output_final_state=False,
                       use_qk_l2norm_in_kernel=False, **_):
    """Qwen3-Next's gated delta rule (torch_recurrent_gated_delta_rule's sums) in float64:
    transformers' own versions cast to float32 even in a float64 model."""
    _, length, k_heads, k_dim = key.shape
    v_heads, v_dim = value.shape[-2:]
    group = v_heads // k_heads
    q, k = (x.double().repeat_interleave(group, dim=2) for x in (query, key))
    if use_qk_l2norm_in_kernel:
        q, k = (x * torch.rsqrt((x * x).sum(-1, keepdim=True) + 1e-6) for x in (q, k))
    q = q / k_dim ** 0.5
    state = (torch.zeros(q.shape[0], v_heads, k_dim, v_dim, dtype=torch.float64) if initial_state is None
             else initial_state.double())
    out = torch.zeros(q.shape[0], length, v_heads, v_dim, dtype=torch.float64)
    for t in range(length):
        state = state * g[:, t].double().exp()[..., None, None]
        memory = (state * k[:, t, :, :, None]).sum(-2)
        delta = (value[:, t].double() - memory) * beta[:, t, :, None].double()
        state = state + k[:, t, :, :, None] * delta[:, :, None, :]
        out[:, t] = (state * q[:, t, :, :, None]).sum(-2)
    return out.to(query.dtype), (state if output_final_state else None)


def f64_distance(model, prompts: list[dict]) -> float:
    """The largest |float32 reference logit - float64 logit| over the prompts' first steps:
    how much of the 1e-4 budget the reference's own rounding takes. Qwen3-Next's delta rule
    runs in float64 too (float64_delta_rule): its f32 chunked form can take most of it."""
    wide = copy.deepcopy(model).double()
    modules = [sys.modules[name] for name in ("transformers.models.qwen3_next.modeling_qwen3_next",
                                              "transformers.models.qwen3_5_moe.modeling_qwen3_5_moe")
               if name in sys.modules]
    saved = [(m, m.torch_chunk_gated_delta_rule, m.torch_recurrent_gated_delta_rule) for m in modules]
    for m in modules:
        m.torch_chunk_gated_delta_rule = m.torch_recurrent_gated_delta_rule = float64_delta_rule
    worst = 0.0
    try:
        with torch.no_grad():
            for p in prompts:
                logits = wide(torch.tensor([p["prompt_ids"]]), use_cache=False).logits[0, -1]
                worst = max(worst, float((logits - p["logits"].double()).abs().max()))
    finally:
        for m, chunk, recurrent in saved:
            m.torch_chunk_gated_delta_rule, m.torch_recurrent_gated_delta_rule = chunk, recurrent
    return worst


def changed_by(model, ref: dict, edit) -> tuple[int, int]:
    """The same weights under the config `edit` changes: how many prompts' first-step
    logits (by more than 1e-3) and greedy tokens differ from the reference's."""
    config = copy.deepcopy(model.config)
    edit(config)
    other = AutoModelForCausalLM.from_config(config, **LOAD_KW).eval()
    other.load_state_dict(model.state_dict())
    changed_logits = changed_tokens = 0
    with torch.no_grad():
        for p in ref["prompts"]:
            ids = p["prompt_ids"]
            logits = other(torch.tensor([ids]), use_cache=False).logits[0, -1]
            changed_logits += int((logits - p["logits"]).abs().max() > 1e-3)
            changed_tokens += int(no_cache_greedy(other, ids) != p["new_ids"])
    return changed_logits, changed_tokens


def check_window_bites(model, model_dir: Path, ref: dict) -> int:
    """The same weights with every layer attending in full must give other first-step
    logits for most prompts, or the fixture would not test the window. Returns how many
    prompts' greedy tokens differ too."""
    def full(config):
        config.sliding_window = 10**6  # longer than any prompt: the same as full attention
    changed_logits, changed_tokens = changed_by(model, ref, full)
    assert changed_tokens > 0 and changed_logits > 0, f"{model_dir.name}: the window never bites"
    print(f"  window check: full attention changes the first-step logits of {changed_logits} and "
          f"the greedy tokens of {changed_tokens} of {len(ref['prompts'])} prompts")
    return changed_tokens


def check_indexer_bites(model, model_dir: Path, ref: dict) -> int:
    """GLM-5's DSA: the same weights with index_topk beyond every length (each query attends
    all its keys: dense MLA) must change the greedy tokens of some prompts, or the fixture
    would not test the selection. Returns how many prompts' greedy tokens differ."""
    def dense(config):
        config.index_topk = 10**6
    changed_logits, changed_tokens = changed_by(model, ref, dense)
    assert changed_tokens > 0 and changed_logits > 0, f"{model_dir.name}: the indexer never bites"
    print(f"  indexer check: dense attention changes the first-step logits of {changed_logits} and "
          f"the greedy tokens of {changed_tokens} of {len(ref['prompts'])} prompts")
    return changed_tokens


def swiglu_clamped_fraction(model, prompts: list[dict]) -> float:
    """gpt-oss: the share of gate values above swiglu_limit and of up values outside
    [-limit, limit] (what the clamped SwiGLU changes) over every prompt's forward pass."""
    experts_class = type(model.model.layers[0].mlp.experts)
    original = experts_class._apply_gate
    counts = [0, 0]

    def counting(self, gate_up):
        gate, up = gate_up[..., ::2], gate_up[..., 1::2]
        counts[0] += int((gate > self.limit).sum() + (up.abs() > self.limit).sum())
        counts[1] += gate.numel() + up.numel()
        return original(self, gate_up)

    experts_class._apply_gate = counting
    try:
        with torch.no_grad():
            for p in prompts:
                model(torch.tensor([p["prompt_ids"]]), use_cache=False)
    finally:
        experts_class._apply_gate = original
    return counts[0] / counts[1]


def write_generation_config(model_dir: Path, cfg: dict, eos) -> None:
    gen = {"bos_token_id": cfg.get("bos_token_id"), "eos_token_id": eos,
           "do_sample": False, "transformers_version": transformers.__version__}
    if cfg.get("pad_token_id") is not None:
        gen["pad_token_id"] = cfg["pad_token_id"]
    (model_dir / "generation_config.json").write_text(json.dumps(gen, indent=2) + "\n")


def check_recorded_outputs(model, model_dir: Path, ref: dict) -> None:
    """Requires `model` to reproduce the written logits_<i>.f32 bit for bit and the
    recorded greedy tokens of every prompt."""
    with torch.no_grad():
        for i, p in enumerate(ref["prompts"]):
            logits = model(torch.tensor([p["prompt_ids"]]), use_cache=False).logits[0, -1]
            saved = np.fromfile(model_dir / f"logits_{i}.f32", dtype="<f4")
            assert np.array_equal(logits.numpy(), saved), f"{model_dir.name}: logits_{i} differ"
            new, _ = greedy_generate(model, p["prompt_ids"])
            assert new == p["new_ids"], f"{model_dir.name}: prompt {i} greedy differs on reload"


def verify_reload(model_dir: Path, model, ref: dict, spec: dict | None = None) -> None:
    """from_pretrained of the written directory must give the same parameters and the same
    first-step logits, bit for bit, and the same greedy tokens. The only unexpected keys
    allowed are those of an MTP layer the script wrote (spec "mtp_layer")."""
    kwargs = dict(LOAD_KW)
    if (spec or {}).get("config_class"):
        kwargs["config"] = config_class(spec).from_pretrained(model_dir)
    loaded, info = model_class(spec).from_pretrained(model_dir, output_loading_info=True, **kwargs)
    loaded.eval()
    mtp_prefix = f"model.layers.{model.config.num_hidden_layers}."
    unexpected = [k for k in info.get("unexpected_keys") or []
                  if not ((spec or {}).get("mtp_layer") and k.startswith(mtp_prefix))]
    assert not unexpected, f"{model_dir.name}: unexpected_keys {unexpected}"
    for kind in ("missing_keys", "mismatched_keys"):
        assert not info.get(kind), f"{model_dir.name}: {kind} {info.get(kind)}"
    mine = dict(model.named_parameters())
    for name, param in loaded.named_parameters():
        assert torch.equal(param, mine[name]), f"{model_dir.name}: {name} differs after reload"
    check_recorded_outputs(loaded, model_dir, ref)
    print(f"  reload check: parameters, logits and greedy tokens identical "
          f"({len(ref['prompts'])} prompts)")


def reference_document(spec: dict, ref: dict, seed: int, files: list[str], tok, eos: list[int],
                       **extra) -> dict:
    """The reference.json contents of one model directory; `extra` keys override or add."""
    reference = {
        "model": spec["dir"],
        "description": "random weights (not trained); reference computed by transformers "
                       "in float32 on the bf16-rounded weights, eager attention and experts",
        "command": COMMAND,
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
        "seed": seed,
        "dtype_stored": "bfloat16",
        "dtype_compute": "float32",
        "expert_layout": spec["expert_layout"],
        "weight_files": files,
        "eos_token_ids": eos,
        "new_tokens": NEW_TOKENS,
        "greedy": "argmax each step, no EOS stop (eos_stop_index: first new token that is "
                  "an EOS id, or null)",
        "min_top_gap": round(ref["min_gap"], 6),
        "min_router_margin": round(ref["min_router_margin"], 6),
        "clip_qkv_fraction_clamped": (round(ref["clip_fraction"], 6)
                                      if ref["clip_fraction"] is not None else None),
        "logits_format": "raw little-endian float32, [vocab_size] values: the logits after "
                         "the last prompt token",
        "prompts": [{"name": p["name"], **({"messages": p["messages"],
                                             "add_generation_prompt": True}
                                            if "messages" in p else {}),
                     "text": p["text"], "prompt_ids": p["prompt_ids"],
                     "new_ids": p["new_ids"], "new_text": tok.decode(p["new_ids"]),
                     "top_gaps": p["top_gaps"], "eos_stop_index": p["eos_stop_index"],
                     "first_top5": p["first_top5"],
                     "logits_file": f"logits_{i}.f32"}
                    for i, p in enumerate(ref["prompts"])],
        "debug_first_prompt": {
            "router_topk": ref["first_routing"],
            "router_note": "per MoE layer: for each prompt position the selected expert ids "
                           "in descending router-probability order and their weights "
                           "(after norm_topk_prob when set); dense layers are absent",
            "hidden_rms": ref["hidden_rms"],
            "hidden_rms_note": "root-mean-square of the hidden state per prompt position: "
                               "index 0 = embeddings, index L+1 = output of decoder layer "
                               "L (residual included), last entry = final norm output",
        },
    }
    reference.update(extra)
    return reference


def generate_model(spec: dict, base_tok) -> dict:
    model_dir = OUT_ROOT / spec["dir"]
    if model_dir.exists():
        shutil.rmtree(model_dir)
    model_dir.mkdir(parents=True)
    cfg = spec["config"]
    (model_dir / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    write_generation_config(model_dir, cfg, spec["eos"])
    write_tokenizer_files(model_dir, spec["template"])
    # AutoTokenizer reads config.json too; a model_type it does not know needs the class.
    tok_kw = {"config": config_class(spec).from_pretrained(model_dir)} if spec.get("config_class") else {}
    tok = AutoTokenizer.from_pretrained(model_dir, **tok_kw)
    prompts = encode_prompts(tok, base_tok)
    eos = spec["eos"] if isinstance(spec["eos"], list) else [spec["eos"]]

    print(f"{spec['dir']}:")
    std = cfg["initializer_range"]
    judge = deepseek_acceptable if spec.get("router_bias") else acceptable
    for attempt in range(MAX_SEED_TRIES):
        seed = spec["seed"] + attempt
        model = build_model(model_dir, seed, std, len(tok), spec)
        if spec.get("router_bias"):
            init_router_bias(model, seed)
        with torch.no_grad():
            ref = compute_reference(model, prompts, eos)
        why = judge(ref, num_experts_of(cfg), spec.get("min_router_margin", MIN_ROUTER_MARGIN))
        if why is None and spec.get("f64_conditioning"):
            # A seed whose f32 reference is itself 1e-4 from the exact value would test the
            # rounding, not the engine (gpt-oss-tiny's seed 9000: 1.4e-4).
            distance = f64_distance(model, ref["prompts"])
            limit = spec.get("f64_max_diff", F64_MAX_DIFF)
            if distance > limit:
                why = f"f32 reference {distance:.2e} from float64 (> {limit})"
        if why is None:
            break
        print(f"  seed {seed} rejected: {why}; trying seed {seed + 1}")
    else:
        sys.exit(f"{spec['dir']}: no acceptable seed in {MAX_SEED_TRIES} tries")
    emitted = [t for p in ref["prompts"] for t in p["new_ids"]]
    assert max(emitted) < len(tok), "greedy emitted an id outside the tokenizer"
    print(f"  seed {seed}: min top-1/top-2 gap {ref['min_gap']:.4f}, "
          f"min router margin {ref['min_router_margin']:.2e}, experts used per layer "
          f"{ {k: len(v) for k, v in ref['experts_used'].items()} }"
          + (f", clip_qkv clamps {100 * ref['clip_fraction']:.2f}% of q/k/v entries"
             if ref["clip_fraction"] is not None else ""))

    tensors = hub_state_dict(model, spec["expert_layout"])
    if spec.get("mtp_layer"):
        tensors.update(mtp_layer_tensors(tensors, cfg, seed))
    files = write_safetensors(tensors, model_dir, spec["shards"], cfg["num_hidden_layers"])
    for i, p in enumerate(ref["prompts"]):
        p["logits"].numpy().astype("<f4").tofile(model_dir / f"logits_{i}.f32")

    extra = {}
    if spec.get("window_bites"):
        changed = check_window_bites(model, model_dir, ref)
        extra["sliding_window_note"] = (f"with full attention instead, the greedy tokens of {changed} "
                                        f"of {len(ref['prompts'])} prompts differ")
    if spec.get("indexer_bites"):
        changed = check_indexer_bites(model, model_dir, ref)
        extra["indexer_note"] = (f"index_topk {cfg['index_topk']}: the selection drops keys for "
                                 f"{ref['indexer_dropping_queries']} indexer queries, smallest k-th/(k+1)-th "
                                 f"score margin {ref['min_indexer_margin']:.2e}; with dense attention instead, "
                                 f"the greedy tokens of {changed} of {len(ref['prompts'])} prompts differ")
    if cfg.get("model_type") == "gpt_oss":
        extra["swiglu_clamped_fraction"] = round(swiglu_clamped_fraction(model, ref["prompts"]), 6)
    if spec.get("router_bias"):
        extra["router_bias_changed_fraction"] = round(ref["bias_changed_fraction"], 6)
        extra["dtype_stored"] = "bfloat16 (e_score_correction_bias float32)"
    if "kv_lora_rank" in cfg:
        extra["kv_cache"] = kv_cache_note(cfg)
    if spec.get("mtp_layer"):
        extra["mtp_layer"] = (f"model.layers.{cfg['num_hidden_layers']}.*: random tensors in the "
                              "layout of a multi-token-prediction layer; the reference never runs "
                              "them and an engine must not read them")
    reference = reference_document(spec, ref, seed, files, tok, eos, **extra)
    (model_dir / "reference.json").write_text(
        json.dumps(reference, indent=1, ensure_ascii=False) + "\n")
    if spec.get("config_class"):
        verify_files_reload(model_dir, reference, spec)
    else:
        verify_reload(model_dir, model, reference, spec)
    size = sum(f.stat().st_size for f in model_dir.iterdir() if not f.is_symlink())
    print(f"  wrote {model_dir.relative_to(REPO)} ({size / 1e6:.2f} MB)")
    return {"dir": spec["dir"], "seed": seed, "min_gap": ref["min_gap"], "size": size}


def mtp_layer_tensors(tensors: dict[str, torch.Tensor], cfg: dict, seed: int) -> dict[str, torch.Tensor]:
    """GLM-4.5's multi-token-prediction layer as its checkpoints store it after the decoder
    layers (model.layers.<num_hidden_layers>.*): a full MoE decoder layer's tensors (copied
    in shape from the last layer, random values) plus eh_proj [H, 2H], enorm, hnorm and
    shared_head.norm [H]. Plain decoding never runs it; transformers skips it on load."""
    last, mtp = cfg["num_hidden_layers"] - 1, cfg["num_hidden_layers"]
    hidden = cfg["hidden_size"]
    gen = torch.Generator().manual_seed(seed + 104729)
    out = {}
    for name, t in sorted(tensors.items()):
        if name.startswith(f"model.layers.{last}."):
            new = name.replace(f"model.layers.{last}.", f"model.layers.{mtp}.", 1)
            out[new] = (0.3 * torch.randn(t.shape, generator=gen)).to(t.dtype)
    out[f"model.layers.{mtp}.eh_proj.weight"] = (0.3 * torch.randn(hidden, 2 * hidden, generator=gen)).to(torch.bfloat16)
    for norm in ("enorm", "hnorm", "shared_head.norm"):
        out[f"model.layers.{mtp}.{norm}.weight"] = torch.ones(hidden, dtype=torch.bfloat16)
    return out


# ----------------------------------------------------------------------------- DeepSeek-V3
#
# deepseek-v3-tiny/      DeepseekV3ForCausalLM, bf16 (e_score_correction_bias f32, as the
#                        hub checkpoint has it), per-expert tensors, two shards: shard 1
#                        the non-layer tensors (tied embeddings, final norm), shard 2 the
#                        layers.
# deepseek-v3-tiny-fp8/  the same model with every Linear weight of the layers (attention,
#                        dense MLP, shared and routed experts; not the router) stored as
#                        float8_e4m3fn with f32 "<name>_scale_inv" block scales, as
#                        deepseek-ai/DeepSeek-V3 ships them (quantization_config fp8,
#                        weight_block_size FP8_BLOCK). Shard 1 is a relative symlink to
#                        the bf16 model's (same tensors). The reference runs on the
#                        dequantised weights (q.float() * scale_inv per block), so the
#                        comparison is exact in what it tests.

DEEPSEEK_CONFIG = {
    "architectures": ["DeepseekV3ForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
    "first_k_dense_replace": 1,
    "hidden_act": "silu",
    "hidden_size": 32,
    "initializer_range": 0.3,
    "intermediate_size": 64,
    "kv_lora_rank": 32,
    "max_position_embeddings": 256,
    "model_type": "deepseek_v3",
    "moe_intermediate_size": 16,
    "moe_layer_freq": 1,
    "n_group": 4,
    "n_routed_experts": 16,
    "n_shared_experts": 1,
    "norm_topk_prob": True,
    "num_attention_heads": 4,
    "num_experts_per_tok": 4,
    "num_hidden_layers": 4,
    "num_key_value_heads": 4,
    "num_nextn_predict_layers": 0,
    "q_lora_rank": 24,
    "qk_nope_head_dim": 16,
    "qk_rope_head_dim": 8,
    "rms_norm_eps": 1e-06,
    "rope_interleave": True,
    # factor 4 over 64 original positions: with rotary dim 8 the YaRN ramp keeps pair 0,
    # blends pair 1 and interpolates pairs 2-3; mscale != mscale_all_dim makes both the
    # cos/sin attention_factor and the softmax-scale correction differ from 1.
    "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 4.0, "mscale": 1.0,
                     "mscale_all_dim": 0.8, "original_max_position_embeddings": 64, "type": "yarn"},
    "rope_theta": 10000.0,
    "routed_scaling_factor": 2.5,
    "scoring_func": "sigmoid",
    "tie_word_embeddings": True,
    "topk_group": 2,
    "topk_method": "noaux_tc",
    "torch_dtype": "bfloat16",
    "transformers_version": transformers.__version__,
    "use_cache": True,
    "v_head_dim": 16,
    "vocab_size": 151936,
}
FP8_BLOCK = [16, 16]  # small blocks for a tiny model; several dims are not multiples of 16
FP8_QUANTIZATION_CONFIG = {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                           "weight_block_size": FP8_BLOCK}
DEEPSEEK = {"dir": "deepseek-v3-tiny", "fp8_dir": "deepseek-v3-tiny-fp8", "config": DEEPSEEK_CONFIG,
            "eos": QWEN3_EOS, "seed": 3000, "expert_layout": "per_expert", "template": "qwen3"}
BIAS_STD = 0.1             # e_score_correction_bias ~ N(0, 0.1): changes some selections
MIN_BIAS_CHANGED = 0.05    # the bias must change the expert set of >= 5% of routed positions
E4M3_MAX = 448.0


def group_limited_choice(choice: torch.Tensor, n_group: int, topk_group: int, top_k: int):
    """DeepseekV3TopkRouter's selection on choice scores [rows, E]: the sorted expert ids
    and the smallest group and expert margins (k-th minus (k+1)-th)."""
    rows, num_experts = choice.shape
    group_scores = choice.view(rows, n_group, -1).topk(2, dim=-1).values.sum(dim=-1)
    margin = float("inf")
    if topk_group < n_group:
        ordered = group_scores.sort(dim=-1, descending=True).values
        margin = (ordered[:, topk_group - 1] - ordered[:, topk_group]).min().item()
    keep = torch.zeros_like(group_scores, dtype=torch.bool)
    keep.scatter_(1, group_scores.topk(topk_group, dim=-1).indices, True)
    masked = choice.masked_fill(~keep.repeat_interleave(num_experts // n_group, dim=1), float("-inf"))
    ordered = masked.sort(dim=-1, descending=True).values
    margin = min(margin, (ordered[:, top_k - 1] - ordered[:, top_k]).min().item())
    return masked.topk(top_k, dim=-1).indices.sort(dim=-1).values, margin


def deepseek_router_stats(module, logits: torch.Tensor, indices: torch.Tensor) -> tuple[float, int]:
    """Smallest selection margin of one DeepseekV3TopkRouter call (in biased-score units),
    and how many rows the e_score_correction_bias moved to another expert set. Also
    checks that this re-implementation selects what the module did."""
    scores = logits.sigmoid()
    args = (module.num_group, module.topk_group, module.top_k)
    chosen, margin = group_limited_choice(scores + module.e_score_correction_bias, *args)
    assert torch.equal(chosen, indices.sort(dim=-1).values), "router re-implementation differs"
    unbiased, _ = group_limited_choice(scores, *args)
    return margin, int((chosen != unbiased).any(dim=-1).sum())


def minimax_router_stats(logits: torch.Tensor, bias: torch.Tensor, indices: torch.Tensor,
                         top_k: int) -> tuple[float, int]:
    """deepseek_router_stats for MiniMaxM2TopKRouter (sigmoid + bias, top-k, one group)."""
    scores = logits.float().sigmoid()
    chosen, margin = group_limited_choice(scores + bias, 1, 1, top_k)
    assert torch.equal(chosen, indices.sort(dim=-1).values), "router re-implementation differs"
    unbiased, _ = group_limited_choice(scores, 1, 1, top_k)
    return margin, int((chosen != unbiased).any(dim=-1).sum())


def init_router_bias(model: torch.nn.Module, seed: int) -> None:
    """Random non-zero e_score_correction_bias (a buffer, so init_weights leaves it at 0);
    f32, not rounded, as the hub checkpoint stores it."""
    gen = torch.Generator().manual_seed(seed + 7919)
    with torch.no_grad():
        for layer in model.model.layers:
            gate = getattr(layer.mlp, "gate", None)
            # DeepSeek-V3 / GLM keep it on the gate, MiniMax-M2 on the MoE block.
            owner = gate if hasattr(gate, "e_score_correction_bias") else layer.mlp
            if gate is not None and hasattr(owner, "e_score_correction_bias"):
                bias = owner.e_score_correction_bias
                bias.copy_(BIAS_STD * torch.randn(bias.shape, generator=gen))


def is_fp8_weight(name: str, tensor: torch.Tensor) -> bool:
    """The tensors DeepSeek-V3 stores in fp8: 2-D Linear weights inside the layers, except
    norms and the router (mlp.gate.weight)."""
    return (tensor.dim() == 2 and name.startswith("model.layers.") and name.endswith(".weight")
            and "norm" not in name and not name.endswith("mlp.gate.weight"))


def quantise_fp8(w: torch.Tensor, block: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Block-wise e4m3 quantisation: scale_inv [ceil(rows/b0), ceil(cols/b1)] f32 = amax of
    the block / 448, q = w / scale_inv rounded to float8_e4m3fn."""
    rows, cols = w.shape
    br, bc = block
    sr, sc = -(-rows // br), -(-cols // bc)
    padded = torch.zeros(sr * br, sc * bc, dtype=torch.float32)
    padded[:rows, :cols] = w.float()
    blocks = padded.view(sr, br, sc, bc)
    scale = (blocks.abs().amax(dim=(1, 3)) / E4M3_MAX).to(torch.float32)
    assert bool((scale > 0).all()), "an all-zero block"
    q = (blocks / scale[:, None, :, None]).view(sr * br, sc * bc)[:rows, :cols]
    return q.to(torch.float8_e4m3fn).contiguous(), scale.contiguous()


def dequantise_fp8(q: torch.Tensor, scale: torch.Tensor, block: list[int]) -> torch.Tensor:
    """q.float() * scale_inv of its block, in f32 (what charm computes on load)."""
    rows, cols = q.shape
    expanded = scale.repeat_interleave(block[0], dim=0)[:rows].repeat_interleave(block[1], dim=1)[:, :cols]
    return q.to(torch.float32) * expanded


def model_state_from_hub(hub: dict[str, torch.Tensor], model) -> dict[str, torch.Tensor]:
    """The in-memory state dict (fused experts, tied lm_head) from hub tensors in f32:
    the inverse of hub_state_dict's 'per_expert' layout."""
    state = {}
    for name, current in model.state_dict().items():
        if name.endswith("mlp.experts.gate_up_proj"):
            prefix = name[: -len("gate_up_proj")]
            state[name] = torch.stack([torch.cat([hub[f"{prefix}{e}.gate_proj.weight"],
                                                  hub[f"{prefix}{e}.up_proj.weight"]])
                                       for e in range(current.shape[0])])
        elif name.endswith("mlp.experts.down_proj"):
            prefix = name[: -len("down_proj")]
            state[name] = torch.stack([hub[f"{prefix}{e}.down_proj.weight"] for e in range(current.shape[0])])
        elif name == "lm_head.weight" and name not in hub:
            state[name] = hub["model.embed_tokens.weight"]
        else:
            state[name] = hub[name]
    return {k: v.to(torch.float32) for k, v in state.items()}


def fp8_hub_tensors(hub: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The fp8 checkpoint's tensors: fp8 weights plus "<name>_scale_inv", the rest as is."""
    out = {}
    for name, t in hub.items():
        if is_fp8_weight(name, t):
            out[name], out[name + "_scale_inv"] = quantise_fp8(t, FP8_BLOCK)
        else:
            out[name] = t
    return out


def dequantised_hub(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Replaces every float8_e4m3fn tensor by its dequantised f32 values; drops the scales."""
    out = {}
    for name, t in tensors.items():
        if name.endswith("_scale_inv"):
            continue
        if t.dtype == torch.float8_e4m3fn:
            scale = tensors.get(name + "_scale_inv")
            assert scale is not None, f"{name}: no scale"
            out[name] = dequantise_fp8(t, scale, FP8_BLOCK)
        else:
            out[name] = t
    return out


def write_two_shards(tensors: dict[str, torch.Tensor], out_dir: Path,
                     shard1_link: Path | None = None) -> list[str]:
    """Shard 1: tensors outside the layers; shard 2: the layers; plus the index. With
    `shard1_link`, shard 1 is a relative symlink to that file (same tensors)."""
    names = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    parts: list[dict[str, torch.Tensor]] = [{}, {}]
    weight_map = {}
    for key in sorted(tensors):
        idx = 1 if key.startswith("model.layers.") else 0
        parts[idx][key] = tensors[key]
        weight_map[key] = names[idx]
    meta = {"format": "pt"}
    if shard1_link is None:
        save_file(parts[0], str(out_dir / names[0]), metadata=meta)
    else:
        (out_dir / names[0]).symlink_to(os.path.relpath(shard1_link, out_dir))
    save_file(parts[1], str(out_dir / names[1]), metadata=meta)
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (out_dir / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    return names + ["model.safetensors.index.json"]


def read_checkpoint(model_dir: Path) -> dict[str, torch.Tensor]:
    """Every tensor the index of `model_dir` names, read back from the files."""
    index = json.loads((model_dir / "model.safetensors.index.json").read_text())
    out = {}
    for file in sorted(set(index["weight_map"].values())):
        out.update(load_file(str(model_dir / file)))
    assert set(out) == set(index["weight_map"]), f"{model_dir.name}: index and files differ"
    return out


def verify_fp8_reload(model_dir: Path, config_dir: Path, ref: dict, num_tokens: int) -> None:
    """transformers cannot load fp8 on a CPU without accelerate, so: read the written
    files, dequantise, load into a fresh model and require the recorded logits bit for bit
    and the recorded greedy tokens."""
    config = AutoConfig.from_pretrained(config_dir)
    model = AutoModelForCausalLM.from_config(config, **LOAD_KW).eval()
    model.load_state_dict(model_state_from_hub(dequantised_hub(read_checkpoint(model_dir)), model))
    check_recorded_outputs(model, model_dir, ref)
    print(f"  fp8 reload check (files dequantised here): logits and greedy tokens identical "
          f"({len(ref['prompts'])} prompts)")


def verify_files_reload(model_dir: Path, ref: dict, spec: dict) -> None:
    """For a model_type transformers does not know (kimi_k2): from_pretrained applies its
    per-expert -> fused conversion by model_type, so it would not map the hub's expert
    names. Instead read the written files, load them into a fresh model of the spec's
    class and require the recorded logits bit for bit and the recorded greedy tokens."""
    config = config_class(spec).from_pretrained(model_dir)
    model = model_class(spec)._from_config(config, dtype=torch.float32, attn_implementation="eager",
                                           experts_implementation="eager").eval()
    hub = read_checkpoint(model_dir)
    state = model_state_from_hub(hub, model)
    assert set(state) == set(model.state_dict()), f"{model_dir.name}: state names differ"
    model.load_state_dict(state)
    check_recorded_outputs(model, model_dir, ref)
    print(f"  reload check (files read here, {config.model_type} is not an AutoConfig type): logits and "
          f"greedy tokens identical ({len(ref['prompts'])} prompts)")


def kv_cache_note(cfg: dict) -> dict:
    """KV cache bytes per token (f32) of the compressed MLA cache charm keeps, and of the
    full per-head K/V the reference expands it to."""
    layers = cfg["num_hidden_layers"]
    # GLM-5's DSA: charm keeps the indexer's key [index_head_dim] in the same row.
    compressed = layers * (cfg["kv_lora_rank"] + cfg["qk_rope_head_dim"] + cfg.get("index_head_dim", 0)) * 4
    full = layers * cfg["num_attention_heads"] * (cfg["qk_nope_head_dim"] + cfg["qk_rope_head_dim"]
                                                  + cfg["v_head_dim"]) * 4
    return {"bytes_per_token_f32": compressed, "full_kv_bytes_per_token_f32": full,
            "note": "compressed = num_hidden_layers * (kv_lora_rank + qk_rope_head_dim [+ index_head_dim]) * 4; "
                    "full = num_hidden_layers * num_attention_heads * (qk_nope_head_dim + "
                    "qk_rope_head_dim + v_head_dim) * 4"}


def deepseek_acceptable(ref: dict, num_experts: int, min_router_margin: float = MIN_ROUTER_MARGIN) -> str | None:
    why = acceptable(ref, num_experts, min_router_margin)
    if why is None and ref["bias_changed_fraction"] < MIN_BIAS_CHANGED:
        why = f"the bias changes only {ref['bias_changed_fraction']:.3f} of routed positions"
    return why


def write_model_dir(model_dir: Path, cfg: dict, spec: dict) -> None:
    if model_dir.exists():
        shutil.rmtree(model_dir)
    model_dir.mkdir(parents=True)
    (model_dir / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    write_generation_config(model_dir, cfg, spec["eos"])
    write_tokenizer_files(model_dir, spec["template"])


def generate_deepseek(spec: dict, base_tok) -> list[dict]:
    """deepseek-v3-tiny and its fp8 twin: one seed must give acceptable references for both."""
    cfg = spec["config"]
    bf16_dir, fp8_dir = OUT_ROOT / spec["dir"], OUT_ROOT / spec["fp8_dir"]
    write_model_dir(bf16_dir, cfg, spec)
    write_model_dir(fp8_dir, {**cfg, "quantization_config": FP8_QUANTIZATION_CONFIG}, spec)
    tok = AutoTokenizer.from_pretrained(bf16_dir)
    prompts = encode_prompts(tok, base_tok)
    eos = spec["eos"]
    print(f"{spec['dir']} + {spec['fp8_dir']}:")
    for attempt in range(MAX_SEED_TRIES):
        seed = spec["seed"] + attempt
        model = build_model(bf16_dir, seed, cfg["initializer_range"], len(tok))
        init_router_bias(model, seed)
        hub = hub_state_dict(model, spec["expert_layout"])
        fp8_tensors = fp8_hub_tensors(hub)
        fp8_model = copy.deepcopy(model)
        fp8_model.load_state_dict(model_state_from_hub(dequantised_hub(fp8_tensors), fp8_model))
        with torch.no_grad():
            ref = compute_reference(model, prompts, eos)
            fp8_ref = compute_reference(fp8_model, prompts, eos)
        why = deepseek_acceptable(ref, cfg["n_routed_experts"])
        why = why or (("fp8: " + w) if (w := deepseek_acceptable(fp8_ref, cfg["n_routed_experts"])) else None)
        if why is None:
            break
        print(f"  seed {seed} rejected: {why}; trying seed {seed + 1}")
    else:
        sys.exit(f"{spec['dir']}: no acceptable seed in {MAX_SEED_TRIES} tries")
    changed = sum(int(not torch.equal(model_state_from_hub(hub, model)[k], v))
                  for k, v in fp8_model.state_dict().items() if v.dtype == torch.float32)
    print(f"  seed {seed}: min gap {ref['min_gap']:.4f} (fp8 {fp8_ref['min_gap']:.4f}), min router "
          f"margin {ref['min_router_margin']:.4f} (fp8 {fp8_ref['min_router_margin']:.4f}), bias changes "
          f"{100 * ref['bias_changed_fraction']:.1f}% of expert sets, fp8 changes {changed} tensors, greedy "
          f"tokens differing bf16 vs fp8: "
          f"{sum(a != b for p, q in zip(ref['prompts'], fp8_ref['prompts']) for a, b in zip(p['new_ids'], q['new_ids']))}")

    summaries = []
    for out_dir, tensors, r, link, kind in (
            (bf16_dir, hub, ref, None, "bf16"),
            (fp8_dir, fp8_tensors, fp8_ref, bf16_dir / "model-00001-of-00002.safetensors", "fp8")):
        files = write_two_shards(tensors, out_dir, link)
        for i, p in enumerate(r["prompts"]):
            p["logits"].numpy().astype("<f4").tofile(out_dir / f"logits_{i}.f32")
        extra = {"kv_cache": kv_cache_note(cfg),
                 "router_bias_changed_fraction": round(r["bias_changed_fraction"], 6)}
        if kind == "fp8":
            extra.update({
                "model": spec["fp8_dir"],
                "description": "random weights (not trained); the layers' Linear weights stored as "
                               "float8_e4m3fn with f32 weight_scale_inv blocks; reference computed "
                               "by transformers in float32 on the dequantised weights "
                               "(q.float() * scale_inv), eager attention and experts",
                "dtype_stored": "float8_e4m3fn + f32 scales (layer Linear weights), bfloat16 "
                                "(embeddings, norms, router), float32 (e_score_correction_bias)",
                "fp8_weight_block_size": FP8_BLOCK,
                "shared_files": {"model-00001-of-00002.safetensors": f"symlink to ../{spec['dir']}/"}})
        else:
            extra["dtype_stored"] = "bfloat16 (e_score_correction_bias float32)"
        reference = reference_document({**spec, "dir": out_dir.name}, r, seed, files, tok, eos, **extra)
        (out_dir / "reference.json").write_text(json.dumps(reference, indent=1, ensure_ascii=False) + "\n")
        if kind == "bf16":
            verify_reload(out_dir, model, reference)
        else:
            verify_fp8_reload(out_dir, bf16_dir, reference, len(tok))
        size = sum(f.stat().st_size for f in out_dir.iterdir() if not f.is_symlink())
        print(f"  wrote {out_dir.relative_to(REPO)} ({size / 1e6:.2f} MB)")
        summaries.append({"dir": out_dir.name, "seed": seed, "min_gap": r["min_gap"], "size": size})
    return summaries


def main() -> None:
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    if not (TOKENIZER_DIR / "tokenizer.json").exists():
        sys.exit(f"missing {TOKENIZER_DIR / 'tokenizer.json'}")
    if not QWEN25_TEMPLATE.exists():
        sys.exit(f"missing {QWEN25_TEMPLATE}")
    base_tok = AutoTokenizer.from_pretrained(TOKENIZER_DIR)
    known = [spec["dir"] for spec in MODELS] + [DEEPSEEK["dir"]]
    wanted = sys.argv[1:] or known
    unknown = set(wanted) - set(known)
    if unknown:
        sys.exit(f"unknown fixture(s) {sorted(unknown)}; known: {known}")
    summary = [generate_model(spec, base_tok) for spec in MODELS if spec["dir"] in wanted]
    if DEEPSEEK["dir"] in wanted:
        summary += generate_deepseek(DEEPSEEK, base_tok)
    total = sum(s["size"] for s in summary)
    print(f"total {total / 1e6:.2f} MB; min gaps "
          + ", ".join(f"{s['dir']} {s['min_gap']:.4f}" for s in summary))


if __name__ == "__main__":
    main()
