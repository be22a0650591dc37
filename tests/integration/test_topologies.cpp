// The placement invariant (DESIGN.md): logits are bit-identical whether the routed
// experts run in-process (single node), on two worker processes, or on three workers
// with an uneven expert map. Real `charm worker` processes on 127.0.0.1.
#include <doctest/doctest.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>

#include <nlohmann/json.hpp>

#include "common/topology.h"
#include "common/wire.h"
#include "coordinator/engine.h"
#include "tests/support/child_process.h"
#include "tests/support/fixture_topology.h"
#include "tests/support/reference_run.h"
#include "tests/support/temp_dir.h"

namespace {

using namespace charm;
namespace fs = std::filesystem;

const fs::path kSource = CHARM_SOURCE_DIR;
const std::string kCharm = std::string(CHARM_BINARY_DIR) + "/charm";
using test::write_topology;

using Outcome = test::ReferenceRun;
using test::check_identical;

/// Starts the workers of a split (if any), builds an Engine and runs every reference prompt.
Outcome run_split(const std::string& model, const std::vector<std::string>& split, const std::string& tiers = "", bool prefetch = false) {
  std::vector<std::pair<std::string, uint16_t>> workers;
  const test::TempDir dir("charm-topo");  // outlives the workers and the engine below
  const fs::path yaml = write_topology(dir.path(), model, split, workers, tiers, prefetch);
  std::vector<std::unique_ptr<test::ChildProcess>> children;
  for (const auto& [name, port] : workers) {
    children.push_back(std::make_unique<test::ChildProcess>(
        std::vector<std::string>{kCharm, "worker", "--config", yaml.string(), "--name", name}));
  }
  for (const auto& [name, port] : workers) REQUIRE(test::wait_for_port(port, std::chrono::seconds(60)));
  auto engine = Engine::create(Topology::load(yaml));
  return test::run_reference(*engine, model);
}

/// Two workers that split the experts evenly: each holds `experts_each` (layer, expert)
/// pairs and served requests.
void check_even_halves(const Outcome& two, uint64_t experts_each) {
  REQUIRE(two.status.size() == 2);
  for (const auto& w : two.status) {
    CHECK(w.experts_held == experts_each);
    CHECK(w.requests > 0);
  }
}

}  // namespace

TEST_CASE("qwen3-moe-tiny: single node, two workers and three uneven workers give bit-identical logits") {
  const Outcome single = run_split("qwen3-moe-tiny", {});
  const Outcome two = run_split("qwen3-moe-tiny", {"\"0-7\"", "\"8-15\""});
  const Outcome three = run_split("qwen3-moe-tiny", {"\"0-1\"", "[\"2-5\", 6, \"7-10\"]", "\"11-15\""});
  check_identical(single, two);
  check_identical(single, three);
  REQUIRE(two.status.size() == 2);
  REQUIRE(three.status.size() == 3);
  for (const auto& w : two.status) {
    CHECK(w.state == "up");
    CHECK(w.requests > 0);
    MESSAGE(w.name << ": experts " << w.experts_held << ", requests " << w.requests << ", bytes out " << w.bytes_out
                   << ", bytes in " << w.bytes_in << ", rtt p50 " << w.rtt_p50_ms << " ms");
  }
  CHECK(three.status[0].experts_held == 2 * 3);   // experts 0-1 on the 3 MoE layers
  CHECK(three.status[1].experts_held == 9 * 3);
  CHECK(three.status[2].experts_held == 5 * 3);
}

TEST_CASE("qwen3-moe-tiny: replicated experts (spread over live replicas) give bit-identical logits") {
  const Outcome single = run_split("qwen3-moe-tiny", {});
  // configs/replicas.yaml's split (every expert on two of three workers), and two full copies.
  const Outcome pairs = run_split("qwen3-moe-tiny", {"\"0-10\"", "\"5-15\"", "[\"0-4\", \"11-15\"]"});
  const Outcome copies = run_split("qwen3-moe-tiny", {"\"0-15\"", "\"0-15\""});
  check_identical(single, pairs);
  check_identical(single, copies);
  for (const auto& w : pairs.status) CHECK(w.requests > 0);  // every replica got work
  for (const auto& w : copies.status) CHECK(w.requests > 0);
  CHECK(pairs.status[0].experts_held == 11 * 3);
  CHECK(pairs.status[2].experts_held == 10 * 3);
}

