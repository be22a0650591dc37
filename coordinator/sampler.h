// Next-token selection: greedy, or temperature sampling with top-k and top-p (nucleus)
// filtering, in the order transformers' generate applies its logits warpers
// (temperature, then top-k, then top-p).
#pragma once

#include <cstdint>
#include <random>

namespace charm {

struct SamplingParams;

/// Picks the next token from logits [vocab] f32. temperature == 0 -> argmax (first index
/// on ties). Otherwise softmax(logits / temperature) restricted to the top_k most likely
/// (top_k > 0) and then to the smallest set whose probability reaches top_p (always at
/// least one token), sampled with `rng`. `logits` is used as scratch and modified.
int32_t sample_token(float* logits, size_t vocab, const SamplingParams& params, std::mt19937_64& rng);

}  // namespace charm
