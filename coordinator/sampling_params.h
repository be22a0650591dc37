// The sampling and stopping controls of one request, and the defaults a checkpoint's
// generation_config.json suggests for them.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace charm {

/// Sampling and stopping controls of one request (OpenAI semantics).
struct SamplingParams {
  double temperature = 1.0;          ///< 0 = greedy
  int64_t top_k = 0;                 ///< 0 = off
  double top_p = 1.0;                ///< 1 = off
  std::optional<uint64_t> seed;      ///< fixed seed -> reproducible sampling
  int64_t max_tokens = 256;
  std::vector<std::string> stop;     ///< stop strings (not included in the output)
  /// OpenAI's penalties, subtracted from a logit: frequency_penalty * (times the token was
  /// generated) + presence_penalty * (1 if it was generated at all); 0 = off, [-2, 2].
  double frequency_penalty = 0.0;
  double presence_penalty = 0.0;
  /// transformers' RepetitionPenaltyLogitsProcessor over prompt and generated tokens:
  /// a seen token's logit is divided by it when positive, multiplied when negative; 1 = off.
  double repetition_penalty = 1.0;
  bool logprobs = false;             ///< return each sampled token's log-probability
  int64_t top_logprobs = 0;          ///< and this many most likely alternatives (0..20)
};

/// The sampling defaults a checkpoint's generation_config.json (its parsed contents,
/// named `source` in warnings) suggests: temperature, top_p, top_k, repetition_penalty,
/// and `do_sample: false` meaning greedy, over charm's own (temperature 1, no
/// top-k/top-p, repetition_penalty 1), as vLLM applies them (repetition_penalty too
/// when greedy: transformers and vLLM both penalise before the argmax). Fields of the
/// wrong type or range are ignored with a warning; others (min_p, max_new_tokens, …)
/// are not implemented and are ignored. Never throws.
SamplingParams sampling_defaults(const nlohmann::json& generation_config, const std::string& source);

}  // namespace charm
