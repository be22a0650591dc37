#include "coordinator/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "common/kernels.h"
#include "coordinator/sampling_params.h"
#include "coordinator/text/tokenizer.h"

namespace charm {
namespace {

/// Sorts the best `count` of `ids` to the front, by logit, best first (ties: lower id).
void sort_front(std::vector<int32_t>& ids, size_t count, const float* logits) {
  std::partial_sort(ids.begin(), ids.begin() + count, ids.end(), [&](int32_t a, int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  });
}

/// How many of the sorted-front candidates form the nucleus: the fewest whose share of
/// `total` reaches top_p. Sorts only as far as needed (doubling), since a full sort of a
/// 150k vocabulary per token costs more than the model's decode step on small models.
size_t nucleus_size(std::vector<int32_t>& ids, const std::vector<double>& weight, double total, double top_p,
                    const float* logits) {
  for (size_t sorted = std::min<size_t>(ids.size(), 256);; sorted = std::min(ids.size(), sorted * 2)) {
    sort_front(ids, sorted, logits);
    double cumulative = 0;
    for (size_t i = 0; i < sorted; ++i) {
      cumulative += weight[ids[i]];
      if (cumulative >= top_p * total) return i + 1;
    }
    if (sorted == ids.size()) return sorted;  // rounding: the whole set
  }
}

}  // namespace

int32_t sample_token(float* logits, size_t vocab, const SamplingParams& params, std::mt19937_64& rng) {
  if (params.temperature <= 0.0) return static_cast<int32_t>(argmax(logits, vocab));
  // Candidates: every token in id order (no list: the loops below read the logits
  // directly), or, under top_k or top_p, a list of ids the filters reorder. The buffers
  // are this thread's, kept between calls: a vocabulary-sized allocation per token cost
  // more than the draw.
  const bool top_k = params.top_k > 0 && static_cast<size_t>(params.top_k) < vocab;
  const bool listed = top_k || params.top_p < 1.0;
  thread_local std::vector<int32_t> ids;
  thread_local std::vector<double> weight;  // by id; read only for candidates
  if (listed) {
    ids.resize(vocab);
    std::iota(ids.begin(), ids.end(), 0);
    if (top_k) {
      sort_front(ids, static_cast<size_t>(params.top_k), logits);
      ids.resize(static_cast<size_t>(params.top_k));
    }
  }
  weight.resize(vocab);
  // Calls f(id) on the candidates in order until it returns true; returns that id, or -1.
  auto find_candidate = [&](auto&& f) -> int32_t {
    if (listed) {
      for (int32_t id : ids) {
        if (f(id)) return id;
      }
    } else {
      for (size_t i = 0; i < vocab; ++i) {
        if (f(static_cast<int32_t>(i))) return static_cast<int32_t>(i);
      }
    }
    return -1;
  };
  // Unnormalised softmax(logits / temperature) over the candidates: exp in f32, as
  // token_logprob takes it, summed in double (the double exp made this function 1.3x
  // slower: 510 against 390 us per call over a 50k vocabulary, about 1 % of a q8 decode
  // step of the 4-layer OLMoE benchmark). A logit more than about 104 temperatures under
  // the best gets weight 0 (f32's exp underflows; its share was below 1e-45), so it is
  // never drawn.
  const auto inv_t = static_cast<float>(1.0 / params.temperature);
  const float max = top_k ? logits[ids[0]] : max_value(logits, vocab);  // top_k sorted the best first
  double total = 0;
  find_candidate([&](int32_t id) {
    total += weight[id] = std::exp((logits[id] - max) * inv_t);
    return false;
  });
  if (params.top_p < 1.0) {
    ids.resize(nucleus_size(ids, weight, total, params.top_p, logits));
    total = 0;
    for (int32_t id : ids) total += weight[id];
  }
  // Inverse-CDF draw over the kept candidates in their current (fixed) order.
  const double u = std::uniform_real_distribution<double>(0.0, total)(rng);
  double cumulative = 0;
  int32_t last_possible = listed ? ids.front() : 0;
  const int32_t picked = find_candidate([&](int32_t id) {
    if (weight[id] == 0) return false;  // a masked (-inf) logit, or one that underflowed
    cumulative += weight[id];
    last_possible = id;
    return u < cumulative;
  });
  // u == total after rounding: the last candidate that can be drawn (never a masked one,
  // which the last id may be: the padding sits at the end of the vocabulary).
  return picked >= 0 ? picked : last_possible;
}

std::vector<int32_t> unsampleable_ids(const Tokenizer& tokenizer, size_t model_vocab, std::span<const int32_t> keep) {
  std::vector<int32_t> ids;
  for (size_t id = 0; id < model_vocab; ++id) {
    const auto i = static_cast<int32_t>(id);
    if (!tokenizer.has_token(i) && std::find(keep.begin(), keep.end(), i) == keep.end()) ids.push_back(i);
  }
  return ids;
}

void apply_penalties(float* logits, size_t vocab, const SamplingParams& params, std::span<const int32_t> prompt,
                     std::span<const int32_t> generated) {
  auto in_vocab = [vocab](int32_t id) { return id >= 0 && static_cast<size_t>(id) < vocab; };
  if (params.repetition_penalty != 1.0) {
    // Each distinct id once, as the processor's gather/scatter over input_ids does.
    const float penalty = static_cast<float>(params.repetition_penalty);
    std::vector<uint8_t> seen(vocab, 0);
    for (std::span<const int32_t> ids : {prompt, generated}) {
      for (int32_t id : ids) {
        if (!in_vocab(id) || seen[id]) continue;
        seen[id] = 1;
        float& logit = logits[id];
        logit = logit < 0 ? logit * penalty : logit / penalty;
      }
    }
  }
  if (params.frequency_penalty == 0.0 && params.presence_penalty == 0.0) return;
  // Counts per generated id: a sorted copy, walked run by run (ascending id).
  std::vector<int32_t> sorted(generated.begin(), generated.end());
  std::sort(sorted.begin(), sorted.end());
  const float frequency = static_cast<float>(params.frequency_penalty);
  const float presence = static_cast<float>(params.presence_penalty);
  for (size_t i = 0; i < sorted.size();) {
    size_t end = i;
    while (end < sorted.size() && sorted[end] == sorted[i]) ++end;
    if (in_vocab(sorted[i])) {
      float& logit = logits[sorted[i]];
      logit -= frequency * static_cast<float>(end - i);
      logit -= presence;
    }
    i = end;
  }
}

TokenLogprob token_logprob(const float* logits, size_t vocab, int32_t token, size_t top_n) {
  float max = -std::numeric_limits<float>::infinity();
  for (size_t i = 0; i < vocab; ++i) max = std::max(max, logits[i]);
  // exp in f32 (x - max is exact in f32 for the logits that matter, expf is within an ulp,
  // and it is ~10x faster than the double exp over a 150k vocabulary), summed in double.
  double sum = 0;
  for (size_t i = 0; i < vocab; ++i) sum += std::exp(logits[i] - max);
  const double log_sum = std::log(sum);
  auto logprob = [&](int32_t id) {
    return static_cast<float>((static_cast<double>(logits[id]) - max) - log_sum);
  };
  TokenLogprob out;
  out.token = token;
  out.logprob = logprob(token);
  // The best top_n ids, kept sorted (best first) while scanning once; masked ids sort
  // last by id, so they fill in only when too few finite ones exist.
  auto better = [&](int32_t a, int32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); };
  std::vector<int32_t> best;
  best.reserve(std::min(top_n, vocab) + 1);
  for (size_t i = 0; i < vocab && top_n > 0; ++i) {
    const auto id = static_cast<int32_t>(i);
    if (best.size() == top_n && !better(id, best.back())) continue;
    best.insert(std::upper_bound(best.begin(), best.end(), id, better), id);
    if (best.size() > top_n) best.pop_back();
  }
  out.top.reserve(best.size());
  for (int32_t id : best) out.top.emplace_back(id, logprob(id));
  return out;
}

void mask_logits(float* logits, std::span<const int32_t> ids) {
  for (int32_t id : ids) logits[id] = -std::numeric_limits<float>::infinity();
}

}  // namespace charm
