#include "coordinator/dispatch/cluster_dispatch.h"

#include <algorithm>
#include <exception>
#include <numeric>
#include <optional>

#include <spdlog/spdlog.h>

#include "common/cluster_auth.h"
#include "common/error.h"
#include "common/fixed_point.h"
#include "common/wire_layer.h"
#include "coordinator/dispatch/cluster_worker.h"

namespace charm {

using cluster_detail::Clock;
using std::chrono::milliseconds;
using cluster_detail::from_ticks;
using cluster_detail::ms_since;
using cluster_detail::ms_until;
using cluster_detail::ticks;

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

// One worker's share of a layer in one round.
struct ClusterDispatcher::Batch {
  PendingLayer* pending = nullptr;  // the layer it is part of
  std::vector<uint32_t> local_row;  // global row -> row in request (UINT32_MAX: unused)
  std::vector<uint32_t> rows;       // request row -> global row
  std::vector<uint32_t> origin;     // request assignment -> index in the caller's list
  LayerRequest request;
  std::shared_ptr<FrameConnection> conn;  // sent on this one: its reply comes on it
  Clock::time_point sent_at;
};

// The begun layer: what begin_layer was given, and its progress through failover rounds.
struct ClusterDispatcher::PendingLayer {
  uint32_t layer = 0;
  const float* hidden = nullptr;
  uint32_t num_rows = 0;
  uint32_t hidden_size = 0;
  std::vector<ExpertAssignment> assignments;
  int64_t* sums = nullptr;   // [num_rows, hidden_size]: each reply added whole, once
  bool abandoned = false;  // the caller has gone (threw, or the layer failed): replies dropped
  const std::vector<std::vector<int>>* owners = nullptr;
  size_t outstanding = 0;             // its batches in inflight_, replies not yet read
  std::vector<bool> failed;           // failed in this layer: not chosen again for it
  std::vector<uint32_t> retry;        // assignments of failed workers, to resend
  std::vector<std::string> failures;  // "worker 'b' (addr): why", in order
};

// One authenticated connection and what its handshake and first health reply said.
struct ClusterDispatcher::Opened {
  std::unique_ptr<FrameConnection> conn;
  uint64_t held = 0;  // (layer, expert) pairs
  HealthReplyMsg health;
  uint64_t bytes_out = 0;
  uint64_t bytes_in = 0;
  double health_ms = 0;  // the health exchange's round trip
};

// Registers the connection open() is handshaking on, so that the destructor can abort it.
struct ClusterDispatcher::Opening {
  ClusterDispatcher& d;
  Worker& worker;
  Opening(ClusterDispatcher& dispatcher, Worker& w, FrameConnection& conn) : d(dispatcher), worker(w) {
    worker.reached = true;
    std::lock_guard<std::mutex> lock(d.stats_mutex_);
    if (d.stopping_) fail_unavailable(worker.label + ": the coordinator is stopping");
    worker.opening = &conn;
  }
  ~Opening() {
    std::lock_guard<std::mutex> lock(d.stats_mutex_);
    worker.opening = nullptr;
  }
};

ClusterDispatcher::ClusterDispatcher(const Topology& topology, Placement placement,
                                     std::string model_fingerprint, ExpertIdentities identities)
    : model_fingerprint_(std::move(model_fingerprint)),
      identities_(std::move(identities)),
      placement_(std::move(placement)),
      connect_timeout_(topology.connect_timeout_ms),
      handshake_timeout_(topology.handshake_timeout_ms),
      request_timeout_(topology.request_timeout_ms),
      startup_timeout_(topology.startup_timeout_ms),
      heartbeat_interval_(topology.heartbeat_ms),
      rejoin_min_(topology.rejoin_min_ms),
      rejoin_max_(std::max(topology.rejoin_max_ms, topology.rejoin_min_ms)),
      hedge_floor_(topology.hedge_floor_ms),
      hedge_cap_(std::max(topology.hedge_cap_ms, topology.hedge_floor_ms)),
      probe_floor_(topology.probe_floor_ms),
      probe_cap_(std::max(topology.probe_cap_ms, topology.probe_floor_ms)),
      // Under the hedge floor, so a probe goes out on time after the first look.
      health_tick_(std::clamp<int64_t>(topology.hedge_floor_ms / 2, 1, 25)),
      slow_ms_(static_cast<double>(topology.slow_ms)),
      cluster_secret_(topology.cluster_secret) {
  // The model's shape bounds what a legitimate worker sends before it is accepted.
  size_t num_experts = 0;
  for (const auto& [layer, owners] : placement_) num_experts = std::max(num_experts, owners.size());
  max_hello_reply_bytes_ =
      max_hello_reply_bytes(static_cast<uint32_t>(placement_.size()), static_cast<uint32_t>(num_experts));
  max_health_reply_bytes_ =
      max_health_reply_bytes(static_cast<uint32_t>(placement_.size()), static_cast<uint32_t>(num_experts));
  for (size_t i = 0; i < topology.workers.size(); ++i) {
    auto worker = std::make_unique<Worker>();
    worker->spec = topology.workers[i];
    worker->index = static_cast<int>(i);
    worker->address = worker->spec.host + ":" + std::to_string(worker->spec.port);
    worker->label = "worker '" + worker->spec.name + "' (" + worker->address + ")";
    worker->backoff = rejoin_min_;
    workers_.push_back(std::move(worker));
  }
  inflight_.resize(workers_.size());
  staged_hints_.resize(workers_.size());
  for (const auto& [layer, owners] : placement_) {
    for (size_t e = 0; e < owners.size(); ++e) {
      if (!identities_.count({static_cast<uint32_t>(layer), static_cast<uint32_t>(e)})) {
        fail_internal("coordinator: no content identity for layer " + std::to_string(layer) + " expert " +
                      std::to_string(e) + " of the placement");
      }
    }
  }
  connect_all_at_startup();
  try {
    for (auto& worker : workers_) {
      Worker& w = *worker;
      w.health_thread = std::thread([this, &w] { health_loop(w); });
    }
  } catch (...) {
    stop_health_threads();  // no destructor runs for a constructor that throws
    throw;
  }
}

void ClusterDispatcher::connect_all_at_startup() {
  // All at once: N silent or loading workers cost one wait, not N.
  std::vector<std::exception_ptr> errors(workers_.size());
  {
    std::vector<std::thread> threads;
    for (size_t i = 0; i < workers_.size(); ++i) {
      threads.emplace_back([this, i, &errors] {
        try {
          connect_at_startup(*workers_[i]);
        } catch (const Error& e) {
          errors[i] = std::current_exception();
          // A wrong model or secret ends the start: the others stop retrying.
          if (e.category() != ErrorCategory::kUnavailable) startup_failed_ = true;
        } catch (...) {
          errors[i] = std::current_exception();
          startup_failed_ = true;
        }
      });
    }
    for (auto& t : threads) t.join();
  }
  // A worker still unreachable is left to rejoin later, as long as its experts have other
  // replicas; a failed handshake (wrong model) is fatal.
  std::string unreachable;
  for (size_t i = 0; i < workers_.size(); ++i) {
    if (!errors[i]) continue;
    try {
      std::rethrow_exception(errors[i]);
    } catch (const Error& e) {
      if (e.category() != ErrorCategory::kUnavailable) throw;
      mark_down(*workers_[i], nullptr, e.message());
      unreachable += (unreachable.empty() ? "" : "; ") + workers_[i]->label + " (" + e.message() + ")";
    }
  }
  if (!unreachable.empty()) {
    require_coverage("cannot reach " + unreachable);
    spdlog::warn("coordinator: starting without {}; every expert has another replica, and the "
                 "worker will rejoin when it answers",
                 unreachable);
  }
}

void ClusterDispatcher::connect_at_startup(Worker& worker) {
  // Workers started together with the coordinator may still be loading their experts (not
  // listening yet): retry refused connections until the startup deadline. One that took
  // the connection but did not complete the handshake is listening and silent (stopped,
  // hung): waiting longer would stall the start, so it is left to rejoin. Handshake
  // failures are final.
  const auto deadline = Clock::now() + startup_timeout_;
  for (bool logged = false;; logged = true) {
    try {
      connect(worker);
      return;
    } catch (const Error& e) {
      if (e.category() != ErrorCategory::kUnavailable || worker.reached || startup_failed_ ||
          Clock::now() >= deadline) {
        throw;
      }
      if (!logged) spdlog::info("coordinator: waiting for {}: {}", worker.label, e.message());
    }
    std::this_thread::sleep_for(std::min<Clock::duration>(milliseconds(200), deadline - Clock::now()));
  }
}

ClusterDispatcher::~ClusterDispatcher() { stop_health_threads(); }

void ClusterDispatcher::stop_health_threads() {
  {
    std::lock_guard<std::mutex> lock(health_mutex_);
    stopping_ = true;
  }
  health_wake_.notify_all();
  {
    // A rejoin handshake in progress with a silent worker would wait handshake_ms.
    std::lock_guard<std::mutex> lock(stats_mutex_);
    for (auto& w : workers_) {
      if (w->opening) w->opening->abort();
    }
  }
  for (auto& w : workers_) {
    if (w->health_thread.joinable()) w->health_thread.join();
  }
}

ClusterDispatcher::Opened ClusterDispatcher::open(Worker& worker) {
  worker.reached = false;
  auto conn = FrameConnection::connect(worker.spec.host, worker.spec.port, connect_timeout_,
                                       "worker '" + worker.spec.name + "'");
  const Opening opening(*this, worker, *conn);  // a silent worker cannot hold up the destructor
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
  const HelloReplyMsg& reply = handshake.reply;
  const HelloExpectations expected = hello_expectations(worker);
  const uint64_t held = accept_hello_reply(reply, expected, worker.label);
  // ... and it holds the assigned experts with the coordinator's weights: the fingerprint
  // covers shapes only.
  std::vector<ExpertKey> assigned;
  for (const auto& [layer, experts] : expected.experts) {
    for (uint32_t e : experts) assigned.emplace_back(layer, e);
  }
  if (const auto mismatches = compare_identities(identities_, reply.identities, assigned); !mismatches.empty()) {
    fail_protocol(worker.label + " holds other weights than the coordinator's checkpoint: " +
                  describe_mismatches(mismatches, "on the worker", "in the coordinator's checkpoint") +
                  " (a different, edited or corrupted copy of the model, or a container converted from one)");
  }
  if (!reply.lossy_form.empty()) {
    spdlog::warn("coordinator: {} serves LOSSY experts ({}) converted from this checkpoint: its outputs differ "
                 "from the checkpoint's",
                 worker.label, reply.lossy_form);
  }
  // Its RAM slots (experts_by_tier) from the start rather than from the first heartbeat:
  // a restarted worker may run with another budget.
  const auto asked = Clock::now();
  const uint64_t health_out = conn->send(encode_health_request(), handshake_timeout_);
  conn->set_max_frame_bytes(max_health_reply_bytes_);
  const FrameBody health_body = conn->receive(handshake_timeout_);
  Opened opened{std::move(conn), held, decode_as<HealthReplyMsg>(health_body, max_health_reply_bytes_), 0, 0, 0};
  // Accepted: layer replies carry hidden rows, up to the normal frame limit.
  opened.conn->set_max_frame_bytes(kDefaultMaxFrameBytes);
  opened.health_ms = std::chrono::duration<double, std::milli>(Clock::now() - asked).count();
  opened.bytes_out = handshake.bytes_out + health_out;
  opened.bytes_in = handshake.bytes_in + health_body.bytes + 4;
  return opened;
}

void ClusterDispatcher::connect(Worker& worker) {
  // Two connections, each through the whole handshake: the data connection carries layer
  // requests and hints, the probe connection healthRequests only, so a probe never queues
  // behind a computation (the worker serves each connection on its own thread).
  Opened data = open(worker);
  data.conn->set_read_while_sending(true);  // layer requests are pipelined on it
  Opened probe = open(worker);
  probe.conn->set_max_frame_bytes(max_health_reply_bytes_);  // it only ever reads health replies
  worker.probe = std::move(probe.conn);
  worker.unanswered = false;
  std::lock_guard<std::mutex> lock(stats_mutex_);
  if (worker.conn) worker.conn->abort();
  worker.conn = std::move(data.conn);
  if (worker.ever_up) ++worker.rejoins;
  worker.ever_up = true;
  worker.state = WorkerState::kUp;
  worker.experts_held = data.held;
  worker.ram_slots = probe.health.slots;
  worker.tier_layers = probe.health.tier_layers;
  worker.residency = probe.health.residency;
  worker.bytes_out += data.bytes_out + probe.bytes_out;
  worker.bytes_in += data.bytes_in + probe.bytes_in;
  worker.probe_rtt.add(data.health_ms);
  worker.probe_rtt.add(probe.health_ms);
  worker.last_seen = worker.last_probe_ok = Clock::now();
  worker.backoff = rejoin_min_;
  worker.rejoin_error.clear();
  spdlog::info("coordinator: connected to {} ({} experts{})", worker.label, data.held,
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

void ClusterDispatcher::mark_down(Worker& worker, const FrameConnection* conn, const std::string& reason) {
  std::lock_guard<std::mutex> lock(stats_mutex_);
  // A failure of a data connection already replaced (or dropped) says nothing new.
  if (conn != nullptr && worker.conn.get() != conn) return;
  // Aborted, not closed: the engine thread may be in a send or receive on it right now,
  // which this ends at once (and a late reply can never be read from it).
  if (worker.conn) worker.conn->abort();
  worker.conn.reset();
  if (worker.state != WorkerState::kDown) spdlog::warn("coordinator: {} is down: {}", worker.label, reason);
  worker.state = WorkerState::kDown;
  worker.down_reason = worker.last_error = reason;
  worker.rejoin_error.clear();
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
                                    [&](int w) { return workers_[static_cast<size_t>(w)]->state == WorkerState::kUp; });
      if (!live) missing.push_back(static_cast<int64_t>(e));
    }
    if (!missing.empty()) {
      uncovered += (uncovered.empty() ? "" : "; ") + std::string("layer ") + std::to_string(layer) +
                   " experts " + id_ranges(missing);
    }
  }
  if (!uncovered.empty()) fail_unavailable(why + "; no live replica holds " + uncovered);
}

