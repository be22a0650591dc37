// Test support for the coordinator <-> worker tests (test_rpc.cpp, test_failover.cpp,
// test_frozen_worker.cpp): a tiny checkpoint written to a temp dir, in-process
// WorkerServers on ephemeral loopback ports holding parts of it, and replicated clusters.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/checkpoint.h"
#include "common/fingerprint.h"
#include "common/model_config.h"
#include "common/topology.h"
#include "common/wire.h"
#include "coordinator/dispatch/expert_dispatch.h"
#include "coordinator/models/checkpoint_families.h"
#include "tests/support/safetensors_writer.h"
#include "tests/support/temp_dir.h"
#include "worker/experts/expert_executor.h"
#include "worker/experts/expert_manifest.h"
#include "worker/experts/expert_store.h"
#include "worker/rpc_server.h"

namespace charm::rpc_test {

using namespace charm::testing;

constexpr int64_t kHidden = 8;
constexpr int64_t kInter = 4;
constexpr uint32_t kExperts = 4;
const std::vector<uint32_t> kLayers = {0, 2};

// Deterministic values in [-1, 1) with full f32 mantissas (not just bf16-exact ones), so a
// reordered sum would show.
std::vector<float> noise(size_t count, uint32_t seed) {
  std::vector<float> v(count);
  uint64_t state = seed * 0x9e3779b97f4a7c15ull + 1;
  for (auto& x : v) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    x = static_cast<float>(static_cast<int64_t>(state >> 11) % 2000003) / 1000001.5f;
  }
  return v;
}

// A checkpoint directory with per-expert SwiGLU tensors for layers 0 and 2.
struct TinyModel {
  test::TempDir dir{"charm-rpc"};
  std::unique_ptr<Checkpoint> checkpoint;
  std::string fingerprint;
  ExpertIdentities identities;  // every expert's content identity (what a coordinator expects)

  TinyModel() {
    // A whole config.json (ModelConfig::parse accepts it), so `charm status` can work out
    // the placement: 3 layers, layer 1 dense, layers 0 and 2 MoE.
    nlohmann::json config = {{"architectures", {"Qwen3MoeForCausalLM"}},
                             {"model_type", "qwen3_moe"},
                             {"vocab_size", 16},
                             {"hidden_size", kHidden},
                             {"intermediate_size", 2 * kInter},
                             {"moe_intermediate_size", kInter},
                             {"num_hidden_layers", 3},
                             {"num_attention_heads", 2},
                             {"num_experts", kExperts},
                             {"num_experts_per_tok", 2},
                             {"mlp_only_layers", {1}}};
    write_bytes(dir / "config.json", config.dump());
    std::vector<TensorSpec> tensors;
    uint32_t seed = 1;
    for (uint32_t layer : kLayers) {
      for (uint32_t e = 0; e < kExperts; ++e) {
        const std::string p = "model.layers." + std::to_string(layer) + ".mlp.experts." +
                              std::to_string(e) + ".";
        tensors.push_back({p + "gate_proj.weight", DType::kF32, {kInter, kHidden},
                           noise(kInter * kHidden, seed++)});
        tensors.push_back({p + "up_proj.weight", DType::kF32, {kInter, kHidden},
                           noise(kInter * kHidden, seed++)});
        tensors.push_back({p + "down_proj.weight", DType::kF32, {kHidden, kInter},
                           noise(kHidden * kInter, seed++)});
      }
    }
    write_safetensors(dir / "model.safetensors", tensors);
    checkpoint = Checkpoint::open(dir.path());
    fingerprint = model_fingerprint(*checkpoint);
    std::vector<ExpertKey> all;
    for (uint32_t layer : kLayers) {
      for (uint32_t e = 0; e < kExperts; ++e) all.emplace_back(layer, e);
    }
    identities = hash_expert_identities(*checkpoint, ExpertTensorNames{}, all, kHidden, kInter);
  }

  /// Writes the model's expert manifest into the cache, as a coordinator's start does.
  void cache_manifest() const {
    const ModelConfig config = ModelConfig::parse(checkpoint->config_json(), "config.json", checkpoint_families());
    std::vector<ExpertKey> all(identities.size());
    std::transform(identities.begin(), identities.end(), all.begin(), [](const auto& entry) { return entry.first; });
    load_expert_manifest(*checkpoint, config, all, ManifestOptions{manifest_cache_file(*checkpoint, fingerprint)});
  }

  std::unique_ptr<ExpertStore> store(const std::vector<uint32_t>& experts) const {
    std::vector<ExpertKey> owned;
    for (uint32_t layer : kLayers) {
      for (uint32_t e : experts) owned.emplace_back(layer, e);
    }
    return std::make_unique<ExpertStore>(*checkpoint, ExpertTensorNames{}, owned, kHidden, kInter);
  }
};

// One in-process worker: its store, executor, service and server.
// `port` 0 = ephemeral; restart() brings a stopped worker back on the same port.
struct TestWorker {
  std::unique_ptr<ExpertStore> store;
  std::unique_ptr<ExpertExecutor> executor;
  std::unique_ptr<ExecutorService> service;
  std::unique_ptr<WorkerServer> server;
  WorkerServerOptions options;

