#!/usr/bin/env python3
"""Writes each tiny fixture checkpoint (tests/fixtures/models/<name>/) as a GGUF file laid out
the way llama.cpp's convert_hf_to_gguf.py lays out that family, so the tests can check that
charm serving the GGUF gives the same logits as serving the safetensors.

Why not run convert_hf_to_gguf.py itself: it needs torch and transformers (CI has neither),
and it refuses what llama.cpp's graphs cannot run but the fixtures exercise on purpose
(Qwen3-MoE's mlp_only_layers, for one). So this script follows the converter's rules with
the gguf package (numpy only):
- tensor names from gguf-py's own map (gguf.get_tensor_name_map, the converter's table);
- routed experts stacked into ffn_{gate,up,down}_exps [n_expert, rows, cols];
- 1-D tensors, `*_norm.weight` and the routers (ffn_gate_inp, ffn_gate_inp_shexp) widened to
  F32 (convert_hf_to_gguf's rule), every other matrix kept as the checkpoint's bf16 bits, or
  written as --outtype f16 / f32;
- Mixtral (arch "llama"): q_proj / k_proj rows permuted to llama.cpp's rotary order
  (LlamaModel.permute); DeepSeek-V3 (arch "deepseek2"): kv_b_proj split into attn_k_b
  (transposed) and attn_v_b, num_key_value_heads written as 1 (MLA as MQA);
- gpt-oss (arch "gpt-oss", GptOssModel.modify_tensors without --fuse-gate-up-exps):
  gate_up_proj [E, H, 2I] transposed and split into ffn_gate_exps (its even rows) and
  ffn_up_exps (odd rows), down_proj transposed, the biases split the same way, sinks
  named attn_sinks.weight; --outtype mxfp4 makes only the routed experts MXFP4 (the
  converter keeps gpt-oss's experts MXFP4 and everything else at its outtype, here bf16);
- GLM-4.5 (arch "glm4moe", Glm4MoeModel): block_count counts the multi-token-prediction
  layers too (num_hidden_layers + num_nextn_predict_layers), whose tensors are written
  as blk.<n>.* and blk.<n>.nextn.*; MiniMax-M2 (arch "minimax-m2"): experts w1 / w3 / w2
  stacked as Mixtral's, rotary_dim as rope.dimension_count;
- Qwen3-Next (arch "qwen3next", Qwen3NextModel.modify_tensors, on tensors already widened to
  f32 as the converter widens bf16 before it): A_log written as -exp(A_log) (ssm_a; exp
  here in f64, rounded once to f32: torch's f32 exp may differ by an ulp), dt_bias as
  ssm_dt.bias, conv1d squeezed to [channels, kernel] and kept F32, every norm but the
  DeltaNet's gated one written as 1 + w, in_proj_qkvz split into attn_qkv (q of every key
  head, then k, then v) and attn_gate (z); --ssm-in keeps it whole as older converters
  did (ssm_in, the hub's per-key-head grouping);
- GLM-5 (arch "glm-dsa", GlmMoeDsaModel) and DeepSeek-V3.2 (arch "deepseek32",
  DeepseekV32Model): DeepSeek-V3's rules, the indexer's tensors (indexer.proj kept F32) and
  attention.indexer.* keys, GLM-5's indexer_types as booleans (true = full); the gating
  function only where the config names one (the fixtures do not: llama.cpp's glm-dsa then
  takes sigmoid). gguf 0.19 has no deepseek32: GLM-5's tensor names (the same) are used;
- Qwen3.5-MoE (arch "qwen35moe", _LinearAttentionVReorderBase): Qwen3-Next's rules on its
  separate projections, after the value heads are reordered from the hub's grouped order
  (key head g's heads together) to tiled order (head j of every key head together) in
  every value-head-indexed place: the v rows of in_proj_qkv, the rows of in_proj_z,
  in_proj_b and in_proj_a, A_log, dt_bias, conv1d's v channels and out_proj's columns;
- hyper-parameters under llama.cpp's metadata keys; a value llama.cpp hard-codes for the
  architecture is written only when the fixture differs from it, with the key llama.cpp
  defines for it (e.g. {arch}.expert_weights_norm);
- the tokenizer as get_vocab_base writes it: one token per id up to vocab_size, "[PAD<i>]"
  (type UNUSED) for ids the tokenizer lacks, added special tokens as CONTROL.

The real converter's output is compared with this script's on the demo model (which
llama.cpp can convert) in docs/models.md ("GGUF"), and on the Qwen3-Next, Qwen3.5-MoE, GLM-5
and DeepSeek-V3.2 fixtures (convert_hf_to_gguf.py --no-mtp, the GLM and DeepSeek vocabularies
set as gpt2: the same tensors byte for byte, and the same model keys but {arch}.vocab_size,
which this script adds to the Qwen files).

Usage: gen_gguf_fixtures.py --out DIR [--outtype bf16|f16|f32|q8_0|q4_0|q4_1|q5_0|q5_1|mxfp4] [--dense-only]
       [--fuse-gate-up-exps] [--ssm-in] [NAME ...]
(default: every fixture llama.cpp has an architecture for; needs numpy and gguf)
"""
from __future__ import annotations