void ClusterDispatcher::waiting(Worker& worker, uint32_t rows) {
  int64_t none = 0;
  worker.waiting_since.compare_exchange_strong(none, ticks(Clock::now()));
  if (rows > worker.waiting_rows.load()) worker.waiting_rows = rows;
}

void ClusterDispatcher::progressed(size_t w) {
  // A reply came (the worker lives: the countdown restarts for the next one), or the worker
  // failed (nothing is awaited from it any more).
  Worker& worker = *workers_[w];
  const std::deque<Batch>& queue = inflight_[w];
  if (queue.empty()) {
    worker.waiting_since = 0;
    worker.waiting_rows = 0;
    return;
  }
  worker.waiting_since = ticks(Clock::now());
  worker.waiting_rows = queue.front().request.num_rows;
}

void ClusterDispatcher::send_request(size_t w, Batch& batch) {
  Worker& worker = *workers_[w];
  const PendingLayer& p = *batch.pending;
  LayerRequest& req = batch.request;
  req.request_id = next_request_id_++;
  req.layer = p.layer;
  req.hidden_size = p.hidden_size;
  req.num_rows = static_cast<uint32_t>(batch.rows.size());
  // The rows go from the caller's hidden states straight into the frame (req.hidden stays
  // empty: the batch keeps the request's ids and assignments only).
  // A staged prefetch hint rides on this request (the worker starts it while computing).
  PrefetchHintMsg& staged = staged_hints_[w];
  const PrefetchHintMsg* prefetch = staged.experts.empty() ? nullptr : &staged;
  const Frame frame = encode_layer_request_rows({req.request_id, req.layer, req.hidden_size, prefetch}, p.hidden,
                                                batch.rows, req.assignments);
  staged = {};
  {
    // Marked down by its health thread since this round chose it: fail over like any
    // send error.
    std::lock_guard<std::mutex> lock(stats_mutex_);
    if (!worker.conn) fail_unavailable("not connected" + (worker.last_error.empty() ? "" : ": " + worker.last_error));
    batch.conn = worker.conn;
  }
  waiting(worker, req.num_rows);
  batch.sent_at = Clock::now();
  const uint64_t out = batch.conn->send(frame, request_timeout_);
  std::lock_guard<std::mutex> lock(stats_mutex_);
  worker.requests += 1;
  worker.bytes_out += out;
  worker.layer_bytes_out += out;
}

