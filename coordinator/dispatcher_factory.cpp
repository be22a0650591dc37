#include "coordinator/dispatcher_factory.h"

#include "common/fingerprint.h"
#include "coordinator/cluster_dispatch.h"
#include "coordinator/local_dispatch.h"

namespace charm {

std::vector<int64_t> moe_layers(const ModelConfig& config) {
  std::vector<int64_t> layers;
  for (int64_t l = 0; l < config.num_hidden_layers; ++l) {
    if (config.is_moe_layer(l)) layers.push_back(l);
  }
  return layers;
}

std::unique_ptr<ExpertDispatcher> make_dispatcher(const Topology& topology, const Checkpoint& checkpoint,
                                                  const ModelConfig& config, LocalExperts& local) {
  if (!topology.single_node) {
    return std::make_unique<ClusterDispatcher>(topology, topology.placement(moe_layers(config), config.num_experts),
                                               model_fingerprint(checkpoint));
  }
  std::vector<ExpertKey> all;
  for (int64_t l : moe_layers(config)) {
    for (int64_t e = 0; e < config.num_experts; ++e) all.emplace_back(l, e);
  }
  local.store = std::make_unique<ExpertStore>(checkpoint, ExpertTensorNames{}, all, config.hidden_size,
                                              config.moe_intermediate_size);
  local.executor = std::make_unique<ExpertExecutor>(*local.store);
  return std::make_unique<LocalDispatcher>(*local.executor);
}

}  // namespace charm
