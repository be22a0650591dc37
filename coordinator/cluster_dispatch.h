// Cluster mode: the coordinator's client of the workers. One TCP connection per worker
// (common/wire.h frames), a hello handshake at construction, and per MoE layer one
// request per worker that serves any expert of the batch-union. An expert held by several
// workers (replicas) is sent to one live replica; a worker that fails mid-layer is marked
// down, its share resent to other replicas, and it is reconnected in the background with
// back-off (rejoin). Idle workers get heartbeats.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/topology.h"
#include "common/wire.h"
#include "coordinator/expert_dispatch.h"
#include "coordinator/metrics.h"

namespace charm {

struct HelloExpectations;  // common/cluster_auth.h

/// ExpertDispatcher over remote workers.
/// Thread-safety: one layer at a time (as ExpertDispatcher says); status() may be
/// called concurrently from another thread. A background thread (started by the
/// constructor, joined by the destructor) sends heartbeats and reconnects down workers;
/// a per-worker mutex keeps it off a connection that has a layer request in flight.
class ClusterDispatcher final : public ExpertDispatcher {
 public:
  /// Connects to every worker of `topology` (connect within topology.connect_timeout_ms,
  /// hello within topology.handshake_timeout_ms), retrying refused connections for
  /// topology.startup_timeout_ms (workers still loading). Starts without a worker that is
  /// still unreachable then if every expert has another live replica (it rejoins later).
  /// Every connection, the background rejoins' included, runs the shared-secret handshake
  /// (common/cluster_auth.h) when topology.cluster_secret is set.
  /// `placement` is Topology::placement's map (layer -> expert -> worker indices);
  /// `model_fingerprint` is the coordinator's model_fingerprint().
  /// Throws Error(kUnavailable) naming the unreachable workers and the experts left without
  /// a replica, and Error(kProtocol) naming the worker and both values when a worker
  /// rejects the handshake or reports a different protocol version or model fingerprint,
  /// and naming the worker and "shared secret" when the topology's cluster secret and the
  /// worker's differ or only one side has one.
  ClusterDispatcher(const Topology& topology, Placement placement, std::string model_fingerprint);
  /// Stops the background thread and closes every connection.
  ~ClusterDispatcher() override;

  /// Spreads the batch-union over live replicas (per expert, in ascending expert order: the
  /// live replica with the fewest assignments so far in this layer, ties to the lower
  /// worker index) and sends each chosen worker one layerRequest holding only the rows its
  /// assignments use (row ids remapped); every request goes out before any reply is read,
  /// so the workers compute in parallel. Throws Error(kInvalidInput) for a layer absent
  /// from the placement or an expert id out of range, Error(kUnavailable) (see
  /// finish_layer) when an expert has no live replica. A worker that cannot be sent to is
  /// failed over by finish_layer.
  void begin_layer(uint32_t layer, const float* hidden, uint32_t num_rows, uint32_t hidden_size,
                   const std::vector<ExpertAssignment>& assignments, float* outputs) override;

  /// Reads the replies of the begun layer within topology.request_timeout_ms of each send
  /// and scatters them into `outputs` in the original assignment order, the workers'
  /// bytes unchanged. A worker that fails (connection reset, timeout, malformed reply, an
  /// error reply) is marked down and its assignments are resent to live replicas it has
  /// not failed in this layer, until every assignment is answered. Throws
  /// Error(kUnavailable) naming the layer, the experts left without a live replica and
  /// every worker tried (with why it failed) when that cannot be done.
  void finish_layer() override;

  /// Splits `experts` by owning worker (every replica) and sends each one prefetchHint (no
  /// reply is read: the protocol's one fire-and-forget message). Workers that are down or
  /// in a heartbeat right now, and a layer absent from the placement, get nothing; a send
  /// that fails is logged and left for the next request on that connection to report.
  void hint_layer(uint32_t layer, const std::vector<uint32_t>& experts) override;

  /// One entry per worker: "up" while connected, "down" after a failure until it rejoins.
  std::vector<WorkerStatus> status() const override;

  /// Reports every layer request's round trip (failed-over resends included), each failed
  /// layer request (worker_error), each failover (the same count as WorkerStatus::failovers)
  /// and expert statistics to `metrics` (null: none). Call before the first layer;
  /// `metrics` must outlive this.
  void set_metrics(Metrics* metrics) { metrics_ = metrics; }

 private:
  struct Worker;
  struct Batch;
  struct PendingLayer;

  void connect(Worker& worker);
  HelloExpectations hello_expectations(const Worker& worker) const;
  void connect_at_startup(Worker& worker);
  void require_coverage(const std::string& why) const;
  void send_round(const std::vector<uint32_t>& which);
  void send_request(Worker& worker, Batch& batch);
  void receive_reply(Worker& worker, Batch& batch);
  void fail_worker(size_t w, Batch& batch, const Error& e, std::vector<uint32_t>& retry);
  void mark_down(Worker& worker, const std::string& reason);
  void mark_down_locked(Worker& worker, const std::string& reason);
  [[noreturn]] void fail_uncovered(const std::vector<int64_t>& experts);
  void health_loop();
  void rejoin_if_due(Worker& worker);
  void heartbeat_if_due(Worker& worker);

  std::string model_fingerprint_;
  Placement placement_;
  std::chrono::milliseconds connect_timeout_;
  std::chrono::milliseconds handshake_timeout_;
  std::chrono::milliseconds request_timeout_;
  std::chrono::milliseconds startup_timeout_;
  std::chrono::milliseconds heartbeat_interval_;  // 0: no heartbeats
  std::chrono::milliseconds rejoin_min_;
  std::chrono::milliseconds rejoin_max_;
  double slow_ms_;
  std::string cluster_secret_;  // topology.cluster_secret; empty: open cluster
  // Frame caps while a (re)connecting worker is not accepted yet, from the model's shape
  // (max_hello_reply_bytes, max_health_reply_bytes).
  uint64_t max_hello_reply_bytes_ = 0;
  uint64_t max_health_reply_bytes_ = 0;
  std::vector<std::unique_ptr<Worker>> workers_;
  uint64_t next_request_id_ = 1;  // engine thread only
  std::unique_ptr<PendingLayer> pending_;  // the begun layer, between begin and finish
  Metrics* metrics_ = nullptr;  // set before the first layer; may be null
  mutable std::mutex stats_mutex_;  // guards every Worker's statistics and state

  // The background heartbeat / rejoin thread.
  std::mutex health_mutex_;
  std::condition_variable health_wake_;
  bool health_stop_ = false;
  std::thread health_thread_;
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

/// Which workers are "slow": p50[i] (layer RTT medians, ms; `samples[i]` how many) over
/// `slow_ms` (> 0), or over 4x the median of the other workers' p50 and at least 2 ms above
/// it. Workers with fewer than 8 samples are neither judged nor compared against.
/// Returns one flag per worker and, for each slow one, why (both numbers).
std::vector<std::string> slow_workers(const std::vector<double>& p50, const std::vector<size_t>& samples,
                                      double slow_ms);

}  // namespace charm
