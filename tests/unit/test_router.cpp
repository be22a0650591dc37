// Softmax top-k routing (blocks.h) and the rank-order combine, checked against values
// worked out by hand from the definitions in Qwen3MoeTopKRouter / OlmoeTopKRouter.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <map>

#include "common/fixed_point.h"
#include "coordinator/models/blocks.h"

using namespace charm;

TEST_CASE("softmax_topk picks the k largest probabilities, best first") {
  const float logits[] = {0.1f, 2.0f, -1.0f, 1.5f, 0.0f};
  const Routing r = softmax_topk(logits, 1, 5, 2, /*norm_topk_prob=*/false);
  REQUIRE(r.experts.size() == 2);
  CHECK(r.experts[0] == 1);
  CHECK(r.experts[1] == 3);
  double z = 0;
  for (float l : logits) z += std::exp(l);
  CHECK(r.weights[0] == doctest::Approx(std::exp(2.0) / z).epsilon(1e-6));
  CHECK(r.weights[1] == doctest::Approx(std::exp(1.5) / z).epsilon(1e-6));
}

TEST_CASE("norm_topk_prob renormalises the chosen weights to sum to one") {
  const float logits[] = {0.1f, 2.0f, -1.0f, 1.5f, 0.0f, 3.0f, -2.0f, 0.5f};
  const Routing r = softmax_topk(logits, 2, 4, 3, /*norm_topk_prob=*/true);
  for (size_t row = 0; row < 2; ++row) {
    float sum = 0;
    for (size_t k = 0; k < 3; ++k) sum += r.weights[row * 3 + k];
    CHECK(sum == doctest::Approx(1.0f).epsilon(1e-6));
  }
  CHECK(r.experts[3] == 1);  // row 1: logits {0, 3, -2, 0.5} -> 1, 3, 0
  CHECK(r.experts[4] == 3);
  CHECK(r.experts[5] == 0);
}

TEST_CASE("ties go to the lower expert id") {
  const float logits[] = {1.0f, 1.0f, 1.0f, 1.0f};
  const Routing r = softmax_topk(logits, 1, 4, 2, false);
  CHECK(r.experts[0] == 0);
  CHECK(r.experts[1] == 1);
}

namespace {
/// Returns expert e's output for a row as (e + 1) * row values, summed weighted in fixed
/// point as the executor does, recording what it was asked.
class RecordingDispatcher : public ExpertDispatcher {
 public:
  std::vector<ExpertAssignment> seen;
  const float* hidden = nullptr;
  uint32_t rows = 0;
  uint32_t hidden_size = 0;
  int64_t* sums = nullptr;
  void begin_layer(uint32_t, const float* x, uint32_t num_rows, uint32_t width,
                   const std::vector<ExpertAssignment>& assignments, int64_t* out) override {
    seen = assignments;
    hidden = x;
    rows = num_rows;
    hidden_size = width;
    sums = out;
  }
  void finish_layer() override {
    std::fill_n(sums, size_t{rows} * hidden_size, 0);
    std::vector<float> y(hidden_size);
    uint64_t saturated = 0;
    for (const ExpertAssignment& a : seen) {
      for (size_t d = 0; d < hidden_size; ++d) y[d] = static_cast<float>(a.expert + 1) * hidden[a.row * hidden_size + d];
      add_weighted_term(y.data(), a.weight, hidden_size, sums + size_t{a.row} * hidden_size, saturated);
    }
  }
  void drop_unfinished() override {}
  std::vector<WorkerStatus> status() const override { return {}; }
};
}  // namespace

