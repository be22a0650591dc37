#include "coordinator/dispatcher_factory.h"

#include "common/fingerprint.h"
#include "coordinator/cluster_dispatch.h"
#include "coordinator/local_dispatch.h"
#include "worker/store_factory.h"

namespace charm {

std::unique_ptr<ExpertDispatcher> make_dispatcher(const Topology& topology, const Checkpoint& checkpoint,
                                                  const ModelConfig& config, LocalExperts& local,
                                                  Metrics* metrics) {
  if (!topology.single_node) {
    auto cluster = std::make_unique<ClusterDispatcher>(
        topology, topology.placement(config.moe_layer_ids(), config.num_experts), model_fingerprint(checkpoint));
    cluster->set_metrics(metrics);
    return cluster;
  }
  std::vector<ExpertKey> all;
  for (int64_t l : config.moe_layer_ids()) {
    for (int64_t e = 0; e < config.num_experts; ++e) all.emplace_back(l, e);
  }
  local.store = open_store(topology.store, checkpoint, config, all, "local", model_fingerprint(checkpoint));
  local.executor = std::make_unique<ExpertExecutor>(*local.store);
  // Prefetch hints go straight to the in-process store (async reads, no waiting).
  const ExpertStore* store = local.store.get();
  return std::make_unique<LocalDispatcher>(
      *local.executor, [store](uint32_t layer, const std::vector<uint32_t>& experts) { store->prefetch(layer, experts); },
      metrics);
}

}  // namespace charm