import argparse
import json
import struct
import sys
from pathlib import Path

import numpy as np
import gguf

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures" / "models"

ARCH = {
    "Qwen2MoeForCausalLM": gguf.MODEL_ARCH.QWEN2MOE,
    "Qwen3MoeForCausalLM": gguf.MODEL_ARCH.QWEN3MOE,
    "OlmoeForCausalLM": gguf.MODEL_ARCH.OLMOE,
    "MixtralForCausalLM": gguf.MODEL_ARCH.LLAMA,
    "DeepseekV3ForCausalLM": gguf.MODEL_ARCH.DEEPSEEK2,
    "GptOssForCausalLM": gguf.MODEL_ARCH.GPT_OSS,
    "Glm4MoeForCausalLM": gguf.MODEL_ARCH.GLM4_MOE,
    "MiniMaxM2ForCausalLM": gguf.MODEL_ARCH.MINIMAXM2,
    "Qwen3NextForCausalLM": gguf.MODEL_ARCH.QWEN3NEXT,
    "Qwen3_5MoeForCausalLM": gguf.MODEL_ARCH.QWEN35MOE,
    "GlmMoeDsaForCausalLM": gguf.MODEL_ARCH.GLM_DSA,
    "DeepseekV32ForCausalLM": gguf.MODEL_ARCH.GLM_DSA,  # written as deepseek32 (ARCH_NAME)
}
# The architecture name where gguf 0.19 has no MODEL_ARCH of its own.
ARCH_NAME = {"DeepseekV32ForCausalLM": "deepseek32"}
MLA = (gguf.MODEL_ARCH.DEEPSEEK2, gguf.MODEL_ARCH.GLM_DSA)
DEFAULT_FIXTURES = ["qwen2-moe-tiny", "qwen3-moe-tiny", "olmoe-tiny", "mixtral-tiny", "deepseek-v3-tiny",
                    "gpt-oss-tiny", "glm4-moe-tiny", "minimax-m2-tiny", "qwen3-next-tiny", "qwen3.5-moe-tiny",
                    "glm-moe-dsa-tiny", "deepseek-v32-tiny"]

# Whether llama.cpp's graph renormalises the top-k router weights for the architecture
# when the file does not say (src/llama-model.cpp): only then is the key not needed.
DEFAULT_NORM_TOPK = {
    gguf.MODEL_ARCH.QWEN2MOE: False,
    gguf.MODEL_ARCH.QWEN3MOE: True,
    gguf.MODEL_ARCH.OLMOE: False,
    gguf.MODEL_ARCH.LLAMA: True,
    gguf.MODEL_ARCH.DEEPSEEK2: False,
    gguf.MODEL_ARCH.GPT_OSS: False,  # softmax over the chosen k (SOFTMAX_WEIGHT): no key
    gguf.MODEL_ARCH.GLM4_MOE: False,
    gguf.MODEL_ARCH.MINIMAXM2: False,
    gguf.MODEL_ARCH.QWEN3NEXT: True,  # hard-coded in llama.cpp's graph: no key is ever written
    gguf.MODEL_ARCH.QWEN35MOE: True,
    gguf.MODEL_ARCH.GLM_DSA: False,
}

# The clamp of gpt-oss's SwiGLU that llama.cpp's graph hard-codes (build_moe_ffn,
# LLM_FFN_SWIGLU_OAI_MOE); a fixture with another one carries it as swiglu_clamp_exp.
GPT_OSS_SWIGLU_LIMIT = 7.0


def read_safetensors(model_dir: Path) -> dict[str, tuple[str, np.ndarray]]:
    """name -> (dtype, array); bf16 kept as its uint16 bits."""
    out = {}
    for path in sorted(model_dir.glob("*.safetensors")):
        raw = path.read_bytes()
        n = struct.unpack("<Q", raw[:8])[0]
        header = json.loads(raw[8 : 8 + n])
        base = 8 + n
        for name, info in header.items():
            if name == "__metadata__":
                continue
            begin, end = info["data_offsets"]
            np_type = {"BF16": np.uint16, "F16": np.float16, "F32": np.float32}[info["dtype"]]
            array = np.frombuffer(raw[base + begin : base + end], dtype=np_type).reshape(info["shape"])
            out[name] = (info["dtype"], array)
    return out


def to_f32(dtype: str, array: np.ndarray) -> np.ndarray:
    if dtype == "BF16":
        return (array.astype(np.uint32) << 16).view(np.float32)
    return array.astype(np.float32)


