#include "coordinator/cluster_dispatch.h"

#include <algorithm>
#include <cstring>
#include <numeric>
#include <optional>

#include <spdlog/spdlog.h>

#include "common/cluster_auth.h"
#include "common/error.h"

namespace charm {

using Clock = std::chrono::steady_clock;

void RttWindow::add(double ms) {
  samples_.push_back(ms);
  if (samples_.size() > capacity_) samples_.pop_front();
}

double RttWindow::percentile(double q) const {
  if (samples_.empty()) return 0;
  std::vector<double> sorted(samples_.begin(), samples_.end());
  std::sort(sorted.begin(), sorted.end());
  // Nearest rank: the smallest sample with at least q of the samples at or below it.
  size_t rank = static_cast<size_t>(q * static_cast<double>(sorted.size()) + 0.999999);
  rank = std::clamp<size_t>(rank, 1, sorted.size());
  return sorted[rank - 1];
}

std::vector<std::string> slow_workers(const std::vector<double>& p50, const std::vector<size_t>& samples,
                                      double slow_ms) {
  constexpr size_t kMinSamples = 8;  // a handful of requests says nothing about a p50
  constexpr double kFactor = 4, kMinGapMs = 2;  // sub-millisecond loopback jitter is not "slow"
  std::vector<std::string> why(p50.size());
  for (size_t i = 0; i < p50.size(); ++i) {
    if (samples[i] < kMinSamples) continue;
    char text[160];
    if (slow_ms > 0 && p50[i] > slow_ms) {
      std::snprintf(text, sizeof text, "layer RTT p50 %.2f ms is over timeouts.slow_ms %.0f", p50[i], slow_ms);
      why[i] = text;
      continue;
    }
    std::vector<double> others;
    for (size_t j = 0; j < p50.size(); ++j) {
      if (j != i && samples[j] >= kMinSamples) others.push_back(p50[j]);
    }
    if (others.empty()) continue;
    std::sort(others.begin(), others.end());
    const double median = others[(others.size() - 1) / 2];
    if (p50[i] > kFactor * median && p50[i] - median >= kMinGapMs) {
      std::snprintf(text, sizeof text, "layer RTT p50 %.2f ms is over 4x the other workers' median %.2f ms",
                    p50[i], median);
      why[i] = text;
    }
  }
  return why;
}

struct ClusterDispatcher::Worker {
  WorkerSpec spec;
  int index = 0;
  std::string address;  // host:port
  std::string label;    // "worker 'w1' (127.0.0.1:5001)" for messages
  // The connection, guarded by `io`, which is held for every send, receive and heartbeat
  // so a heartbeat never lands between a layer request and its reply.
  std::mutex io;
  std::unique_ptr<FrameConnection> conn;
  bool busy = false;  // a layer request is in flight on `conn`
  // State and statistics, guarded by stats_mutex_.
  std::string state = "down";
  bool ever_up = false;
  uint64_t experts_held = 0;
  uint64_t requests = 0;
  uint64_t bytes_out = 0;
  uint64_t bytes_in = 0;
  uint64_t failovers = 0;
  uint64_t rejoins = 0;
  std::optional<Clock::time_point> last_seen;  // last handshake, reply or heartbeat reply
  std::optional<uint64_t> ram_slots;  // HealthReply.slots of its last heartbeat since connecting
  Clock::time_point next_retry;
  std::chrono::milliseconds backoff{0};
  std::string last_error;
  RttWindow rtt;
};

// One worker's share of a layer in one round.
struct ClusterDispatcher::Batch {
  std::vector<uint32_t> local_row;  // global row -> row in request (UINT32_MAX: unused)
  std::vector<uint32_t> rows;       // request row -> global row
  std::vector<uint32_t> origin;     // request assignment -> index in the caller's list
  ExpertRequest request;
  Clock::time_point sent_at;
  bool in_flight = false;
};

// The begun layer: what begin_layer was given, and its progress through failover rounds.
struct ClusterDispatcher::PendingLayer {
  uint32_t layer = 0;
  const float* hidden = nullptr;
  uint32_t num_rows = 0;
  uint32_t hidden_size = 0;
  std::vector<ExpertAssignment> assignments;
  float* outputs = nullptr;  // nullptr while draining an abandoned layer: replies dropped
  const std::vector<std::vector<int>>* owners = nullptr;
  std::vector<Batch> batches;         // this round, one per worker
  std::vector<bool> failed;           // failed in this layer: not chosen again for it
  std::vector<uint32_t> retry;        // assignments whose worker failed at send this round
  std::vector<std::string> failures;  // "worker 'b' (addr): why", in order
};

ClusterDispatcher::ClusterDispatcher(const Topology& topology, Placement placement,
                                     std::string model_fingerprint)
    : model_fingerprint_(std::move(model_fingerprint)),
      placement_(std::move(placement)),
      connect_timeout_(topology.connect_timeout_ms),
      handshake_timeout_(topology.handshake_timeout_ms),
      request_timeout_(topology.request_timeout_ms),
      startup_timeout_(topology.startup_timeout_ms),
      heartbeat_interval_(topology.heartbeat_ms),
      rejoin_min_(topology.rejoin_min_ms),
      rejoin_max_(std::max(topology.rejoin_max_ms, topology.rejoin_min_ms)),
      slow_ms_(static_cast<double>(topology.slow_ms)),
      cluster_secret_(topology.cluster_secret) {
  // The model's shape bounds what a legitimate worker sends before it is accepted.
  size_t num_experts = 0;
  for (const auto& [layer, owners] : placement_) num_experts = std::max(num_experts, owners.size());
  max_hello_reply_bytes_ =
      max_hello_reply_bytes(static_cast<uint32_t>(placement_.size()), static_cast<uint32_t>(num_experts));
  max_health_reply_bytes_ = max_health_reply_bytes(static_cast<uint32_t>(placement_.size()));
  for (size_t i = 0; i < topology.workers.size(); ++i) {
    auto worker = std::make_unique<Worker>();
    worker->spec = topology.workers[i];
    worker->index = static_cast<int>(i);
    worker->address = worker->spec.host + ":" + std::to_string(worker->spec.port);
    worker->label = "worker '" + worker->spec.name + "' (" + worker->address + ")";
    worker->backoff = rejoin_min_;
    workers_.push_back(std::move(worker));
  }
  // A worker still unreachable at the startup deadline is left to rejoin later, as long
  // as its experts have other replicas; a failed handshake (wrong model) is fatal.
  std::string unreachable;
  for (auto& worker : workers_) {
    try {
      connect_at_startup(*worker);
    } catch (const Error& e) {
      if (e.category() != ErrorCategory::kUnavailable) throw;
      mark_down(*worker, e.message());
      unreachable += (unreachable.empty() ? "" : "; ") + e.message();
    }
  }
  if (!unreachable.empty()) {
    require_coverage("cannot reach " + unreachable);
    spdlog::warn("coordinator: starting without {}; every expert has another replica, and the "
                 "worker will rejoin when it answers",
                 unreachable);
  }
  health_thread_ = std::thread([this] { health_loop(); });
}

void ClusterDispatcher::connect_at_startup(Worker& worker) {
  // Workers started together with the coordinator may still be loading their experts:
  // retry refused connections until the startup deadline; handshake failures are final.
  const auto deadline = std::chrono::steady_clock::now() + startup_timeout_;
  for (bool logged = false;; logged = true) {
    try {
      connect(worker);
      return;
    } catch (const Error& e) {
      if (e.category() != ErrorCategory::kUnavailable || std::chrono::steady_clock::now() >= deadline) throw;
      if (!logged) spdlog::info("coordinator: waiting for {}: {}", worker.label, e.message());
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
}

ClusterDispatcher::~ClusterDispatcher() {
  {
    std::lock_guard<std::mutex> lock(health_mutex_);
    health_stop_ = true;
  }
  health_wake_.notify_all();
  if (health_thread_.joinable()) health_thread_.join();
}

void ClusterDispatcher::connect(Worker& worker) {
  auto conn = FrameConnection::connect(worker.spec.host, worker.spec.port, connect_timeout_,
                                       "worker '" + worker.spec.name + "'");
  HelloMsg hello;
  hello.model_fingerprint = model_fingerprint_;
  hello.client_name = "coordinator";
  // The shared-secret handshake (common/cluster_auth.h) when the topology names a secret,
  // all of it within one handshake_timeout_; every (re)connect, the health thread's
  // rejoins included, goes through here, so a rejoining worker proves the secret again.
  // Until its helloReply is accepted the peer is a stranger: frames no bigger than a
  // legitimate reply for this model's shape.
  const ClientHandshake handshake = client_handshake(*conn, std::move(hello), cluster_secret_, handshake_timeout_,
                                                     worker.label, max_hello_reply_bytes_);
  const uint64_t held = accept_hello_reply(handshake.reply, hello_expectations(worker), worker.label);
  // Its RAM slots (experts_by_tier) from the start rather than from the first heartbeat:
  // a restarted worker may run with another budget.
  const uint64_t health_out = conn->send(encode_health_request(), handshake_timeout_);
  conn->set_max_frame_bytes(max_health_reply_bytes_);
  const FrameBody health_body = conn->receive(handshake_timeout_);
  const HealthReplyMsg health = decode_as<HealthReplyMsg>(health_body, max_health_reply_bytes_);
  // Accepted: layer replies carry hidden rows, up to the normal frame limit.
  conn->set_max_frame_bytes(kDefaultMaxFrameBytes);
  {
    std::lock_guard<std::mutex> io(worker.io);
    worker.conn = std::move(conn);
    worker.busy = false;
  }
  std::lock_guard<std::mutex> lock(stats_mutex_);
  if (worker.ever_up) ++worker.rejoins;
  worker.ever_up = true;
  worker.state = "up";
  worker.experts_held = held;
  worker.ram_slots = health.slots;
  worker.bytes_out += handshake.bytes_out + health_out;
  worker.bytes_in += handshake.bytes_in + health_body.bytes + 4;
  worker.last_seen = Clock::now();
  worker.backoff = rejoin_min_;
  spdlog::info("coordinator: connected to {} ({} experts{})", worker.label, held,
               worker.rejoins > 0 ? ", rejoined" : "");
}

HelloExpectations ClusterDispatcher::hello_expectations(const Worker& worker) const {
  HelloExpectations expected;
  expected.model_fingerprint = model_fingerprint_;
  for (const auto& [layer, owners] : placement_) {
    for (size_t e = 0; e < owners.size(); ++e) {
      if (std::find(owners[e].begin(), owners[e].end(), worker.index) == owners[e].end()) continue;
      expected.experts[static_cast<uint32_t>(layer)].push_back(static_cast<uint32_t>(e));
    }
  }
  return expected;
}

void ClusterDispatcher::mark_down(Worker& worker, const std::string& reason) {
  std::lock_guard<std::mutex> io(worker.io);
  mark_down_locked(worker, reason);
}

void ClusterDispatcher::mark_down_locked(Worker& worker, const std::string& reason) {
  if (worker.conn) worker.conn->close();
  worker.conn.reset();
  worker.busy = false;
  std::lock_guard<std::mutex> lock(stats_mutex_);
  if (worker.state == "up") spdlog::warn("coordinator: {} is down: {}", worker.label, reason);
  worker.state = "down";
  worker.last_error = reason;
  worker.backoff = rejoin_min_;
  worker.next_retry = Clock::now() + worker.backoff;
}

void ClusterDispatcher::require_coverage(const std::string& why) const {
  std::string uncovered;
  std::lock_guard<std::mutex> lock(stats_mutex_);
  for (const auto& [layer, owners] : placement_) {
    std::vector<int64_t> missing;
    for (size_t e = 0; e < owners.size(); ++e) {
      const bool live = std::any_of(owners[e].begin(), owners[e].end(),
                                    [&](int w) { return workers_[static_cast<size_t>(w)]->state == "up"; });
      if (!live) missing.push_back(static_cast<int64_t>(e));
    }
    if (!missing.empty()) {
      uncovered += (uncovered.empty() ? "" : "; ") + std::string("layer ") + std::to_string(layer) +
                   " experts " + id_ranges(missing);
    }
  }
  if (!uncovered.empty()) fail_unavailable(why + "; no live replica holds " + uncovered);
}

void ClusterDispatcher::send_request(Worker& worker, Batch& batch) {
  const PendingLayer& p = *pending_;
  ExpertRequest& req = batch.request;
  req.request_id = next_request_id_++;
  req.layer = p.layer;
  req.hidden_size = p.hidden_size;
  req.num_rows = static_cast<uint32_t>(batch.rows.size());
  req.hidden.resize(size_t{req.num_rows} * p.hidden_size);
  for (size_t r = 0; r < batch.rows.size(); ++r) {
    std::memcpy(&req.hidden[r * p.hidden_size], p.hidden + size_t{batch.rows[r]} * p.hidden_size,
                p.hidden_size * sizeof(float));
  }
  const Frame frame = encode_layer_request(req);
  std::lock_guard<std::mutex> io(worker.io);
  // Marked down by a heartbeat since this round chose it: fail over like any send error.
  if (!worker.conn || !worker.conn->is_open()) fail_unavailable("not connected");
  worker.busy = true;
  batch.sent_at = Clock::now();
  const uint64_t out = worker.conn->send(frame, request_timeout_);
  batch.in_flight = true;
  std::lock_guard<std::mutex> lock(stats_mutex_);
  worker.requests += 1;
  worker.bytes_out += out;
}

void ClusterDispatcher::receive_reply(Worker& worker, Batch& batch) {
  const PendingLayer& p = *pending_;
  std::lock_guard<std::mutex> io(worker.io);
  if (!worker.conn) fail_unavailable("not connected");
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
      batch.sent_at + request_timeout_ - Clock::now());
  FrameBody body = worker.conn->receive(std::max(left, std::chrono::milliseconds(1)));
  batch.in_flight = false;
  worker.busy = false;  // one frame back: the stream is between messages again
  const double rtt_ms =
      std::chrono::duration<double, std::milli>(Clock::now() - batch.sent_at).count();
  {
    std::lock_guard<std::mutex> lock(stats_mutex_);
    worker.bytes_in += body.bytes + 4;
  }
  LayerResponseMsg reply = decode_as<LayerResponseMsg>(body);
  if (reply.response.request_id != batch.request.request_id) {
    fail_protocol("reply to request " + std::to_string(reply.response.request_id) +
                  ", expected " + std::to_string(batch.request.request_id));
  }
  if (!reply.error.empty()) fail_unavailable(reply.error);
  const size_t expected = batch.origin.size() * size_t{p.hidden_size};
  if (reply.response.outputs.size() != expected) {
    fail_protocol("layerResponse.outputs has " + std::to_string(reply.response.outputs.size()) +
                  " floats, expected " + std::to_string(batch.origin.size()) +
                  " assignments * hidden_size " + std::to_string(p.hidden_size));
  }
  if (p.outputs != nullptr) {
    for (size_t j = 0; j < batch.origin.size(); ++j) {
      std::memcpy(p.outputs + size_t{batch.origin[j]} * p.hidden_size,
                  &reply.response.outputs[j * p.hidden_size], p.hidden_size * sizeof(float));
    }
  }
  if (metrics_) {
    metrics_->worker_rpc(worker.spec.name, rtt_ms / 1000.0);
    // The worker's own tier counts for this request (hits + misses = experts computed,
    // checked by the decoder); a failed-over resend counts on the replica that served it.
    const ExpertStats& st = reply.response.stats;
    metrics_->expert_stats(worker.spec.name, st.hits, st.misses, st.bytes_read);
  }
  std::lock_guard<std::mutex> lock(stats_mutex_);
  worker.rtt.add(rtt_ms);
  worker.last_seen = Clock::now();
}

void ClusterDispatcher::fail_worker(size_t w, Batch& batch, const Error& e, std::vector<uint32_t>& retry) {
  Worker& worker = *workers_[w];
  PendingLayer& p = *pending_;
  batch.in_flight = false;
  mark_down(worker, "layer " + std::to_string(p.layer) + ": " + e.message());
  {
    std::lock_guard<std::mutex> lock(stats_mutex_);
    ++worker.failovers;
  }
  // The same event in /metrics: one failed request, one failover (counted where
  // worker.failovers is, so the exported counter and /cluster/status agree).
  if (metrics_) {
    metrics_->worker_error(worker.spec.name);
    metrics_->failover(worker.spec.name);
  }
  p.failed[w] = true;
  p.failures.push_back(worker.label + ": " + e.message());
  retry.insert(retry.end(), batch.origin.begin(), batch.origin.end());
  if (p.outputs != nullptr) {
    spdlog::warn("coordinator: layer {}: {} failed ({}); resending its {} assignments to replicas", p.layer,
                 worker.label, e.message(), batch.origin.size());
  }
}

void ClusterDispatcher::fail_uncovered(const std::vector<int64_t>& experts) {
  const PendingLayer& p = *pending_;
  std::string owners;
  {
    std::lock_guard<std::mutex> lock(stats_mutex_);
    std::vector<int> seen;
    for (int64_t e : experts) {
      for (int w : (*p.owners)[static_cast<size_t>(e)]) {
        if (std::find(seen.begin(), seen.end(), w) != seen.end()) continue;
        seen.push_back(w);
        const Worker& worker = *workers_[static_cast<size_t>(w)];
        owners += (owners.empty() ? "" : "; ") + worker.label + " " + worker.state +
                  (worker.last_error.empty() ? "" : " (" + worker.last_error + ")");
      }
    }
  }
  std::string tried;
  for (const std::string& f : p.failures) tried += (tried.empty() ? "" : "; ") + f;
  const std::string message = "layer " + std::to_string(p.layer) + ": no live replica of expert" +
                              (experts.size() == 1 ? " " : "s ") + id_ranges(experts) +
                              "; workers tried in this layer: " + (tried.empty() ? "none" : tried) +
                              "; their owners: " + owners;
  pending_.reset();
  fail_unavailable(message);
}

void ClusterDispatcher::send_round(const std::vector<uint32_t>& which) {
  PendingLayer& p = *pending_;
  p.batches.assign(workers_.size(), Batch{});
  std::vector<bool> live(workers_.size());
  {
    std::lock_guard<std::mutex> lock(stats_mutex_);
    for (size_t w = 0; w < workers_.size(); ++w) live[w] = workers_[w]->state == "up" && !p.failed[w];
  }
  // Per expert, ascending: the live replica with the fewest assignments so far in this
  // round, ties to the lower index. Deterministic, and the bytes do not depend on it:
  // every replica computes an expert's rows identically and the combine is the caller's.
  std::map<uint32_t, size_t> count;  // expert -> assignments of it in `which`
  for (uint32_t i : which) ++count[p.assignments[i].expert];
  std::vector<size_t> load(workers_.size(), 0);
  std::map<uint32_t, int> chosen;
  std::vector<int64_t> uncovered;
  for (const auto& [expert, n] : count) {
    int best = -1;
    for (int w : (*p.owners)[expert]) {
      if (live[static_cast<size_t>(w)] && (best < 0 || load[static_cast<size_t>(w)] < load[static_cast<size_t>(best)])) {
        best = w;
      }
    }
    if (best < 0) {
      uncovered.push_back(expert);
      continue;
    }
    load[static_cast<size_t>(best)] += n;
    chosen[expert] = best;
  }
  if (!uncovered.empty()) fail_uncovered(uncovered);

  // Group by chosen worker in assignment order, remapping rows to each worker's own rows.
  for (uint32_t i : which) {
    const ExpertAssignment& a = p.assignments[i];
    Batch& b = p.batches[static_cast<size_t>(chosen.at(a.expert))];
    if (b.local_row.empty()) b.local_row.assign(p.num_rows, UINT32_MAX);
    if (b.local_row[a.row] == UINT32_MAX) {
      b.local_row[a.row] = static_cast<uint32_t>(b.rows.size());
      b.rows.push_back(a.row);
    }
    b.request.assignments.push_back({b.local_row[a.row], a.expert});
    b.origin.push_back(i);
  }
  // Every request goes out before any reply is read, so the workers compute in parallel.
  for (size_t w = 0; w < workers_.size(); ++w) {
    if (p.batches[w].origin.empty()) continue;
    try {
      send_request(*workers_[w], p.batches[w]);
    } catch (const Error& e) {
      fail_worker(w, p.batches[w], e, p.retry);
    }
  }
}

void ClusterDispatcher::begin_layer(uint32_t layer, const float* hidden, uint32_t num_rows,
                                    uint32_t hidden_size,
                                    const std::vector<ExpertAssignment>& assignments,
                                    float* outputs) {
  if (pending_) {
    // The caller threw between begin and finish: read the stale replies so every
    // connection is back in step, and drop them (its outputs may be gone).
    pending_->outputs = nullptr;
    for (size_t w = 0; w < workers_.size(); ++w) {
      Batch& b = pending_->batches[w];
      if (!b.in_flight) continue;
      try {
        receive_reply(*workers_[w], b);
      } catch (const Error& e) {
        std::vector<uint32_t> dropped;
        fail_worker(w, b, e, dropped);
      }
    }
    spdlog::warn("coordinator: dropped an unfinished layer {}", pending_->layer);
    pending_.reset();
  }
  const auto found = placement_.find(layer);
  if (found == placement_.end()) {
    fail_invalid("layer " + std::to_string(layer) + " is not a MoE layer of the placement map");
  }
  for (size_t i = 0; i < assignments.size(); ++i) {
    const ExpertAssignment& a = assignments[i];
    if (a.row >= num_rows) {
      fail_invalid("assignment " + std::to_string(i) + ": row " + std::to_string(a.row) +
                   " >= num_rows " + std::to_string(num_rows));
    }
    if (a.expert >= found->second.size()) {
      fail_invalid("assignment " + std::to_string(i) + ": expert " + std::to_string(a.expert) +
                   " >= num_experts " + std::to_string(found->second.size()) + " on layer " +
                   std::to_string(layer));
    }
  }
  auto p = std::make_unique<PendingLayer>();
  p->layer = layer;
  p->hidden = hidden;
  p->num_rows = num_rows;
  p->hidden_size = hidden_size;
  p->assignments = assignments;
  p->outputs = outputs;
  p->owners = &found->second;
  p->failed.assign(workers_.size(), false);
  pending_ = std::move(p);
  std::vector<uint32_t> all(assignments.size());
  std::iota(all.begin(), all.end(), 0u);
  send_round(all);
}

void ClusterDispatcher::finish_layer() {
  if (!pending_) fail_internal("finish_layer without begin_layer");
  PendingLayer& p = *pending_;
  // Each round reads every reply; what failed goes to other replicas in the next round.
  for (;;) {
    std::vector<uint32_t> retry = std::move(p.retry);
    p.retry.clear();
    for (size_t w = 0; w < workers_.size(); ++w) {
      Batch& b = p.batches[w];
      if (!b.in_flight) continue;
      try {
        receive_reply(*workers_[w], b);
      } catch (const Error& e) {
        fail_worker(w, b, e, retry);
      }
    }
    if (retry.empty()) break;
    std::sort(retry.begin(), retry.end());
    send_round(retry);  // throws (and clears pending_) when an expert has no live replica
  }
  pending_.reset();
}

void ClusterDispatcher::health_loop() {
  // Short ticks: each worker's own deadline (next_retry, last_seen + heartbeat) decides.
  constexpr std::chrono::milliseconds kTick{25};
  std::unique_lock<std::mutex> lock(health_mutex_);
  while (!health_stop_) {
    health_wake_.wait_for(lock, kTick, [this] { return health_stop_; });
    if (health_stop_) break;
    lock.unlock();
    for (auto& worker : workers_) {
      rejoin_if_due(*worker);
      heartbeat_if_due(*worker);
    }
    lock.lock();
  }
}

void ClusterDispatcher::rejoin_if_due(Worker& worker) {
  {
    std::lock_guard<std::mutex> lock(stats_mutex_);
    if (worker.state != "down" || Clock::now() < worker.next_retry) return;
  }
  try {
    connect(worker);  // the full handshake again: a restarted worker may serve another model
  } catch (const Error& e) {
    std::lock_guard<std::mutex> lock(stats_mutex_);
    worker.backoff = std::min(worker.backoff * 2, rejoin_max_);
    worker.next_retry = Clock::now() + worker.backoff;
    if (e.message() != worker.last_error) {
      spdlog::info("coordinator: {} has not rejoined: {} (next try in {} ms)", worker.label, e.message(),
                   worker.backoff.count());
    }
    worker.last_error = e.message();
  }
}

void ClusterDispatcher::heartbeat_if_due(Worker& worker) {
  if (heartbeat_interval_.count() == 0) return;
  {
    std::lock_guard<std::mutex> lock(stats_mutex_);
    if (worker.state != "up" || (worker.last_seen && Clock::now() - *worker.last_seen < heartbeat_interval_)) return;
  }
  // Never wait for the engine: a worker busy with a layer is heard from by its reply.
  std::unique_lock<std::mutex> io(worker.io, std::try_to_lock);
  if (!io.owns_lock() || worker.busy || !worker.conn) return;
  try {
    const uint64_t out = worker.conn->send(encode_health_request(), heartbeat_interval_);
    const FrameBody body = worker.conn->receive(heartbeat_interval_);
    const HealthReplyMsg health = decode_as<HealthReplyMsg>(body);
    std::lock_guard<std::mutex> lock(stats_mutex_);
    worker.last_seen = Clock::now();
    worker.ram_slots = health.slots;
    worker.bytes_out += out;
    worker.bytes_in += body.bytes + 4;
  } catch (const Error& e) {
    mark_down_locked(worker, "heartbeat: " + e.message());
  }
}

void ClusterDispatcher::hint_layer(uint32_t layer, const std::vector<uint32_t>& experts) {
  const auto found = placement_.find(layer);
  if (found == placement_.end()) return;
  const std::vector<std::vector<int>>& owners = found->second;
  // Every replica of a predicted expert gets the hint: which one serves the request is
  // decided when it is sent (the first live one), and a spare warm copy helps a failover.
  std::vector<PrefetchHintMsg> hints(workers_.size());
  for (uint32_t e : experts) {
    if (e >= owners.size()) continue;
    for (int w : owners[e]) hints.at(static_cast<size_t>(w)).experts.push_back(e);
  }
  for (size_t w = 0; w < workers_.size(); ++w) {
    Worker& worker = *workers_[w];
    if (hints[w].experts.empty()) continue;
    hints[w].layer = layer;
    // `io` keeps the hint's bytes from interleaving with a heartbeat's; a hint never waits
    // for one (it is dropped instead). It has no reply, so a layer request in flight
    // (busy) still gets the next frame back.
    std::unique_lock<std::mutex> io(worker.io, std::try_to_lock);
    // No reconnect for a hint: a broken connection is the next request's to report.
    if (!io.owns_lock() || !worker.conn || !worker.conn->is_open()) continue;
    try {
      const uint64_t out = worker.conn->send(encode_prefetch_hint(hints[w]), request_timeout_);
      std::lock_guard<std::mutex> lock(stats_mutex_);
      worker.bytes_out += out;
    } catch (const Error& e) {
      spdlog::debug("coordinator: prefetch hint to {} dropped: {}", worker.label, e.message());
    }
  }
}

std::vector<WorkerStatus> ClusterDispatcher::status() const {
  std::lock_guard<std::mutex> lock(stats_mutex_);
  std::vector<double> p50;
  std::vector<size_t> samples;
  for (const auto& w : workers_) {
    p50.push_back(w->rtt.percentile(0.50));
    samples.push_back(w->state == "up" ? w->rtt.size() : 0);  // a down worker is not judged
  }
  const std::vector<std::string> slow = slow_workers(p50, samples, slow_ms_);
  const auto now = Clock::now();
  std::vector<WorkerStatus> out;
  for (size_t i = 0; i < workers_.size(); ++i) {
    const Worker& w = *workers_[i];
    WorkerStatus s;
    s.name = w.spec.name;
    s.address = w.address;
    s.state = w.state;
    s.experts_held = w.experts_held;
    s.requests = w.requests;
    s.rtt_p50_ms = p50[i];
    s.rtt_p99_ms = w.rtt.percentile(0.99);
    s.bytes_out = w.bytes_out;
    s.bytes_in = w.bytes_in;
    s.failovers = w.failovers;
    s.rejoins = w.rejoins;
    s.last_seen_ms = w.last_seen ? std::chrono::duration<double, std::milli>(now - *w.last_seen).count() : -1;
    s.slow = !slow[i].empty();
    s.slow_reason = slow[i];
    s.last_error = w.last_error;
    if (w.ram_slots) s.experts_by_tier = split_by_tier(w.experts_held, *w.ram_slots);
    out.push_back(std::move(s));
  }
  return out;
}

}  // namespace charm
