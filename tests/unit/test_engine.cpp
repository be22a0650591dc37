// Tests of the generation engine (coordinator/engine.h) on the committed fixtures:
// what it may sample, and what it refuses at load.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <limits>

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "common/gpu_runtime.h"
#include "common/topology.h"
#include "coordinator/engine.h"
#include "coordinator/models/kv_cache.h"
#include "tests/support/expect_error.h"
#include "tests/support/safetensors_writer.h"
#include "tests/support/temp_dir.h"

namespace {

using namespace charm;

const std::filesystem::path kModels = std::filesystem::path(CHARM_SOURCE_DIR) / "tests/fixtures/models";

std::unique_ptr<Engine> single_node(const std::filesystem::path& dir) {
  Topology topology;
  topology.model = dir;
  topology.single_node = true;
  return Engine::create(topology);
}

}  // namespace

// The fixtures' config.json pads vocab_size (151936) past the tokenizer's 151669 ids, as
// Qwen's checkpoints do; the padded rows have logits like any other. Near-uniform
// sampling (temperature 50) without the mask picks one of the 267 padded ids about once
// in 870 draws (23 of 20000 from this prompt's first-step logits); before the mask,
// seed 1 hit one within its first 250 tokens.
TEST_CASE("padded vocabulary ids are never sampled, and the generation succeeds") {
  auto engine = single_node(kModels / "qwen3-moe-tiny");
  const int32_t decodable = engine->tokenizer().vocab_size();
  REQUIRE(decodable == 151669);
  SamplingParams params;
  params.temperature = 50;
  params.max_tokens = 250;
  int64_t sampled = 0;
  for (uint64_t seed = 1; seed <= 4; ++seed) {
    CAPTURE(seed);
    params.seed = seed;
    GenerationResult r;
    REQUIRE_NOTHROW(r = engine->generate({9707, 11, 1879}, params, {}));
    for (int32_t id : r.tokens) CHECK(id < decodable);
    sampled += r.completion_tokens;
  }
  MESSAGE("sampled " << sampled << " tokens at temperature 50");
}

// The mask covers only ids with no token: greedy generation through the engine gives the
// transformers reference's tokens on every fixture (test_model_reference.cpp checks the
// same with the bare model and argmax).
TEST_CASE("the sampling mask leaves greedy generation as the reference has it, for every family") {
  for (const char* name : {"qwen3-moe-tiny", "olmoe-tiny", "qwen2-moe-tiny", "mixtral-tiny", "deepseek-v3-tiny",
                           "deepseek-v3-tiny-fp8", "glm4-moe-tiny", "kimi-k2-tiny", "minimax-m2-tiny",
                           "mixtral-swa-tiny", "qwen2-moe-swa-tiny", "gpt-oss-tiny", "glm-moe-dsa-tiny",
                           "qwen3-next-tiny", "qwen3.5-moe-tiny", "deepseek-v32-tiny"}) {
    CAPTURE(name);
    auto engine = single_node(kModels / name);
    std::ifstream in(kModels / name / "reference.json");
    const auto reference = nlohmann::json::parse(in);
    for (const auto& prompt : reference["prompts"]) {
      CAPTURE(prompt["name"].get<std::string>());
      const auto expected = prompt["new_ids"].get<std::vector<int32_t>>();
      SamplingParams greedy;
      greedy.temperature = 0;
      greedy.max_tokens = static_cast<int64_t>(expected.size());
      const GenerationResult r = engine->generate(prompt["prompt_ids"].get<std::vector<int32_t>>(), greedy, {});
      // An EOS id ends the generation and is not in r.tokens; compare up to it.
      REQUIRE(r.tokens.size() <= expected.size());
      CHECK(std::equal(r.tokens.begin(), r.tokens.end(), expected.begin()));
      if (r.tokens.size() < expected.size()) CHECK(r.finish_reason == "stop");
    }
  }
}

