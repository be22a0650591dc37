// A GGUF model served across `charm worker` processes: workers read their experts
// straight out of the GGUF (GGML blocks as stored), and greedy decoding through two
// workers gives the single-node tokens and first-step logits bit for bit; a BF16 GGUF
// (Qwen3-MoE's, and Qwen3-Next's with its DeltaNet layers) decodes the safetensors
// fixture's tokens. The GGUFs are the ctest fixture
// gguf_fixtures' (scripts/gen_gguf_fixtures.py).
#include <doctest/doctest.h>

#include <cstring>
#include <cstdlib>
#include <fstream>
#include <set>

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
const fs::path kGguf = fs::path(CHARM_BINARY_DIR) / "gguf-fixtures";

struct Decoded {
  std::vector<float> first_logits;
  std::vector<int32_t> tokens;
};

/// Greedy continuations of `prompts` (max_tokens each) on `model`, single node (empty
/// split) or through the split's worker processes.
std::vector<Decoded> decode_prompts(const std::string& model, const std::vector<std::string>& split,
                                    const std::vector<std::pair<std::vector<int32_t>, int>>& prompts) {
  test::TempDir dir{"charm-gguf"};
  std::vector<std::pair<std::string, uint16_t>> ports;
  const fs::path yaml = test::write_topology(dir.path(), model, split, ports);
  std::vector<std::unique_ptr<test::ChildProcess>> workers;
  for (const auto& [name, port] : ports) {
    workers.push_back(std::make_unique<test::ChildProcess>(
        std::vector<std::string>{kCharm, "worker", "--config", yaml.string(), "--name", name}));
  }
  for (const auto& [name, port] : ports) REQUIRE(test::wait_for_port(port, std::chrono::seconds(60)));
  auto engine = Engine::create(Topology::load(yaml));
  std::vector<Decoded> out;
  for (const auto& [prompt, max_tokens] : prompts) {
    SamplingParams params;
    params.temperature = 0;
    params.max_tokens = max_tokens;
    Decoded d;
    d.tokens = engine->start(prompt, params, &d.first_logits)->wait({}).tokens;
    out.push_back(std::move(d));
  }
  return out;
}

/// Greedy decoding of decode_ids' prompts on `model`, single node, with store `tiers`.
std::vector<Decoded> decode_ids_with_store(const std::string& model, const std::string& tiers) {
  test::TempDir dir{"charm-gguf-store"};
  std::vector<std::pair<std::string, uint16_t>> unused;
  const fs::path yaml = test::write_topology(dir.path(), model, {}, unused, tiers);
  auto engine = Engine::create(Topology::load(yaml));
  std::vector<Decoded> out;
  for (const auto& prompt : std::vector<std::vector<int32_t>>{{1, 5, 17, 300, 42}, {511, 0, 256, 3}}) {
    SamplingParams params;
    params.temperature = 0;
    params.max_tokens = 10;
    Decoded d;
    d.tokens = engine->start(prompt, params, &d.first_logits)->wait({}).tokens;
    out.push_back(std::move(d));
  }
  return out;
}

/// decode_prompts over fixture `reference`'s reference prompts, as many tokens as the reference.
std::vector<Decoded> decode(const std::string& model, const std::vector<std::string>& split,
                            const std::string& reference_fixture = "qwen3-moe-tiny") {
  std::ifstream in(fs::path(CHARM_SOURCE_DIR) / "tests/fixtures/models" / reference_fixture / "reference.json");
  const auto reference = nlohmann::json::parse(in);
  std::vector<std::pair<std::vector<int32_t>, int>> prompts;
  for (const auto& p : reference["prompts"]) {
    prompts.emplace_back(p["prompt_ids"].get<std::vector<int32_t>>(), static_cast<int>(p["new_ids"].size()));
  }
  return decode_prompts(model, split, prompts);
}

/// decode_prompts over a few prompts of ids < 512 (the K-quant fixture's vocabulary).
std::vector<Decoded> decode_ids(const std::string& model, const std::vector<std::string>& split) {
  return decode_prompts(model, split, {{{1, 5, 17, 300, 42}, 12}, {{7, 7, 7}, 8}, {{511, 0, 256, 3, 9, 100}, 10}});
}