void ClusterDispatcher::receive_reply(Worker& worker, Batch& batch) {
  const PendingLayer& p = *batch.pending;
  // Called once the reply has begun to arrive; the rest of it within the request's time
  // (a worker frozen mid-frame is aborted by its health thread before that).
  FrameBody body = batch.conn->receive(std::max(ms_until(batch.sent_at + request_timeout_), milliseconds(1)));
  // From when the worker could start on it: a pipelined request waits for the one before.
  const auto now = Clock::now();
  const double rtt_ms =
      std::chrono::duration<double, std::milli>(now - std::max(batch.sent_at, worker.last_reply_at)).count();
  worker.last_reply_at = now;
  {
    std::lock_guard<std::mutex> lock(stats_mutex_);
    worker.bytes_in += body.bytes + 4;
    worker.layer_bytes_in += body.bytes + 4;
  }
  // Read in place: each partial-sum row is added from the frame straight into the caller's sums.
  const LayerResponseView reply = decode_layer_response_view(std::move(body));
  if (reply.request_id != batch.request.request_id) {
    fail_protocol("reply to request " + std::to_string(reply.request_id) +
                  ", expected " + std::to_string(batch.request.request_id));
  }
  if (!reply.error.empty()) fail_unavailable(reply.error);
  check_partial_sums(batch, reply.outputs, p.hidden_size);
  // Nothing below throws: a reply is added whole or not at all, so a worker failed after
  // this point has no share left to resend (its batch is popped by the caller).
  if (!p.abandoned) {
    for (size_t r = 0; r < batch.rows.size(); ++r) {
      add_fixed_rows(p.sums + size_t{batch.rows[r]} * p.hidden_size, &reply.outputs[r * p.hidden_size],
                     p.hidden_size);
    }
    warn_saturated_once(reply.stats.saturated, "layer " + std::to_string(p.layer) + " (" + worker.label + ")");
  }
  if (metrics_) {
    metrics_->worker_rpc(worker.spec.name, rtt_ms / 1000.0);
    // The worker's own tier counts for this request (hits + misses = experts computed,
    // checked by the decoder); a failed-over resend counts on the replica that served it.
    const LayerStats& st = reply.stats;
    metrics_->expert_stats(worker.spec.name, st.hits, st.misses, st.bytes_read);
  }
  std::lock_guard<std::mutex> lock(stats_mutex_);
  worker.rtt.add(rtt_ms);
  worker.rtt_by_size[rtt_size_class(batch.request.num_rows)].add(rtt_ms);
  worker.last_seen = Clock::now();
}