QUANT_TYPES = {"q8_0": gguf.GGMLQuantizationType.Q8_0, "q4_0": gguf.GGMLQuantizationType.Q4_0,
               "q4_1": gguf.GGMLQuantizationType.Q4_1, "q5_0": gguf.GGMLQuantizationType.Q5_0,
               "q5_1": gguf.GGMLQuantizationType.Q5_1, "mxfp4": gguf.GGMLQuantizationType.MXFP4}


def stored(dtype: str, array: np.ndarray, outtype: str, fallback: str = "f16"):
    """(array, raw ggml type) for a matrix written at `outtype` from `dtype`. A quantised
    outtype uses gguf-py's own quantiser (as convert_hf_to_gguf.py --outtype q8_0 does) and
    falls back to `fallback` (F16, as the converter does) for a matrix whose rows are not
    whole blocks."""
    if outtype in QUANT_TYPES:
        qtype = QUANT_TYPES[outtype]
        try:
            return gguf.quants.quantize(to_f32(dtype, array), qtype), qtype
        except gguf.QuantError:
            return stored(dtype, array, fallback)
    if outtype == "bf16" and dtype == "BF16":
        return array, gguf.GGMLQuantizationType.BF16
    values = to_f32(dtype, array)
    if outtype == "f16":
        return values.astype(np.float16), gguf.GGMLQuantizationType.F16
    if outtype == "bf16":
        bits = values.view(np.uint32)
        return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16), gguf.GGMLQuantizationType.BF16
    return values, gguf.GGMLQuantizationType.F32