TEST_CASE("olmoe-tiny (fused expert tensors): single node and two workers give bit-identical logits") {
  const Outcome single = run_split("olmoe-tiny", {});
  const Outcome two = run_split("olmoe-tiny", {"\"0-2\"", "\"3-7\""});
  check_identical(single, two);
}

TEST_CASE("prefetch hints never change a bit: single node and two workers, hints on and off, one slot per layer") {
  for (const std::string model : {"olmoe-tiny", "qwen3-moe-tiny", "qwen2-moe-tiny"}) {
    INFO("model " << model);
    const std::vector<std::string> split =
        model == "olmoe-tiny" ? std::vector<std::string>{"\"0-2\"", "\"3-7\""}
                              : std::vector<std::string>{"\"0-7\"", "\"8-15\""};
    // qwen3-moe-tiny: one 12 KiB slot per layer per store, so hints really start reads
    // (and evict); olmoe-tiny: every expert resident.
    const std::string tiers =
        model == "qwen3-moe-tiny" ? "ram_gb: 0.0000343323, pin: none, usage_file: none, io_threads: 2" : "";
    const Outcome off = run_split(model, {});
    const Outcome single = run_split(model, {}, tiers, /*prefetch=*/true);
    const Outcome two = run_split(model, split, tiers, /*prefetch=*/true);
    check_identical(off, single);
    check_identical(off, two);
    CHECK(off.prefetch.empty());
    // Every MoE layer but the first got hints, and some were right.
    REQUIRE_FALSE(two.prefetch.empty());
    for (const auto& [layer, s] : two.prefetch) {
      CHECK(s.steps > 0);
      CHECK(s.correct <= s.actual);
      MESSAGE(model << " layer " << layer << ": recall " << s.recall() << ", precision " << s.precision());
    }
    CHECK(two.prefetch.count(0) == 0);
  }
}

