// OLMoE (OlmoeForCausalLM), following transformers' models/olmoe/modeling_olmoe.py:
// pre-norm decoder layers whose attention RMS-normalises the whole q and k projections
// (not per head), optionally clamps q, k and v to [-clip_qkv, clip_qkv], applies RoPE,
// and a softmax top-k routed MoE block in every layer.
#include <algorithm>
#include <string>
#include <vector>

#include "coordinator/models/blocks.h"
#include "coordinator/models/model.h"

namespace charm {
namespace {

struct OlmoeLayer {
  RmsNorm input_layernorm, post_attention_layernorm;
  Linear q_proj, k_proj, v_proj, o_proj;
  RmsNorm q_norm;  // over num_heads * head_dim
  RmsNorm k_norm;  // over num_key_value_heads * head_dim
  SoftmaxTopkMoe sparse_moe;
};

class Olmoe final : public LayerStack<OlmoeLayer> {
 public:
  Olmoe(const Checkpoint& ckpt, const ModelConfig& config, ExpertDispatcher& dispatcher)
      : LayerStack(ckpt, config, dispatcher) {
    const size_t h = config.hidden_size;
    const size_t q_dim = config.num_attention_heads * config.head_dim;
    const size_t kv_dim = config.num_key_value_heads * config.head_dim;
    const double eps = config.rms_norm_eps;
    for (int64_t l = 0; l < config.num_hidden_layers; ++l) {
      const std::string p = "model.layers." + std::to_string(l);
      OlmoeLayer layer;
      layer.input_layernorm = RmsNorm::load(ckpt, p + ".input_layernorm", h, eps);
      layer.post_attention_layernorm = RmsNorm::load(ckpt, p + ".post_attention_layernorm", h, eps);
      layer.q_proj = Linear::load(ckpt, p + ".self_attn.q_proj", q_dim, h, config.attention_bias);
      layer.k_proj = Linear::load(ckpt, p + ".self_attn.k_proj", kv_dim, h, config.attention_bias);
      layer.v_proj = Linear::load(ckpt, p + ".self_attn.v_proj", kv_dim, h, config.attention_bias);
      layer.o_proj = Linear::load(ckpt, p + ".self_attn.o_proj", h, q_dim, config.attention_bias);
      layer.q_norm = RmsNorm::load(ckpt, p + ".self_attn.q_norm", q_dim, eps);
      layer.k_norm = RmsNorm::load(ckpt, p + ".self_attn.k_norm", kv_dim, eps);
      layer.sparse_moe = SoftmaxTopkMoe::load(ckpt, p + ".mlp", h, config.num_experts, config.num_experts_per_tok,
                                              config.norm_topk_prob);
      layers_.push_back(std::move(layer));
    }
  }

 protected:
  const SoftmaxTopkMoe* hint_router(size_t l) const override { return &layers_[l].sparse_moe; }

  /// OlmoeAttention: full-width q/k RMSNorm, clip_qkv clamp, RoPE, causal GQA, o_proj.
  void attention(size_t l, const float* x, size_t n, size_t pos0, KvCache& cache, float* out) override {
    const OlmoeLayer& layer = layers_[l];
    const size_t hd = config_.head_dim;
    const size_t nh = config_.num_attention_heads;
    const size_t nkv = config_.num_key_value_heads;
    std::vector<float> q(n * nh * hd), k(n * nkv * hd), v(n * nkv * hd);
    layer.q_proj(x, n, q.data());
    layer.k_proj(x, n, k.data());
    layer.v_proj(x, n, v.data());
    layer.q_norm(q.data(), n, q.data());
    layer.k_norm(k.data(), n, k.data());
    if (config_.clip_qkv > 0) {
      const float c = static_cast<float>(config_.clip_qkv);
      for (auto* t : {&q, &k, &v}) {
        for (float& e : *t) e = std::clamp(e, -c, c);
      }
    }
    rope_attention(rope_, q.data(), k.data(), v.data(), n, pos0, cache, l, nh, nkv, hd, layer.o_proj, out);
  }

  /// OlmoeSparseMoeBlock: every layer is routed; a prefetch hint goes out while it runs.
  void feed_forward(size_t l, const float* x, const float* hidden, size_t n, float* out) override {
    routed_moe(l, layers_[l].sparse_moe, x, hidden, n, out);
  }
};

}  // namespace

std::unique_ptr<Model> load_olmoe(const Checkpoint& checkpoint, const ModelConfig& config,
                                  ExpertDispatcher& dispatcher) {
  return std::make_unique<Olmoe>(checkpoint, config, dispatcher);
}

}  // namespace charm
