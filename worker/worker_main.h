// `charm worker --config <topology.yaml> --name <worker>`: load this worker's experts and
// serve them until SIGINT/SIGTERM.
#pragma once

#include <string>
#include <vector>

#include "common/model_config.h"
#include "common/model_family.h"
#include "common/topology.h"
#include "worker/experts/expert_store.h"

namespace charm {

/// The (layer, expert) pairs `topology` assigns to worker number `worker_index` (index
/// into topology.workers), over the model's MoE layers (ModelConfig::is_moe_layer).
/// Throws what Topology::placement throws for an inconsistent placement.
std::vector<ExpertKey> owned_experts(const Topology& topology, const ModelConfig& config,
                                     int worker_index);

/// The rule of common/listen_check.h for worker `spec`'s socket: on an address other
/// machines can reach it needs the cluster's shared secret or `cluster.insecure: true`.
/// Throws Error(kInvalidInput) saying how to create a secret (`charm secret new`), and
/// what is_loopback_host throws.
void check_worker_listen(const Topology& topology, const WorkerSpec& spec);

/// Runs worker `worker_name`: checks its address (check_worker_listen), then opens
/// topology.model (Checkpoint::open), parses its config as one of `families` (the
/// program's family table, coordinator/models/checkpoint_families.h; worker/ lists none),
/// opens only the experts the placement assigns it in an ExpertStore with the worker's
/// tier settings (worker/experts/store_factory.h: budget, container, pin), binds exactly the
/// worker's host:port and serves (worker/rpc_server.h) until SIGINT or SIGTERM, then
/// closes every connection and returns 0. Blocks SIGINT/SIGTERM in the calling thread
/// (threads it starts inherit that) and waits for them with sigwait. Throws
/// Error(kInvalidInput) for an unknown worker name or a bad checkpoint/config/placement,
/// Error(kUnavailable) when the address cannot be bound. `debug_delay_ms` > 0 (tests only:
/// `charm worker --debug-delay-ms`) delays every layer reply, see WorkerServerOptions.
int run_worker(const Topology& topology, const std::string& worker_name, CheckpointFamilies families,
               int64_t debug_delay_ms = 0);

}  // namespace charm
