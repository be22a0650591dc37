// Test support: a WorkerServer over a LayerService that needs no checkpoint. The
// "expert" e applied to a row is row * (e + 1), so a test can check outputs exactly; the
// reply is the executor's: per row, the fixed-point sum of weight * output.
// Holds experts 0 and 1 of MoE layers 0 and 2 of a 3-layer, 4-expert, hidden-size-8 model.
#pragma once

#include <memory>
#include <mutex>
#include <string>

#include "common/fixed_point.h"
#include "common/topology.h"
#include "common/wire.h"
#include "worker/rpc_server.h"

namespace charm::test {

constexpr uint32_t kEchoHidden = 8;
constexpr const char* kEchoFingerprint = "00000000c0ffee00";

class EchoService final : public LayerService {
 public:
  LayerResponse run(const LayerRequest& request) override {
    LayerResponse out;
    const size_t h = request.hidden_size;
    out.outputs.assign(size_t{request.num_rows} * h, 0);
    std::vector<float> y(h);
    for (const ExpertAssignment& a : request.assignments) {
      if (a.expert > 1) fail_invalid("layer " + std::to_string(request.layer) + " expert " +
                                     std::to_string(a.expert) + " is not held here");
      for (size_t i = 0; i < h; ++i) y[i] = request.hidden[size_t{a.row} * h + i] * float(a.expert + 1);
      add_weighted_term(y.data(), a.weight, h, out.outputs.data() + size_t{a.row} * h, out.stats.saturated);
    }
    out.stats.rows_computed = static_cast<uint32_t>(request.assignments.size());
    return out;
  }
  std::map<uint32_t, std::vector<uint32_t>> held() const override { return {{0, {0, 1}}, {2, {0, 1}}}; }
  ExpertIdentities identities() const override;
  /// Records the hints that reach the service (the server's checks passed).
  void prefetch(uint32_t layer, const std::vector<uint32_t>& experts) override {
    std::lock_guard<std::mutex> lock(mutex_);
    hints_.emplace_back(layer, experts);
  }
  std::vector<std::pair<uint32_t, std::vector<uint32_t>>> hints() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return hints_;
  }

 private:
  mutable std::mutex mutex_;
  std::vector<std::pair<uint32_t, std::vector<uint32_t>>> hints_;
};

/// The content identities EchoService reports (and a coordinator of the echo model expects).
inline ExpertIdentities echo_identities() {
  ExpertIdentities out;
  for (uint32_t layer : {0u, 2u}) {
    for (uint32_t e : {0u, 1u}) out[{layer, e}] = ContentHash{layer, e + 1};
  }
  return out;
}
inline ExpertIdentities EchoService::identities() const { return echo_identities(); }

/// The model shape EchoService pretends to serve.
inline ModelLimits echo_limits() { return ModelLimits{3, 4, kEchoHidden, {0, 2}}; }

/// An EchoService served on an ephemeral loopback port.
struct EchoWorker {
  EchoService service;
  std::unique_ptr<WorkerServer> server;

  explicit EchoWorker(const std::string& secret = "", const std::string& name = "a",
                      std::chrono::milliseconds handshake_timeout = std::chrono::milliseconds(10000),
                      size_t max_connections = 256) {
    WorkerServerOptions options;
    options.worker_name = name;
    options.model_fingerprint = kEchoFingerprint;
    options.shared_secret = secret;
    options.limits = echo_limits();
    options.handshake_timeout = handshake_timeout;
    options.max_connections = max_connections;
    options.max_frame_bytes = 1 << 20;
    server = std::make_unique<WorkerServer>(options, service);
    server->start();
  }
  uint16_t port() const { return server->port(); }

  /// A topology with this one worker owning experts 0 and 1, and the matching placement
  /// (experts 2 and 3 go nowhere: tests only route to 0 and 1).
  Topology topology(const std::string& secret) const {
    Topology t;
    t.workers = {WorkerSpec{"a", "127.0.0.1", port(), {0, 1}, {}}};
    t.connect_timeout_ms = 5000;
    t.request_timeout_ms = 5000;
    t.startup_timeout_ms = 0;
    t.cluster_secret = secret;
    return t;
  }
  static Placement placement() { return {{0, {{0}, {0}}}, {2, {{0}, {0}}}}; }
};

/// A valid layerRequest for the echo model: `rows` rows, each routed to experts 0 and 1.
inline LayerRequest echo_request(uint32_t rows, uint64_t id = 1, uint32_t layer = 0) {
  LayerRequest req;
  req.request_id = id;
  req.layer = layer;
  req.hidden_size = kEchoHidden;
  req.num_rows = rows;
  for (uint32_t i = 0; i < rows * kEchoHidden; ++i) req.hidden.push_back(float(i) * 0.5f);
  for (uint32_t r = 0; r < rows; ++r) {
    req.assignments.push_back({r, 0});
    req.assignments.push_back({r, 1});
  }
  return req;
}

}  // namespace charm::test
