#include "coordinator/sampling_params.h"

#include <spdlog/spdlog.h>

namespace charm {

SamplingParams sampling_defaults(const nlohmann::json& generation_config, const std::string& source) {
  SamplingParams d;
  auto number = [&](const char* key, double lo, double hi, double& out) {
    if (!generation_config.contains(key)) return;
    const auto& v = generation_config[key];
    if (v.is_number() && v.get<double>() >= lo && v.get<double>() <= hi) {
      out = v.get<double>();
    } else {
      spdlog::warn("{}: ignoring {} = {} (expected a number in [{}, {}])", source, key, v.dump(), lo, hi);
    }
  };
  number("temperature", 0.0, 1e6, d.temperature);
  number("top_p", 1e-9, 1.0, d.top_p);
  number("repetition_penalty", 1e-9, 1e6, d.repetition_penalty);
  double top_k = 0;
  number("top_k", 0.0, 1e9, top_k);
  d.top_k = static_cast<int64_t>(top_k);
  if (generation_config.value("do_sample", true) == false) d.temperature = 0;
  return d;
}

}  // namespace charm
