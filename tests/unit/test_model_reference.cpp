// The model families against transformers: the committed fixtures
// (scripts/gen_fixtures.py, tests/fixtures/models/*/reference.json) hold prompts, the
// reference's greedy continuations and its first-step logits; charm must reproduce the
// tokens exactly and the logits within 1e-4, in single-node mode.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <functional>

#include <nlohmann/json.hpp>

#include "common/checkpoint.h"
#include "common/error.h"
#include "common/kernels.h"
#include "common/model_config.h"
#include "common/topology.h"
#include "coordinator/dispatch/dispatcher_factory.h"
#include "coordinator/engine.h"
#include "coordinator/models/families.h"
#include "tests/support/expect_error.h"

namespace {

using namespace charm;

const std::filesystem::path kModels = std::filesystem::path(CHARM_SOURCE_DIR) / "tests/fixtures/models";

std::vector<float> read_f32_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  REQUIRE(in.good());
  in.seekg(0, std::ios::end);
  std::vector<float> v(static_cast<size_t>(in.tellg()) / 4);
  in.seekg(0);
  in.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(v.size() * 4));
  return v;
}

/// Fixture `name`'s checkpoint, config and single-node dispatcher, for load_model.
struct SingleNode {
  explicit SingleNode(const std::string& name)
      : dir(kModels / name),
        ckpt(Checkpoint::open(dir)),
        config(ModelConfig::parse(ckpt->config_json(), (dir / "config.json").string(), checkpoint_families())) {
    Topology topology;
    topology.model = dir;
    topology.single_node = true;
    dispatcher = make_dispatcher(topology, *ckpt, config, local);
  }
  std::filesystem::path dir;
  std::unique_ptr<Checkpoint> ckpt;
  ModelConfig config;
  LocalExperts local;
  std::unique_ptr<ExpertDispatcher> dispatcher;
};

/// One reference prompt as charm ran it.
struct PromptOutcome {
  std::string name;
  float max_diff = 0;              ///< max |logit - reference| after the prompt
  bool tokens_match = false;       ///< the greedy continuation is the reference's
  size_t kv_bytes_per_token = 0;   ///< of the cache it ran with
};

/// Runs every reference prompt of fixture `name` with its config changed by `edit`.
std::vector<PromptOutcome> run_fixture(const std::string& name, const std::function<void(ModelConfig&)>& edit = {}) {
  SingleNode node(name);
  const auto& dir = node.dir;
  if (edit) edit(node.config);
  const ModelConfig& config = node.config;
  auto model = load_model(*node.ckpt, config, *node.dispatcher);

  std::ifstream in(dir / "reference.json");
  const auto reference = nlohmann::json::parse(in);
  std::vector<PromptOutcome> outcomes;
  for (const auto& prompt : reference["prompts"]) {
    const auto ids = prompt["prompt_ids"].get<std::vector<int32_t>>();
    const auto expected_new = prompt["new_ids"].get<std::vector<int32_t>>();
    const auto expected_logits = read_f32_file(dir / prompt["logits_file"].get<std::string>());
    REQUIRE(expected_logits.size() == static_cast<size_t>(config.vocab_size));

    PromptOutcome outcome{prompt["name"].get<std::string>()};
    KvCache cache = model->new_cache(ids.size() + expected_new.size());
    outcome.kv_bytes_per_token = cache.bytes_per_token();
    std::vector<float> logits(config.vocab_size);
    model->forward(ids.data(), ids.size(), cache, logits.data());
    for (size_t i = 0; i < logits.size(); ++i) {
      outcome.max_diff = std::max(outcome.max_diff, std::fabs(logits[i] - expected_logits[i]));
    }
    std::vector<int32_t> generated;
    for (size_t step = 0; step < expected_new.size(); ++step) {
      const int32_t token = static_cast<int32_t>(argmax(logits.data(), logits.size()));
      generated.push_back(token);
      if (step + 1 < expected_new.size()) model->forward(&token, 1, cache, logits.data());
    }
    outcome.tokens_match = generated == expected_new;
    outcomes.push_back(outcome);
  }
  return outcomes;
}