def llama_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """LlamaModel.permute: HF's half-split rotary rows -> llama.cpp's interleaved pairs."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def stack_experts(tensors, prefix_of, names, n_layers, n_experts):
    """Replaces per-expert (or fused gate_up) tensors by one [E, rows, cols] per projection."""
    out = dict(tensors)
    for layer in range(n_layers):
        prefix = prefix_of(layer)
        gate_up = prefix + ".gate_up_proj"
        if gate_up in out:  # transformers 5: [E, 2I, H] gate rows first, then up
            dtype, gu = out.pop(gate_up)
            half = gu.shape[1] // 2
            out[f"{prefix}.{names[0]}.weight"] = (dtype, np.ascontiguousarray(gu[:, :half]))
            out[f"{prefix}.{names[1]}.weight"] = (dtype, np.ascontiguousarray(gu[:, half:]))
            dtype, down = out.pop(prefix + ".down_proj")
            out[f"{prefix}.{names[2]}.weight"] = (dtype, down)
            continue
        for proj in names:
            keys = [f"{prefix}.{e}.{proj}.weight" for e in range(n_experts)]
            if keys[0] not in out:
                break
            parts = [out.pop(k) for k in keys]
            out[f"{prefix}.{proj}.weight"] = (parts[0][0], np.stack([p[1] for p in parts]))
    return out


def gpt_oss_pieces(hf_name: str, array: np.ndarray) -> list[tuple[str, np.ndarray]]:
    """GptOssModel.modify_tensors for bf16 experts (no --fuse-gate-up-exps): gate_up_proj
    [E, H, 2I] (x @ W, gate in the even columns) transposed to [E, 2I, H] and split into
    gate_proj (its even rows) and up_proj (odd rows); down_proj [E, I, H] transposed to
    [E, H, I]; gate_up_proj_bias split the same way; sinks named sinks.weight."""
    def c(a):
        return np.ascontiguousarray(a)
    if hf_name.endswith("self_attn.sinks"):
        return [(hf_name + ".weight", array)]
    if hf_name.endswith("experts.gate_up_proj"):
        t = array.swapaxes(-1, -2)
        return [(hf_name.replace("gate_up_proj", "gate_proj.weight"), c(t[:, ::2])),
                (hf_name.replace("gate_up_proj", "up_proj.weight"), c(t[:, 1::2]))]
    if hf_name.endswith("experts.gate_up_proj_bias"):
        return [(hf_name.replace("gate_up_proj_bias", "gate_proj.bias"), c(array[..., ::2])),
                (hf_name.replace("gate_up_proj_bias", "up_proj.bias"), c(array[..., 1::2]))]
    if hf_name.endswith("experts.down_proj"):
        return [(hf_name + ".weight", c(array.swapaxes(-1, -2)))]
    if hf_name.endswith("experts.down_proj_bias"):
        return [(hf_name.replace("down_proj_bias", "down_proj.bias"), array)]
    return [(hf_name, array)]


def write_tokenizer(writer: gguf.GGUFWriter, model_dir: Path, vocab_size: int, config: dict) -> None:
    tok = json.loads((model_dir / "tokenizer.json").read_text())
    reverse = {i: t for t, i in tok["model"]["vocab"].items()}
    special = {}
    for added in tok.get("added_tokens", []):
        reverse[added["id"]] = added["content"]
        special[added["id"]] = added.get("special", False)
    tokens, types = [], []
    for i in range(vocab_size):
        if i not in reverse:
            tokens.append(f"[PAD{i}]")
            types.append(gguf.TokenType.UNUSED)
        else:
            tokens.append(reverse[i])
            types.append(gguf.TokenType.CONTROL if special.get(i, None) else
                         gguf.TokenType.USER_DEFINED if i in special else gguf.TokenType.NORMAL)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("qwen2")  # every fixture carries the Qwen2 tokenizer
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    merges = tok["model"]["merges"]
    writer.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in merges])
    gen = json.loads((model_dir / "generation_config.json").read_text())
    eos = gen.get("eos_token_id", config.get("eos_token_id"))
    eos = eos if isinstance(eos, list) else [eos]
    writer.add_eos_token_id(eos[0])
    if len(eos) > 1:
        writer.add_eot_token_id(eos[1])
    if config.get("bos_token_id") is not None:
        writer.add_bos_token_id(config["bos_token_id"])
    writer.add_add_bos_token(False)
    tc = model_dir / "tokenizer_config.json"
    if tc.exists() and "chat_template" in json.loads(tc.read_text()):
        writer.add_chat_template(json.loads(tc.read_text())["chat_template"])


def write_hparams(writer: gguf.GGUFWriter, arch, c: dict) -> None:
    a = writer.arch
    writer.add_block_count(block_count(arch, c))
    writer.add_context_length(c["max_position_embeddings"])
    writer.add_embedding_length(c["hidden_size"])
    if "intermediate_size" in c:  # Qwen3.5-MoE has no dense MLP
        writer.add_feed_forward_length(c["intermediate_size"])
    writer.add_head_count(c["num_attention_heads"])
    writer.add_head_count_kv(1 if arch in MLA else c["num_key_value_heads"])
    writer.add_rope_freq_base(c.get("rope_theta", 10000.0))
    writer.add_layer_norm_rms_eps(c["rms_norm_eps"])
    writer.add_vocab_size(c["vocab_size"])
    n_experts = c.get("num_experts", c.get("num_local_experts", c.get("n_routed_experts")))
    writer.add_expert_count(n_experts)
    writer.add_expert_used_count(c["num_experts_per_tok"])
    if "head_dim" in c:
        writer.add_key_length(c["head_dim"])
        writer.add_value_length(c["head_dim"])
    if "moe_intermediate_size" in c:
        writer.add_expert_feed_forward_length(c["moe_intermediate_size"])
    if "shared_expert_intermediate_size" in c:
        writer.add_expert_shared_feed_forward_length(c["shared_expert_intermediate_size"])
    if c.get("clip_qkv") is not None:
        writer.add_clamp_kqv(c["clip_qkv"])
    norm = c.get("norm_topk_prob", DEFAULT_NORM_TOPK[arch])
    if arch in MLA:
        writer.add_leading_dense_block_count(c.get("first_k_dense_replace", 0))
        if c.get("q_lora_rank") is not None:
            writer.add_q_lora_rank(c["q_lora_rank"])
        writer.add_kv_lora_rank(c["kv_lora_rank"])
        writer.add_key_length(c["kv_lora_rank"] + c["qk_rope_head_dim"])
        writer.add_value_length(c["kv_lora_rank"])
        writer.add_key_length_mla(c["qk_nope_head_dim"] + c["qk_rope_head_dim"])
        writer.add_value_length_mla(c["v_head_dim"])
        writer.add_expert_shared_count(c.get("n_shared_experts", 0))
        writer.add_expert_weights_scale(c.get("routed_scaling_factor", 1.0))
        writer.add_rope_dimension_count(c["qk_rope_head_dim"])
        writer.add_expert_group_count(c.get("n_group", 1))
        writer.add_expert_group_used_count(c.get("topk_group", 1))
        func = c.get("scoring_func", "softmax" if arch == gguf.MODEL_ARCH.DEEPSEEK2 else None)
        if func is not None:
            writer.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID if func == "sigmoid"
                                          else gguf.ExpertGatingFuncType.SOFTMAX)
        rs = c.get("rope_scaling") or {}
        if rs.get("type", rs.get("rope_type")) == "yarn":
            writer.add_rope_scaling_type(gguf.RopeScalingType.YARN)
            writer.add_rope_scaling_factor(rs["factor"])
            writer.add_rope_scaling_orig_ctx_len(rs["original_max_position_embeddings"])
            writer.add_rope_scaling_yarn_beta_fast(rs.get("beta_fast", 32))
            writer.add_rope_scaling_yarn_beta_slow(rs.get("beta_slow", 1))
            if rs.get("mscale_all_dim") is not None:
                writer.add_rope_scaling_yarn_log_mul(0.1 * rs["mscale_all_dim"])
    if arch == gguf.MODEL_ARCH.GLM_DSA:
        writer.add_indexer_head_count(c["index_n_heads"])
        writer.add_indexer_key_length(c["index_head_dim"])
        writer.add_indexer_top_k(c["index_topk"])
        if c.get("indexer_types") is not None and writer.arch == "glm-dsa":
            writer.add_array(f"{writer.arch}.attention.indexer.types", [t == "full" for t in c["indexer_types"]])
    if arch == gguf.MODEL_ARCH.GPT_OSS:
        write_gpt_oss_hparams(writer, c)
    elif arch == gguf.MODEL_ARCH.GLM4_MOE:
        write_glm4_moe_hparams(writer, c)
    elif arch == gguf.MODEL_ARCH.MINIMAXM2:
        writer.add_expert_feed_forward_length(c["intermediate_size"])  # MiniMaxM2Model
        writer.add_rope_dimension_count(c["rotary_dim"])
        writer.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID)  # TextModel, from scoring_func
    elif arch in (gguf.MODEL_ARCH.QWEN3NEXT, gguf.MODEL_ARCH.QWEN35MOE):
        write_qwen3_next_hparams(writer, c)
        if arch == gguf.MODEL_ARCH.QWEN35MOE:
            # _Qwen35MRopeMixin's default sections [11, 11, 10] are for 32 rotary pairs; llama.cpp
            # aborts when they outgrow the head (the fixture turns 2 pairs). Interleaved MRoPE
            # gives pair i section i % 3 while i < 3 * sections[i % 3] (else the 4th, whose text
            # position is 0), so each section is sized to reach the last pair it owns: [11, 11,
            # 10] for 32 pairs, [1, 1, 0] for 2. A text token's three positions are equal, so
            # every pair then turns as plain RoPE, as charm and transformers turn it.
            half = int(c["head_dim"] * c.get("partial_rotary_factor", 0.25)) // 2
            sections = [max((i // 3 + 1 for i in range(half) if i % 3 == k), default=0) for k in range(3)]
            writer.add_rope_dimension_sections([*sections, 0])
    if norm != DEFAULT_NORM_TOPK[arch] or arch in (*MLA, gguf.MODEL_ARCH.GLM4_MOE) and norm:
        writer.add_bool(gguf.Keys.LLM.EXPERT_WEIGHTS_NORM.format(arch=a), bool(norm))


def block_count(arch, c: dict) -> int:
    """GLM-4.5's file counts its multi-token-prediction layers as blocks too (Glm4MoeModel)."""
    if arch == gguf.MODEL_ARCH.GLM4_MOE:
        return c["num_hidden_layers"] + c.get("num_nextn_predict_layers", 0)
    return c["num_hidden_layers"]


