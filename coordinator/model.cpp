#include "coordinator/model.h"

#include <algorithm>
#include <string>

#include "common/error.h"

namespace charm {

std::unique_ptr<Model> load_model(const Checkpoint& checkpoint, const ModelConfig& config,
                                  ExpertDispatcher& dispatcher) {
  if (config.architecture == "Qwen3MoeForCausalLM") return load_qwen3_moe(checkpoint, config, dispatcher);
  if (config.architecture == "OlmoeForCausalLM") return load_olmoe(checkpoint, config, dispatcher);
  fail_unsupported("architecture '" + config.architecture + "' has no model family in charm");
}

void check_token_ids(const int32_t* tokens, size_t n, int64_t vocab_size) {
  for (size_t i = 0; i < n; ++i) {
    if (tokens[i] < 0 || tokens[i] >= vocab_size) {
      fail_invalid("token id " + std::to_string(tokens[i]) + " at position " + std::to_string(i) +
                   " is outside the vocabulary [0, " + std::to_string(vocab_size) + ")");
    }
  }
}

void embed_tokens(const std::vector<float>& embed, size_t hidden, const int32_t* tokens, size_t n, float* out) {
  for (size_t i = 0; i < n; ++i) {
    const float* row = embed.data() + static_cast<size_t>(tokens[i]) * hidden;
    std::copy(row, row + hidden, out + i * hidden);
  }
}

}  // namespace charm