TEST_CASE("a tokenizer with more ids than the model's vocab_size is refused at load, naming both files") {
  test::TempDir dir("charm-engine");
  const auto fixture = kModels / "qwen3-moe-tiny";
  for (const auto& entry : std::filesystem::directory_iterator(fixture)) {
    if (entry.path().filename() != "config.json")
      std::filesystem::create_symlink(entry.path(), dir / entry.path().filename().string());
  }
  std::ifstream in(fixture / "config.json");
  nlohmann::json config = nlohmann::json::parse(in);
  config["vocab_size"] = 151000;  // below the tokenizer's 151669
  testing::write_bytes(dir / "config.json", config.dump());
  test::expect_error([&] { single_node(dir.path()); }, ErrorCategory::kInvalidInput,
                     {(dir / "tokenizer.json").string(), "151669", (dir / "config.json").string(), "151000"});
}

// The refusal reaches HTTP clients as a 400 (a chat request to such a model is the
// request's mistake), so it names the model, not the server's files; the load logged why.
TEST_CASE("a model without a usable chat template refuses chat without naming its files") {
  test::TempDir dir("charm-engine");
  for (const auto& entry : std::filesystem::directory_iterator(kModels / "qwen3-moe-tiny")) {
    if (entry.path().filename() != "tokenizer_config.json")
      std::filesystem::create_symlink(entry.path(), dir / entry.path().filename().string());
  }
  auto engine = single_node(dir.path());
  std::string model_name = "'";  // quoted, as the message writes it
  model_name += dir.path().filename().string();
  model_name += "'";
  const Error e = test::expect_error([&] { engine->chat_template(); }, ErrorCategory::kInvalidInput,
                                     {model_name, "no usable chat template", "/v1/completions"});
  CHECK(e.message().find(dir.path().string()) == std::string::npos);
  SamplingParams greedy;
  greedy.temperature = 0;
  greedy.max_tokens = 2;
  CHECK(engine->generate({9707}, greedy, {}).completion_tokens == 2);  // completions still work
}

// One HTTP request with max_tokens near INT64_MAX used to overflow prompt + max_tokens,
// pass the context check, and size the KV cache with a wrapped product: heap corruption.
TEST_CASE("max_tokens near INT64_MAX is refused by the context check, never sized into a cache") {
  auto engine = single_node(kModels / "qwen3-moe-tiny");
  SamplingParams params;
  params.temperature = 0;
  for (const int64_t max_tokens : {std::numeric_limits<int64_t>::max(), std::numeric_limits<int64_t>::max() - 1,
                                   std::numeric_limits<int64_t>::max() - 2}) {
    CAPTURE(max_tokens);
    params.max_tokens = max_tokens;
    test::expect_error([&] { engine->generate({9707, 11, 1879}, params, {}); }, ErrorCategory::kInvalidInput,
                       {"exceeds the model's context"});
  }
}

TEST_CASE("a KV cache whose size in bytes would wrap around is refused") {
  test::expect_error([] { KvCache(2, std::numeric_limits<size_t>::max() / 8, 64); }, ErrorCategory::kInvalidInput,
                     {"does not fit in memory"});
  KvCache small(1, 2, 4);  // room for 2 positions: one block of 16
  small.advance(2);
  test::expect_error([&] { small.advance(std::numeric_limits<size_t>::max()); }, ErrorCategory::kInvalidInput,
                     {"exceeds the KV cache capacity of 16"});
}

TEST_CASE("a request that cannot fit in the whole KV cache is refused with both sizes; one that fits runs") {
  Topology topology;
  topology.model = kModels / "qwen3-moe-tiny";
  topology.single_node = true;
  topology.serving.kv_cache_gb = 4.0 * 16 * 1024 / (1u << 30);  // 4 blocks of 16 positions (1024 bytes each)
  auto engine = Engine::create(topology);
  REQUIRE(engine->load().kv_blocks_total == 4);
  SamplingParams params;
  params.temperature = 0;
  params.max_tokens = 62;  // 3 + 62 = 65 > 64
  test::expect_error([&] { engine->start({9707, 11, 1879}, params); }, ErrorCategory::kInvalidInput,
                     {"prompt (3 tokens) plus max_tokens (62)", "KV cache of 64 tokens"});
  params.max_tokens = 61;
  CHECK(engine->generate({9707, 11, 1879}, params, {}).completion_tokens == 61);
  CHECK(engine->load().kv_blocks_used == 0);  // released when it ended
}

