#include "coordinator/models/blocks.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <utility>

#include "common/attention.h"
#include "common/error.h"
#include "common/fixed_point.h"
#include "common/ggml_quantize.h"
#include "common/kernels.h"
#include "common/matmul.h"

namespace charm {

Linear Linear::load(const Checkpoint& ckpt, const std::string& name, size_t out, size_t in, bool with_bias) {
  Linear l = load_exact(ckpt, name, out, in, with_bias);
  if (const auto type = ckpt.dense_quant()) l.weight = quantize_dense(std::move(l.weight), *type, name + ".weight");
  return l;
}

Linear Linear::load_exact(const Checkpoint& ckpt, const std::string& name, size_t out, size_t in, bool with_bias) {
  Linear l;
  l.weight = ckpt.load_matrix(name + ".weight", static_cast<int64_t>(out), static_cast<int64_t>(in));
  if (with_bias) l.bias = ckpt.load_f32(name + ".bias", {static_cast<int64_t>(out)});
  return l;
}

void Linear::operator()(const float* x, size_t rows, float* y) const {
  matmul(weight.view(), x, rows, bias.empty() ? nullptr : bias.data(), y);
}

RmsNorm RmsNorm::load(const Checkpoint& ckpt, const std::string& name, size_t n, double eps, bool unit_offset) {
  RmsNorm norm;
  norm.weight = ckpt.load_f32(name + ".weight", {static_cast<int64_t>(n)});
  if (unit_offset) {
    for (float& w : norm.weight) w = 1.0f + w;
  }
  norm.eps = static_cast<float>(eps);
  return norm;
}

void RmsNorm::operator()(const float* x, size_t rows, float* y) const {
  rms_norm(x, weight.data(), rows, weight.size(), eps, y);
}

Rope::Rope(size_t head_dim, double theta, RopeLayout layout)
    : head_dim_(head_dim), inv_freq_(head_dim / 2), layout_(layout) {
  // Computed in f32 as transformers does: 1 / base ** (arange(0, d, 2) / d).
  for (size_t i = 0; i < head_dim / 2; ++i) {
    const float exponent = static_cast<float>(2 * i) / static_cast<float>(head_dim);
    inv_freq_[i] = 1.0f / std::pow(static_cast<float>(theta), exponent);
  }
}

Rope::Rope(std::vector<float> inv_freq, float attention_factor, RopeLayout layout)
    : head_dim_(2 * inv_freq.size()), inv_freq_(std::move(inv_freq)), attention_factor_(attention_factor),
      layout_(layout) {}

void Rope::apply(float* x, size_t rows, size_t heads, size_t pos0, size_t head_width) const {
  const size_t half = head_dim_ / 2;
  const size_t stride = head_width == 0 ? head_dim_ : head_width;
  // The interleaved layout reads pair i from dims (2i, 2i+1) and writes it to (i, i+half).
  const bool interleaved = layout_ == RopeLayout::kInterleaved;
  std::vector<float> cos(half), sin(half), in(head_dim_);
  for (size_t r = 0; r < rows; ++r) {
    const float pos = static_cast<float>(pos0 + r);
    for (size_t i = 0; i < half; ++i) {
      const float angle = pos * inv_freq_[i];
      cos[i] = std::cos(angle) * attention_factor_;
      sin[i] = std::sin(angle) * attention_factor_;
    }
    for (size_t h = 0; h < heads; ++h) {
      float* v = x + (r * heads + h) * stride;
      std::copy(v, v + head_dim_, in.begin());
      for (size_t i = 0; i < half; ++i) {
        const float a = interleaved ? in[2 * i] : in[i];
        const float b = interleaved ? in[2 * i + 1] : in[i + half];
        v[i] = a * cos[i] - b * sin[i];
        v[i + half] = b * cos[i] + a * sin[i];
      }
    }
  }
}

namespace {

/// One layer of a GQA cache as common/attention.h reads it: KV head h is floats
/// [h * head_dim, (h + 1) * head_dim) of the position's key and value rows.
class GqaRows final : public KvRows {
 public:
  GqaRows(const KvCache& cache, size_t layer, size_t head_dim) : cache_(cache), layer_(layer), head_dim_(head_dim) {}
  const float* key(size_t head, size_t pos) const override { return cache_.key(layer_, pos) + head * head_dim_; }
  const float* value(size_t head, size_t pos) const override { return cache_.value(layer_, pos) + head * head_dim_; }

