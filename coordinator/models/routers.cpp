#include "coordinator/models/routers.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>

#include "common/kernels.h"

namespace charm {

Routing topk_softmax(const float* router_logits, size_t rows, size_t num_experts, size_t top_k) {
  Routing routing;
  routing.top_k = top_k;
  routing.experts.resize(rows * top_k);
  routing.weights.resize(rows * top_k);
  std::vector<float> logits(num_experts);
  std::vector<uint32_t> order(num_experts);
  for (size_t r = 0; r < rows; ++r) {
    std::copy_n(router_logits + r * num_experts, num_experts, logits.begin());
    top_k_by(order, top_k, logits);
    float* w = routing.weights.data() + r * top_k;
    for (size_t k = 0; k < top_k; ++k) {
      routing.experts[r * top_k + k] = order[k];
      w[k] = logits[order[k]];
    }
    softmax(w, top_k);
  }
  return routing;
}

TopkSoftmaxRouter TopkSoftmaxRouter::load(const Checkpoint& ckpt, const std::string& prefix, size_t hidden,
                                          size_t num_experts, size_t top_k) {
  TopkSoftmaxRouter r;
  r.router = Linear::load_exact(ckpt, prefix, num_experts, hidden, /*with_bias=*/true);
  r.top_k = top_k;
  return r;
}

Routing TopkSoftmaxRouter::route(const float* x, size_t rows) const {
  std::vector<float> router_logits(rows * router.out());
  router(x, rows, router_logits.data());
  return topk_softmax(router_logits.data(), rows, router.out(), top_k);
}

Routing sigmoid_group_topk(const float* router_logits, size_t rows, size_t num_experts, const float* bias,
                           const GroupLimitedTopk& p) {
  const size_t per_group = num_experts / p.n_group;
  Routing routing;
  routing.top_k = p.top_k;
  routing.experts.resize(rows * p.top_k);
  routing.weights.resize(rows * p.top_k);
  std::vector<float> scores(num_experts), choice(num_experts), group_score(p.n_group);
  std::vector<uint32_t> expert_order(num_experts), group_order(p.n_group);
  for (size_t r = 0; r < rows; ++r) {
    const float* logits = router_logits + r * num_experts;
    for (size_t e = 0; e < num_experts; ++e) {
      scores[e] = sigmoid(logits[e]);
      choice[e] = scores[e] + bias[e];
    }
    // Group score: the sum of the group's two largest choice values.
    for (size_t g = 0; g < p.n_group; ++g) {
      const float* c = choice.data() + g * per_group;
      float first = -std::numeric_limits<float>::infinity(), second = first;
      for (size_t i = 0; i < per_group; ++i) {
        if (c[i] > first) {
          second = first;
          first = c[i];
        } else if (c[i] > second) {
          second = c[i];
        }
      }
      group_score[g] = first + second;
    }
    top_k_by(group_order, p.topk_group, group_score);
    std::vector<bool> kept(p.n_group, false);
    for (size_t i = 0; i < p.topk_group; ++i) kept[group_order[i]] = true;
    for (size_t e = 0; e < num_experts; ++e) {
      if (!kept[e / per_group]) choice[e] = -std::numeric_limits<float>::infinity();  // masked_fill
    }
    top_k_by(expert_order, p.top_k, choice);
    // Weights from the unbiased scores.
    float sum = 0;
    for (size_t k = 0; k < p.top_k; ++k) sum += scores[expert_order[k]];
    const float denominator = sum + 1e-20f;
    for (size_t k = 0; k < p.top_k; ++k) {
      float w = scores[expert_order[k]];
      if (p.norm_topk_prob) w /= denominator;
      routing.experts[r * p.top_k + k] = expert_order[k];
      routing.weights[r * p.top_k + k] = w * p.routed_scaling_factor;
    }
  }
  return routing;
}

GroupLimitedRouter GroupLimitedRouter::load(const Checkpoint& ckpt, const std::string& prefix, size_t hidden,
                                            size_t num_experts, const GroupLimitedTopk& params,
                                            const std::string& bias_name) {
  GroupLimitedRouter router;
  router.gate = Linear::load_exact(ckpt, prefix, num_experts, hidden);
  router.e_score_correction_bias =
      ckpt.load_f32(bias_name.empty() ? prefix + ".e_score_correction_bias" : bias_name,
                    {static_cast<int64_t>(num_experts)});
  router.params = params;
  return router;
}

Routing GroupLimitedRouter::route(const float* x, size_t rows) const {
  std::vector<float> logits(rows * gate.out());
  gate(x, rows, logits.data());
  return sigmoid_group_topk(logits.data(), rows, gate.out(), e_score_correction_bias.data(), params);
}

MoeBlock load_group_limited_moe(const Checkpoint& ckpt, const std::string& prefix, const ModelConfig& c) {
  const GroupLimitedTopk params{static_cast<size_t>(c.num_experts_per_tok), static_cast<size_t>(c.n_group),
                                static_cast<size_t>(c.topk_group), c.norm_topk_prob,
                                static_cast<float>(c.routed_scaling_factor)};
  MoeBlock moe;
  moe.router = std::make_unique<GroupLimitedRouter>(
      GroupLimitedRouter::load(ckpt, prefix + ".gate", c.hidden_size, c.num_experts, params));
  if (c.n_shared_experts > 0) {
    moe.shared_expert =
        DenseMlp::load(ckpt, prefix + ".shared_experts", c.hidden_size, c.n_shared_experts * c.moe_intermediate_size);
  }
  return moe;
}

MoeBlock load_gated_shared_moe(const Checkpoint& ckpt, const std::string& prefix, const ModelConfig& c) {
  MoeBlock moe;
  moe.router = std::make_unique<SoftmaxTopkRouter>(
      SoftmaxTopkRouter::load(ckpt, prefix, c.hidden_size, c.num_experts, c.num_experts_per_tok, c.norm_topk_prob));
  moe.shared_expert = GatedSharedExpert::load(ckpt, prefix, c.hidden_size, c.shared_expert_intermediate_size);
  return moe;
}

}  // namespace charm