  TestWorker(const TinyModel& model, const std::string& name, const std::vector<uint32_t>& experts,
             std::chrono::milliseconds delay = std::chrono::milliseconds(0)) {
    store = model.store(experts);
    executor = std::make_unique<ExpertExecutor>(*store);
    service = std::make_unique<ExecutorService>(*executor);
    options.worker_name = name;
    options.host = "127.0.0.1";
    options.port = 0;
    options.model_fingerprint = model.fingerprint;
    options.debug_delay = delay;
    server = std::make_unique<WorkerServer>(options, *service);
    server->start();
    options.port = server->port();
  }

  /// A fresh server on the same port (after server->stop()), optionally with another delay.
  void restart(std::chrono::milliseconds delay = std::chrono::milliseconds(0)) {
    server.reset();
    options.debug_delay = delay;
    server = std::make_unique<WorkerServer>(options, *service);
    server->start();
  }
};

// Workers "a" (experts 0, 2) and "b" (experts 1, 3), a topology naming them, and the
// placement that matches.
struct Cluster {
  TinyModel model;
  TestWorker a{model, "a", {0, 2}};
  TestWorker b{model, "b", {1, 3}};
  Topology topology;
  Placement placement;

  Cluster() {
    topology.model = model.dir.path();
    topology.workers = {WorkerSpec{"a", "127.0.0.1", a.server->port(), {0, 2}, {}, {}},
                        WorkerSpec{"b", "127.0.0.1", b.server->port(), {1, 3}, {}, {}}};
    topology.connect_timeout_ms = 5000;
    topology.request_timeout_ms = 30000;
    topology.heartbeat_ms = 0;  // byte counts compared below must not move under a heartbeat
    // ... nor under a probe of a reply that a loaded machine made late (probes start only
    // at the request's own deadline: never).
    topology.hedge_floor_ms = topology.hedge_cap_ms = topology.request_timeout_ms;
    topology.api_host = "127.0.0.1";
    topology.api_port = unused_port();
    for (uint32_t layer : kLayers) placement[layer] = {{0}, {1}, {0}, {1}};
  }

  static uint16_t unused_port() {
    auto listener = FrameListener::listen("127.0.0.1", 0);
    return listener->port();  // closed on return: nothing listens there now
  }
};

// Each row routes to 2 distinct experts; some rows use only one worker, some both.
std::vector<ExpertAssignment> routing(uint32_t num_rows) {
  std::vector<ExpertAssignment> out;
  for (uint32_t r = 0; r < num_rows; ++r) {
    out.push_back({r, (r * 3) % kExperts});
    out.push_back({r, (r * 3 + 2) % kExperts});
  }
  return out;
}

// Polls `done` every 10 ms for up to `limit` (a bound, not a timing assertion).
inline bool eventually(const std::function<bool()>& done,
                       std::chrono::milliseconds limit = std::chrono::milliseconds(10000)) {
  const auto until = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < until) {
    if (done()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return done();
}

// Workers "a" and "b" both hold all 4 experts (replicas of each other); the placement
// lists both owners of every expert.
struct Replicas {
  TinyModel model;
  TestWorker a;
  TestWorker b;
  Topology topology;
  Placement placement;

  explicit Replicas(std::chrono::milliseconds b_delay = std::chrono::milliseconds(0))
      : a(model, "a", {0, 1, 2, 3}), b(model, "b", {0, 1, 2, 3}, b_delay) {
    topology.model = model.dir.path();
    topology.workers = {WorkerSpec{"a", "127.0.0.1", a.server->port(), {0, 1, 2, 3}, {}, {}},
                        WorkerSpec{"b", "127.0.0.1", b.server->port(), {0, 1, 2, 3}, {}, {}}};
    topology.request_timeout_ms = 30000;
    topology.heartbeat_ms = 0;
    topology.rejoin_min_ms = 20;
    topology.rejoin_max_ms = 100;
    for (uint32_t layer : kLayers) placement[layer] = {{0, 1}, {0, 1}, {0, 1}, {0, 1}};
  }

  // Placement with only worker `w` owning everything (the other still in `topology`).
  Placement only(int w) const {
    Placement p;
    for (uint32_t layer : kLayers) p[layer] = {{w}, {w}, {w}, {w}};
    return p;
  }
};

// The local executor's fixed-point sums ([rows, kHidden]) for `assignments` on `layer`.
inline std::vector<int64_t> expected(const TinyModel& model, uint32_t layer, const std::vector<float>& hidden,
                                     uint32_t rows, const std::vector<ExpertAssignment>& assignments) {
  auto store = model.store({0, 1, 2, 3});
  ExpertExecutor local(*store);
  std::vector<int64_t> want(size_t{rows} * kHidden, 0);
  local.run_into(layer, hidden.data(), rows, assignments, want.data());
  return want;
}

template <typename T>
inline bool same_bytes(const std::vector<T>& x, const std::vector<T>& y) {
  return x.size() == y.size() && std::memcmp(x.data(), y.data(), x.size() * sizeof(T)) == 0;
}

inline const WorkerStatus& named(const std::vector<WorkerStatus>& all, const std::string& name) {
  for (const auto& s : all) {
    if (s.name == name) return s;
  }
  throw std::runtime_error("no worker " + name);
}

}  // namespace charm::rpc_test
