// Batch invariance (DESIGN.md; issue 14): a sequence's first-step logits and its tokens
// are bit-identical whether it runs alone or beside others that arrive at random times
// with random lengths and sampling parameters, whatever the step budget (how prompts are
// chunked), a KV pool small enough to preempt, the prefix cache, single node or two
// `charm worker` processes on 127.0.0.1.
#include <doctest/doctest.h>

#include <chrono>
#include <cstring>
#include <fstream>
#include <iomanip>
#include <memory>
#include <random>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "common/topology.h"
#include "coordinator/engine.h"
#include "tests/support/child_process.h"
#include "tests/support/fixture_topology.h"
#include "tests/support/temp_dir.h"

namespace {

using namespace charm;
namespace fs = std::filesystem;

const std::string kCharm = std::string(CHARM_BINARY_DIR) + "/charm";
const std::string kModel = "qwen3-moe-tiny";

struct Request {
  std::vector<int32_t> prompt;
  SamplingParams params;
  int delay_ms = 0;  // arrival, after the run starts
};

struct Answer {
  std::vector<float> first_logits;
  std::vector<int32_t> tokens;
  std::string finish_reason;
};

/// A fixed, seeded mix: prompts cut from the reference prompts (1 to 60 tokens, several
/// sharing a start, so the prefix cache is hit), greedy and seeded sampling with top-k,
/// top-p and penalties, 4 to 30 new tokens, arrivals spread over 60 ms.
std::vector<Request> request_mix(const std::string& model = kModel) {
  std::ifstream in(fs::path(CHARM_SOURCE_DIR) / "tests/fixtures/models" / model / "reference.json");
  const auto reference = nlohmann::json::parse(in);
  std::vector<int32_t> text;  // every reference prompt back to back
  for (const auto& p : reference["prompts"]) {
    for (int32_t id : p["prompt_ids"].get<std::vector<int32_t>>()) text.push_back(id);
  }
  std::mt19937 rng(20261201);
  auto uniform = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  std::vector<Request> mix;
  for (int i = 0; i < 16; ++i) {
    Request r;
    const size_t start = i % 3 == 0 ? 0 : static_cast<size_t>(uniform(0, 40));  // every third shares a start
    const size_t length = static_cast<size_t>(uniform(1, 60));
    r.prompt.assign(text.begin() + static_cast<long>(start),
                    text.begin() + static_cast<long>(std::min(text.size(), start + length)));
    r.params.max_tokens = uniform(4, 30);
    if (i % 2 == 0) {
      r.params.temperature = 0;
    } else {
      r.params.temperature = 0.7 + 0.1 * uniform(0, 5);
      r.params.top_k = uniform(0, 40);
      r.params.top_p = uniform(0, 1) ? 0.9 : 1.0;
      r.params.seed = static_cast<uint64_t>(1000 + i);
    }
    if (i % 4 == 1) r.params.repetition_penalty = 1.3;
    if (i % 4 == 3) r.params.frequency_penalty = 0.5;
    r.delay_ms = uniform(0, 60);
    mix.push_back(std::move(r));
  }
  return mix;
}

Answer run_one(Engine& engine, const Request& r) {
  Answer a;
  GenerationResult result = engine.start(r.prompt, r.params, &a.first_logits)->wait({});
  a.tokens = std::move(result.tokens);
  a.finish_reason = std::move(result.finish_reason);
  return a;
}

/// Every request alone, one after another.
std::vector<Answer> run_alone(Engine& engine, const std::vector<Request>& mix) {
  std::vector<Answer> answers;
  for (const Request& r : mix) answers.push_back(run_one(engine, r));
  return answers;
}

/// Every request on its own thread, arriving after its delay.
std::vector<Answer> run_together(Engine& engine, const std::vector<Request>& mix) {
  std::vector<Answer> answers(mix.size());
  std::vector<std::exception_ptr> errors(mix.size());
  {
    std::vector<std::jthread> clients;
    for (size_t i = 0; i < mix.size(); ++i) {
      clients.emplace_back([&, i] {
        std::this_thread::sleep_for(std::chrono::milliseconds(mix[i].delay_ms));
        try {
          answers[i] = run_one(engine, mix[i]);
        } catch (...) {
          errors[i] = std::current_exception();
        }
      });
    }
  }
  for (const auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }
  return answers;
}

void check_same(const std::vector<Answer>& expected, const std::vector<Answer>& got) {
  REQUIRE(expected.size() == got.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    CAPTURE(i);
    REQUIRE(got[i].first_logits.size() == expected[i].first_logits.size());
    CHECK(std::memcmp(got[i].first_logits.data(), expected[i].first_logits.data(),
                      expected[i].first_logits.size() * sizeof(float)) == 0);
    CHECK(got[i].tokens == expected[i].tokens);
    CHECK(got[i].finish_reason == expected[i].finish_reason);
  }
}

/// An engine over the fixture: single node (empty split) or the split's workers, started
/// here and stopped with the returned object.
struct Served {
  test::TempDir dir{"charm-batch"};
  std::vector<std::unique_ptr<test::ChildProcess>> workers;
  std::unique_ptr<Engine> engine;

  Served(const std::vector<std::string>& split, const std::string& serving, const std::string& model = kModel) {
    std::vector<std::pair<std::string, uint16_t>> ports;
    const fs::path yaml = test::write_topology(dir.path(), model, split, ports, "", false, serving);
    for (const auto& [name, port] : ports) {
      workers.push_back(std::make_unique<test::ChildProcess>(
          std::vector<std::string>{kCharm, "worker", "--config", yaml.string(), "--name", name}));
    }
    for (const auto& [name, port] : ports) REQUIRE(test::wait_for_port(port, std::chrono::seconds(60)));
    engine = Engine::create(Topology::load(yaml));
  }
};

}  // namespace