def write_gpt_oss_hparams(writer: gguf.GGUFWriter, c: dict) -> None:
    """GptOssModel.set_gguf_parameters and TextModel's rope_scaling rule; the SwiGLU clamp
    only when it is not the one llama.cpp hard-codes (GPT_OSS_SWIGLU_LIMIT)."""
    writer.add_sliding_window(c["sliding_window"])
    writer.add_expert_feed_forward_length(c["intermediate_size"])
    rs = c["rope_scaling"]
    writer.add_rope_scaling_type(gguf.RopeScalingType.YARN)
    writer.add_rope_scaling_factor(rs["factor"])
    writer.add_rope_scaling_orig_ctx_len(rs.get("original_max_position_embeddings", 4096))
    if "beta_fast" in rs:
        writer.add_rope_scaling_yarn_beta_fast(rs["beta_fast"])
    if "beta_slow" in rs:
        writer.add_rope_scaling_yarn_beta_slow(rs["beta_slow"])
    limit = c.get("swiglu_limit", GPT_OSS_SWIGLU_LIMIT)
    if limit != GPT_OSS_SWIGLU_LIMIT:
        writer.add_swiglu_clamp_exp([float(limit)] * c["num_hidden_layers"])  # per layer, as llama.cpp reads it


def write_glm4_moe_hparams(writer: gguf.GGUFWriter, c: dict) -> None:
    """Glm4MoeModel.set_gguf_parameters plus TextModel's expert groups."""
    writer.add_rope_dimension_count(int(c["head_dim"] * c.get("partial_rotary_factor", 0.5)))
    writer.add_expert_shared_count(c["n_shared_experts"])
    writer.add_leading_dense_block_count(c["first_k_dense_replace"])
    writer.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID)
    writer.add_expert_weights_scale(c["routed_scaling_factor"])
    writer.add_expert_group_count(c.get("n_group", 1))
    writer.add_expert_group_used_count(c.get("topk_group", 1))
    writer.add_nextn_predict_layers(c.get("num_nextn_predict_layers", 0))