/// Runs every reference prompt of fixture `name` and checks logits and greedy tokens.
void check_fixture(const std::string& name) {
  std::ifstream in(kModels / name / "reference.json");
  const auto reference = nlohmann::json::parse(in);
  for (const PromptOutcome& outcome : run_fixture(name)) {
    CAPTURE(name);
    CAPTURE(outcome.name);
    if (reference.contains("kv_cache")) {  // DeepSeek-V3: the compressed MLA cache's size
      CHECK(outcome.kv_bytes_per_token == reference["kv_cache"]["bytes_per_token_f32"].get<size_t>());
    }
    CHECK(outcome.max_diff < 1e-4f);
    MESSAGE(name << " " << outcome.name << ": max |logit - reference| = " << outcome.max_diff);
    CHECK(outcome.tokens_match);
  }
}

}  // namespace

TEST_CASE("qwen3-moe-tiny matches transformers: greedy tokens exact, logits within 1e-4") {
  check_fixture("qwen3-moe-tiny");
}

TEST_CASE("olmoe-tiny matches transformers: greedy tokens exact, logits within 1e-4") {
  check_fixture("olmoe-tiny");
}

// --- Qwen2-MoE and Mixtral (issue 4) ---------------------------------------------------

TEST_CASE("qwen2-moe-tiny (gated shared expert, q/k/v biases) matches transformers: greedy exact, logits 1e-4") {
  check_fixture("qwen2-moe-tiny");
}

TEST_CASE("mixtral-tiny (block_sparse_moe w1/w3/w2) matches transformers: greedy exact, logits 1e-4") {
  check_fixture("mixtral-tiny");
}

// --- DeepSeek-V3 (issue 4) ---------------------------------------------------------------

TEST_CASE("deepseek-v3-tiny (MLA, YaRN, group-limited sigmoid routing) matches transformers") {
  check_fixture("deepseek-v3-tiny");
}

TEST_CASE("deepseek-v3-tiny-fp8 (block-scaled float8_e4m3fn weights) matches transformers on the dequantised weights") {
  check_fixture("deepseek-v3-tiny-fp8");
}

// --- GLM-4.5 MoE and Kimi K2 (issue 16) -----------------------------------------------------

TEST_CASE("glm4-moe-tiny (partial rotary, q/k norm, group-limited sigmoid routing, shared experts) matches transformers") {
  check_fixture("glm4-moe-tiny");
}

TEST_CASE("kimi-k2-tiny (DeepSeek-V3 with Kimi K2's config: one group, YaRN beta 1/1, untied lm_head) matches transformers") {
  check_fixture("kimi-k2-tiny");
}

TEST_CASE("minimax-m2-tiny (whole-projection q/k norm, rotary_dim, sigmoid routing with the bias beside the gate) matches transformers") {
  check_fixture("minimax-m2-tiny");
}

// --- Sliding-window attention and gpt-oss (issue 16, items 6 and 3) ---------------------------

TEST_CASE("mixtral-swa-tiny (sliding_window 6 on every layer) matches transformers: greedy exact, logits 1e-4") {
  check_fixture("mixtral-swa-tiny");
}

TEST_CASE("qwen2-moe-swa-tiny (sliding_window 5 on layers 0 and 2) matches transformers: greedy exact, logits 1e-4") {
  check_fixture("qwen2-moe-swa-tiny");
}

TEST_CASE("gpt-oss-tiny (sinks, alternating sliding/full layers, YaRN, biased experts, clamped SwiGLU) matches transformers") {
  check_fixture("gpt-oss-tiny");
}

// --- GLM-5 with DeepSeek Sparse Attention (issue 16, item 2) -----------------------------------

