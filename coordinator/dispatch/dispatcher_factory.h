// Chooses how the coordinator reaches routed experts: in-process (single-node mode) or
// through the cluster's workers, from the topology.
#pragma once

#include <memory>
#include <vector>

#include "common/checkpoint.h"
#include "common/model_config.h"
#include "common/topology.h"
#include "coordinator/api/metrics.h"
#include "coordinator/dispatch/expert_dispatch.h"
#include "worker/experts/expert_executor.h"
#include "worker/experts/expert_store.h"

namespace charm {

/// The in-process worker role: every routed expert, held by the coordinator itself.
struct LocalExperts {
  std::unique_ptr<ExpertStore> store;
  std::unique_ptr<ExpertExecutor> executor;
};

/// Single-node: opens every routed expert in `local` with topology.store's tier settings
/// (worker/experts/store_factory.h) and returns a LocalDispatcher over it; a container's experts
/// must carry this checkpoint's content identities (Error(kInvalidInput) naming the
/// layer, expert and both hashes otherwise; a lossy one is warned about). Cluster: loads
/// the checkpoint's expert manifest (worker/experts/expert_manifest.h: cached, else hashed now),
/// connects to every worker of the topology (handshake with the model fingerprint and
/// the experts' content identities) and returns a ClusterDispatcher. Either reports to
/// `metrics` (may be null; must outlive the dispatcher). Throws Error naming the worker
/// that cannot be reached or does not match.
std::unique_ptr<ExpertDispatcher> make_dispatcher(const Topology& topology, const Checkpoint& checkpoint,
                                                  const ModelConfig& config, LocalExperts& local,
                                                  Metrics* metrics = nullptr);

}  // namespace charm