void ClusterDispatcher::check_partial_sums(const Batch& batch, std::span<const int64_t> sums, uint32_t hidden_size) {
  const size_t expected = batch.rows.size() * size_t{hidden_size};
  if (sums.size() != expected) {
    fail_protocol("layerResponse.outputs has " + std::to_string(sums.size()) + " values, expected numRows " +
                  std::to_string(batch.rows.size()) + " * hidden_size " + std::to_string(hidden_size));
  }
  // A row's value can only come from its own terms: anything larger is not a sum of them
  // and could overflow the total.
  std::vector<uint32_t> terms(batch.rows.size(), 0);
  for (const ExpertAssignment& a : batch.request.assignments) ++terms[a.row];
  for (size_t r = 0; r < batch.rows.size(); ++r) {
    const size_t bad = first_out_of_range(sums.data() + r * hidden_size, hidden_size, terms[r]);
    if (bad != hidden_size) {
      fail_protocol("layerResponse.outputs row " + std::to_string(r) + " value " + std::to_string(bad) +
                    " is out of range for a sum of " + std::to_string(terms[r]) + " terms");
    }
  }
}

void ClusterDispatcher::fail_worker(size_t w, const Error& e) {
  Worker& worker = *workers_[w];
  std::deque<Batch>& queue = inflight_[w];
  const FrameConnection* conn = queue.empty() ? nullptr : queue.front().conn.get();
  const uint32_t layer = queue.empty() ? 0 : queue.front().pending->layer;
  // An aborted connection's own error ("was aborted") is not why: the abort's reason is.
  std::string why = e.message();
  if (conn != nullptr && conn->aborted()) {
    std::lock_guard<std::mutex> lock(stats_mutex_);
    if (!worker.down_reason.empty()) why = worker.down_reason;
  }
  const std::string reason = "layer " + std::to_string(layer) + ": " + why;
  mark_down(worker, conn, reason);
  {
    std::lock_guard<std::mutex> lock(stats_mutex_);
    ++worker.failovers;
    // Marked down by its health thread first (a probe): say which layer it failed, too.
    if (!worker.conn) {
      worker.down_reason = reason;
      worker.last_error = reason + (worker.rejoin_error.empty() ? "" : "; rejoin: " + worker.rejoin_error);
    }
  }
  // The same event in /metrics: one failed request, one failover (counted where
  // worker.failovers is, so the exported counter and /cluster/status agree).
  if (metrics_) {
    metrics_->worker_error(worker.spec.name);
    metrics_->failover(worker.spec.name);
  }
  // Every layer it had requests of (pipelined: up to kMaxLayersInFlight) resends them.
  std::map<PendingLayer*, size_t> resent;
  for (const Batch& b : queue) {
    PendingLayer& p = *b.pending;
    if (!p.failed[w]) p.failures.push_back(worker.label + ": " + why);
    p.failed[w] = true;
    --p.outstanding;
    if (!p.abandoned) p.retry.insert(p.retry.end(), b.origin.begin(), b.origin.end());
    resent[&p] += b.origin.size();
  }
  queue.clear();
  progressed(w);
  for (const auto& [p, n] : resent) {
    if (p->abandoned) continue;
    spdlog::warn("coordinator: layer {}: {} failed ({}); resending its {} assignments to replicas", p->layer,
                 worker.label, why, n);
  }
  collect_finished();
}