TEST_CASE("qwen3-moe-tiny: one expert slot per layer gives the logits of full residency (checkpoint and container)") {
  const test::TempDir tmp("charm-tiers");
  const fs::path& dir = tmp.path();
  // Two shards written by `charm convert --worker`, and one container of every expert.
  std::vector<std::pair<std::string, uint16_t>> unused;
  const fs::path cluster_yaml = write_topology(dir / "convert", "qwen3-moe-tiny", {"\"0-7\"", "\"8-15\""}, unused);
  const fs::path model = kSource / "tests/fixtures/models/qwen3-moe-tiny";
  const std::string all = (dir / "all").string();
  REQUIRE(std::system((kCharm + " convert --checkpoint " + model.string() + " --out " + all + " 2>/dev/null").c_str()) == 0);
  for (const char* w : {"w0", "w1"}) {
    const std::string cmd = kCharm + " convert --config " + cluster_yaml.string() + " --worker " + w + " --out " +
                            (dir / w).string() + " 2>/dev/null";
    REQUIRE(std::system(cmd.c_str()) == 0);
  }
  // qwen3-moe-tiny experts are 12 KiB slots; 3 MoE layers -> 36 KiB is one slot per layer.
  const std::string one_slot = "ram_gb: 0.0000343323, pin: none, usage_file: none, io_threads: 2";
  const Outcome full = run_split("qwen3-moe-tiny", {});
  const Outcome single_ckpt = run_split("qwen3-moe-tiny", {}, one_slot);
  const Outcome single_container = run_split("qwen3-moe-tiny", {}, one_slot + ", container: " + all);
  check_identical(full, single_ckpt);
  check_identical(full, single_container);
  // Two workers, each on one slot per layer, each serving its own shard (written by
  // hand: each entry names its own container).
  std::vector<std::pair<std::string, uint16_t>> workers;
  const fs::path yaml = dir / "two-tiny.yaml";
  {
    std::ofstream out(yaml);
    out << "model: " << model.string() << "\nmode: cluster\nworkers:\n";
    for (int i = 0; i < 2; ++i) {
      const uint16_t port = test::free_port();
      workers.emplace_back("w" + std::to_string(i), port);
      out << "  - {name: w" << i << ", port: " << port << ", experts: \"" << (i ? "8-15" : "0-7") << "\", " << one_slot
          << ", container: " << (dir / ("w" + std::to_string(i))).string() << "}\n";
    }
  }
  std::vector<std::unique_ptr<test::ChildProcess>> children;
  for (const auto& [name, port] : workers) {
    children.push_back(std::make_unique<test::ChildProcess>(
        std::vector<std::string>{kCharm, "worker", "--config", yaml.string(), "--name", name}));
  }
  for (const auto& [name, port] : workers) REQUIRE(test::wait_for_port(port, std::chrono::seconds(60)));
  auto engine = Engine::create(Topology::load(yaml));
  std::ifstream in(model / "reference.json");
  const auto reference = nlohmann::json::parse(in);
  size_t i = 0;
  for (const auto& prompt : reference["prompts"]) {
    const auto logits = engine->prompt_logits(prompt["prompt_ids"].get<std::vector<int32_t>>());
    REQUIRE(logits.size() == full.logits[i].size());
    CHECK(std::memcmp(logits.data(), full.logits[i].data(), logits.size() * sizeof(float)) == 0);
    ++i;
  }
  // The workers really streamed: `charm status` sees misses and bytes read.
  for (const auto& [name, port] : workers) {
    auto conn = FrameConnection::connect("127.0.0.1", port, std::chrono::seconds(5), name);
    conn->send(encode_health_request(), std::chrono::seconds(5));
    const auto health = decode_as<HealthReplyMsg>(conn->receive(std::chrono::seconds(5)));
    CHECK(health.slots == 3);
    CHECK(health.tier.misses > 0);
    CHECK(health.tier.bytes_read > 0);
    MESSAGE(name << ": hits " << health.tier.hits << ", misses " << health.tier.misses << ", bytes read "
                 << health.tier.bytes_read << ", io wait " << health.tier.io_wait_ns / 1000 << " us");
  }
}

// --- Qwen2-MoE and Mixtral (issue 4) ---------------------------------------------------

TEST_CASE("qwen2-moe-tiny (shared expert overlapping the workers): single node and two workers bit-identical") {
  const Outcome single = run_split("qwen2-moe-tiny", {});
  const Outcome two = run_split("qwen2-moe-tiny", {"\"0-7\"", "\"8-15\""});
  check_identical(single, two);
  for (const auto& w : two.status) CHECK(w.requests > 0);
}

TEST_CASE("mixtral-tiny (block_sparse_moe w1/w3/w2 experts): single node and two workers bit-identical") {
  const Outcome single = run_split("mixtral-tiny", {});
  const Outcome two = run_split("mixtral-tiny", {"\"0-2\"", "\"3-7\""});
  check_identical(single, two);
  for (const auto& w : two.status) CHECK(w.requests > 0);
}

// --- DeepSeek-V3 (issue 4) ---------------------------------------------------------------

TEST_CASE("deepseek-v3-tiny (shared experts on the coordinator): single node and two workers give bit-identical logits") {
  const Outcome single = run_split("deepseek-v3-tiny", {});
  const Outcome two = run_split("deepseek-v3-tiny", {"\"0-7\"", "\"8-15\""});
  check_identical(single, two);
  REQUIRE(two.status.size() == 2);
  CHECK(two.status[0].experts_held == 8 * 3);  // 3 MoE layers: first_k_dense_replace = 1
  CHECK(two.status[1].experts_held == 8 * 3);
}

TEST_CASE("deepseek-v3-tiny-fp8 (workers dequantise fp8 experts): single node and two workers give bit-identical logits") {
  const Outcome single = run_split("deepseek-v3-tiny-fp8", {});
  const Outcome two = run_split("deepseek-v3-tiny-fp8", {"\"0-5\"", "\"6-15\""});
  check_identical(single, two);
}

