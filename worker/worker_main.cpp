#include "worker/worker_main.h"

#include <algorithm>
#include <csignal>

#include <spdlog/spdlog.h>

#include "common/checkpoint.h"
#include "common/error.h"
#include "common/fingerprint.h"
#include "common/stop_signals.h"
#include "worker/expert_executor.h"
#include "worker/rpc_server.h"
#include "worker/store_factory.h"

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

}  // namespace

int run_worker(const Topology& topology, const std::string& worker_name, int64_t debug_delay_ms) {
  const sigset_t signals = block_stop_signals();  // before any thread starts
  const WorkerSpec& spec = topology.worker(worker_name);
  std::unique_ptr<Checkpoint> checkpoint = Checkpoint::open(topology.model);
  const ModelConfig config =
      ModelConfig::parse(checkpoint->config_json(), (topology.model / "config.json").string());
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