TEST_CASE("glm-moe-dsa-tiny (MLA with the lightning indexer's top-5 keys, a shared-selection layer) matches transformers") {
  check_fixture("glm-moe-dsa-tiny");
}

TEST_CASE("deepseek-v32-tiny (DeepSeek-V3.2: an indexer on every layer turning RoPE halves, YaRN) matches transformers") {
  check_fixture("deepseek-v32-tiny");
}

TEST_CASE("glm-moe-dsa-tiny catches an indexer off by one: index_topk 4 or 6 instead of 5 fails the reference") {
  for (int64_t topk : {4, 6}) {
    CAPTURE(topk);
    size_t failing = 0;
    for (const PromptOutcome& outcome : run_fixture("glm-moe-dsa-tiny", [&](ModelConfig& c) { c.index_topk = topk; })) {
      MESSAGE("index_topk " << topk << ", " << outcome.name << ": max |logit - reference| = " << outcome.max_diff
                            << std::string(outcome.tokens_match ? "" : ", greedy tokens differ"));
      failing += outcome.max_diff >= 1e-4f || !outcome.tokens_match;
    }
    CHECK(failing >= 4);  // of 5 prompts; one_token has a single key, which any index_topk keeps
  }
}

// --- Qwen3-Next: gated DeltaNet linear attention (issue 16, item 5) ----------------------------

TEST_CASE("qwen3-next-tiny (gated DeltaNet layers, gated full attention, 1 + weight norms) matches transformers") {
  check_fixture("qwen3-next-tiny");
}

TEST_CASE("qwen3.5-moe-tiny (Qwen3.5-MoE's text model: separate DeltaNet projections, every layer MoE) matches transformers") {
  check_fixture("qwen3.5-moe-tiny");
}

// --- Chunked prefill (issue 6) -------------------------------------------------------------

TEST_CASE("chunked prefill gives the logits of one whole-prompt forward, bit for bit, for every family") {
  for (const std::string name : {"qwen3-moe-tiny", "olmoe-tiny", "qwen2-moe-tiny", "mixtral-tiny", "deepseek-v3-tiny",
                                 "deepseek-v3-tiny-fp8", "glm4-moe-tiny", "kimi-k2-tiny",
                                 "minimax-m2-tiny", "mixtral-swa-tiny", "qwen2-moe-swa-tiny", "gpt-oss-tiny",
                                 "glm-moe-dsa-tiny", "deepseek-v32-tiny",
                                 "qwen3-next-tiny", "qwen3.5-moe-tiny"}) {
    CAPTURE(name);
    Topology topology;
    topology.model = kModels / name;
    topology.single_node = true;
    std::ifstream in(topology.model / "reference.json");
    const auto reference = nlohmann::json::parse(in);
    std::vector<int32_t> ids;  // every reference prompt back to back: long enough for several chunks
    for (const auto& prompt : reference["prompts"]) {
      for (int32_t id : prompt["prompt_ids"].get<std::vector<int32_t>>()) ids.push_back(id);
    }
    REQUIRE(ids.size() > 7);
    std::vector<float> whole;
    for (size_t chunk : {ids.size(), size_t{1}, size_t{3}, ids.size() - 1}) {
      CAPTURE(chunk);
      topology.serving.max_batch_tokens = static_cast<int64_t>(chunk);
      topology.serving.max_num_seqs = 1;
      const std::vector<float> logits = Engine::create(topology)->prompt_logits(ids);
      if (whole.empty()) {
        whole = logits;
      } else {
        REQUIRE(logits.size() == whole.size());
        CHECK(std::memcmp(logits.data(), whole.data(), whole.size() * sizeof(float)) == 0);
      }
    }
  }
}

