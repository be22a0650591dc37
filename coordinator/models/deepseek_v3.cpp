// DeepSeek-V3 (DeepseekV3ForCausalLM), following transformers'
// models/deepseek_v3/modeling_deepseek_v3.py: pre-norm decoder layers with multi-head
// latent attention over a compressed KV cache (coordinator/models/mla_attention.h, YaRN RoPE in
// the interleaved layout), a dense SwiGLU MLP in the first first_k_dense_replace layers
// and, after them, DeepseekV3MoE: the group-limited sigmoid router
// (coordinator/models/routers.h), the routed experts through the ExpertDispatcher, plus the
// shared experts computed here on the coordinator while the routed requests are out.
#include <string>
#include <vector>

#include "coordinator/models/blocks.h"
#include "coordinator/models/mla_attention.h"
#include "coordinator/models/model.h"
#include "coordinator/models/routers.h"

namespace charm {
namespace {

/// DeepseekV3MoE: routed experts (remote or in-process) + shared experts (here).
struct DeepseekV3Moe {
  GroupLimitedRouter gate;
  bool has_shared = false;
  DenseMlp shared_experts;  // width n_shared_experts * moe_intermediate_size

  static DeepseekV3Moe load(const Checkpoint& ckpt, const std::string& prefix, const ModelConfig& c) {
    DeepseekV3Moe moe;
    const GroupLimitedTopk params{static_cast<size_t>(c.num_experts_per_tok), static_cast<size_t>(c.n_group),
                                  static_cast<size_t>(c.topk_group), c.norm_topk_prob,
                                  static_cast<float>(c.routed_scaling_factor)};
    moe.gate = GroupLimitedRouter::load(ckpt, prefix + ".gate", c.hidden_size, c.num_experts, params);
    moe.has_shared = c.n_shared_experts > 0;
    if (moe.has_shared) {
      moe.shared_experts =
          DenseMlp::load(ckpt, prefix + ".shared_experts", c.hidden_size, c.n_shared_experts * c.moe_intermediate_size);
    }
    return moe;
  }

  /// out [rows, hidden] = routed(x) + shared_experts(x). The shared experts run here
  /// while the routed requests are in flight.
  void operator()(ExpertDispatcher& dispatcher, uint32_t layer, const float* x, size_t rows, float* out) const {
    const size_t hidden = gate.gate.in();
    RoutedExpertsCall routed(dispatcher, layer, x, rows, hidden, gate(x, rows));
    std::vector<float> shared(has_shared ? rows * hidden : 0);
    if (has_shared) shared_experts(x, rows, shared.data());
    routed.finish(out);
    if (has_shared) add_residual(out, shared.data(), rows * hidden);
  }
};

struct DeepseekV3Layer {
  RmsNorm input_layernorm, post_attention_layernorm;
  MlaAttention self_attn;
  bool moe = false;
  DeepseekV3Moe sparse_moe;  // when moe
  DenseMlp mlp;              // when !moe
};

class DeepseekV3 final : public LayerStack<DeepseekV3Layer> {
 public:
  DeepseekV3(const Checkpoint& ckpt, const ModelConfig& config, ExpertDispatcher& dispatcher)
      : LayerStack(ckpt, config, dispatcher) {
    const size_t h = config.hidden_size;
    const double eps = config.rms_norm_eps;
    for (int64_t l = 0; l < config.num_hidden_layers; ++l) {
      const std::string p = "model.layers." + std::to_string(l);
      DeepseekV3Layer layer;
      layer.input_layernorm = RmsNorm::load(ckpt, p + ".input_layernorm", h, eps);
      layer.post_attention_layernorm = RmsNorm::load(ckpt, p + ".post_attention_layernorm", h, eps);
      layer.self_attn = MlaAttention::load(ckpt, p + ".self_attn", config);
      layer.moe = config.is_moe_layer(l);
      if (layer.moe) {
        layer.sparse_moe = DeepseekV3Moe::load(ckpt, p + ".mlp", config);
      } else {
        layer.mlp = DenseMlp::load(ckpt, p + ".mlp", h, config.intermediate_size);
      }
      layers_.push_back(std::move(layer));
    }
  }

  /// The compressed MLA cache: one [kv_lora_rank | qk_rope_head_dim] row per layer and token.
  KvCache new_cache(size_t max_tokens) const override {
    return KvCache(config_.num_hidden_layers, max_tokens, MlaAttention::cache_row_dim(config_), 0);
  }

 protected:
  void attention(size_t l, const float* x, size_t n, size_t pos0, KvCache& cache, float* out) override {
    layers_[l].self_attn(rope_, x, n, pos0, cache, l, out);
  }

  /// DeepseekV3MoE (routed + shared experts), or dense SwiGLU in the first layers.
  void feed_forward(size_t l, const float* x, const float* /*hidden*/, size_t n, float* out) override {
    const DeepseekV3Layer& layer = layers_[l];
    if (layer.moe) {
      layer.sparse_moe(dispatcher_, static_cast<uint32_t>(l), x, n, out);
    } else {
      layer.mlp(x, n, out);
    }
  }
};

}  // namespace

std::unique_ptr<Model> load_deepseek_v3(const Checkpoint& checkpoint, const ModelConfig& config,
                                        ExpertDispatcher& dispatcher) {
  return std::make_unique<DeepseekV3>(checkpoint, config, dispatcher);
}

}  // namespace charm
