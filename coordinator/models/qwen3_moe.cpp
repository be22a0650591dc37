// Qwen3-MoE (Qwen3MoeForCausalLM), following transformers'
// models/qwen3_moe/modeling_qwen3_moe.py: pre-norm decoder layers with GQA attention whose
// q and k are RMS-normalised per head before RoPE, and either a dense SwiGLU MLP
// (mlp_only_layers, decoder_sparse_step) or a softmax top-k routed MoE block.
#include <string>
#include <vector>

#include "coordinator/models/blocks.h"
#include "coordinator/models/model.h"

namespace charm {
namespace {

struct Qwen3MoeLayer {
  RmsNorm input_layernorm, post_attention_layernorm;
  Linear q_proj, k_proj, v_proj, o_proj;
  RmsNorm q_norm, k_norm;  // over head_dim, shared by all heads
  bool moe = false;
  SoftmaxTopkMoe sparse_moe;  // when moe
  DenseMlp mlp;               // when !moe
};

class Qwen3Moe final : public LayerStack<Qwen3MoeLayer> {
 public:
  Qwen3Moe(const Checkpoint& ckpt, const ModelConfig& config, ExpertDispatcher& dispatcher)
      : LayerStack(ckpt, config, dispatcher) {
    const size_t h = config.hidden_size;
    const size_t hd = config.head_dim;
    const size_t nh = config.num_attention_heads;
    const size_t nkv = config.num_key_value_heads;
    const double eps = config.rms_norm_eps;
    for (int64_t l = 0; l < config.num_hidden_layers; ++l) {
      const std::string p = "model.layers." + std::to_string(l);
      Qwen3MoeLayer layer;
      layer.input_layernorm = RmsNorm::load(ckpt, p + ".input_layernorm", h, eps);
      layer.post_attention_layernorm = RmsNorm::load(ckpt, p + ".post_attention_layernorm", h, eps);
      layer.q_proj = Linear::load(ckpt, p + ".self_attn.q_proj", nh * hd, h, config.attention_bias);
      layer.k_proj = Linear::load(ckpt, p + ".self_attn.k_proj", nkv * hd, h, config.attention_bias);
      layer.v_proj = Linear::load(ckpt, p + ".self_attn.v_proj", nkv * hd, h, config.attention_bias);
      layer.o_proj = Linear::load(ckpt, p + ".self_attn.o_proj", h, nh * hd, config.attention_bias);
      layer.q_norm = RmsNorm::load(ckpt, p + ".self_attn.q_norm", hd, eps);
      layer.k_norm = RmsNorm::load(ckpt, p + ".self_attn.k_norm", hd, eps);
      layer.moe = config.is_moe_layer(l);
      if (layer.moe) {
        layer.sparse_moe = SoftmaxTopkMoe::load(ckpt, p + ".mlp", h, config.num_experts, config.num_experts_per_tok,
                                                config.norm_topk_prob);
      } else {
        layer.mlp = DenseMlp::load(ckpt, p + ".mlp", h, config.intermediate_size);
      }
      layers_.push_back(std::move(layer));
    }
  }

 protected:
  const SoftmaxTopkMoe* hint_router(size_t l) const override {
    return layers_[l].moe ? &layers_[l].sparse_moe : nullptr;
  }

  /// Qwen3MoeAttention: q/k per-head RMSNorm, RoPE, causal GQA, o_proj.
  void attention(size_t l, const float* x, size_t n, size_t pos0, KvCache& cache, float* out) override {
    const Qwen3MoeLayer& layer = layers_[l];
    const size_t hd = config_.head_dim;
    const size_t nh = config_.num_attention_heads;
    const size_t nkv = config_.num_key_value_heads;
    std::vector<float> q(n * nh * hd), k(n * nkv * hd), v(n * nkv * hd);
    layer.q_proj(x, n, q.data());
    layer.k_proj(x, n, k.data());
    layer.v_proj(x, n, v.data());
    layer.q_norm(q.data(), n * nh, q.data());
    layer.k_norm(k.data(), n * nkv, k.data());
    rope_attention(rope_, q.data(), k.data(), v.data(), n, pos0, cache, l, nh, nkv, hd, layer.o_proj, out);
  }

  /// Qwen3MoeSparseMoeBlock (routed experts, a prefetch hint while they run) or dense SwiGLU.
  void feed_forward(size_t l, const float* x, const float* hidden, size_t n, float* out) override {
    const Qwen3MoeLayer& layer = layers_[l];
    if (!layer.moe) return layer.mlp(x, n, out);
    routed_moe(l, layer.sparse_moe, x, hidden, n, out);
  }
};

}  // namespace

std::unique_ptr<Model> load_qwen3_moe(const Checkpoint& checkpoint, const ModelConfig& config,
                                      ExpertDispatcher& dispatcher) {
  return std::make_unique<Qwen3Moe>(checkpoint, config, dispatcher);
}

}  // namespace charm
