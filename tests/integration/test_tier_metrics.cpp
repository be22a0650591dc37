// The workers' expert-tier counters as the coordinator exports them: /metrics'
// charm_expert_{hits,misses,bytes_read}_total from each layer reply's LayerStats
// (ClusterDispatcher) or the in-process store (LocalDispatcher), and experts_by_tier
// from the RAM slot count (split_by_tier). Worker "a" runs with one RAM slot per layer
// for two experts per layer, so misses and disk reads really happen.
#include <doctest/doctest.h>

#include <chrono>
#include <cstring>
#include <sstream>
#include <string>
#include <thread>

#include "app/status_report.h"
#include "coordinator/api/metrics.h"
#include "coordinator/dispatch/cluster_dispatch.h"
#include "coordinator/dispatch/local_dispatch.h"
#include "tests/support/rpc_cluster.h"
#include "worker/experts/expert_executor.h"
#include "worker/experts/expert_source.h"
#include "worker/experts/expert_store.h"

using namespace charm;
using namespace charm::rpc_test;
using namespace std::chrono_literals;

namespace {

// The value of the sample named exactly `series` ("name{labels}") in a /metrics text; -1
// when absent.
double sample(const std::string& text, const std::string& series) {
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind(series + " ", 0) == 0) return std::stod(line.substr(series.size() + 1));
  }
  return -1;
}

// A store over `experts` of both MoE layers with one RAM slot per layer (no pins), read
// from the checkpoint: every other distinct expert of a layer is a miss.
std::unique_ptr<ExpertStore> one_slot_per_layer(const TinyModel& model, const std::vector<uint32_t>& experts) {
  std::vector<ExpertKey> owned;
  for (uint32_t layer : kLayers) {
    for (uint32_t e : experts) owned.emplace_back(layer, e);
  }
  StoreOptions o;
  o.worker_name = "a";
  o.ram_bytes = kLayers.size() * 4096;  // the tiny model's slot: 4 KiB
  o.pin = PinMode::kNone;
  auto source = std::make_unique<CheckpointSource>(*model.checkpoint, ExpertTensorNames{}, owned, kHidden, kInter,
                                                   model.identities);
  return std::make_unique<ExpertStore>(std::move(source), owned, kHidden, kInter, o);
}

// Runs every layer for batches of 1..4 rows through `dispatcher`.
void run_some_layers(ExpertDispatcher& dispatcher) {
  for (uint32_t rows = 1; rows <= 4; ++rows) {
    const std::vector<float> hidden = noise(rows * kHidden, 40 + rows);
    const auto assignments = routing(rows);
    std::vector<int64_t> out(rows * kHidden);
    for (uint32_t layer : kLayers) {
      dispatcher.begin_layer(layer, hidden.data(), rows, kHidden, assignments, out.data());
      dispatcher.finish_layer();
    }
  }
}

}  // namespace

TEST_CASE("split_by_tier: all in RAM when every expert has a slot, else RAM slots and the rest on disk") {
  CHECK(split_by_tier(64, 64) == std::map<std::string, uint64_t>{{"ram", 64}});
  CHECK(split_by_tier(64, 0) == std::map<std::string, uint64_t>{{"ram", 64}});  // keeps no tiers
  CHECK(split_by_tier(64, 16) == std::map<std::string, uint64_t>{{"ram", 16}, {"disk", 48}});
  CHECK(split_by_tier(0, 0) == std::map<std::string, uint64_t>{{"ram", 0}});
}

TEST_CASE("cluster: /metrics counts the hits, misses and bytes the workers report; tiers known from the connect") {
  Cluster cluster;
  // Worker "a" again on the same port, now with a RAM budget of one slot per layer.
  cluster.a.server.reset();
  cluster.a.store = one_slot_per_layer(cluster.model, {0, 2});
  cluster.a.executor = std::make_unique<ExpertExecutor>(*cluster.a.store);
  cluster.a.service = std::make_unique<ExecutorService>(*cluster.a.executor);
  cluster.a.restart();
  // Heartbeats stay off (the fixture's default): the split is learnt when connecting.
  ClusterDispatcher dispatcher(cluster.topology, cluster.placement, cluster.model.fingerprint, cluster.model.identities);
  Metrics metrics;
  dispatcher.set_metrics(&metrics);
  run_some_layers(dispatcher);

  // The coordinator's sums equal the workers' own totals (nothing but these requests ran;
  // no prefetches, so every byte read was a miss's).
  const std::string text = metrics.render();
  INFO(text);
  for (TestWorker* w : {&cluster.a, &cluster.b}) {
    const HealthReplyMsg h = w->server->health();
    const std::string label = "{worker=\"" + h.worker_name + "\"}";
    CHECK(sample(text, "charm_expert_hits_total" + label) == static_cast<double>(h.tier.hits));
    CHECK(sample(text, "charm_expert_misses_total" + label) == static_cast<double>(h.tier.misses));
    CHECK(sample(text, "charm_expert_bytes_read_total" + label) == static_cast<double>(h.tier.bytes_read));
  }
  const HealthReplyMsg a = cluster.a.server->health();
  CHECK(a.tier.misses > 0);  // one slot, two experts per layer: the budget really bites
  CHECK(a.tier.bytes_read > 0);
  CHECK(cluster.b.server->health().tier.misses == 0);  // "b" holds everything

  // experts_by_tier: from the health query the coordinator makes right after the handshake.
  const std::vector<WorkerStatus> status = dispatcher.status();
  CHECK(status[0].experts_by_tier == std::map<std::string, uint64_t>{{"ram", 2}, {"disk", 2}});
  CHECK(status[1].experts_by_tier == std::map<std::string, uint64_t>{{"ram", 4}});

  // charm status shows the same split from its own health query when the coordinator's
  // view has none.
  ClusterStatus table;
  WorkerStatusRow row;
  row.name = "a";
  row.address = "127.0.0.1:1";
  row.up = true;
  row.health = a;
  table.workers.push_back(row);
  table.coordinator_reachable = true;
  CHECK(format_status(table).find("ram:2,disk:2") != std::string::npos);
}

