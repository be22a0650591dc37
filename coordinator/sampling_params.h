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
};

/// The sampling defaults a checkpoint's generation_config.json (its parsed contents,
/// named `source` in warnings) suggests: temperature, top_p, top_k, and `do_sample: false`
/// meaning greedy, over charm's own (temperature 1, no top-k/top-p), as vLLM applies
/// them. Fields of the wrong type or range are ignored with a warning; others
/// (repetition_penalty, …) are not implemented and are ignored. Never throws.
SamplingParams sampling_defaults(const nlohmann::json& generation_config, const std::string& source);

}  // namespace charm
