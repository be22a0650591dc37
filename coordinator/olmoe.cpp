// OLMoE (OlmoeForCausalLM), following transformers' models/olmoe/modeling_olmoe.py:
// pre-norm decoder layers whose attention RMS-normalises the whole q and k projections
// (not per head), optionally clamps q, k and v to [-clip_qkv, clip_qkv], applies RoPE,
// and a softmax top-k routed MoE block in every layer.
#include <algorithm>
#include <string>
#include <vector>

#include "coordinator/blocks.h"
#include "coordinator/model.h"

namespace charm {
namespace {

struct OlmoeLayer {
  RmsNorm input_layernorm, post_attention_layernorm;
  Linear q_proj, k_proj, v_proj, o_proj;
  RmsNorm q_norm;  // over num_heads * head_dim
  RmsNorm k_norm;  // over num_key_value_heads * head_dim
  SoftmaxTopkMoe sparse_moe;
};

class Olmoe final : public DecoderModel {
 public:
  Olmoe(const Checkpoint& ckpt, const ModelConfig& config, ExpertDispatcher& dispatcher)
      : DecoderModel(ckpt, config, dispatcher) {
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

  void forward(const int32_t* tokens, size_t n, KvCache& cache, float* logits) override {
    const size_t h = config_.hidden_size;
    std::vector<float> hidden(n * h), x(n * h), delta(n * h);
    const size_t pos0 = begin_forward(tokens, n, cache, hidden.data());
    for (size_t l = 0; l < layers_.size(); ++l) {
      const OlmoeLayer& layer = layers_[l];
      layer.input_layernorm(hidden.data(), n, x.data());
      attention(layer, l, x.data(), n, pos0, cache, delta.data());
      add_residual(hidden.data(), delta.data(), n * h);
      // OlmoeSparseMoeBlock: every layer is routed.
      layer.post_attention_layernorm(hidden.data(), n, x.data());
      RoutedExpertsCall moe = layer.sparse_moe.begin(dispatcher_, static_cast<uint32_t>(l), x.data(), n);
      if (l + 1 < layers_.size()) {  // prefetch hint for the next layer while this one runs
        const OlmoeLayer& next = layers_[l + 1];
        hint_next_moe_layer(dispatcher_, static_cast<uint32_t>(l + 1), next.post_attention_layernorm,
                            next.sparse_moe, hidden.data(), n);
      }
      moe.finish(delta.data());
      add_residual(hidden.data(), delta.data(), n * h);
    }
    end_forward(hidden.data(), n, logits);
  }

 private:
  /// OlmoeAttention: full-width q/k RMSNorm, clip_qkv clamp, RoPE, causal GQA, o_proj.
  void attention(const OlmoeLayer& layer, size_t l, const float* x, size_t n, size_t pos0, KvCache& cache,
                 float* out) const {
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

  std::vector<OlmoeLayer> layers_;
};

}  // namespace

std::unique_ptr<Model> load_olmoe(const Checkpoint& checkpoint, const ModelConfig& config,
                                  ExpertDispatcher& dispatcher) {
  return std::make_unique<Olmoe>(checkpoint, config, dispatcher);
}

}  // namespace charm