TEST_CASE("batch invariance: every request of a random concurrent mix equals the same request alone, bit for bit") {
  const std::vector<Request> mix = request_mix();
  // The reference: one at a time, a generous budget.
  Served alone({}, "");
  const std::vector<Answer> expected = run_alone(*alone.engine, mix);
  for (const Answer& a : expected) REQUIRE(!a.first_logits.empty());

  SUBCASE("single node, prompts chunked by a 7-token step budget") {
    Served together({}, "max_batch_tokens: 7, max_num_seqs: 6");
    check_same(expected, run_together(*together.engine, mix));
    const EngineLoad load = together.engine->load();
    CHECK(load.prefix_hits > 0);  // prompts sharing a start reused full blocks
  }
  SUBCASE("single node, a KV pool of 6 blocks: sequences are preempted and recomputed") {
    // 6 blocks x 16 positions x 1024 bytes (qwen3-moe-tiny: 4 layers x 2 x 32 floats x 4 bytes).
    Served together({}, "kv_cache_gb: " + std::to_string(6.0 * 16 * 1024 / (1u << 30)) + ", max_num_seqs: 16");
    REQUIRE(together.engine->load().kv_blocks_total == 6);
    check_same(expected, run_together(*together.engine, mix));
    CHECK(together.engine->load().preemptions > 0);
  }
  SUBCASE("two workers, ping-pong micro-batches (the default with workers): two requests per worker per layer") {
    Served together({"\"0-7\"", "\"8-15\""}, "max_batch_tokens: 32");
    check_same(expected, run_together(*together.engine, mix));
    for (const WorkerStatus& w : together.engine->cluster_status()) CHECK(w.requests > 0);
  }
  SUBCASE("two workers, one micro-batch: one request per worker per layer carries every sequence's rows") {
    Served together({"\"0-7\"", "\"8-15\""}, "max_batch_tokens: 32, micro_batches: 1");
    check_same(expected, run_together(*together.engine, mix));
  }
  SUBCASE("single node, two micro-batches forced") {
    Served together({}, "max_batch_tokens: 7, max_num_seqs: 6, micro_batches: 2");
    check_same(expected, run_together(*together.engine, mix));
  }
}

// The families of issue 16 through the same mix: GLM-4.5 (GQA cache, partial rotary),
// Kimi K2 (the compressed MLA cache), MiniMax-M2 (whole-projection q/k norm), gpt-oss and
// the sliding-window fixtures, GLM-5's sparse attention, Qwen3-Next's linear attention.
TEST_CASE("batch invariance holds for the issue 16 fixtures: chunked, preempted, two workers") {
  struct Fixture {
    std::string name;
    std::vector<std::string> split;
    size_t bytes_per_token;  // of the KV cache: 6 blocks of it force preemption
  };
  for (const Fixture& f : {Fixture{"glm4-moe-tiny", {"\"0-7\"", "\"8-15\""}, 4 * 2 * 2 * 16 * 4},
                           Fixture{"kimi-k2-tiny", {"\"0-11\"", "\"12-23\""}, 3 * (16 + 64) * 4},
                           Fixture{"minimax-m2-tiny", {"\"0-7\"", "\"8-15\""}, 3 * 2 * 2 * 16 * 4},
                           // issue 16 items 3 and 6: sliding windows (and gpt-oss's sinks)
                           Fixture{"gpt-oss-tiny", {"\"0-3\"", "\"4-7\""}, 4 * 2 * 2 * 16 * 4},
                           Fixture{"mixtral-swa-tiny", {"\"0-3\"", "\"4-7\""}, 3 * 2 * 2 * 8 * 4},
                           Fixture{"qwen2-moe-swa-tiny", {"\"0-7\"", "\"8-15\""}, 4 * 2 * 2 * 8 * 4},
                           // issue 16 item 2: the indexer's keys ride in the MLA cache row
                           Fixture{"glm-moe-dsa-tiny", {"\"0-7\"", "\"8-15\""}, 4 * (32 + 8 + 16) * 4},
                           // issue 16 item 5: rows for the one full-attention layer, DeltaNet states beside
                           Fixture{"qwen3-next-tiny", {"\"0-7\"", "\"8-15\""}, 1 * 2 * 2 * 16 * 4}}) {
    CAPTURE(f.name);
    const std::vector<Request> mix = request_mix(f.name);
    Served alone({}, "", f.name);
    const std::vector<Answer> expected = run_alone(*alone.engine, mix);
    for (const Answer& a : expected) REQUIRE(!a.first_logits.empty());
    {
      Served together({}, "max_batch_tokens: 7, max_num_seqs: 6", f.name);
      check_same(expected, run_together(*together.engine, mix));
    }
    {
      const double gb = 6.0 * 16 * static_cast<double>(f.bytes_per_token) / (1u << 30);
      std::ostringstream budget;  // std::to_string's 6 decimals (or 15: minimax) round the size down a block
      budget << std::fixed << std::setprecision(20) << gb;  // exact: 6 blocks are a multiple of 2^-30 GiB
      Served together({}, "kv_cache_gb: " + budget.str() + ", max_num_seqs: 16", f.name);
      REQUIRE(together.engine->load().kv_blocks_total == 6);
      check_same(expected, run_together(*together.engine, mix));
      CHECK(together.engine->load().preemptions > 0);
    }
    {
      Served together(f.split, "max_batch_tokens: 32", f.name);
      check_same(expected, run_together(*together.engine, mix));
      for (const WorkerStatus& w : together.engine->cluster_status()) CHECK(w.requests > 0);
    }
  }
}
