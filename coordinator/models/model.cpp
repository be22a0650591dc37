#include "coordinator/models/model.h"

#include <algorithm>
#include <string>

#include "common/error.h"
#include "common/ggml_quantize.h"
#include "coordinator/models/rope_scaling.h"

namespace charm {
namespace {

/// The embedding table [vocab, hidden], quantised as the projections are under quant_dense
/// (llama.cpp's Q8_0 / Q4_0 files quantise token_embd too; a tied lm_head shares it).
StoredMatrix load_embeddings(const Checkpoint& ckpt, const ModelConfig& config) {
  const std::string name = "model.embed_tokens.weight";
  StoredMatrix embed = ckpt.load_matrix(name, config.vocab_size, config.hidden_size);
  if (const auto type = ckpt.dense_quant()) embed = quantize_dense(std::move(embed), *type, name);
  return embed;
}

}  // namespace

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
      embed_(load_embeddings(ckpt, config)),
      head_(OutputHead::load(ckpt, config.hidden_size, config.vocab_size, config.rms_norm_eps,
                             config.tie_word_embeddings)) {}

KvLayout DecoderModel::kv_layout() const {
  const auto kv_dim = static_cast<size_t>(config_.num_key_value_heads * config_.head_dim);
  return KvLayout{static_cast<size_t>(config_.num_hidden_layers), kv_dim, kv_dim};
}

void DecoderModel::check_batch(std::span<const SequenceStep> batch) const {
  for (const SequenceStep& s : batch) {
    if (s.n == 0 || s.cache == nullptr) fail_invalid("a batch part must hold at least one token and a cache");
    if (s.cache->layout() != kv_layout()) fail_invalid("a batch part's KV cache has another layout than this model's");
    check_token_ids(s.tokens, s.n, config_.vocab_size);
    if (s.n > s.cache->capacity() - s.cache->length()) {
      fail_invalid("sequence of " + std::to_string(s.cache->length() + s.n) +
                   " tokens exceeds the KV cache capacity of " + std::to_string(s.cache->capacity()));
    }
  }
}

std::vector<SequenceRows> DecoderModel::begin_forward(std::span<const SequenceStep> batch, float* hidden) const {
  std::vector<SequenceRows> rows;
  size_t row0 = 0;
  const size_t h = config_.hidden_size;
  for (const SequenceStep& s : batch) {
    rows.push_back(SequenceRows{row0, s.n, s.cache->length(), s.cache});
    s.cache->advance(s.n);
    for (size_t i = 0; i < s.n; ++i) matrix_row_to_f32(embed_.view(), s.tokens[i], hidden + (row0 + i) * h);
    row0 += s.n;
  }
  return rows;
}

// One micro-batch of a step: some of its sequences, with their own activations.
struct DecoderModel::MicroBatch {
  std::span<const SequenceStep> steps;
  std::vector<SequenceRows> rows;
  size_t n = 0;  // rows
  std::vector<float> hidden, x, delta;  // [n, hidden_size]
  std::optional<MoeCall> moe;           // its MoE layer in flight (x holds its input)
};

std::vector<std::span<const SequenceStep>> split_micro_batches(std::span<const SequenceStep> batch, size_t parts) {
  if (parts < 2 || batch.size() < 2) return {batch};
  // Two halves of about equal rows, each whole sequences (attention is per sequence).
  size_t total = 0;
  for (const SequenceStep& s : batch) total += s.n;
  size_t cut = 1, before = batch[0].n;
  while (cut + 1 < batch.size() && 2 * (before + batch[cut].n) <= total) before += batch[cut++].n;
  return {batch.first(cut), batch.subspan(cut)};
}

void DecoderModel::forward_batch(std::span<const SequenceStep> batch) {
  dispatcher_.drop_unfinished();  // a forward that threw may have left layers begun
  // Everything is checked before any cache moves: a refused batch leaves them all as they were.
  check_batch(batch);
  begin_step();
  const size_t h = config_.hidden_size;
  // Automatic (0) is one batch: two halves measured slower on the LAN bed (docs/benchmarks.md),
  // each streaming the coordinator's dense weights once more per step.
  const size_t parts = micro_batches_ > 0 ? micro_batches_ : 1;
  std::vector<MicroBatch> micro;
  for (std::span<const SequenceStep> steps : split_micro_batches(batch, parts)) {
    MicroBatch& m = micro.emplace_back();
    m.steps = steps;
    for (const SequenceStep& s : steps) m.n += s.n;
    m.hidden.resize(m.n * h);
    m.x.resize(m.n * h);
    m.delta.resize(m.n * h);
    m.rows = begin_forward(steps, m.hidden.data());
  }
  // Ping-pong (two-batch overlap): each micro-batch's attention runs while the other's
  // routed experts are out. Every sequence's arithmetic is what it would be alone (batch
  // invariance), so the split changes no bit of any output.
  for (size_t l = 0; l < num_layers(); ++l) {
    for (MicroBatch& m : micro) {
      finish_moe(m);
      input_norm(l)(m.hidden.data(), m.n, m.x.data());
      attention(l, m.x.data(), m.n, m.rows, m.delta.data());
      add_residual(m.hidden.data(), m.delta.data(), m.n * h);
      post_attention_norm(l)(m.hidden.data(), m.n, m.x.data());
      feed_forward(l, m);
    }
  }
  for (MicroBatch& m : micro) finish_moe(m);
  end_forward(micro);
}

void DecoderModel::feed_forward(size_t layer, MicroBatch& m) {
  const MoeBlock* moe = moe_block(layer);
  if (moe == nullptr) {
    dense_mlp(layer)(m.x.data(), m.n, m.delta.data());
    add_residual(m.hidden.data(), m.delta.data(), m.delta.size());
    return;
  }
  const std::optional<NextMoeLayer> next = next_moe_layer(layer, m.hidden.data());
  m.moe = moe->begin(dispatcher_, static_cast<uint32_t>(layer), m.x.data(), m.n, next ? &*next : nullptr);
}

void DecoderModel::finish_moe(MicroBatch& m) {
  if (!m.moe) return;
  m.moe->finish(m.delta.data());
  m.moe.reset();
  add_residual(m.hidden.data(), m.delta.data(), m.delta.size());
}

std::optional<NextMoeLayer> DecoderModel::next_moe_layer(size_t layer, const float* hidden) const {
  for (size_t j = layer + 1; j < num_layers(); ++j) {
    if (const MoeBlock* moe = moe_block(j)) {
      return NextMoeLayer{static_cast<uint32_t>(j), &post_attention_norm(j), moe->router.get(), hidden};
    }
  }
  return std::nullopt;
}

void DecoderModel::end_forward(std::span<const MicroBatch> micro) const {
  const size_t h = config_.hidden_size;
  // One output head over every micro-batch's rows: per half, its weights (the largest
  // matrix of a small model) would stream from memory twice per step.
  std::vector<float> last;  // the last row of every part that wants logits
  std::vector<float*> outputs;
  for (const MicroBatch& m : micro) {
    for (size_t i = 0; i < m.steps.size(); ++i) {
      if (m.steps[i].logits == nullptr) continue;
      const float* row = m.hidden.data() + (m.rows[i].row0 + m.rows[i].rows - 1) * h;
      last.insert(last.end(), row, row + h);
      outputs.push_back(m.steps[i].logits);
    }
  }
  if (outputs.empty()) return;
  std::vector<float> logits(outputs.size() * config_.vocab_size);
  head_(last.data(), outputs.size(), embed_, logits.data());
  for (size_t i = 0; i < outputs.size(); ++i) {
    std::copy_n(logits.data() + i * config_.vocab_size, config_.vocab_size, outputs[i]);
  }
}

}  // namespace charm
