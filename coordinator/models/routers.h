// Routers other than the softmax top-k of coordinator/models/blocks.h: DeepSeek-V3's sigmoid
// scores with a selection-only bias and group-limited top-k ("noaux_tc"), following
// transformers' models/deepseek_v3/modeling_deepseek_v3.py: DeepseekV3TopkRouter (GLM-4.5's
// Glm4MoeTopkRouter is the same), and the MoE block both families build from it; and
// gpt-oss's top-k-then-softmax router (models/gpt_oss/modeling_gpt_oss.py: GptOssTopKRouter).
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "common/checkpoint.h"
#include "common/model_config.h"
#include "coordinator/models/blocks.h"

namespace charm {

/// Parameters of the group-limited sigmoid router (DeepseekV3Config names).
struct GroupLimitedTopk {
  size_t top_k = 0;                    ///< num_experts_per_tok
  size_t n_group = 1;                  ///< groups of num_experts / n_group consecutive experts
  size_t topk_group = 1;               ///< groups a token may route into
  bool norm_topk_prob = true;          ///< renormalise the k weights to sum 1
  float routed_scaling_factor = 1.0f;  ///< then multiply them by this
};

/// For each row of router_logits [rows, num_experts] (f32):
///   scores = sigmoid(logits); choice = scores + bias (bias [num_experts], selection only);
///   group score = sum of the two largest choice values of the group; keep the topk_group
///   best groups; the top_k experts by choice among the kept groups; weights = their
///   unbiased scores, divided by (sum + 1e-20) when norm_topk_prob, times
///   routed_scaling_factor.
/// Experts come best choice first (ties: lower id first; groups likewise); the reference
/// leaves the order unspecified (topk sorted=False) and sums in expert order, so only the
/// set and the weights are the reference's. REQUIRES num_experts % n_group == 0, two or
/// more experts per group, top_k <= topk_group * num_experts / n_group.
Routing sigmoid_group_topk(const float* router_logits, size_t rows, size_t num_experts, const float* bias,
                           const GroupLimitedTopk& params);

/// DeepseekV3TopkRouter: weights "<prefix>.weight" [num_experts, hidden] and
/// "<prefix>.e_score_correction_bias" [num_experts] (read as f32), then sigmoid_group_topk.
/// MiniMaxM2TopKRouter is the same with one group and no scaling, its bias stored beside
/// the gate (`bias_name` "<block>.e_score_correction_bias"; empty: under `prefix`).
struct GroupLimitedRouter final : Router {
  Linear gate;
  std::vector<float> e_score_correction_bias;
  GroupLimitedTopk params;
  static GroupLimitedRouter load(const Checkpoint& ckpt, const std::string& prefix, size_t hidden,
                                 size_t num_experts, const GroupLimitedTopk& params,
                                 const std::string& bias_name = "");
  Routing route(const float* x, size_t rows) const override;
  size_t hidden() const override { return gate.in(); }
};

/// For each row of router_logits [rows, num_experts] (f32): the top_k largest logits (ties:
/// lower id first), best first, weighted by the softmax over those k logits only
/// (GptOssTopKRouter: torch.topk, then softmax of the top values).
Routing topk_softmax(const float* router_logits, size_t rows, size_t num_experts, size_t top_k);

/// GptOssTopKRouter: a Linear with bias, "<prefix>.weight" [num_experts, hidden] and
/// "<prefix>.bias" [num_experts], then topk_softmax.
struct TopkSoftmaxRouter final : Router {
  Linear router;
  size_t top_k = 0;
  static TopkSoftmaxRouter load(const Checkpoint& ckpt, const std::string& prefix, size_t hidden, size_t num_experts,
                                size_t top_k);
  Routing route(const float* x, size_t rows) const override;
  size_t hidden() const override { return router.in(); }
};

/// The MoE block of DeepseekV3MoE and Glm4MoeMoE: the GroupLimitedRouter "<prefix>.gate"
/// (config's num_experts_per_tok, n_group, topk_group, norm_topk_prob,
/// routed_scaling_factor), the routed experts through the dispatcher and, when
/// n_shared_experts > 0, the shared experts "<prefix>.shared_experts" as one DenseMlp of
/// width n_shared_experts * moe_intermediate_size, run on the coordinator. Throws what
/// Checkpoint::load_f32 / load_matrix throw for a missing or mis-shaped tensor.
MoeBlock load_group_limited_moe(const Checkpoint& ckpt, const std::string& prefix, const ModelConfig& config);

/// The MoE block of Qwen2MoeSparseMoeBlock and Qwen3NextSparseMoeBlock: the softmax top-k
/// router "<prefix>.gate" (num_experts, num_experts_per_tok, norm_topk_prob), the routed
/// experts through the dispatcher and the sigmoid-gated shared expert "<prefix>.shared_expert"
/// of width shared_expert_intermediate_size, run on the coordinator. Throws what
/// Checkpoint::load_f32 / load_matrix throw for a missing or mis-shaped tensor.
MoeBlock load_gated_shared_moe(const Checkpoint& ckpt, const std::string& prefix, const ModelConfig& config);

}  // namespace charm