TEST_CASE("a step budget below the sequence cap, or of 0 tokens, is refused by name") {
  Topology topology;
  topology.model = kModels / "olmoe-tiny";
  topology.single_node = true;
  topology.serving.max_batch_tokens = 0;
  test::expect_error([&] { Engine::create(topology); }, ErrorCategory::kInvalidInput, {"max_batch_tokens"});
  topology.serving.max_batch_tokens = 4;
  topology.serving.max_num_seqs = 8;
  test::expect_error([&] { Engine::create(topology); }, ErrorCategory::kInvalidInput,
                     {"max_batch_tokens (4)", "max_num_seqs (8)"});
}

// --- The one MoE block (issue 13) ------------------------------------------------------------

namespace {

// Forwards everything to `inner`, asks for hints and records which MoE layers they name.
class HintRecorder : public ExpertDispatcher {
 public:
  explicit HintRecorder(ExpertDispatcher& inner) : inner_(inner) {}
  void begin_layer(uint32_t layer, const float* hidden, uint32_t num_rows, uint32_t hidden_size,
                   const std::vector<ExpertAssignment>& assignments, int64_t* sums) override {
    inner_.begin_layer(layer, hidden, num_rows, hidden_size, assignments, sums);
  }
  void finish_layer() override { inner_.finish_layer(); }
  void drop_unfinished() override { inner_.drop_unfinished(); }
  void hint_layer(uint32_t layer, const std::vector<uint32_t>& experts) override {
    hinted.push_back(static_cast<int64_t>(layer));
    CHECK(!experts.empty());
  }
  bool wants_hints() const override { return true; }
  std::vector<WorkerStatus> status() const override { return inner_.status(); }
  std::vector<int64_t> hinted;

 private:
  ExpertDispatcher& inner_;
};

}  // namespace

TEST_CASE("every family sends the next MoE layer's prefetch hint, and hints change no bit of the logits") {
  // The MoE block is shared, so a family that skipped the hint (DeepSeek-V3 did) fails here.
  for (const std::string name : {"qwen3-moe-tiny", "olmoe-tiny", "qwen2-moe-tiny", "mixtral-tiny", "deepseek-v3-tiny",
                                 "deepseek-v3-tiny-fp8", "glm4-moe-tiny", "kimi-k2-tiny",
                                 "minimax-m2-tiny", "mixtral-swa-tiny", "qwen2-moe-swa-tiny", "gpt-oss-tiny",
                                 "glm-moe-dsa-tiny", "deepseek-v32-tiny",
                                 "qwen3-next-tiny", "qwen3.5-moe-tiny"}) {
    CAPTURE(name);
    SingleNode node(name);
    const ModelConfig& config = node.config;
    const std::vector<int32_t> ids = {1, 7, 3, 9};
    auto logits_of = [&](ExpertDispatcher& d) {
      auto model = load_model(*node.ckpt, config, d);
      KvCache cache = model->new_cache(ids.size());
      std::vector<float> logits(config.vocab_size);
      model->forward(ids.data(), ids.size(), cache, logits.data());
      return logits;
    };
    const std::vector<float> plain = logits_of(*node.dispatcher);
    HintRecorder recorder(*node.dispatcher);
    const std::vector<float> hinted = logits_of(recorder);
    CHECK(std::memcmp(plain.data(), hinted.data(), plain.size() * sizeof(float)) == 0);
    // One hint per MoE layer after the first, in order (each names the layer it predicts).
    const std::vector<int64_t> moe = config.moe_layer_ids();
    REQUIRE(moe.size() >= 2);
    CHECK(recorder.hinted == std::vector<int64_t>(moe.begin() + 1, moe.end()));
  }
}

// --- Ping-pong micro-batches (issue 17, item 3) -------------------------------------------------