// --- GLM-4.5 MoE and Kimi K2 (issue 16) -----------------------------------------------------

TEST_CASE("glm4-moe-tiny (shared experts, MTP layer unread): single node and two workers give bit-identical logits") {
  const Outcome single = run_split("glm4-moe-tiny", {});
  const Outcome two = run_split("glm4-moe-tiny", {"\"0-7\"", "\"8-15\""});
  check_identical(single, two);
  check_even_halves(two, 8 * 3);  // 3 MoE layers: first_k_dense_replace = 1, no MTP layer
}

TEST_CASE("kimi-k2-tiny (one expert group, 8 of 24 experts): single node and two workers give bit-identical logits") {
  const Outcome single = run_split("kimi-k2-tiny", {});
  const Outcome two = run_split("kimi-k2-tiny", {"\"0-11\"", "\"12-23\""});
  check_identical(single, two);
  check_even_halves(two, 12 * 2);  // 2 MoE layers: first_k_dense_replace = 1
}

TEST_CASE("minimax-m2-tiny (bias beside the gate, every layer MoE): single node and two workers give bit-identical logits") {
  const Outcome single = run_split("minimax-m2-tiny", {});
  const Outcome two = run_split("minimax-m2-tiny", {"\"0-7\"", "\"8-15\""});
  check_identical(single, two);
  check_even_halves(two, 8 * 3);  // 3 MoE layers, no dense one
}

// --- gpt-oss and sliding-window attention (issue 16, items 3 and 6) ------------------------

TEST_CASE("gpt-oss-tiny (biased experts, clamped SwiGLU on the workers): single node and two workers give bit-identical logits") {
  const Outcome single = run_split("gpt-oss-tiny", {});
  const Outcome two = run_split("gpt-oss-tiny", {"\"0-3\"", "\"4-7\""});
  check_identical(single, two);
  check_even_halves(two, 4 * 4);  // 4 MoE layers
}

TEST_CASE("glm-moe-dsa-tiny (DeepSeek Sparse Attention, a shared-selection layer): single node and two workers give bit-identical logits") {
  const Outcome single = run_split("glm-moe-dsa-tiny", {});
  const Outcome two = run_split("glm-moe-dsa-tiny", {"\"0-7\"", "\"8-15\""});
  check_identical(single, two);
  check_even_halves(two, 8 * 3);  // 3 MoE layers: first_k_dense_replace = 1
}

TEST_CASE("deepseek-v32-tiny (an indexer on every layer): single node and two workers give bit-identical logits") {
  check_identical(run_split("deepseek-v32-tiny", {}), run_split("deepseek-v32-tiny", {"\"0-7\"", "\"8-15\""}));
}

TEST_CASE("qwen3-next-tiny (gated DeltaNet states, gated shared expert): single node and two workers give bit-identical logits") {
  const Outcome single = run_split("qwen3-next-tiny", {});
  const Outcome two = run_split("qwen3-next-tiny", {"\"0-7\"", "\"8-15\""});
  check_identical(single, two);
  check_even_halves(two, 8 * 4);  // 4 MoE layers
}

TEST_CASE("qwen3.5-moe-tiny (separate DeltaNet projections): single node and two workers give bit-identical logits") {
  check_identical(run_split("qwen3.5-moe-tiny", {}), run_split("qwen3.5-moe-tiny", {"\"0-7\"", "\"8-15\""}));
}

TEST_CASE("mixtral-swa-tiny and qwen2-moe-swa-tiny (sliding windows): single node and two workers give bit-identical logits") {
  check_identical(run_split("mixtral-swa-tiny", {}), run_split("mixtral-swa-tiny", {"\"0-3\"", "\"4-7\""}));
  check_identical(run_split("qwen2-moe-swa-tiny", {}), run_split("qwen2-moe-swa-tiny", {"\"0-7\"", "\"8-15\""}));
}
