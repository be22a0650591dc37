// Cluster mode: the coordinator's client of the workers. Two TCP connections per worker
// (common/wire.h frames), each opened with the hello handshake: a data connection for
// layer requests and prefetch hints, and a probe connection for healthRequests, which the
// worker answers on its own thread, never behind a computation. Per MoE layer one request
// per worker that serves any expert of the batch-union. An expert held by several
// workers (replicas) is sent to one live replica; a worker that fails mid-layer is marked
// down, its share resent to other replicas, and it is reconnected in the background
// (rejoin). A worker whose reply is late past a deadline learned from its own round
// trips is probed; one that does not answer the probe either is frozen (stopped, asleep,
// cut off): down, failed over, its stuck connection aborted (docs/architecture.md,
// "Silent workers"). Idle workers get heartbeats on the probe connection.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "common/topology.h"
#include "common/wire.h"
#include "coordinator/api/metrics.h"
#include "coordinator/dispatch/expert_dispatch.h"

namespace charm {

struct HelloExpectations;  // common/cluster_auth.h

/// ExpertDispatcher over remote workers.
/// Thread-safety: one layer at a time (as ExpertDispatcher says), begin/finish/hint from
/// one engine thread; status() may be called concurrently from another thread. One health
/// thread per worker (started by the constructor, joined by the destructor) probes it,
/// sends its heartbeats and rejoins it, on the probe connection and fresh connections
/// only: the data connections are the engine thread's, which never waits on a lock held
/// across I/O, and a frozen worker blocks nothing but its own health thread.
class ClusterDispatcher final : public ExpertDispatcher {
 public:
  /// Connects to every worker of `topology`, all at once (connect within
  /// topology.connect_timeout_ms, hello within topology.handshake_timeout_ms), retrying
  /// refused connections for topology.startup_timeout_ms (workers still loading). A worker
  /// that accepts the connection but does not complete the handshake is silent (stopped)
  /// and not retried. Starts without the workers still unreachable then if every expert has
  /// another live replica (they rejoin later).
  /// Every connection, the background rejoins' included, runs the shared-secret handshake
  /// (common/cluster_auth.h) when topology.cluster_secret is set.
  /// `placement` is Topology::placement's map (layer -> expert -> worker indices);
  /// `model_fingerprint` is the coordinator's model_fingerprint(); `identities` the
  /// content identity of every placed expert in the coordinator's checkpoint
  /// (worker/experts/expert_manifest.h), which each worker's helloReply must report for the
  /// experts the placement gives it. A worker serving a lossy container of these weights
  /// (helloReply.lossyForm) is accepted with a warning naming it and the form.
  /// Throws Error(kUnavailable) naming the unreachable workers and the experts left without
  /// a replica, and Error(kProtocol) naming the worker and both values when a worker
  /// rejects the handshake or reports a different protocol version or model fingerprint,
  /// naming the worker, layer, expert and both content hashes when it holds other weights
  /// (the first mismatch, then how many more), and naming the worker and "shared secret"
  /// when the topology's cluster secret and the worker's differ or only one side has one.
  /// Throws Error(kInternal) when `identities` lacks a placed expert.
  ClusterDispatcher(const Topology& topology, Placement placement, std::string model_fingerprint,
                    ExpertIdentities identities);
  /// Stops the health threads (aborting the handshakes they are in) and closes every
  /// connection.
  ~ClusterDispatcher() override;

  /// Spreads the batch-union over live replicas (per expert, in ascending expert order: the
  /// live replica with the fewest assignments so far in this layer, ties to the lower
  /// worker index; a "suspect" one only when no other is up) and sends each chosen worker
  /// one layerRequest holding only the rows its assignments use (row ids remapped); every
  /// request goes out before any reply is read, so the workers compute in parallel. A
  /// second layer begun before the first is finished is pipelined: its requests follow the
  /// first's on the same connections (each worker answers in order) while the caller
  /// computes; the data connections read while they send, so a request to a worker busy
  /// sending a reply never waits on it (FrameConnection::set_read_while_sending). Throws
  /// Error(kInvalidInput) for a layer absent from the placement or an expert id out of
  /// range, Error(kUnavailable) (see finish_layer) when an expert has no live replica. A
  /// worker that cannot be sent to is failed over by finish_layer.
  void begin_layer(uint32_t layer, const float* hidden, uint32_t num_rows, uint32_t hidden_size,
                   const std::vector<ExpertAssignment>& assignments, int64_t* sums) override;

