#include "coordinator/models/model.h"

#include <algorithm>
#include <string>

#include "common/error.h"
#include "coordinator/models/rope_scaling.h"

namespace charm {

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
      embed_(ckpt.load_matrix("model.embed_tokens.weight", config.vocab_size, config.hidden_size)),
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
  for (size_t i = 0; i < n; ++i) matrix_row_to_f32(embed_.view(), tokens[i], hidden + i * h);
  return pos0;
}

void DecoderModel::forward(const int32_t* tokens, size_t n, KvCache& cache, float* logits) {
  const size_t h = config_.hidden_size;
  std::vector<float> hidden(n * h), x(n * h), delta(n * h);
  const size_t pos0 = begin_forward(tokens, n, cache, hidden.data());
  for (size_t l = 0; l < num_layers(); ++l) {
    input_norm(l)(hidden.data(), n, x.data());
    attention(l, x.data(), n, pos0, cache, delta.data());
    add_residual(hidden.data(), delta.data(), n * h);
    post_attention_norm(l)(hidden.data(), n, x.data());
    feed_forward(l, x.data(), hidden.data(), n, delta.data());
    add_residual(hidden.data(), delta.data(), n * h);
  }
  end_forward(hidden.data(), n, logits);
}

void DecoderModel::feed_forward(size_t layer, const float* x, const float* hidden, size_t n, float* out) {
  const MoeBlock* moe = moe_block(layer);
  if (moe == nullptr) return dense_mlp(layer)(x, n, out);
  const std::optional<NextMoeLayer> next = next_moe_layer(layer, hidden);
  (*moe)(dispatcher_, static_cast<uint32_t>(layer), x, n, next ? &*next : nullptr, out);
}

std::optional<NextMoeLayer> DecoderModel::next_moe_layer(size_t layer, const float* hidden) const {
  for (size_t j = layer + 1; j < num_layers(); ++j) {
    if (const MoeBlock* moe = moe_block(j)) {
      return NextMoeLayer{static_cast<uint32_t>(j), &post_attention_norm(j), moe->router.get(), hidden};
    }
  }
  return std::nullopt;
}

void DecoderModel::end_forward(const float* hidden, size_t n, float* logits) const {
  const size_t h = config_.hidden_size;
  head_(hidden + (n - 1) * h, embed_, logits);  // last position only
}

}  // namespace charm