def write_qwen3_next_hparams(writer: gguf.GGUFWriter, c: dict) -> None:
    """Qwen3NextModel.set_gguf_parameters. attention.recurrent_layers from layer_types, which
    Qwen3NextConfig fills in from full_attention_interval when config.json has none (gguf
    0.19 has no name for that key, hence the raw one)."""
    a = writer.arch
    writer.add_uint32(f"{a}.ssm.conv_kernel", c["linear_conv_kernel_dim"])
    writer.add_uint32(f"{a}.ssm.state_size", c["linear_key_head_dim"])
    writer.add_uint32(f"{a}.ssm.group_count", c["linear_num_key_heads"])
    writer.add_uint32(f"{a}.ssm.time_step_rank", c["linear_num_value_heads"])
    writer.add_uint32(f"{a}.ssm.inner_size", c["linear_value_head_dim"] * c["linear_num_value_heads"])
    interval = c.get("full_attention_interval", 4)
    linear = [t == "linear_attention" for t in c["layer_types"]] if c.get("layer_types") is not None else \
        [(layer + 1) % interval != 0 for layer in range(c["num_hidden_layers"])]
    writer.add_array(f"{a}.attention.recurrent_layers", linear)
    writer.add_uint32(f"{a}.full_attention_interval", interval)
    writer.add_rope_dimension_count(int(c["head_dim"] * c.get("partial_rotary_factor", 0.25)))


def tile_v_heads(array: np.ndarray, axis: int, c: dict, head_dim: int) -> np.ndarray:
    """_LinearAttentionVReorderBase._reorder_v_heads: `axis` (value heads x head_dim) from
    grouped order [key head, head within it] to tiled [head within, key head]."""
    kh = c["linear_num_key_heads"]
    r = c["linear_num_value_heads"] // kh
    moved = np.moveaxis(array, axis, 0)
    tiled = moved.reshape(kh, r, head_dim, -1).swapaxes(0, 1).reshape(moved.shape)
    return np.ascontiguousarray(np.moveaxis(tiled, 0, axis))


def qwen35_tiled(hf_name: str, array: np.ndarray, c: dict) -> np.ndarray:
    """_LinearAttentionVReorderBase.modify_tensors: the value heads of `array` tiled
    (nothing to do when there are as many value heads as key heads)."""
    if c["linear_num_key_heads"] == c["linear_num_value_heads"] or "linear_attn." not in hf_name:
        return array
    dv = c["linear_value_head_dim"]
    qk = 2 * c["linear_key_head_dim"] * c["linear_num_key_heads"]
    if ".in_proj_qkv." in hf_name or ".conv1d." in hf_name:  # only the v rows / channels
        return np.concatenate([array[:qk], tile_v_heads(array[qk:], 0, c, dv)])
    if ".in_proj_z." in hf_name:
        return tile_v_heads(array, 0, c, dv)
    if ".in_proj_b." in hf_name or ".in_proj_a." in hf_name or hf_name.endswith((".A_log", ".dt_bias")):
        return tile_v_heads(array, 0, c, 1)
    if ".out_proj." in hf_name:
        return tile_v_heads(array, 1, c, dv)
    return array


def qwen3_next_pieces(hf_name: str, dtype: str, array: np.ndarray, c: dict, ssm_in: bool):
    """Qwen3NextModel.modify_tensors on one tensor: [(name, dtype, array)], where a name
    starting "blk." is the GGUF name itself (attn_qkv / attn_gate have no HF name)."""
    if hf_name.endswith(".A_log"):
        return [(hf_name, "F32", (-np.exp(to_f32(dtype, array).astype(np.float64))).astype(np.float32))]
    if hf_name.endswith(".dt_bias"):
        return [(hf_name.removesuffix(".dt_bias") + ".dt_proj.bias", dtype, array)]
    if "conv1d" in hf_name:
        return [(hf_name, "F32", to_f32(dtype, array).reshape(array.shape[0], -1))]
    if hf_name.endswith("norm.weight") and not hf_name.endswith("linear_attn.norm.weight"):
        return [(hf_name, "F32", to_f32(dtype, array) + np.float32(1))]
    if hf_name.endswith("in_proj_qkvz.weight") and not ssm_in:
        dk, dv = c["linear_key_head_dim"], c["linear_value_head_dim"]
        kh, vh = c["linear_num_key_heads"], c["linear_num_value_heads"]
        r = vh // kh
        groups = array.reshape(kh, 2 * dk + 2 * r * dv, -1)  # rows grouped per key head: q | k | v | z
        q, k = groups[:, :dk], groups[:, dk:2 * dk]
        v, z = groups[:, 2 * dk:2 * dk + r * dv], groups[:, 2 * dk + r * dv:]
        hidden = array.shape[-1]
        qkv = np.concatenate([x.reshape(-1, hidden) for x in (q, k, v)])
        layer = int(hf_name.split(".")[2])
        return [(f"blk.{layer}.attn_qkv.weight", dtype, np.ascontiguousarray(qkv)),
                (f"blk.{layer}.attn_gate.weight", dtype, np.ascontiguousarray(z.reshape(-1, hidden)))]
    return [(hf_name, dtype, array)]