namespace {

// Forwards to `inner` and records the order of begins (with their rows) and finishes.
class OrderRecorder : public ExpertDispatcher {
 public:
  explicit OrderRecorder(ExpertDispatcher& inner) : inner_(inner) {}
  void begin_layer(uint32_t layer, const float* hidden, uint32_t num_rows, uint32_t hidden_size,
                   const std::vector<ExpertAssignment>& assignments, int64_t* sums) override {
    calls.push_back("begin " + std::to_string(layer) + " x" + std::to_string(num_rows));
    inner_.begin_layer(layer, hidden, num_rows, hidden_size, assignments, sums);
  }
  void finish_layer() override {
    calls.push_back("finish");
    inner_.finish_layer();
  }
  void drop_unfinished() override { inner_.drop_unfinished(); }
  std::vector<WorkerStatus> status() const override { return inner_.status(); }
  std::vector<std::string> calls;

 private:
  ExpertDispatcher& inner_;
};

}  // namespace

TEST_CASE("split_micro_batches: whole sequences, two halves of about equal rows") {
  std::vector<SequenceStep> steps(4);
  for (size_t i = 0; i < steps.size(); ++i) steps[i].n = std::vector<size_t>{5, 1, 1, 3}[i];
  CHECK(split_micro_batches(steps, 1).size() == 1);
  CHECK(split_micro_batches(std::span(steps).first(1), 2).size() == 1);  // one sequence: not split
  const auto halves = split_micro_batches(steps, 2);
  REQUIRE(halves.size() == 2);
  CHECK(halves[0].size() == 1);  // 5 rows | 5 rows
  CHECK(halves[1].size() == 3);
  for (size_t i = 0; i < steps.size(); ++i) steps[i].n = 1;
  const auto even = split_micro_batches(steps, 2);
  CHECK(even[0].size() == 2);
  CHECK(even[1].size() == 2);
}

TEST_CASE("two micro-batches interleave their MoE layers and change no bit of any sequence's logits") {
  for (const std::string name : {"qwen3-moe-tiny", "qwen2-moe-tiny", "deepseek-v3-tiny", "kimi-k2-tiny",
                                 "gpt-oss-tiny", "mixtral-swa-tiny"}) {
    CAPTURE(name);
    SingleNode node(name);
    const ModelConfig& config = node.config;
    const std::vector<std::vector<int32_t>> prompts = {{1, 7, 3, 9, 4}, {2}, {5, 6}, {8, 1, 2}};
    auto run = [&](ExpertDispatcher& d, size_t micro) {
      auto model = load_model(*node.ckpt, config, d);
      model->set_micro_batches(micro);
      std::vector<KvCache> caches;
      caches.reserve(prompts.size());
      for (const auto& p : prompts) caches.push_back(model->new_cache(p.size()));
      std::vector<std::vector<float>> logits(prompts.size(), std::vector<float>(config.vocab_size));
      std::vector<SequenceStep> batch;
      for (size_t i = 0; i < prompts.size(); ++i) {
        batch.push_back({prompts[i].data(), prompts[i].size(), &caches[i], logits[i].data()});
      }
      model->forward_batch(batch);
      return logits;
    };
    OrderRecorder one(*node.dispatcher), two(*node.dispatcher);
    const auto whole = run(one, 1);
    const auto split = run(two, 2);
    for (size_t i = 0; i < prompts.size(); ++i) {
      CAPTURE(i);
      CHECK(std::memcmp(whole[i].data(), split[i].data(), whole[i].size() * sizeof(float)) == 0);
    }
    // 11 rows: 5 | 6. Each half's layer finishes just before that half's next attention,
    // so the other half's layer is begun in between.
    const int64_t first = config.moe_layer_ids().front();
    const std::string l = std::to_string(first);
    REQUIRE(two.calls.size() >= 4);
    CHECK(std::vector<std::string>(two.calls.begin(), two.calls.begin() + 3) ==
          std::vector<std::string>{"begin " + l + " x5", "begin " + l + " x6", "finish"});
    CHECK(std::vector<std::string>(one.calls.begin(), one.calls.begin() + 2) ==
          std::vector<std::string>{"begin " + l + " x11", "finish"});
  }
}
