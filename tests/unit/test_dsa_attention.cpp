// DeepSeek Sparse Attention as GLM-5 runs it (coordinator/models/dsa_indexer.h, the
// selection path of coordinator/models/mla_attention.h) on the glm-moe-dsa-tiny fixture's
// weights: an indexer that keeps every key must give dense MLA bit for bit (Colibrì's check
// of its DSA), a biting one must keep exactly min(p + 1, index_topk) keys, and GlmMoeDsaConfig's
// fields are read or refused by name. test_model_reference.cpp checks the whole model
// against transformers.
#include <doctest/doctest.h>

#include <cstring>
#include <fstream>
#include <numeric>
#include <random>

#include <nlohmann/json.hpp>

#include "common/checkpoint.h"
#include "common/error.h"
#include "common/model_config.h"
#include "coordinator/models/dsa_indexer.h"
#include "coordinator/models/families.h"
#include "coordinator/models/mla_attention.h"
#include "coordinator/models/rope_scaling.h"
#include "tests/support/expect_error.h"

namespace {

using namespace charm;

const std::filesystem::path kFixture = std::filesystem::path(CHARM_SOURCE_DIR) / "tests/fixtures/models/glm-moe-dsa-tiny";

nlohmann::json fixture_config() {
  std::ifstream in(kFixture / "config.json");
  return nlohmann::json::parse(in);
}

ModelConfig parse(const nlohmann::json& j) { return ModelConfig::parse(j, "config.json", checkpoint_families()); }

/// One layer's MLA and indexer from the fixture, with index_topk set to `topk`.
struct DsaLayer {
  explicit DsaLayer(int64_t topk) : ckpt(Checkpoint::open(kFixture)), config(parse(fixture_config())) {
    config.index_topk = topk;
    attention = MlaAttention::load(*ckpt, "model.layers.1.self_attn", config);
    indexer = LightningIndexer::load(*ckpt, "model.layers.1.self_attn.indexer", config);
  }
  KvCache new_cache(size_t tokens) const {
    return KvCache(KvLayout{static_cast<size_t>(config.num_hidden_layers), MlaAttention::cache_row_dim(config), 0},
                   tokens);
  }
  std::unique_ptr<Checkpoint> ckpt;
  ModelConfig config;
  MlaAttention attention;
  LightningIndexer indexer;
};

constexpr size_t kLayer = 1;

/// Normal(0, 1) rows [rows, hidden] from a fixed seed.
std::vector<float> random_rows(size_t rows, size_t hidden, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(rows * hidden);
  for (float& v : x) v = normal(gen);
  return x;
}

/// A 20-row prefill chunk, then three one-row decode steps: per step, the dense output and
/// the output through the indexer's selection, each over its own cache, and the selections.
struct Outputs {
  std::vector<std::vector<float>> dense, sparse;
  std::vector<MlaAttention::KeySelection> selections;
};

Outputs run_both(const DsaLayer& layer) {
  const size_t hidden = layer.config.hidden_size;
  const Rope rope = make_rope(layer.config);
  KvCache dense_cache = layer.new_cache(32), sparse_cache = layer.new_cache(32);
  Outputs out;
  size_t pos = 0;
  uint32_t seed = 1;
  for (size_t rows : {20, 1, 1, 1}) {
    const std::vector<float> x = random_rows(rows, hidden, seed++);
    std::vector<float> dense(rows * hidden), sparse(rows * hidden);
    const SequenceRows d{0, rows, pos, &dense_cache}, s{0, rows, pos, &sparse_cache};
    layer.attention(rope, x.data(), rows, {&d, 1}, kLayer, dense.data());
    const std::vector<float> q_latent = layer.attention.query_latent(x.data(), rows);
    MlaAttention::KeySelection selection = layer.indexer.select(x.data(), q_latent, rows, {&s, 1}, kLayer);
    layer.attention.attend(rope, x.data(), q_latent, rows, {&s, 1}, kLayer, &selection, sparse.data());
    out.dense.push_back(std::move(dense));
    out.sparse.push_back(std::move(sparse));
    out.selections.push_back(std::move(selection));
    pos += rows;
  }
  return out;
}

bool same_bits(const float* a, const float* b, size_t n) { return std::memcmp(a, b, n * sizeof(float)) == 0; }

}  // namespace

TEST_CASE("an indexer that keeps every key gives dense MLA attention bit for bit, in prefill and decode") {
  const DsaLayer layer(1 << 20);
  const Outputs out = run_both(layer);
  size_t pos = 0;
  for (size_t step = 0; step < out.dense.size(); ++step) {
    CAPTURE(step);
    const MlaAttention::KeySelection& selection = out.selections[step];
    for (size_t r = 0; r < selection.size(); ++r) {
      std::vector<uint32_t> every(pos + r + 1);
      std::iota(every.begin(), every.end(), 0u);
      CHECK(selection[r] == every);
    }
    REQUIRE(out.sparse[step].size() == out.dense[step].size());
    CHECK(same_bits(out.sparse[step].data(), out.dense[step].data(), out.dense[step].size()));
    pos += selection.size();
  }
}