 private:
  const KvCache& cache_;
  size_t layer_, head_dim_;
};

}  // namespace

void causal_gqa_attention(const float* q, size_t rows, size_t pos0, const KvCache& cache, size_t layer,
                          size_t num_heads, size_t num_kv_heads, size_t head_dim, float* out,
                          size_t sliding_window, const float* sinks) {
  AttentionShape shape;
  shape.sliding_window = sliding_window;
  shape.sinks = sinks;
  shape.num_heads = num_heads;
  shape.num_kv_heads = num_kv_heads;
  shape.key_dim = shape.value_dim = head_dim;
  shape.scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  causal_attention(q, rows, pos0, shape, GqaRows(cache, layer, head_dim), out);
}

namespace {

/// The tail of a RoPE GQA attention block for one sequence, after the q/k/v projections
/// and norms: rotates its q [rows, num_heads, head_dim] and k [rows, num_kv_heads,
/// head_dim] in place for positions seq.pos0.., stores k and v in `layer` of its cache and
/// attends causally into attn [rows, num_heads * head_dim].
void rope_attention(const Rope& rope, float* q, float* k, const float* v, const SequenceRows& seq, size_t layer,
                    const RopeGqaAttention& a, float* attn) {
  rope.apply(q, seq.rows, a.num_heads, seq.pos0, a.head_dim);
  rope.apply(k, seq.rows, a.num_kv_heads, seq.pos0, a.head_dim);
  store_kv(*seq.cache, layer, seq.pos0, seq.rows, a.num_kv_heads * a.head_dim, k, v);
  causal_gqa_attention(q, seq.rows, seq.pos0, *seq.cache, layer, a.num_heads, a.num_kv_heads, a.head_dim, attn,
                       a.options.sliding_window, a.sinks.empty() ? nullptr : a.sinks.data());
}

}  // namespace

RopeGqaAttention RopeGqaAttention::load(const Checkpoint& ckpt, const std::string& prefix, size_t hidden,
                                        size_t num_heads, size_t num_kv_heads, size_t head_dim,
                                        const GqaOptions& options) {
  RopeGqaAttention a;
  a.num_heads = num_heads;
  a.num_kv_heads = num_kv_heads;
  a.head_dim = head_dim;
  a.options = options;
  const size_t q_rows = num_heads * head_dim * (options.output_gate ? 2 : 1);
  a.q_proj = Linear::load(ckpt, prefix + ".q_proj", q_rows, hidden, options.qkv_bias);
  a.k_proj = Linear::load(ckpt, prefix + ".k_proj", num_kv_heads * head_dim, hidden, options.qkv_bias);
  a.v_proj = Linear::load(ckpt, prefix + ".v_proj", num_kv_heads * head_dim, hidden, options.qkv_bias);
  a.o_proj = Linear::load(ckpt, prefix + ".o_proj", hidden, num_heads * head_dim, options.o_bias);
  if (options.qk_norm != QkNorm::kNone) {
    const bool per_head = options.qk_norm == QkNorm::kPerHead;
    const bool offset = options.norm_unit_offset;
    a.q_norm = RmsNorm::load(ckpt, prefix + ".q_norm", per_head ? head_dim : num_heads * head_dim, options.norm_eps,
                             offset);
    a.k_norm = RmsNorm::load(ckpt, prefix + ".k_norm", per_head ? head_dim : num_kv_heads * head_dim,
                             options.norm_eps, offset);
  }
  if (options.sinks) a.sinks = ckpt.load_f32(prefix + ".sinks", {static_cast<int64_t>(num_heads)});
  return a;
}

void RopeGqaAttention::split_query_gate(std::vector<float>& q, size_t rows, std::vector<float>& gate) const {
  const size_t heads = rows * num_heads;
  std::vector<float> query(heads * head_dim);
  gate.resize(heads * head_dim);
  for (size_t i = 0; i < heads; ++i) {
    const float* both = q.data() + i * 2 * head_dim;
    std::copy(both, both + head_dim, query.data() + i * head_dim);
    std::copy(both + head_dim, both + 2 * head_dim, gate.data() + i * head_dim);
  }
  q = std::move(query);
}

void RopeGqaAttention::normalise_qkv(float* q, float* k, float* v, size_t rows) const {
  if (options.qk_norm == QkNorm::kPerHead) {  // one row per head
    q_norm(q, rows * num_heads, q);
    k_norm(k, rows * num_kv_heads, k);
  } else if (options.qk_norm == QkNorm::kWhole) {
    q_norm(q, rows, q);
    k_norm(k, rows, k);
  }
  if (options.clip_qkv > 0) {
    const float c = static_cast<float>(options.clip_qkv);
    const size_t kv_size = rows * num_kv_heads * head_dim;
    for (auto [t, size] : {std::pair{q, rows * num_heads * head_dim}, {k, kv_size}, {v, kv_size}}) {
      for (size_t i = 0; i < size; ++i) t[i] = std::clamp(t[i], -c, c);
    }
  }
}

void RopeGqaAttention::operator()(const Rope& rope, const float* x, size_t rows, std::span<const SequenceRows> batch,
                                  size_t layer, float* out) const {
  const size_t q_dim = num_heads * head_dim, kv_dim = k_proj.out();
  std::vector<float> q(rows * q_proj.out()), k(rows * kv_dim), v(rows * v_proj.out());
  q_proj(x, rows, q.data());
  k_proj(x, rows, k.data());
  v_proj(x, rows, v.data());
  std::vector<float> gate;
  if (options.output_gate) split_query_gate(q, rows, gate);
  normalise_qkv(q.data(), k.data(), v.data(), rows);
  std::vector<float> attn(rows * q_dim);
  for (const SequenceRows& seq : batch) {
    rope_attention(rope, q.data() + seq.row0 * q_dim, k.data() + seq.row0 * kv_dim, v.data() + seq.row0 * kv_dim, seq,
                   layer, *this, attn.data() + seq.row0 * q_dim);
  }
  for (size_t i = 0; i < gate.size(); ++i) attn[i] = attn[i] * sigmoid(gate[i]);
  o_proj(attn.data(), rows, out);
}

DenseMlp DenseMlp::load(const Checkpoint& ckpt, const std::string& prefix, size_t hidden, size_t intermediate) {
  return DenseMlp{Linear::load(ckpt, prefix + ".gate_proj", intermediate, hidden),
                  Linear::load(ckpt, prefix + ".up_proj", intermediate, hidden),
                  Linear::load(ckpt, prefix + ".down_proj", hidden, intermediate)};
}

void DenseMlp::operator()(const float* x, size_t rows, float* y) const {
  std::vector<float> g(rows * gate.out());
  std::vector<float> u(rows * up.out());
  gate(x, rows, g.data());
  up(x, rows, u.data());
  for (size_t i = 0; i < g.size(); ++i) g[i] = silu(g[i]) * u[i];
  down(g.data(), rows, y);
}

void top_k_by(std::vector<uint32_t>& order, size_t k, const std::vector<float>& value) {
  std::iota(order.begin(), order.end(), 0u);
  std::partial_sort(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(k), order.end(),
                    [&](uint32_t a, uint32_t b) { return value[a] > value[b] || (value[a] == value[b] && a < b); });
}

Routing softmax_topk(const float* router_logits, size_t rows, size_t num_experts, size_t top_k, bool norm_topk_prob) {
  Routing routing;
  routing.top_k = top_k;
  routing.experts.resize(rows * top_k);
  routing.weights.resize(rows * top_k);
  std::vector<float> probs(num_experts);
  std::vector<uint32_t> order(num_experts);
  for (size_t r = 0; r < rows; ++r) {
    std::copy(router_logits + r * num_experts, router_logits + (r + 1) * num_experts, probs.begin());
    softmax(probs.data(), num_experts);
    top_k_by(order, top_k, probs);
    float sum = 0;
    for (size_t k = 0; k < top_k; ++k) sum += probs[order[k]];
    for (size_t k = 0; k < top_k; ++k) {
      routing.experts[r * top_k + k] = order[k];
      routing.weights[r * top_k + k] = norm_topk_prob ? probs[order[k]] / sum : probs[order[k]];
    }
  }
  return routing;
}

RoutedExpertsCall::RoutedExpertsCall(ExpertDispatcher& dispatcher, uint32_t layer, const float* x, size_t rows,
                                     size_t hidden, Routing routing)
    : dispatcher_(dispatcher), rows_(rows), hidden_(hidden), routing_(std::move(routing)) {
  const size_t k = routing_.top_k;
  if (k > kMaxTermsPerRow) {
    fail_invalid("layer " + std::to_string(layer) + ": top_k " + std::to_string(k) + " exceeds " +
                 std::to_string(kMaxTermsPerRow) + ", the fixed-point combine's headroom");
  }
  assignments_.resize(rows * k);
  for (size_t r = 0; r < rows; ++r) {
    for (size_t j = 0; j < k; ++j) {
      assignments_[r * k + j] = ExpertAssignment{static_cast<uint32_t>(r), routing_.experts[r * k + j],
                                                 routing_.weights[r * k + j]};
    }
  }
  sums_.resize(rows * hidden);
  dispatcher_.begin_layer(layer, x, static_cast<uint32_t>(rows), static_cast<uint32_t>(hidden), assignments_,
                          sums_.data());
}

void RoutedExpertsCall::finish(float* out) {
  dispatcher_.finish_layer();
  // The exact integer sum of the weighted terms, rounded once: the same bits whichever
  // workers summed which experts (placement invariant).
  for (size_t i = 0; i < rows_ * hidden_; ++i) out[i] = from_fixed(sums_[i]);
}

}  // namespace charm

