#include "coordinator/model.h"

#include <algorithm>
#include <string>

#include "common/error.h"
#include "coordinator/rope_scaling.h"

namespace charm {

std::unique_ptr<Model> load_model(const Checkpoint& checkpoint, const ModelConfig& config,
                                  ExpertDispatcher& dispatcher) {
  if (config.architecture == "Qwen3MoeForCausalLM") return load_qwen3_moe(checkpoint, config, dispatcher);
  if (config.architecture == "OlmoeForCausalLM") return load_olmoe(checkpoint, config, dispatcher);
  if (config.architecture == "Qwen2MoeForCausalLM") return load_qwen2_moe(checkpoint, config, dispatcher);
  if (config.architecture == "MixtralForCausalLM") return load_mixtral(checkpoint, config, dispatcher);
  if (config.architecture == "DeepseekV3ForCausalLM") return load_deepseek_v3(checkpoint, config, dispatcher);
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

DecoderModel::DecoderModel(const Checkpoint& ckpt, const ModelConfig& config, ExpertDispatcher& dispatcher)
    : config_(config),
      dispatcher_(dispatcher),
      rope_(make_rope(config)),
      embed_(ckpt.load_f32("model.embed_tokens.weight", {config.vocab_size, config.hidden_size})),
      head_(OutputHead::load(ckpt, config.hidden_size, config.vocab_size, config.rms_norm_eps,
                             config.tie_word_embeddings)) {}

KvCache DecoderModel::new_cache(size_t max_tokens) const {
  return KvCache(config_.num_hidden_layers, max_tokens, config_.num_key_value_heads * config_.head_dim);
}

size_t DecoderModel::begin_forward(const int32_t* tokens, size_t n, KvCache& cache, float* hidden) const {
  check_token_ids(tokens, n, config_.vocab_size);
  const size_t pos0 = cache.length();
  cache.advance(n);
  const size_t h = config_.hidden_size;
  for (size_t i = 0; i < n; ++i) {
    const float* row = embed_.data() + static_cast<size_t>(tokens[i]) * h;
    std::copy(row, row + h, hidden + i * h);
  }
  return pos0;
}

void DecoderModel::end_forward(const float* hidden, size_t n, float* logits) const {
  const size_t h = config_.hidden_size;
  head_(hidden + (n - 1) * h, embed_, config_.vocab_size, logits);  // last position only
}

}  // namespace charm
