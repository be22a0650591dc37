#include "coordinator/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "common/kernels.h"
#include "coordinator/engine.h"

namespace charm {

int32_t sample_token(float* logits, size_t vocab, const SamplingParams& params, std::mt19937_64& rng) {
  if (params.temperature <= 0.0) return static_cast<int32_t>(argmax(logits, vocab));
  const float inv_t = static_cast<float>(1.0 / params.temperature);
  // Candidates sorted by logit, best first (ties: lower id first, deterministic).
  std::vector<int32_t> ids(vocab);
  std::iota(ids.begin(), ids.end(), 0);
  size_t keep = vocab;
  if (params.top_k > 0) keep = std::min(keep, static_cast<size_t>(params.top_k));
  auto better = [&](int32_t a, int32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); };
  std::partial_sort(ids.begin(), ids.begin() + keep, ids.end(), better);
  ids.resize(keep);
  std::vector<double> probs(keep);
  const double max = logits[ids[0]] * static_cast<double>(inv_t);
  double sum = 0;
  for (size_t i = 0; i < keep; ++i) {
    probs[i] = std::exp(logits[ids[i]] * static_cast<double>(inv_t) - max);
    sum += probs[i];
  }
  for (double& p : probs) p /= sum;
  if (params.top_p < 1.0) {
    double cumulative = 0;
    size_t cut = 0;
    while (cut < keep) {
      cumulative += probs[cut++];
      if (cumulative >= params.top_p) break;
    }
    probs.resize(cut);
    ids.resize(cut);
  }
  std::discrete_distribution<size_t> pick(probs.begin(), probs.end());
  return ids[pick(rng)];
}

}  // namespace charm