TEST_CASE("cluster: each worker's RAM residency reaches the coordinator in its health replies") {
  Cluster cluster;
  cluster.a.server.reset();
  cluster.a.store = one_slot_per_layer(cluster.model, {0, 2});
  cluster.a.executor = std::make_unique<ExpertExecutor>(*cluster.a.store);
  cluster.a.service = std::make_unique<ExecutorService>(*cluster.a.executor);
  cluster.a.restart();
  ClusterDispatcher dispatcher(cluster.topology, cluster.placement, cluster.model.fingerprint, cluster.model.identities);
  // From the health query right after the handshake: "a" had loaded nothing yet (one
  // LRU slot per layer, no pins); the coordinator's copy is the worker's own.
  std::vector<WorkerStatus> status = dispatcher.status();
  for (uint32_t layer : kLayers) CHECK(status[0].residency.at(layer) == LayerResidency{});
  CHECK(status[0].residency_age_ms >= 0);
  CHECK(status[1].residency == cluster.b.server->health().residency);
  CHECK(!status[1].residency.empty());

  run_some_layers(dispatcher);
  // "a" now holds one of its two experts per layer in its one LRU slot.
  const std::map<uint32_t, LayerResidency> now = cluster.a.server->health().residency;
  for (uint32_t layer : kLayers) {
    CHECK(now.at(layer).pinned.empty());
    CHECK(now.at(layer).cached.size() == 1);
  }
  // Heartbeats are off in this fixture, so the coordinator's view is still the connect's:
  // as old as its last health reply says.
  CHECK(dispatcher.status()[0].residency != now);
}

TEST_CASE("cluster: heartbeats refresh the residency the coordinator shows") {
  Cluster cluster;
  cluster.a.server.reset();
  cluster.a.store = one_slot_per_layer(cluster.model, {0, 2});
  cluster.a.executor = std::make_unique<ExpertExecutor>(*cluster.a.store);
  cluster.a.service = std::make_unique<ExecutorService>(*cluster.a.executor);
  cluster.a.restart();
  cluster.topology.heartbeat_ms = 20;
  ClusterDispatcher dispatcher(cluster.topology, cluster.placement, cluster.model.fingerprint, cluster.model.identities);
  run_some_layers(dispatcher);
  const std::map<uint32_t, LayerResidency> now = cluster.a.server->health().residency;
  CHECK(eventually([&] { return dispatcher.status()[0].residency == now; }));
  CHECK(dispatcher.status()[0].tier_layers == cluster.a.server->health().tier_layers);
}

TEST_CASE("single node: the in-process store's counts reach /metrics as worker \"local\"") {
  TinyModel model;
  auto store = one_slot_per_layer(model, {0, 1, 2, 3});
  ExpertExecutor executor(*store);
  Metrics metrics;
  LocalDispatcher dispatcher(executor, nullptr, &metrics);
  run_some_layers(dispatcher);

  TierCounters total;
  for (const auto& [layer, t] : store->layer_stats()) total += t;
  CHECK(total.misses > 0);
  const std::string text = metrics.render();
  INFO(text);
  CHECK(sample(text, "charm_expert_hits_total{worker=\"local\"}") == static_cast<double>(total.hits));
  CHECK(sample(text, "charm_expert_misses_total{worker=\"local\"}") == static_cast<double>(total.misses));
  CHECK(sample(text, "charm_expert_bytes_read_total{worker=\"local\"}") == static_cast<double>(total.bytes_read));
  // Its residency as the store has it now: one LRU slot per layer, no pins.
  const WorkerStatus local = dispatcher.status().at(0);
  CHECK(local.residency == store->cache().residency());
  CHECK(local.residency_age_ms == 0);
  for (uint32_t layer : kLayers) CHECK(local.residency.at(layer).cached.size() == 1);
  CHECK(dispatcher.status()[0].experts_by_tier == std::map<std::string, uint64_t>{{"ram", 2}, {"disk", 6}});
}