TEST_CASE("index_topk 5 keeps min(p + 1, 5) distinct earlier keys per query; rows that keep all equal dense") {
  const DsaLayer layer(5);
  const Outputs out = run_both(layer);
  const size_t hidden = layer.config.hidden_size;
  size_t pos = 0, differing = 0, beyond = 0;
  for (size_t step = 0; step < out.dense.size(); ++step) {
    const MlaAttention::KeySelection& selection = out.selections[step];
    for (size_t r = 0; r < selection.size(); ++r) {
      const size_t p = pos + r;
      CAPTURE(p);
      const std::vector<uint32_t>& chosen = selection[r];
      REQUIRE(chosen.size() == std::min<size_t>(p + 1, 5));
      CHECK(std::is_sorted(chosen.begin(), chosen.end()));
      CHECK(std::adjacent_find(chosen.begin(), chosen.end()) == chosen.end());
      CHECK(chosen.back() <= p);
      const bool same = same_bits(out.sparse[step].data() + r * hidden, out.dense[step].data() + r * hidden, hidden);
      if (p < 5) CHECK(same);
      beyond += p >= 5;
      differing += p >= 5 && !same;
    }
    pos += selection.size();
  }
  CHECK(differing == beyond);  // the selection bites on every query with more than 5 keys
}

TEST_CASE("a key selection of the wrong row count, or one past its query, is refused") {
  const DsaLayer layer(5);
  const Rope rope = make_rope(layer.config);
  KvCache cache = layer.new_cache(8);
  const size_t hidden = layer.config.hidden_size;
  const std::vector<float> x = random_rows(2, hidden, 7);
  std::vector<float> out(2 * hidden);
  const SequenceRows seq{0, 2, 0, &cache};
  const std::vector<float> q_latent = layer.attention.query_latent(x.data(), 2);
  const MlaAttention::KeySelection one_row = {{0}};
  test::expect_error([&] { layer.attention.attend(rope, x.data(), q_latent, 2, {&seq, 1}, kLayer, &one_row, out.data()); },
                     ErrorCategory::kInvalidInput, {"1 rows for 2 query rows"});
  const MlaAttention::KeySelection ahead = {{0}, {0, 2}};
  test::expect_error([&] { layer.attention.attend(rope, x.data(), q_latent, 2, {&seq, 1}, kLayer, &ahead, out.data()); },
                     ErrorCategory::kInvalidInput, {"position 1", "reaches past it"});
}

TEST_CASE("GlmMoeDsaConfig: indexer_types, index_topk_pattern and the freq/offset default are read") {
  nlohmann::json j = fixture_config();
  CHECK(parse(j).indexer_shared == std::vector<bool>{false, false, true, false});
  j.erase("indexer_types");
  CHECK(parse(j).indexer_shared == std::vector<bool>(4, false));  // index_topk_freq 1: every layer full
  j["index_topk_freq"] = 2;  // full where max(i - 2 + 1, 0) % 2 == 0: layers 0, 1, 3
  CHECK(parse(j).indexer_shared == std::vector<bool>{false, false, true, false});
  j["index_topk_pattern"] = "FSSF";
  CHECK(parse(j).indexer_shared == std::vector<bool>{false, true, true, false});
  // transformers 5 writes these lists back; charm reads them as the fields they stand for.
  j["layer_types"] = std::vector<std::string>(4, "indexed_attention");
  j["mlp_layer_types"] = {"dense", "dense", "sparse", "sparse"};
  const ModelConfig c = parse(j);
  CHECK(c.first_k_dense_replace == 2);
  CHECK(c.rope_interleave);
  CHECK(MlaAttention::cache_row_dim(c) == 32 + 8 + 16);
}

TEST_CASE("GlmMoeDsaConfig: a shared first layer, a bad indexer type or width, mixed MLP types and a null q_lora_rank are refused by name") {
  const nlohmann::json base = fixture_config();
  auto refused = [&](auto edit, ErrorCategory category, const std::vector<std::string>& parts) {
    nlohmann::json j = base;
    edit(j);
    test::expect_error([&] { parse(j); }, category, parts);
  };
  refused([](nlohmann::json& j) { j["indexer_types"] = {"shared", "full", "full", "full"}; },
          ErrorCategory::kInvalidInput, {"layer 0", "shared"});
  refused([](nlohmann::json& j) { j["indexer_types"] = {"full", "full", "sparse", "full"}; },
          ErrorCategory::kInvalidInput, {"indexer_types[2]", "sparse"});
  refused([](nlohmann::json& j) { j["indexer_types"] = {"full", "full"}; }, ErrorCategory::kInvalidInput,
          {"indexer_types", "2 layers"});
  refused([](nlohmann::json& j) { j["index_head_dim"] = 4; }, ErrorCategory::kInvalidInput,
          {"index_head_dim 4", "qk_rope_head_dim 8"});
  refused([](nlohmann::json& j) { j["index_topk"] = 0; }, ErrorCategory::kInvalidInput, {"index_topk"});
  refused([](nlohmann::json& j) { j["mlp_layer_types"] = {"dense", "sparse", "dense", "sparse"}; },
          ErrorCategory::kUnsupported, {"mlp_layer_types[2]"});
  refused([](nlohmann::json& j) { j["q_lora_rank"] = nullptr; }, ErrorCategory::kUnsupported, {"q_lora_rank"});
  refused([](nlohmann::json& j) { j["layer_types"] = std::vector<std::string>(4, "full_attention"); },
          ErrorCategory::kUnsupported, {"layer_types[0]", "indexed_attention"});
}