  /// Reads the replies of the oldest unfinished layer (and, as they come, the newer one's)
  /// as they arrive, each within
  /// topology.request_timeout_ms of its send, and adds each reply's partial sums, whole
  /// and once, into the rows of `sums` its request carried (fixed_add). A worker that fails
  /// (connection reset, timeout, malformed reply, an error reply, or frozen: its reply late
  /// and a probe unanswered, see the class comment) is marked down and its assignments are
  /// resent to live replicas it has not failed in this layer, until every assignment is
  /// answered. Throws Error(kUnavailable) naming the layer, the experts left without a live
  /// replica and every worker tried (with why it failed) when that cannot be done.
  void finish_layer() override;

  /// Abandons every unfinished layer: their replies are read in their turn and dropped.
  void drop_unfinished() override;

  /// Splits `experts` by owning worker (every replica) and stages each one's share: it
  /// rides on the next layerRequest sent to that worker (layerRequest.prefetch), so the
  /// worker starts the reads as soon as that request's own are queued. A share no request
  /// has taken by the end of the next begin_layer (the worker has no part in that layer),
  /// or still staged at the next hint_layer, goes alone as a prefetchHint message (no reply
  /// is read: the protocol's one fire-and-forget message). Workers that are down, and a
  /// layer absent from the placement, get nothing; a send that fails is logged and left
  /// for the next request on that connection to report. A send to a frozen worker is
  /// aborted with it.
  void hint_layer(uint32_t layer, const std::vector<uint32_t>& experts) override;

  /// One entry per worker: "up" while connected, "suspect" while a probe of it is
  /// unanswered (a layer reply of it is late), "down" after a failure until it rejoins.
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
  struct Opened;
  struct Opening;

  // Connections and the workers' state.
  Opened open(Worker& worker);
  void connect(Worker& worker);
  HelloExpectations hello_expectations(const Worker& worker) const;
  void connect_at_startup(Worker& worker);
  void connect_all_at_startup();
  void stop_health_threads();
  void require_coverage(const std::string& why) const;
  void mark_down(Worker& worker, const FrameConnection* conn, const std::string& reason);
  // The engine thread's side of a layer.
  void send_round(PendingLayer& p, const std::vector<uint32_t>& which);
  void send_request(size_t w, Batch& batch);
  void send_staged_hints();  // each staged hint alone, as a prefetchHint message
  void send_hint(size_t w, const PrefetchHintMsg& hint);
  void read_replies();
  void receive_reply(Worker& worker, Batch& batch);
  /// Throws Error(kProtocol) unless `sums` is one row of hidden_size values per request
  /// row of `batch`, each in range for the number of terms that row has there.
  static void check_partial_sums(const Batch& batch, std::span<const int64_t> sums, uint32_t hidden_size);
  void fail_worker(size_t w, const Error& e);
  [[noreturn]] void fail_uncovered(PendingLayer& p, const std::vector<int64_t>& experts);
  size_t unfinished() const;  // layers begun, not finished and not abandoned
  void collect_finished();    // forgets abandoned layers with no request left out
  void waiting(Worker& worker, uint32_t rows);
  void progressed(size_t w);
  // The health threads' side.
  void health_loop(Worker& worker);
  void health_step(Worker& worker, std::chrono::milliseconds& wait);
  bool answered_late(Worker& worker);
  void rejoin(Worker& worker);
  std::optional<std::chrono::steady_clock::time_point> probe_time(const Worker& worker) const;
  bool probe_due(Worker& worker, std::chrono::milliseconds& wait);
  bool heartbeat_due(const Worker& worker) const;
  bool is_down(const Worker& worker) const;
  void probe(Worker& worker, bool late_reply);
  bool await_answer(Worker& worker, bool late_reply, std::chrono::steady_clock::time_point sent,
                    std::chrono::milliseconds deadline);
  std::chrono::milliseconds hedge_deadline(const Worker& worker, uint32_t rows) const;
  std::chrono::milliseconds probe_deadline(const Worker& worker) const;