void check_same(const std::vector<Decoded>& a, const std::vector<Decoded>& b) {
  REQUIRE(a.size() == b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    CAPTURE(i);
    CHECK(a[i].tokens == b[i].tokens);
    REQUIRE(a[i].first_logits.size() == b[i].first_logits.size());
    CHECK(std::memcmp(a[i].first_logits.data(), b[i].first_logits.data(), a[i].first_logits.size() * 4) == 0);
  }
}

}  // namespace

TEST_CASE("a BF16 GGUF decodes the safetensors tokens, single node and through two workers") {
  const std::string gguf = (kGguf / "qwen3-moe-tiny.bf16.gguf").string();
  REQUIRE_MESSAGE(fs::exists(gguf), "run the ctest fixture gguf_fixtures");
  const auto safetensors = decode("qwen3-moe-tiny", {});
  check_same(safetensors, decode(gguf, {}));
  check_same(safetensors, decode(gguf, {"\"0-7\"", "\"8-15\""}));
}

TEST_CASE("Qwen3-Next and Qwen3.5-MoE BF16 GGUFs (DeltaNet layers) through two workers") {
  const std::string gguf = (kGguf / "qwen3-next-tiny.bf16.gguf").string();
  REQUIRE_MESSAGE(fs::exists(gguf), "run the ctest fixture gguf_fixtures");
  const auto safetensors = decode("qwen3-next-tiny", {}, "qwen3-next-tiny");
  check_same(safetensors, decode(gguf, {"\"0-7\"", "\"8-15\""}, "qwen3-next-tiny"));
  // Qwen3.5-MoE's file stores its value heads tiled, so out_proj sums in another order than
  // the safetensors' (test_gguf_model): the two workers are held to the file's single node.
  const std::string q35 = (kGguf / "qwen3.5-moe-tiny.bf16.gguf").string();
  check_same(decode(q35, {}, "qwen3.5-moe-tiny"), decode(q35, {"\"0-7\"", "\"8-15\""}, "qwen3.5-moe-tiny"));
}

TEST_CASE("a Q8_0 GGUF through two workers gives its single-node tokens and logits bit for bit") {
  const std::string gguf = (kGguf / "qwen3-moe-tiny.q8_0.gguf").string();
  REQUIRE_MESSAGE(fs::exists(gguf), "run the ctest fixture gguf_fixtures_q8_0");
  check_same(decode(gguf, {}), decode(gguf, {"\"0-7\"", "\"8-15\""}));
}

TEST_CASE("llama-quantize's Q4_K_M file through two workers gives its single-node tokens and logits") {
  const std::string gguf =
      (fs::path(CHARM_SOURCE_DIR) / "tests/fixtures/gguf_models/qwen3moe-k256.q4_k_m.gguf").string();
  check_same(decode_ids(gguf, {}), decode_ids(gguf, {"\"0-3\"", "\"4-7\""}));
}

TEST_CASE("charm convert of a Q4_K_M GGUF keeps its blocks, and serving the container changes no bit") {
  const std::string gguf =
      (fs::path(CHARM_SOURCE_DIR) / "tests/fixtures/gguf_models/qwen3moe-k256.q4_k_m.gguf").string();
  test::TempDir tmp{"charm-gguf-convert"};
  const std::string container = (tmp.path() / "experts").string();
  REQUIRE(std::system((kCharm + " convert --checkpoint " + gguf + " --out " + container + " 2>/dev/null").c_str()) == 0);
  std::ifstream in(fs::path(container) / "index.json");
  const auto index = nlohmann::json::parse(in);
  std::set<std::string> dtypes;
  for (const auto& e : index["experts"]) {
    for (const char* m : {"gate", "up", "down"}) dtypes.insert(e[m]["dtype"].get<std::string>());
  }
  CHECK(dtypes.contains("Q4_K"));  // as stored, not widened
  // 16 experts of 3 x [256, 256] Q4_K/Q6_K: about a quarter of bf16's 6 MiB.
  CHECK(index["data_bytes"].get<uint64_t>() < 16 * 3 * 256 * 256 * 2 / 2);
  // One expert slot per layer (128 KiB slots, 2 layers): every other expert is read from
  // the container on demand.
  const std::string one_slot = "ram_gb: 0.000245, pin: none, usage_file: none";
  check_same(decode_ids_with_store(gguf, ""), decode_ids_with_store(gguf, one_slot + ", container: " + container));
  check_same(decode_ids_with_store(gguf, ""), decode_ids_with_store(gguf, one_slot));
}
