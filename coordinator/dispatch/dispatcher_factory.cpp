#include "coordinator/dispatch/dispatcher_factory.h"

#include <spdlog/spdlog.h>

#include "common/error.h"
#include "common/fingerprint.h"
#include "coordinator/dispatch/cluster_dispatch.h"
#include "coordinator/dispatch/local_dispatch.h"
#include "worker/experts/expert_manifest.h"
#include "worker/experts/store_factory.h"

namespace charm {
namespace {

std::vector<ExpertKey> every_expert(const ModelConfig& config) {
  std::vector<ExpertKey> all;
  for (int64_t l : config.moe_layer_ids()) {
    for (int64_t e = 0; e < config.num_experts; ++e) all.emplace_back(l, e);
  }
  return all;
}

/// The content identities of `keys` in the coordinator's checkpoint (cached manifest,
/// else hashed now: the first start reads every expert once).
ExpertIdentities checkpoint_identities(const Checkpoint& checkpoint, const ModelConfig& config,
                                       const std::vector<ExpertKey>& keys, const std::string& fingerprint) {
  ManifestOptions options;
  options.cache_file = manifest_cache_file(checkpoint, fingerprint);
  return load_expert_manifest(checkpoint, config, keys, options);
}

/// Single node with a container: its experts must have been converted from this
/// checkpoint's weights (a CheckpointSource checks its own reads instead).
void check_local_container(const ExpertStore& store, const Topology& topology, const Checkpoint& checkpoint,
                           const ModelConfig& config, const std::vector<ExpertKey>& all,
                           const std::string& fingerprint) {
  const auto mismatches =
      compare_identities(checkpoint_identities(checkpoint, config, all, fingerprint), store.identities(), all);
  if (!mismatches.empty()) {
    fail_invalid("container " + topology.store.container.string() + " was converted from other weights than " +
                 checkpoint.dir().string() + ": " +
                 describe_mismatches(mismatches, "in the container", "in the checkpoint") +
                 " (convert this checkpoint again)");
  }
  if (!store.lossy_form().empty()) {
    spdlog::warn("single node: container {} holds LOSSY experts ({}) converted from this checkpoint: outputs "
                 "differ from the checkpoint's",
                 topology.store.container.string(), store.lossy_form());
  }
}

}  // namespace

std::unique_ptr<ExpertDispatcher> make_dispatcher(const Topology& topology, const Checkpoint& checkpoint,
                                                  const ModelConfig& config, LocalExperts& local,
                                                  Metrics* metrics) {
  const std::string fingerprint = model_fingerprint(checkpoint);
  const std::vector<ExpertKey> all = every_expert(config);
  if (!topology.single_node) {
    auto cluster = std::make_unique<ClusterDispatcher>(topology,
                                                       topology.placement(config.moe_layer_ids(), config.num_experts),
                                                       fingerprint, checkpoint_identities(checkpoint, config, all, fingerprint));
    cluster->set_metrics(metrics);
    return cluster;
  }
  local.store = open_store(topology.store, checkpoint, config, all, "local", fingerprint);
  if (!topology.store.container.empty()) check_local_container(*local.store, topology, checkpoint, config, all, fingerprint);
  local.executor = std::make_unique<ExpertExecutor>(*local.store);
  // Prefetch hints go straight to the in-process store (async reads, no waiting).
  const ExpertStore* store = local.store.get();
  return std::make_unique<LocalDispatcher>(
      *local.executor, [store](uint32_t layer, const std::vector<uint32_t>& experts) { store->prefetch(layer, experts); },
      metrics);
}

}  // namespace charm