namespace charm {

void add_residual(float* a, const float* b, size_t n) {
  for (size_t i = 0; i < n; ++i) a[i] += b[i];
}

void store_kv(KvCache& cache, size_t layer, size_t pos0, size_t rows, size_t kv_dim, const float* k, const float* v) {
  for (size_t i = 0; i < rows; ++i) {
    std::copy(k + i * kv_dim, k + (i + 1) * kv_dim, cache.key(layer, pos0 + i));
    std::copy(v + i * kv_dim, v + (i + 1) * kv_dim, cache.value(layer, pos0 + i));
  }
}

OutputHead OutputHead::load(const Checkpoint& ckpt, size_t hidden, size_t vocab, double eps, bool tied) {
  OutputHead head;
  head.norm = RmsNorm::load(ckpt, "model.norm", hidden, eps);
  if (!tied) head.lm_head = Linear::load(ckpt, "lm_head", vocab, hidden);
  return head;
}

void OutputHead::operator()(const float* hidden, size_t rows, const StoredMatrix& embed, float* logits) const {
  std::vector<float> normed(rows * norm.weight.size());
  norm(hidden, rows, normed.data());
  matmul(lm_head.weight.empty() ? embed.view() : lm_head.weight.view(), normed.data(), rows, nullptr, logits);
}

SoftmaxTopkRouter SoftmaxTopkRouter::load(const Checkpoint& ckpt, const std::string& prefix, size_t hidden,
                                          size_t num_experts, size_t top_k, bool norm_topk_prob) {
  SoftmaxTopkRouter r;
  r.router = Linear::load_exact(ckpt, prefix + ".gate", num_experts, hidden);
  r.top_k = top_k;
  r.norm_topk_prob = norm_topk_prob;
  return r;
}

Routing SoftmaxTopkRouter::route(const float* x, size_t rows) const {
  std::vector<float> router_logits(rows * router.out());
  router(x, rows, router_logits.data());
  return softmax_topk(router_logits.data(), rows, router.out(), top_k, norm_topk_prob);
}

std::vector<uint32_t> Router::predict(const float* x, size_t rows) const {
  std::vector<uint32_t> experts = route(x, rows).experts;
  std::sort(experts.begin(), experts.end());
  experts.erase(std::unique(experts.begin(), experts.end()), experts.end());
  return experts;
}

void hint_next_moe_layer(ExpertDispatcher& dispatcher, uint32_t next_layer, const RmsNorm& next_norm,
                         const Router& next_router, const float* hidden, size_t rows) {
  if (!dispatcher.wants_hints()) return;
  std::vector<float> x(rows * next_norm.weight.size());
  next_norm(hidden, rows, x.data());
  dispatcher.hint_layer(next_layer, next_router.predict(x.data(), rows));
}

MoeCall MoeBlock::begin(ExpertDispatcher& dispatcher, uint32_t layer, const float* x, size_t rows,
                        const NextMoeLayer* next) const {
  const size_t hidden = router->hidden();
  MoeCall call;
  // The next layer's hint first: it travels with this layer's requests, so the owners
  // read those experts while they compute this layer.
  if (next != nullptr) hint_next_moe_layer(dispatcher, next->layer, *next->norm, *next->router, next->hidden, rows);
  call.routed_ = std::make_unique<RoutedExpertsCall>(dispatcher, layer, x, rows, hidden, router->route(x, rows));
  // While the routed experts are out: the shared expert.
  if (shared_expert) {
    call.shared_.resize(rows * hidden);
    shared_expert(x, rows, call.shared_.data());
  }
  return call;
}

void MoeCall::finish(float* out) {
  routed_->finish(out);
  if (!shared_.empty()) add_residual(out, shared_.data(), shared_.size());
}

GatedSharedExpert GatedSharedExpert::load(const Checkpoint& ckpt, const std::string& prefix, size_t hidden,
                                          size_t intermediate) {
  return GatedSharedExpert{DenseMlp::load(ckpt, prefix + ".shared_expert", hidden, intermediate),
                           Linear::load_exact(ckpt, prefix + ".shared_expert_gate", 1, hidden)};
}

void GatedSharedExpert::operator()(const float* x, size_t rows, float* out) const {
  const size_t hidden = gate.in();
  std::vector<float> g(rows);
  gate(x, rows, g.data());
  mlp(x, rows, out);
  for (size_t r = 0; r < rows; ++r) {
    const float scale = sigmoid(g[r]);
    for (size_t d = 0; d < hidden; ++d) out[r * hidden + d] *= scale;
  }
}

}  // namespace charm
