// Softmax top-k routing (blocks.h) and the rank-order combine, checked against values
// worked out by hand from the definitions in Qwen3MoeTopKRouter / OlmoeTopKRouter.
#include <doctest/doctest.h>

#include <cmath>
#include <map>

#include "coordinator/blocks.h"

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
/// Returns expert e's output for a row as (e + 1) * row values, recording what it was asked.
class RecordingDispatcher : public ExpertDispatcher {
 public:
  std::vector<ExpertAssignment> seen;
  const float* hidden = nullptr;
  uint32_t hidden_size = 0;
  float* outputs = nullptr;
  void begin_layer(uint32_t, const float* x, uint32_t, uint32_t width,
                   const std::vector<ExpertAssignment>& assignments, float* out) override {
    seen = assignments;
    hidden = x;
    hidden_size = width;
    outputs = out;
  }
  void finish_layer() override {
    const std::vector<ExpertAssignment>& assignments = seen;
    for (size_t i = 0; i < assignments.size(); ++i) {
      for (size_t d = 0; d < hidden_size; ++d) {
        outputs[i * hidden_size + d] = static_cast<float>(assignments[i].expert + 1) *
                                       hidden[assignments[i].row * hidden_size + d];
      }
    }
  }
  std::vector<WorkerStatus> status() const override { return {}; }
};
}  // namespace

TEST_CASE("routed_experts sends every (row, expert) once and sums weighted outputs") {
  Routing routing;
  routing.top_k = 2;
  routing.experts = {3, 1, 0, 3};
  routing.weights = {0.75f, 0.25f, 0.5f, 0.5f};
  const float x[] = {1.0f, 2.0f, -1.0f, 4.0f};  // 2 rows, hidden 2
  float out[4];
  RecordingDispatcher d;
  routed_experts(d, 7, x, 2, 2, routing, out);
  REQUIRE(d.seen.size() == 4);
  CHECK(d.seen[0].row == 0);
  CHECK(d.seen[0].expert == 3);
  CHECK(d.seen[3].row == 1);
  CHECK(d.seen[3].expert == 3);
  CHECK(out[0] == doctest::Approx(0.75f * 4 * 1 + 0.25f * 2 * 1));
  CHECK(out[1] == doctest::Approx(0.75f * 4 * 2 + 0.25f * 2 * 2));
  CHECK(out[2] == doctest::Approx(0.5f * 1 * -1 + 0.5f * 4 * -1));
  CHECK(out[3] == doctest::Approx(0.5f * 1 * 4 + 0.5f * 4 * 4));
}
