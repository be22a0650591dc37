// The placement invariant (DESIGN.md): logits are bit-identical whether the routed
// experts run in-process (single node), on two worker processes, or on three workers
// with an uneven expert map. Real `charm worker` processes on 127.0.0.1.
#include <doctest/doctest.h>

#include <cstring>
#include <fstream>
#include <memory>

#include <nlohmann/json.hpp>

#include "common/topology.h"
#include "coordinator/engine.h"
#include "tests/support/child_process.h"

namespace {

using namespace charm;
namespace fs = std::filesystem;

const fs::path kSource = CHARM_SOURCE_DIR;
const std::string kCharm = std::string(CHARM_BINARY_DIR) + "/charm";

/// Writes a topology YAML for the fixture model with the given expert split, one worker
/// per entry on a free loopback port. An empty split means single-node mode.
fs::path write_topology(const fs::path& dir, const std::string& model, const std::vector<std::string>& split,
                        std::vector<std::pair<std::string, uint16_t>>& workers, bool prefetch) {
  fs::create_directories(dir);
  const fs::path path = dir / ("topology-" + std::to_string(split.size()) + (prefetch ? "-prefetch" : "") + ".yaml");
  std::ofstream out(path);
  out << "model: " << (kSource / "tests/fixtures/models" / model).string() << "\n";
  out << "prefetch: " << (prefetch ? "true" : "false") << "\n";
  out << "mode: " << (split.empty() ? "single-node" : "cluster") << "\n";
  if (!split.empty()) out << "workers:\n";
  for (size_t i = 0; i < split.size(); ++i) {
    const uint16_t port = test::free_port();
    workers.emplace_back("w" + std::to_string(i), port);
    out << "  - {name: w" << i << ", host: 127.0.0.1, port: " << port << ", experts: " << split[i] << "}\n";
  }
  return path;
}

struct Outcome {
  std::vector<std::vector<float>> logits;  // first-step logits per prompt
  std::vector<int32_t> greedy;             // greedy continuation of the first prompt
  std::vector<WorkerStatus> status;
  std::map<uint32_t, PrefetchLayerStats> prefetch;
};

/// Starts the workers of a split (if any), builds an Engine and runs every reference prompt.
Outcome run_split(const std::string& model, const std::vector<std::string>& split, bool prefetch = false) {
  std::vector<std::pair<std::string, uint16_t>> workers;
  const fs::path yaml = write_topology(fs::temp_directory_path() / ("charm-topo-" + std::to_string(getpid())), model,
                                       split, workers, prefetch);
  std::vector<std::unique_ptr<test::ChildProcess>> children;
  for (const auto& [name, port] : workers) {
    children.push_back(std::make_unique<test::ChildProcess>(
        std::vector<std::string>{kCharm, "worker", "--config", yaml.string(), "--name", name}));
  }
  for (const auto& [name, port] : workers) REQUIRE(test::wait_for_port(port, std::chrono::seconds(60)));

  auto engine = Engine::create(Topology::load(yaml));
  std::ifstream in(kSource / "tests/fixtures/models" / model / "reference.json");
  const auto reference = nlohmann::json::parse(in);
  Outcome outcome;
  for (const auto& prompt : reference["prompts"]) {
    outcome.logits.push_back(engine->prompt_logits(prompt["prompt_ids"].get<std::vector<int32_t>>()));
  }
  SamplingParams greedy;
  greedy.temperature = 0;
  greedy.max_tokens = 12;
  outcome.greedy = engine->generate(reference["prompts"][0]["prompt_ids"].get<std::vector<int32_t>>(), greedy, nullptr)
                       .tokens;
  outcome.status = engine->cluster_status();
  outcome.prefetch = engine->prefetch_stats();
  return outcome;
}

void check_identical(const Outcome& a, const Outcome& b) {
  REQUIRE(a.logits.size() == b.logits.size());
  for (size_t i = 0; i < a.logits.size(); ++i) {
    REQUIRE(a.logits[i].size() == b.logits[i].size());
    CHECK(std::memcmp(a.logits[i].data(), b.logits[i].data(), a.logits[i].size() * sizeof(float)) == 0);
  }
  CHECK(a.greedy == b.greedy);
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

TEST_CASE("olmoe-tiny (fused expert tensors): single node and two workers give bit-identical logits") {
  const Outcome single = run_split("olmoe-tiny", {});
  const Outcome two = run_split("olmoe-tiny", {"\"0-2\"", "\"3-7\""});
  check_identical(single, two);
}

TEST_CASE("prefetch hints never change a bit: single node and two workers, hints on and off") {
  for (const std::string model : {"olmoe-tiny", "qwen3-moe-tiny"}) {
    INFO("model " << model);
    const std::vector<std::string> split =
        model == "olmoe-tiny" ? std::vector<std::string>{"\"0-2\"", "\"3-7\""}
                              : std::vector<std::string>{"\"0-7\"", "\"8-15\""};
    const Outcome off = run_split(model, {});
    const Outcome single = run_split(model, {}, /*prefetch=*/true);
    const Outcome two = run_split(model, split, /*prefetch=*/true);
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