TEST_CASE("a prompt served from the prefix cache has the logits and tokens it has without it, bit for bit") {
  auto engine = single_node(kModels / "qwen3-moe-tiny");
  std::vector<int32_t> prompt;
  for (int32_t i = 0; i < 50; ++i) prompt.push_back(100 + 7 * i);  // 3 full blocks and 2 tokens
  SamplingParams params;
  params.temperature = 0.8;
  params.seed = 42;
  params.max_tokens = 20;
  std::vector<float> cold, warm;
  const GenerationResult first = engine->start(prompt, params, &cold)->wait({});
  const uint64_t hits_before = engine->load().prefix_hits;
  const GenerationResult second = engine->start(prompt, params, &warm)->wait({});
  CHECK(engine->load().prefix_hits == hits_before + 3);  // the 3 full blocks came from the cache
  REQUIRE(cold.size() == warm.size());
  CHECK(std::memcmp(cold.data(), warm.data(), cold.size() * sizeof(float)) == 0);
  CHECK(first.tokens == second.tokens);
  // The first answer's 50 + 20 tokens: a follow-up turn reuses its generated blocks too.
  std::vector<int32_t> follow_up = prompt;
  follow_up.insert(follow_up.end(), first.tokens.begin(), first.tokens.end());
  follow_up.push_back(9707);
  const uint64_t hits = engine->load().prefix_hits;
  engine->prompt_logits(follow_up);
  CHECK(engine->load().prefix_hits >= hits + 4);  // 71 tokens: 4 full blocks
}

// Qwen3-Next's DeltaNet state after a prefix is not in its KV blocks: a second sequence
// with the same prompt must compute it again rather than resume from cached blocks, and
// get the first one's logits bit for bit (a resumed one would start from a zero state).
TEST_CASE("a model with linear-attention state never resumes from the prefix cache, and repeats its logits") {
  auto engine = single_node(kModels / "qwen3-next-tiny");
  std::ifstream in(kModels / "qwen3-next-tiny" / "reference.json");
  const auto reference = nlohmann::json::parse(in);
  std::vector<int32_t> prompt;  // two prompts back to back: several full blocks
  for (const auto& p : reference["prompts"]) {
    for (int32_t id : p["prompt_ids"].get<std::vector<int32_t>>()) prompt.push_back(id);
    if (prompt.size() > 40) break;
  }
  REQUIRE(prompt.size() > 2 * KvBlockPool::kBlockSize);
  const std::vector<float> first = engine->prompt_logits(prompt);
  const std::vector<float> again = engine->prompt_logits(prompt);
  REQUIRE(first.size() == again.size());
  CHECK(std::memcmp(first.data(), again.data(), first.size() * sizeof(float)) == 0);
  CHECK(engine->load().prefix_hits == 0);
  const std::vector<float> fresh = single_node(kModels / "qwen3-next-tiny")->prompt_logits(prompt);
  CHECK(std::memcmp(first.data(), fresh.data(), first.size() * sizeof(float)) == 0);
}

// The VRAM tier (issue 19): where no GPU is usable, vram_gb is refused at start with the
// runtime's reason; with one, the engine's logits are the CPU's bit for bit (also checked,
// and required, by tests/gpu/ on the GPU machine).
TEST_CASE("vram_gb: refused at start naming the missing GPU where there is none, else the CPU's logits") {
  Topology topology;
  topology.model = kModels / "qwen3-moe-tiny";
  topology.single_node = true;
  topology.store.vram_gb = 8;
  const GpuAvailability gpu = gpu_availability();
  if (!gpu.available) {
    test::expect_error([&] { Engine::create(topology); }, ErrorCategory::kUnavailable,
                       {"worker 'local': vram_gb 8 needs a CUDA GPU", gpu.why_not});
    return;
  }
  const std::vector<int32_t> prompt = {1, 2, 3, 4, 5};
  const std::vector<float> on_gpu = Engine::create(topology)->prompt_logits(prompt);
  const std::vector<float> on_cpu = single_node(kModels / "qwen3-moe-tiny")->prompt_logits(prompt);
  REQUIRE(on_gpu.size() == on_cpu.size());
  CHECK(std::memcmp(on_gpu.data(), on_cpu.data(), on_cpu.size() * sizeof(float)) == 0);
}
