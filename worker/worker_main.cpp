#include "worker/worker_main.h"

#include <algorithm>
#include <csignal>

#include <spdlog/spdlog.h>

#include "common/checkpoint.h"
#include "common/error.h"
#include "common/matmul_q8.h"
#include "common/fingerprint.h"
#include "common/listen_check.h"
#include "common/stop_signals.h"
#include "worker/experts/expert_executor.h"
#include "worker/experts/store_factory.h"
#include "worker/rpc_server.h"

namespace charm {
std::vector<ExpertKey> owned_experts(const Topology& topology, const ModelConfig& config,
                                     int worker_index) {
  std::vector<ExpertKey> owned;
  for (const auto& [layer, owners] : topology.placement(config.moe_layer_ids(), config.num_experts)) {
    for (size_t expert = 0; expert < owners.size(); ++expert) {
      if (std::find(owners[expert].begin(), owners[expert].end(), worker_index) != owners[expert].end()) {
        owned.emplace_back(static_cast<uint32_t>(layer), static_cast<uint32_t>(expert));
      }
    }
  }
  return owned;
}

namespace {

int index_of(const Topology& topology, const WorkerSpec& spec) {
  return static_cast<int>(&spec - topology.workers.data());
}

// What every layerRequest is checked against (check_layer_request).
ModelLimits model_limits(const ModelConfig& config) {
  ModelLimits limits;
  limits.num_layers = static_cast<uint32_t>(config.num_hidden_layers);
  limits.num_experts = static_cast<uint32_t>(config.num_experts);
  limits.hidden_size = static_cast<uint32_t>(config.hidden_size);
  for (int64_t layer : config.moe_layer_ids()) limits.moe_layers.push_back(static_cast<uint32_t>(layer));
  return limits;
}

}  // namespace

void check_worker_listen(const Topology& topology, const WorkerSpec& spec) {
  ListenSpec listen;
  listen.what = "worker '" + spec.name + "'";
  listen.host = spec.host;
  listen.port = spec.port;
  listen.authenticated = !topology.cluster_secret.empty();
  listen.insecure = topology.cluster_insecure;
  listen.insecure_key = "cluster.insecure";
  listen.remedy = "Create a shared secret with `charm secret new cluster.secret`, copy that file to every machine "
                  "of the cluster (mode 0600) and set `cluster: {secret_file: cluster.secret}` in " +
                  topology.source.string() + " (docs/configuration.md, \"Shared secret\").";
  check_listen(listen);
}

int run_worker(const Topology& topology, const std::string& worker_name, CheckpointFamilies families,
               int64_t debug_delay_ms) {
  const sigset_t signals = block_stop_signals();  // before any thread starts
  const WorkerSpec& spec = topology.worker(worker_name);
  check_worker_listen(topology, spec);  // before minutes of loading, not after
  start_activation_mode(topology.activations, "worker " + worker_name);
  std::unique_ptr<Checkpoint> checkpoint = Checkpoint::open(topology.model);
  const ModelConfig config =
      ModelConfig::parse(checkpoint->config_json(), checkpoint->config_origin(), families);
  const std::vector<ExpertKey> owned = owned_experts(topology, config, index_of(topology, spec));
  spdlog::info("worker {}: loading {} experts of {} from {}", worker_name, owned.size(),
               config.architecture, topology.model.string());
  const std::string fingerprint = model_fingerprint(*checkpoint);
  std::unique_ptr<ExpertStore> store = open_store(spec.store, *checkpoint, config, owned, worker_name, fingerprint);
  ExpertExecutor executor(*store);
  ExecutorService service(executor);

  WorkerServerOptions options;
  options.worker_name = worker_name;
  options.host = spec.host;
  options.port = spec.port;
  options.model_fingerprint = fingerprint;
  options.send_timeout = std::chrono::milliseconds(topology.request_timeout_ms);
  // A client gets its connect and its whole handshake before the worker drops it unsettled.
  options.handshake_timeout = std::chrono::milliseconds(topology.connect_timeout_ms + topology.handshake_timeout_ms);
  options.shared_secret = topology.cluster_secret;
  options.limits = model_limits(config);
  options.debug_delay = std::chrono::milliseconds(debug_delay_ms);
  if (debug_delay_ms > 0) spdlog::warn("worker {}: test-only delay of {} ms before every layer reply", worker_name, debug_delay_ms);
  WorkerServer server(std::move(options), service);
  server.start();

  const int sig = wait_for_stop_signal(signals);
  spdlog::info("worker {}: {} received, stopping", worker_name, sig == SIGINT ? "SIGINT" : "SIGTERM");
  server.stop();
  return 0;
}

}  // namespace charm
