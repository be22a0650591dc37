// Cluster mode: the coordinator's client of the workers. One TCP connection per worker
// (common/wire.h frames), a hello handshake at construction, and per MoE layer one
// request per worker that owns any expert of the batch-union.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/topology.h"
#include "common/wire.h"
#include "coordinator/expert_dispatch.h"

namespace charm {

/// ExpertDispatcher over remote workers.
/// Thread-safety: one layer at a time (as ExpertDispatcher says); status() may be
/// called concurrently from another thread.
class ClusterDispatcher final : public ExpertDispatcher {
 public:
  /// Connects to every worker of `topology` within topology.connect_timeout_ms and does
  /// the hello handshake, retrying refused connections for topology.startup_timeout_ms
  /// (workers still loading). `placement` is Topology::placement's map (layer -> expert ->
  /// worker index); `model_fingerprint` is the coordinator's model_fingerprint().
  /// Throws Error(kUnavailable) naming the worker and address when one cannot be reached,
  /// and Error(kProtocol) naming the worker and both values when a worker rejects the
  /// handshake or reports a different protocol version or model fingerprint.
  ClusterDispatcher(const Topology& topology, std::map<int64_t, std::vector<int>> placement,
                    std::string model_fingerprint);
  ~ClusterDispatcher() override;

  /// Groups `assignments` by owning worker and sends each worker one layerRequest holding
  /// only the rows its assignments use (row ids remapped); every request goes out before
  /// any reply is read, so the workers compute in parallel. Throws Error(kInvalidInput)
  /// for a layer absent from the placement or an expert id out of range. A worker that
  /// cannot be sent to is reported by finish_layer.
  void begin_layer(uint32_t layer, const float* hidden, uint32_t num_rows, uint32_t hidden_size,
                   const std::vector<ExpertAssignment>& assignments, float* outputs) override;

  /// Reads the replies of the begun layer within topology.request_timeout_ms of each send
  /// and scatters them into `outputs` in the original assignment order, the workers'
  /// bytes unchanged. Throws Error(kUnavailable) naming the worker and layer when a
  /// worker fails, times out or returns an error (its connection is closed and
  /// re-established on the next call), Error(kProtocol) for a malformed reply.
  void finish_layer() override;

  /// Splits `experts` by owning worker and sends each owner one prefetchHint (no reply is
  /// read: the protocol's one fire-and-forget message). Workers that are down, and a
  /// layer absent from the placement, get nothing; a send that fails is logged and left
  /// for the next request on that connection to report.
  void hint_layer(uint32_t layer, const std::vector<uint32_t>& experts) override;

  /// One entry per worker: "up" while connected, "down" after a failure.
  std::vector<WorkerStatus> status() const override;

 private:
  struct Worker;
  struct Batch;

  void connect(Worker& worker);
  void connect_at_startup(Worker& worker);
  void send_request(Worker& worker, Batch& batch, uint32_t layer, uint32_t hidden_size,
                    const float* hidden);
  void receive_reply(Worker& worker, Batch& batch, uint32_t layer, uint32_t hidden_size,
                     float* outputs);
  void mark_down(Worker& worker);
  void fail_batch(size_t w, Batch& batch, const Error& e);

  std::string model_fingerprint_;
  std::map<int64_t, std::vector<int>> placement_;
  std::chrono::milliseconds connect_timeout_;
  std::chrono::milliseconds request_timeout_;
  std::chrono::milliseconds startup_timeout_;
  std::vector<std::unique_ptr<Worker>> workers_;
  uint64_t next_request_id_ = 1;
  // The begun layer, between begin_layer and finish_layer.
  std::vector<Batch> pending_;
  uint32_t pending_layer_ = 0;
  uint32_t pending_hidden_size_ = 0;
  float* pending_outputs_ = nullptr;
  bool has_pending_ = false;
  mutable std::mutex stats_mutex_;  // guards every Worker's statistics and state
};

/// Keeps the last `capacity` samples of a round-trip time, for p50/p99.
class RttWindow {
 public:
  explicit RttWindow(size_t capacity = 1024) : capacity_(capacity) {}
  void add(double ms);
  /// Nearest-rank percentile (q in [0, 1]) of the kept samples; 0 when there are none.
  double percentile(double q) const;
  size_t size() const { return samples_.size(); }

 private:
  size_t capacity_;
  std::deque<double> samples_;
};

}  // namespace charm