void ClusterDispatcher::fail_uncovered(PendingLayer& p, const std::vector<int64_t>& experts) {
  std::string owners;
  {
    std::lock_guard<std::mutex> lock(stats_mutex_);
    std::vector<int> seen;
    for (int64_t e : experts) {
      for (int w : (*p.owners)[static_cast<size_t>(e)]) {
        if (std::find(seen.begin(), seen.end(), w) != seen.end()) continue;
        seen.push_back(w);
        const Worker& worker = *workers_[static_cast<size_t>(w)];
        owners += (owners.empty() ? "" : "; ") + worker.label + " " + worker_state_name(worker.state) +
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
  // Requests still in flight to other workers are read (and dropped) in their turn, so
  // their replies are never taken for another layer's; the error is not held back for
  // them. The caller's forward pass ends here, so every layer it began goes too.
  drop_unfinished();
  fail_unavailable(message);
}

void ClusterDispatcher::send_round(PendingLayer& p, const std::vector<uint32_t>& which) {
  // Usable replicas: up ones first; a suspect one (probed, reply late) only when no replica
  // of an expert is up; never one that failed in this layer.
  std::vector<int> rank(workers_.size(), 0);
  {
    std::lock_guard<std::mutex> lock(stats_mutex_);
    for (size_t w = 0; w < workers_.size(); ++w) {
      const WorkerState state = workers_[w]->state;
      rank[w] = p.failed[w] ? 0 : state == WorkerState::kUp ? 2 : state == WorkerState::kSuspect ? 1 : 0;
    }
  }
  // Per expert, ascending: the best-ranked live replica with the fewest assignments so far
  // in this round, ties to the lower index. Deterministic, and the bytes do not depend on
  // it: every replica computes an expert's rows identically and the combine is the caller's.
  std::map<uint32_t, size_t> count;  // expert -> assignments of it in `which`
  for (uint32_t i : which) ++count[p.assignments[i].expert];
  std::vector<size_t> load(workers_.size(), 0);
  std::map<uint32_t, int> chosen;
  std::vector<int64_t> uncovered;
  for (const auto& [expert, n] : count) {
    int best = -1;
    for (int w : (*p.owners)[expert]) {
      const size_t u = static_cast<size_t>(w);
      if (rank[u] == 0) continue;
      if (best < 0 || rank[u] > rank[static_cast<size_t>(best)] ||
          (rank[u] == rank[static_cast<size_t>(best)] && load[u] < load[static_cast<size_t>(best)])) {
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
  if (!uncovered.empty()) fail_uncovered(p, uncovered);

  // Group by chosen worker in assignment order, remapping rows to each worker's own rows.
  std::vector<Batch> batches(workers_.size());
  for (Batch& b : batches) b.pending = &p;
  for (uint32_t i : which) {
    const ExpertAssignment& a = p.assignments[i];
    Batch& b = batches[static_cast<size_t>(chosen.at(a.expert))];
    if (b.local_row.empty()) b.local_row.assign(p.num_rows, UINT32_MAX);
    if (b.local_row[a.row] == UINT32_MAX) {
      b.local_row[a.row] = static_cast<uint32_t>(b.rows.size());
      b.rows.push_back(a.row);
    }
    b.request.assignments.push_back({b.local_row[a.row], a.expert, a.weight});
    b.origin.push_back(i);
  }
  // Every request goes out before any reply is read, so the workers compute in parallel.
  for (size_t w = 0; w < workers_.size(); ++w) {
    if (batches[w].origin.empty()) continue;
    inflight_[w].push_back(std::move(batches[w]));
    ++p.outstanding;
    try {
      send_request(w, inflight_[w].back());
    } catch (const Error& e) {
      fail_worker(w, e);
    }
  }
}

void ClusterDispatcher::read_replies() {
  // Every worker's next reply at once, read in the order they arrive: one slow or frozen
  // worker neither delays reading the others nor inflates their round trips.
  std::vector<size_t> who;
  std::vector<FrameConnection*> conns;
  auto deadline = Clock::time_point::max();
  for (size_t w = 0; w < workers_.size(); ++w) {
    if (inflight_[w].empty()) continue;
    const Batch& front = inflight_[w].front();
    who.push_back(w);
    conns.push_back(front.conn.get());
    deadline = std::min(deadline, front.sent_at + request_timeout_);
  }
  for (size_t i : wait_readable(conns, ms_until(deadline))) {
    const size_t w = who[i];
    try {
      Batch& batch = inflight_[w].front();
      receive_reply(*workers_[w], batch);
      --batch.pending->outstanding;
      inflight_[w].pop_front();
      progressed(w);
    } catch (const Error& e) {
      fail_worker(w, e);
    }
  }
  // A worker that answers probes but not the request (alive, hung or very slow) fails when
  // its request's time is up.
  const auto now = Clock::now();
  for (size_t w : who) {
    if (inflight_[w].empty() || now < inflight_[w].front().sent_at + request_timeout_) continue;
    fail_worker(w, Error(ErrorCategory::kUnavailable,
                         "timed out after " + std::to_string(request_timeout_.count()) +
                             " ms waiting for a layer reply from " + workers_[w]->label));
  }
}

void ClusterDispatcher::begin_layer(uint32_t layer, const float* hidden, uint32_t num_rows,
                                    uint32_t hidden_size,
                                    const std::vector<ExpertAssignment>& assignments,
                                    int64_t* sums) {
  if (unfinished() >= kMaxLayersInFlight) {
    spdlog::warn("coordinator: {} layers begun and not finished; dropping them", unfinished());
    drop_unfinished();
  }
  const auto found = placement_.find(layer);
  if (found == placement_.end()) {
    fail_invalid("layer " + std::to_string(layer) + " is not a MoE layer of the placement map");
  }
  std::vector<uint32_t> terms(num_rows, 0);
  for (size_t i = 0; i < assignments.size(); ++i) {
    const ExpertAssignment& a = assignments[i];
    if (a.row >= num_rows) {
      fail_invalid("assignment " + std::to_string(i) + ": row " + std::to_string(a.row) +
                   " >= num_rows " + std::to_string(num_rows));
    }
    if (++terms[a.row] > kMaxTermsPerRow) {
      fail_invalid("assignment " + std::to_string(i) + ": row " + std::to_string(a.row) + " has more than " +
                   std::to_string(kMaxTermsPerRow) + " assignments (the fixed-point sum's headroom)");
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
  p->sums = sums;
  {
    std::lock_guard<std::mutex> lock(stats_mutex_);
    token_layers_ += num_rows;
  }
  std::fill_n(sums, size_t{num_rows} * hidden_size, int64_t{0});
  p->owners = &found->second;
  p->failed.assign(workers_.size(), false);
  layers_.push_back(std::move(p));
  std::vector<uint32_t> all(assignments.size());
  std::iota(all.begin(), all.end(), 0u);
  send_round(*layers_.back(), all);
  send_staged_hints();  // the workers without a part in this layer
}

size_t ClusterDispatcher::unfinished() const {
  return static_cast<size_t>(std::count_if(layers_.begin(), layers_.end(), [](const auto& p) { return !p->abandoned; }));
}

void ClusterDispatcher::drop_unfinished() {
  for (PrefetchHintMsg& hint : staged_hints_) hint = {};
  for (auto& p : layers_) {
    if (!p->abandoned) spdlog::debug("coordinator: dropped an unfinished layer {}", p->layer);
    p->abandoned = true;
    p->retry.clear();
  }
  collect_finished();
}

void ClusterDispatcher::collect_finished() {
  // An abandoned layer lives while its requests are out: their batches point at it.
  std::erase_if(layers_, [](const auto& p) { return p->abandoned && p->outstanding == 0; });
}

void ClusterDispatcher::finish_layer() {
  const auto oldest = std::find_if(layers_.begin(), layers_.end(), [](const auto& p) { return !p->abandoned; });
  if (oldest == layers_.end()) fail_internal("finish_layer without begin_layer");
  PendingLayer& p = **oldest;
  // What a failed worker had is resent to other replicas at once, while the rest of the
  // replies keep arriving: the newer layer's too, so its resend does not wait for this one.
  for (;;) {
    bool resent = false;
    for (size_t i = 0; i < layers_.size(); ++i) {
      PendingLayer& q = *layers_[i];
      if (q.abandoned || q.retry.empty()) continue;
      std::vector<uint32_t> retry = std::move(q.retry);
      q.retry.clear();
      std::sort(retry.begin(), retry.end());
      send_round(q, retry);  // throws when an expert has no live replica
      resent = true;
    }
    if (resent) continue;
    if (p.outstanding == 0) break;
    read_replies();
  }
  layers_.erase(std::find_if(layers_.begin(), layers_.end(), [&](const auto& q) { return q.get() == &p; }));
  collect_finished();
}

void ClusterDispatcher::hint_layer(uint32_t layer, const std::vector<uint32_t>& experts) {
  send_staged_hints();  // one staged hint per worker: an older one goes alone
  const auto found = placement_.find(layer);
  if (found == placement_.end()) return;
  const std::vector<std::vector<int>>& owners = found->second;
  // Every replica of a predicted expert gets the hint: which one serves the request is
  // decided when it is sent (the first live one), and a spare warm copy helps a failover.
  for (uint32_t e : experts) {
    if (e >= owners.size()) continue;
    for (int w : owners[e]) staged_hints_.at(static_cast<size_t>(w)).experts.push_back(e);
  }
  for (PrefetchHintMsg& hint : staged_hints_) hint.layer = layer;
}

void ClusterDispatcher::send_staged_hints() {
  for (size_t w = 0; w < workers_.size(); ++w) {
    if (staged_hints_[w].experts.empty()) continue;
    const PrefetchHintMsg hint = std::move(staged_hints_[w]);
    staged_hints_[w] = {};
    send_hint(w, hint);
  }
}

void ClusterDispatcher::send_hint(size_t w, const PrefetchHintMsg& hint) {
  Worker& worker = *workers_[w];
  std::shared_ptr<FrameConnection> conn;
  {
    // No reconnect for a hint: a broken connection is the next request's to report.
    std::lock_guard<std::mutex> lock(stats_mutex_);
    if (!worker.conn || !worker.conn->is_open()) return;
    conn = worker.conn;
  }
  // It has no reply, so a layer request in flight still gets the next frame back. A send
  // that blocks (the worker stopped reading) is watched like a late reply.
  waiting(worker, 0);
  try {
    const uint64_t out = conn->send(encode_prefetch_hint(hint), request_timeout_);
    std::lock_guard<std::mutex> lock(stats_mutex_);
    worker.bytes_out += out;
  } catch (const Error& e) {
    spdlog::debug("coordinator: prefetch hint to {} dropped: {}", worker.label, e.message());
  }
  if (inflight_[w].empty()) {
    worker.waiting_since = 0;
    worker.waiting_rows = 0;
  }
}

std::vector<WorkerStatus> ClusterDispatcher::status() const {
  std::lock_guard<std::mutex> lock(stats_mutex_);
  std::vector<double> p50;
  std::vector<size_t> samples;
  for (const auto& w : workers_) {
    p50.push_back(w->rtt.percentile(0.50));
    samples.push_back(w->state != WorkerState::kDown ? w->rtt.size() : 0);  // a down worker is not judged
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
    s.layer_bytes_out = w.layer_bytes_out;
    s.layer_bytes_in = w.layer_bytes_in;
    s.token_layers = token_layers_;
    s.moe_layers = static_cast<uint32_t>(placement_.size());
    s.failovers = w.failovers;
    s.rejoins = w.rejoins;
    s.last_seen_ms = w.last_seen ? std::chrono::duration<double, std::milli>(now - *w.last_seen).count() : -1;
    s.slow = !slow[i].empty();
    s.slow_reason = slow[i];
    s.last_error = w.last_error;
    if (w.ram_slots) s.experts_by_tier = split_by_tier(w.experts_held, *w.ram_slots, vram_experts_of(w.residency));
    s.tier_layers = w.tier_layers;
    s.residency = w.residency;
    if (w.last_probe_ok) s.residency_age_ms = std::chrono::duration<double, std::milli>(now - *w.last_probe_ok).count();
    out.push_back(std::move(s));
  }
  return out;
}

}  // namespace charm