  std::string model_fingerprint_;
  ExpertIdentities identities_;  // the coordinator's checkpoint, every placed expert
  Placement placement_;
  std::chrono::milliseconds connect_timeout_;
  std::chrono::milliseconds handshake_timeout_;
  std::chrono::milliseconds request_timeout_;
  std::chrono::milliseconds startup_timeout_;
  std::chrono::milliseconds heartbeat_interval_;  // 0: no heartbeats
  std::chrono::milliseconds rejoin_min_;
  std::chrono::milliseconds rejoin_max_;
  std::chrono::milliseconds hedge_floor_, hedge_cap_;  // the learned layer-reply deadline's range
  std::chrono::milliseconds probe_floor_, probe_cap_;  // the learned probe deadline's range
  std::chrono::milliseconds health_tick_;              // how often a health thread looks
  double slow_ms_;
  std::string cluster_secret_;  // topology.cluster_secret; empty: open cluster
  // Frame caps while a (re)connecting worker is not accepted yet, from the model's shape
  // (max_hello_reply_bytes, max_health_reply_bytes).
  uint64_t max_hello_reply_bytes_ = 0;
  uint64_t max_health_reply_bytes_ = 0;
  std::vector<std::unique_ptr<Worker>> workers_;
  uint64_t next_request_id_ = 1;  // engine thread only
  // Begun layers, oldest first: the unfinished ones (at most kMaxLayersInFlight) and the
  // abandoned ones whose requests are still out. Engine thread only.
  std::deque<std::unique_ptr<PendingLayer>> layers_;
  // Per worker, the batches sent on its data connection and not answered, in send order
  // (the order of its replies), whichever layers they belong to. Engine thread only.
  std::vector<std::deque<Batch>> inflight_;
  // Per worker, the hint_layer share waiting for its next request (no experts: none).
  // Engine thread only.
  std::vector<PrefetchHintMsg> staged_hints_;
  Metrics* metrics_ = nullptr;  // set before the first layer; may be null
  mutable std::mutex stats_mutex_;  // guards every Worker's state, statistics and `conn`
  uint64_t token_layers_ = 0;       // sum of num_rows over begin_layer calls; stats_mutex_

  // The health threads sleep on health_wake_ (with health_mutex_); stopping_ ends them.
  std::mutex health_mutex_;
  std::condition_variable health_wake_;
  std::atomic<bool> stopping_{false};
  std::atomic<bool> startup_failed_{false};  // a worker failed its handshake: stop retrying
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

/// A deadline learned from round trips (ms): 4x the p99 of `rtt`, rounded up to a whole
/// millisecond and clamped to [floor, cap]; `floor` while `rtt` holds fewer than 8 samples
/// (too few to know; an early probe costs one small frame, a late one a stall).
std::chrono::milliseconds learned_deadline(const RttWindow& rtt, std::chrono::milliseconds floor,
                                           std::chrono::milliseconds cap);

/// Which size class a layer request of `rows` rows falls in for its learned deadline:
/// floor(log2(rows)), at most kRttSizeClasses - 1 (rows 0 and 1 are class 0). A decode step
/// and a prefill chunk take very different times, so each class has its own window.
constexpr size_t kRttSizeClasses = 16;
size_t rtt_size_class(uint32_t rows);

/// Which workers are "slow": p50[i] (layer RTT medians, ms; `samples[i]` how many) over
/// `slow_ms` (> 0), or over 4x the median of the other workers' p50 and at least 2 ms above
/// it. Workers with fewer than 8 samples are neither judged nor compared against.
/// Returns one flag per worker and, for each slow one, why (both numbers).
std::vector<std::string> slow_workers(const std::vector<double>& p50, const std::vector<size_t>& samples,
                                      double slow_ms);

}  // namespace charm
