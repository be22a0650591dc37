// A GGUF model (llama.cpp's format) seen as the Hugging Face checkpoint it was converted
// from: the config.json that transformers would read, the generation config, and every
// tensor under the name, shape and row order the family files (coordinator/models/) load.
// The inverse of llama.cpp's convert_hf_to_gguf.py for the architectures charm serves:
//   qwen2moe  -> Qwen2MoeForCausalLM     qwen3moe -> Qwen3MoeForCausalLM
//   olmoe     -> OlmoeForCausalLM        llama with experts -> MixtralForCausalLM
//   deepseek2 -> DeepseekV3ForCausalLM (sigmoid routing with exp_probs_b; DeepSeek-V3, R1, Kimi K2)
//   gpt-oss   -> GptOssForCausalLM (biased experts split into gate / up / down, any GGML type
//                                   incl. MXFP4; attn_sinks; even layers sliding)
//   glm4moe   -> Glm4MoeForCausalLM      minimax-m2 -> MiniMaxM2ForCausalLM
//   qwen3next -> Qwen3NextForCausalLM (ssm_* as linear_attn.*; attn_qkv / attn_gate or the
//                                      older fused ssm_in; ssm_a as linear_attn.A; the norms
//                                      already 1 + w: norm_weights_include_unit_offset)
//   glm-dsa   -> GlmMoeDsaForCausalLM, deepseek32 -> DeepseekV32ForCausalLM (deepseek2's
//                tensors and keys, and the lightning indexer's: indexer.*, attention.indexer.*)
//   qwen35moe -> Qwen3_5MoeForCausalLM (the same, q/k/v/z/b/a apart, value heads tiled:
//                                       linear_value_heads_tiled)
// A file's trailing multi-token-prediction blocks (nextn_predict_layers; GLM-4.5's) are not
// decoder layers: their tensors are left out (GgufHfModel::ignored). ffn_gate_up_exps (the
// converter's --fuse-gate-up-exps) becomes the hub's fused <experts>.gate_up_proj.
// Metadata keys are llama.cpp's (gguf-py gguf.constants.Keys); a value llama.cpp's graph
// hard-codes for an architecture (e.g. qwen3moe renormalising the top-k weights) is that
// value unless the file carries the key. What the format cannot express is said where it
// is read (rope_scaling's mscale, below).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/gguf.h"
#include "common/gguf_split.h"

namespace charm {

/// One GGUF tensor under its Hugging Face name.
struct GgufHfTensor {
  std::string hf_name;                 ///< e.g. "model.layers.0.self_attn.q_proj.weight"
  const GgufTensorInfo* gguf = nullptr;  ///< the tensor in the file
  std::vector<int64_t> shape;          ///< HF shape, outermost first (same element count)
  /// Non-zero for Mixtral's q_proj / k_proj: the GGUF rows are in llama.cpp's rotary order
  /// (LlamaModel.permute with this many heads); HF row h*d + t*d/2 + j is GGUF row
  /// h*d + 2*j + t (d = rows / heads, t in {0, 1}).
  int64_t unpermute_heads = 0;
};

/// DeepSeek's kv_b_proj [heads * (nope + v), kv_lora_rank], which llama.cpp stores split:
/// attn_k_b [heads, kv_lora_rank, nope] (numpy order; transposed per head) and attn_v_b
/// [heads, v, kv_lora_rank].
struct GgufKvB {
  std::string hf_name;
  const GgufTensorInfo* k_b = nullptr;
  const GgufTensorInfo* v_b = nullptr;
  int64_t heads = 0, nope = 0, v = 0, kv_lora_rank = 0;
};

/// The HF view of a GGUF model.
struct GgufHfModel {
  nlohmann::json config;             ///< as config.json (architectures, model_type, HF field names)
  nlohmann::json generation_config;  ///< {"eos_token_id": [...], "bos_token_id": ...} from tokenizer.ggml.*
  std::vector<GgufHfTensor> tensors;
  std::vector<GgufKvB> kv_b;
  /// GGUF tensors no family reads (e.g. rope_freqs, the multi-token-prediction layers
  /// past num_hidden_layers): left out, named for the log.
  std::vector<std::string> ignored;
};

/// Maps `files` to its HF form. Throws Error(kUnsupported) naming the architecture for
/// one charm does not serve (and for "llama" without experts: a dense model), naming the
/// key for a gating function or rope scaling the architecture's family does not run and
/// for a per-layer array whose values differ where charm needs one value, and
/// Error(kInvalidInput) naming the key or tensor for a missing or ill-typed required key
/// (block_count, embedding_length, head counts, expert counts; gpt-oss's
/// expert_feed_forward_length and attention.sliding_window), nextn_predict_layers not below
/// block_count, a tensor whose shape disagrees with the metadata, or an expert weight
/// tensor that is not 3-D.
GgufHfModel map_gguf_to_hf(const GgufModelFiles& files);

/// The decimal double an f32 metadata value was written from: the shortest decimal that
/// rounds to that f32 (so 1e-6 stored as 9.99999997e-07 reads back as 1e-6, as in the
/// config.json the converter read). Scaled by 10^`exponent10` exactly in decimal.
double gguf_f32_as_decimal(float value, int exponent10 = 0);

}  // namespace charm