def fuse_gate_up(written: list) -> list:
    """The converter's --fuse-gate-up-exps: each layer's ffn_gate_exps and ffn_up_exps
    joined into ffn_gate_up_exps, gate first (torch.cat along the rows: [E, 2I, H]), and
    so are gpt-oss's biases ([E, 2I])."""
    by_name = {n: (v, q) for n, v, q in written}
    out = []
    for n, v, q in written:
        if ".ffn_up_exps." in n:
            continue
        if ".ffn_gate_exps." in n:
            up, up_type = by_name[n.replace("ffn_gate_exps", "ffn_up_exps")]
            assert up_type == q, n
            joined = np.concatenate([v, up], axis=-2 if n.endswith(".weight") else -1)
            out.append((n.replace("ffn_gate_exps", "ffn_gate_up_exps"), np.ascontiguousarray(joined), q))
        else:
            out.append((n, v, q))
    return out


def convert(name: str, out_dir: Path, outtype: str, dense_only: bool = False, fuse: bool = False,
            ssm_in: bool = False) -> Path:
    model_dir = FIXTURES / name
    config = json.loads((model_dir / "config.json").read_text())
    arch = ARCH[config["architectures"][0]]
    n_blocks = block_count(arch, config)  # the layers the file holds, MTP layers included
    tensors = read_safetensors(model_dir)
    n_experts = config.get("num_experts", config.get("num_local_experts", config.get("n_routed_experts")))
    if arch in (gguf.MODEL_ARCH.LLAMA, gguf.MODEL_ARCH.MINIMAXM2):
        tensors = stack_experts(tensors, lambda l: f"model.layers.{l}.block_sparse_moe.experts", ["w1", "w3", "w2"],
                                n_blocks, n_experts)
    elif arch != gguf.MODEL_ARCH.GPT_OSS:  # gpt-oss's experts are 3-D already (gpt_oss_pieces)
        tensors = stack_experts(tensors, lambda l: f"model.layers.{l}.mlp.experts",
                                ["gate_proj", "up_proj", "down_proj"], n_blocks, n_experts)
    if config.get("tie_word_embeddings"):
        tensors.pop("lm_head.weight", None)

    names = gguf.get_tensor_name_map(arch, n_blocks)
    # Dense layers inside a MoE stack (mlp_only_layers): llama.cpp's QWEN2MOE / QWEN3MOE lists
    # lack ffn_gate/up/down, so their names come from the generic (LLAMA) list.
    generic = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, n_blocks)
    written = []  # (GGUF name, array, ggml type), in name order
    for hf_name in sorted(tensors):
        dtype, array = tensors[hf_name]
        pieces = [(hf_name, array)]
        if arch == gguf.MODEL_ARCH.QWEN3NEXT:
            pieces = qwen3_next_pieces(hf_name, dtype, array, config, ssm_in)  # with a dtype each
        elif arch == gguf.MODEL_ARCH.QWEN35MOE:
            pieces = qwen3_next_pieces(hf_name, dtype, qwen35_tiled(hf_name, array, config), config, ssm_in)
        elif arch == gguf.MODEL_ARCH.LLAMA and hf_name.endswith("q_proj.weight"):
            pieces = [(hf_name, llama_permute(array, config["num_attention_heads"]))]
        elif arch == gguf.MODEL_ARCH.LLAMA and hf_name.endswith("k_proj.weight"):
            pieces = [(hf_name, llama_permute(array, config["num_key_value_heads"]))]
        elif arch == gguf.MODEL_ARCH.GPT_OSS:
            pieces = gpt_oss_pieces(hf_name, array)
        elif hf_name.endswith("kv_b_proj.weight"):
            heads, nope, v = config["num_attention_heads"], config["qk_nope_head_dim"], config["v_head_dim"]
            kv_b = array.reshape(heads, nope + v, array.shape[-1])
            pieces = [(hf_name.replace("kv_b_proj", "k_b_proj"), np.ascontiguousarray(kv_b[:, :nope].swapaxes(1, 2))),
                      (hf_name.replace("kv_b_proj", "v_b_proj"), np.ascontiguousarray(kv_b[:, nope:]))]
        for piece in pieces:
            piece_name, dtype, data = piece if len(piece) == 3 else (piece[0], tensors[hf_name][0], piece[1])
            piece_name = piece_name.replace("e_score_correction_bias", "e_score_correction.bias")  # as the converter
            gguf_name = piece_name if piece_name.startswith("blk.") else (
                names.get_name(piece_name, try_suffixes=(".weight", ".bias")) or
                generic.get_name(piece_name, try_suffixes=(".weight", ".bias")))
            if gguf_name is None:
                sys.exit(f"{name}: no GGUF name for tensor {piece_name}")
            if gguf_name.endswith("ffn_gate_inp_shexp.weight"):
                data = data.reshape(-1)  # [1, hidden] -> llama.cpp's [hidden]
            keep_f32 = (data.ndim <= 1 or gguf_name.endswith("_norm.weight") or ".ffn_gate_inp" in gguf_name or
                        ".ssm_conv1d." in gguf_name or ".indexer.proj." in gguf_name)
            # --dense-only: what charm's quant_dense quantises (Linear::load's projections and
            # the embeddings); the routed experts and MLA's kv_b pieces (read as f32 values)
            # stay as stored, and so does a matrix of partial blocks.
            keep_stored = dense_only and ("_exps." in gguf_name or "kv_b_proj" in hf_name)
            # gpt-oss: the converter writes only the routed experts MXFP4, the rest at its outtype.
            keep_stored |= (arch == gguf.MODEL_ARCH.GPT_OSS and outtype == "mxfp4" and
                            not gguf_name.endswith("_exps.weight"))
            if keep_f32:
                values, qtype = to_f32(dtype, data), gguf.GGMLQuantizationType.F32
            elif keep_stored:
                values, qtype = stored(dtype, data, "bf16")
            else:
                bf16_fallback = dense_only or arch == gguf.MODEL_ARCH.GPT_OSS  # the rest of the file is bf16
                values, qtype = stored(dtype, data, outtype, fallback="bf16" if bf16_fallback else "f16")
            written.append((gguf_name, np.ascontiguousarray(values), qtype))

    def write(path: Path, tensors) -> Path:
        writer = gguf.GGUFWriter(str(path), ARCH_NAME.get(config["architectures"][0], gguf.MODEL_ARCH_NAMES[arch]))
        writer.add_name(name)
        write_hparams(writer, arch, config)
        write_tokenizer(writer, model_dir, config["vocab_size"], config)
        for gguf_name, values, qtype in tensors:
            writer.add_tensor(gguf_name, values, raw_dtype=qtype)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        return path

    if dense_only:
        return [write(out_dir / f"{name}.{outtype}-dense.gguf", written)]
    if fuse:
        return [write(out_dir / f"{name}.{outtype}-fused.gguf", fuse_gate_up(written))]
    if ssm_in:
        return [write(out_dir / f"{name}.{outtype}-ssm-in.gguf", written)]
    out = [write(out_dir / f"{name}.{outtype}.gguf", written)]
    if outtype in QUANT_TYPES:
        # The oracle of the quantised file: every tensor as gguf-py dequantises it, in F32.
        dequantised = [(n, gguf.quants.dequantize(v, q) if q in QUANT_TYPES.values() else v.astype(np.float32)
                        if q != gguf.GGMLQuantizationType.BF16 else to_f32("BF16", v), gguf.GGMLQuantizationType.F32)
                       for n, v, q in written]
        out.append(write(out_dir / f"{name}.{outtype}-dequantised.f32.gguf", dequantised))
    return out


