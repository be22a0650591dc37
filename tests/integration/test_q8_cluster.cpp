// `activations: q8` across processes: workers started with `charm worker --activations
// q8` and a q8 coordinator give the single-node q8 tokens and first-step logits bit for bit
// (the placement invariant holds on the lossy path too), and workers left at the default
// give other logits (so the workers' flag is what made their experts q8).
#include <doctest/doctest.h>

#include <cstring>

#include "common/matmul_q8.h"
#include "common/topology.h"
#include "coordinator/engine.h"
#include "tests/support/child_process.h"
#include "tests/support/fixture_topology.h"
#include "tests/support/temp_dir.h"

namespace {

using namespace charm;
namespace fs = std::filesystem;

const std::string kCharm = std::string(CHARM_BINARY_DIR) + "/charm";
const std::string kModel = (fs::path(CHARM_SOURCE_DIR) / "tests/fixtures/gguf_models/qwen3moe-k256.q4_k_m.gguf").string();

struct Decoded {
  std::vector<float> first_logits;
  std::vector<int32_t> tokens;
};

/// A greedy continuation on the Q4_K_M fixture with a q8 coordinator: single node (empty
/// split) or through workers started with `worker_flags`.
Decoded decode(const std::vector<std::string>& split, const std::vector<std::string>& worker_flags) {
  test::TempDir dir{"charm-q8"};
  std::vector<std::pair<std::string, uint16_t>> ports;
  const fs::path yaml = test::write_topology(dir.path(), kModel, split, ports);
  std::vector<std::unique_ptr<test::ChildProcess>> workers;
  for (const auto& [name, port] : ports) {
    std::vector<std::string> argv{kCharm, "worker", "--config", yaml.string(), "--name", name, "--threads", "1"};
    argv.insert(argv.end(), worker_flags.begin(), worker_flags.end());
    workers.push_back(std::make_unique<test::ChildProcess>(argv));
  }
  for (const auto& [name, port] : ports) REQUIRE(test::wait_for_port(port, std::chrono::seconds(60)));
  Topology topology = Topology::load(yaml);
  topology.activations = ActivationMode::kQ8;  // as `charm serve --activations q8` does
  auto engine = Engine::create(topology);
  SamplingParams params;
  params.temperature = 0;
  params.max_tokens = 6;
  Decoded d;
  d.tokens = engine->start({1, 5, 17, 300, 42, 7, 511, 0, 256}, params, &d.first_logits)->wait({}).tokens;
  set_activation_mode(ActivationMode::kF32);
  return d;
}

bool same_logits(const Decoded& a, const Decoded& b) {
  return a.first_logits.size() == b.first_logits.size() &&
         std::memcmp(a.first_logits.data(), b.first_logits.data(), a.first_logits.size() * 4) == 0;
}

}  // namespace

TEST_CASE("q8 workers and a q8 coordinator give the single-node q8 logits bit for bit") {
  const Decoded single = decode({}, {});
  REQUIRE(!single.first_logits.empty());
  const Decoded cluster = decode({"\"0-3\"", "\"4-7\""}, {"--activations", "q8"});
  CHECK(single.tokens == cluster.tokens);
  CHECK(same_logits(single, cluster));
  const Decoded f32_workers = decode({"\"0-3\"", "\"4-7\""}, {});
  CHECK_FALSE(same_logits(single, f32_workers));
}
