// One engine's answers on a fixture's reference prompts (tests/fixtures/models/<model>/
// reference.json), for the tests that compare topologies and tiers bit for bit.
#pragma once

#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include "coordinator/engine.h"

namespace charm::test {

struct ReferenceRun {
  std::vector<std::vector<float>> logits;  ///< first-step logits per reference prompt
  std::vector<int32_t> greedy;             ///< greedy continuation (12 tokens) of the first prompt
  std::vector<WorkerStatus> status;        ///< the engine's cluster_status afterwards
  std::map<uint32_t, PrefetchLayerStats> prefetch;
};

/// Runs `model`'s reference prompts through `engine`.
inline ReferenceRun run_reference(Engine& engine, const std::string& model) {
  std::ifstream in(std::filesystem::path(CHARM_SOURCE_DIR) / "tests/fixtures/models" / model / "reference.json");
  const auto reference = nlohmann::json::parse(in);
  ReferenceRun out;
  for (const auto& prompt : reference["prompts"]) {
    out.logits.push_back(engine.prompt_logits(prompt["prompt_ids"].get<std::vector<int32_t>>()));
  }
  SamplingParams greedy;
  greedy.temperature = 0;
  greedy.max_tokens = 12;
  out.greedy = engine.generate(reference["prompts"][0]["prompt_ids"].get<std::vector<int32_t>>(), greedy, nullptr).tokens;
  out.status = engine.cluster_status();
  out.prefetch = engine.prefetch_stats();
  return out;
}

/// Every prompt's logits (memcmp) and the greedy tokens are the same.
inline void check_identical(const ReferenceRun& a, const ReferenceRun& b) {
  REQUIRE(a.logits.size() == b.logits.size());
  for (size_t i = 0; i < a.logits.size(); ++i) {
    REQUIRE(a.logits[i].size() == b.logits[i].size());
    CHECK(std::memcmp(a.logits[i].data(), b.logits[i].data(), a.logits[i].size() * sizeof(float)) == 0);
  }
  CHECK(a.greedy == b.greedy);
}

}  // namespace charm::test