def copied_writer(reader: gguf.GGUFReader, out: Path) -> gguf.GGUFWriter:
    """A writer of `out` holding every metadata key of `reader`'s file, as read; the
    caller adds the tensors (and may add keys) before writing."""
    writer = gguf.GGUFWriter(str(out), reader.get_field("general.architecture").contents())
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        vtype = field.types[0]
        sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(name, field.contents(), vtype, sub_type=sub)
    return writer


def dequantise(path: Path, out_dir: Path) -> Path:
    """`path` with every tensor as gguf-py dequantises it, in F32, and the same metadata:
    the oracle of a quantised file (e.g. the committed K-quant fixtures)."""
    reader = gguf.GGUFReader(str(path))
    out = out_dir / (path.name.removesuffix(".gguf") + "-dequantised.f32.gguf")
    writer = copied_writer(reader, out)
    for t in reader.tensors:
        values = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)
        writer.add_tensor(t.name, values.reshape([int(d) for d in reversed(t.shape)]),
                          raw_dtype=gguf.GGMLQuantizationType.F32)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--outtype", choices=["bf16", "f16", "f32", *QUANT_TYPES], default="bf16",
                        help="a quantised type also writes <name>.<type>-dequantised.f32.gguf (gguf-py's values)")
    parser.add_argument("--dense-only", action="store_true",
                        help="quantise only what charm's quant_dense does (not the routed experts): "
                             "<name>.<type>-dense.gguf, the oracle of quant_dense")
    parser.add_argument("--fuse-gate-up-exps", action="store_true",
                        help="join gate and up experts as convert_hf_to_gguf.py --fuse-gate-up-exps does: "
                             "<name>.<type>-fused.gguf")
    parser.add_argument("--ssm-in", action="store_true",
                        help="Qwen3-Next: keep q, k, v, z fused as ssm_in, as older converters did: "
                             "<name>.<type>-ssm-in.gguf")
    parser.add_argument("--dequantise", type=Path, nargs="+", metavar="GGUF",
                        help="instead: write each GGUF's dequantised F32 twin into --out")
    parser.add_argument("names", nargs="*", default=DEFAULT_FIXTURES)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.dequantise:
        for path in args.dequantise:
            print(dequantise(path, args.out))
        return
    for name in args.names:
        if args.dense_only and args.outtype not in QUANT_TYPES:
            sys.exit("--dense-only needs a quantised --outtype")
        for path in convert(name, args.out, args.outtype, args.dense_only, args.fuse_gate_up_exps, args.ssm_in):
            print(path)


if __name__ == "__main__":
    main()