TEST_CASE("a routed-experts call sends every (row, expert) once and sums weighted outputs") {
  Routing routing;
  routing.top_k = 2;
  routing.experts = {3, 1, 0, 3};
  routing.weights = {0.75f, 0.25f, 0.5f, 0.5f};
  const float x[] = {1.0f, 2.0f, -1.0f, 4.0f};  // 2 rows, hidden 2
  float out[4];
  RecordingDispatcher d;
  RoutedExpertsCall(d, 7, x, 2, 2, routing).finish(out);
  REQUIRE(d.seen.size() == 4);
  CHECK(d.seen[0].row == 0);
  CHECK(d.seen[0].expert == 3);
  CHECK(d.seen[3].row == 1);
  CHECK(d.seen[3].expert == 3);
  CHECK(d.seen[0].weight == 0.75f);  // the router weight travels with its assignment
  CHECK(d.seen[2].weight == 0.5f);
  CHECK(out[0] == doctest::Approx(0.75f * 4 * 1 + 0.25f * 2 * 1));
  CHECK(out[1] == doctest::Approx(0.75f * 4 * 2 + 0.25f * 2 * 2));
  CHECK(out[2] == doctest::Approx(0.5f * 1 * -1 + 0.5f * 4 * -1));
  CHECK(out[3] == doctest::Approx(0.5f * 1 * 4 + 0.5f * 4 * 4));
}

// ---- DeepSeek-V3's group-limited sigmoid router (coordinator/models/routers.h) -----------------

#include "coordinator/models/routers.h"

namespace {
float expected_sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }
}  // namespace

TEST_CASE("sigmoid_group_topk: groups by top-2 biased sum, experts by biased score, weights unbiased") {
  // 8 experts in 4 groups of 2; keep 2 groups; top-2 experts.
  const float logits[] = {2.0f, -3.0f, 0.5f, 0.4f, 1.0f, 1.0f, -1.0f, 3.0f};
  // The bias lifts group 1 ({2, 3}) and expert 6; it must not enter the weights.
  const float bias[] = {0.0f, 0.0f, 0.3f, 0.3f, 0.0f, 0.0f, 0.6f, 0.0f};
  GroupLimitedTopk p;
  p.top_k = 2;
  p.n_group = 4;
  p.topk_group = 2;
  p.norm_topk_prob = false;
  p.routed_scaling_factor = 2.5f;
  // Group scores (sigmoid + bias, top-2 sum): g0 0.881+0.047=0.928, g1 0.922+0.899=1.821,
  // g2 0.731+0.731=1.462, g3 0.869+0.953=1.822 -> keep g3 and g1.
  const Routing r = sigmoid_group_topk(logits, 1, 8, bias, p);
  REQUIRE(r.experts.size() == 2);
  // Biased scores in g1/g3: e2 0.922, e3 0.899, e6 0.869, e7 0.953 -> e7, e2.
  CHECK(r.experts[0] == 7);
  CHECK(r.experts[1] == 2);
  CHECK(r.weights[0] == expected_sigmoid(3.0f) * 2.5f);
  CHECK(r.weights[1] == expected_sigmoid(0.5f) * 2.5f);
  // Expert 0 has the second-highest score overall but its group lost.
  CHECK(std::find(r.experts.begin(), r.experts.end(), 0u) == r.experts.end());

  p.norm_topk_prob = true;
  const Routing n = sigmoid_group_topk(logits, 1, 8, bias, p);
  const float sum = expected_sigmoid(3.0f) + expected_sigmoid(0.5f) + 1e-20f;
  CHECK(n.weights[0] == (expected_sigmoid(3.0f) / sum) * 2.5f);
  CHECK(n.weights[1] == (expected_sigmoid(0.5f) / sum) * 2.5f);
  CHECK(n.weights[0] + n.weights[1] == doctest::Approx(2.5f).epsilon(1e-6));
}

TEST_CASE("sigmoid_group_topk: without the bias the selection differs (the bias is used for selection)") {
  const float logits[] = {2.0f, -3.0f, 0.5f, 0.4f, 1.0f, 1.0f, -1.0f, 3.0f};
  const float zero[8] = {};
  GroupLimitedTopk p{2, 4, 2, false, 1.0f};
  const Routing r = sigmoid_group_topk(logits, 1, 8, zero, p);
  // Unbiased groups: g0 0.928, g1 0.622+0.599=1.221, g2 1.462, g3 0.269+0.953=1.222:
  // keep g2, g3; experts e7 0.953, then e4/e5 0.731 (tie -> lower id e4). Biased: e7, e2.
  CHECK(r.experts[0] == 7);
  CHECK(r.experts[1] == 4);
}
