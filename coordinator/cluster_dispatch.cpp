#include "coordinator/cluster_dispatch.h"

#include <algorithm>
#include <cstring>
#include <optional>
#include <thread>

#include <spdlog/spdlog.h>

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

struct ClusterDispatcher::Worker {
  WorkerSpec spec;
  int index = 0;
  std::string address;  // host:port
  std::string label;    // "worker 'w1' (127.0.0.1:5001)" for messages
  std::unique_ptr<FrameConnection> conn;
  // Statistics, guarded by stats_mutex_.
  std::string state = "down";
  uint64_t experts_held = 0;
  uint64_t requests = 0;
  uint64_t bytes_out = 0;
  uint64_t bytes_in = 0;
  RttWindow rtt;
};

// One worker's share of a layer.
struct ClusterDispatcher::Batch {
  std::vector<uint32_t> local_row;  // global row -> row in request (UINT32_MAX: unused)
  std::vector<uint32_t> rows;       // request row -> global row
  std::vector<uint32_t> origin;     // request assignment -> index in the caller's list
  ExpertRequest request;
  Clock::time_point sent_at;
  bool in_flight = false;
  std::optional<Error> error;
};

ClusterDispatcher::ClusterDispatcher(const Topology& topology,
                                     std::map<int64_t, std::vector<int>> placement,
                                     std::string model_fingerprint)
    : model_fingerprint_(std::move(model_fingerprint)),
      placement_(std::move(placement)),
      connect_timeout_(topology.connect_timeout_ms),
      request_timeout_(topology.request_timeout_ms),
      startup_timeout_(topology.startup_timeout_ms) {
  for (size_t i = 0; i < topology.workers.size(); ++i) {
    auto worker = std::make_unique<Worker>();
    worker->spec = topology.workers[i];
    worker->index = static_cast<int>(i);
    worker->address = worker->spec.host + ":" + std::to_string(worker->spec.port);
    worker->label = "worker '" + worker->spec.name + "' (" + worker->address + ")";
    workers_.push_back(std::move(worker));
  }
  for (auto& worker : workers_) connect_at_startup(*worker);
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

ClusterDispatcher::~ClusterDispatcher() = default;

void ClusterDispatcher::connect(Worker& worker) {
  worker.conn.reset();
  auto conn = FrameConnection::connect(worker.spec.host, worker.spec.port, connect_timeout_,
                                       "worker '" + worker.spec.name + "'");
  HelloMsg hello;
  hello.model_fingerprint = model_fingerprint_;
  hello.client_name = "coordinator";
  uint64_t out = conn->send(encode_hello(hello), connect_timeout_);
  FrameBody body = conn->receive(connect_timeout_);
  HelloReplyMsg reply = decode_as<HelloReplyMsg>(body);
  if (!reply.ok) {
    fail_protocol(worker.label + " rejected the handshake: " + reply.error);
  }
  if (reply.protocol_version != kProtocolVersion) {
    fail_protocol(worker.label + " speaks protocol version " +
                  std::to_string(reply.protocol_version) + ", the coordinator " +
                  std::to_string(kProtocolVersion));
  }
  if (reply.model_fingerprint != model_fingerprint_) {
    fail_protocol(worker.label + " serves model fingerprint " + reply.model_fingerprint +
                  ", the coordinator has " + model_fingerprint_);
  }
  // The worker must hold what the coordinator's placement sends it (same topology file).
  uint64_t held = 0;
  for (const auto& [layer, experts] : reply.held) held += experts.size();
  for (const auto& [layer, owners] : placement_) {
    const auto it = reply.held.find(static_cast<uint32_t>(layer));
    for (size_t e = 0; e < owners.size(); ++e) {
      if (owners[e] != worker.index) continue;
      if (it == reply.held.end() ||
          !std::binary_search(it->second.begin(), it->second.end(), static_cast<uint32_t>(e))) {
        fail_protocol(worker.label + " does not hold expert " + std::to_string(e) + " of layer " +
                      std::to_string(layer) + ", which the placement assigns it");
      }
    }
  }
  std::lock_guard<std::mutex> lock(stats_mutex_);
  worker.conn = std::move(conn);
  worker.state = "up";
  worker.experts_held = held;
  worker.bytes_out += out;
  worker.bytes_in += body.bytes + 4;
  spdlog::info("coordinator: connected to {} ({} experts)", worker.label, held);
}

void ClusterDispatcher::mark_down(Worker& worker) {
  if (worker.conn) worker.conn->close();
  worker.conn.reset();
  std::lock_guard<std::mutex> lock(stats_mutex_);
  worker.state = "down";
}

void ClusterDispatcher::send_request(Worker& worker, Batch& batch, uint32_t layer,
                                     uint32_t hidden_size, const float* hidden) {
  ExpertRequest& req = batch.request;
  req.request_id = next_request_id_++;
  req.layer = layer;
  req.hidden_size = hidden_size;
  req.num_rows = static_cast<uint32_t>(batch.rows.size());
  req.hidden.resize(size_t{req.num_rows} * hidden_size);
  for (size_t r = 0; r < batch.rows.size(); ++r) {
    std::memcpy(&req.hidden[r * hidden_size], hidden + size_t{batch.rows[r]} * hidden_size,
                hidden_size * sizeof(float));
  }
  const Frame frame = encode_layer_request(req);
  if (!worker.conn || !worker.conn->is_open()) connect(worker);  // after an earlier failure
  batch.sent_at = Clock::now();
  const uint64_t out = worker.conn->send(frame, request_timeout_);
  batch.in_flight = true;
  std::lock_guard<std::mutex> lock(stats_mutex_);
  worker.requests += 1;
  worker.bytes_out += out;
}

void ClusterDispatcher::receive_reply(Worker& worker, Batch& batch, uint32_t layer,
                                      uint32_t hidden_size, float* outputs) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
      batch.sent_at + request_timeout_ - Clock::now());
  FrameBody body = worker.conn->receive(std::max(left, std::chrono::milliseconds(1)));
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
  const size_t expected = batch.origin.size() * size_t{hidden_size};
  if (reply.response.outputs.size() != expected) {
    fail_protocol("layerResponse.outputs has " + std::to_string(reply.response.outputs.size()) +
                  " floats, expected " + std::to_string(batch.origin.size()) +
                  " assignments * hidden_size " + std::to_string(hidden_size));
  }
  for (size_t j = 0; j < batch.origin.size(); ++j) {
    std::memcpy(outputs + size_t{batch.origin[j]} * hidden_size,
                &reply.response.outputs[j * hidden_size], hidden_size * sizeof(float));
  }
  std::lock_guard<std::mutex> lock(stats_mutex_);
  worker.rtt.add(rtt_ms);
}

void ClusterDispatcher::fail_batch(size_t w, Batch& batch, const Error& e) {
  batch.error = Error(e.category(),
                      workers_[w]->label + ", layer " + std::to_string(pending_layer_) + ": " + e.message());
  mark_down(*workers_[w]);
}

void ClusterDispatcher::begin_layer(uint32_t layer, const float* hidden, uint32_t num_rows,
                                    uint32_t hidden_size,
                                    const std::vector<ExpertAssignment>& assignments,
                                    float* outputs) {
  if (has_pending_) {
    // The caller threw between begin and finish: read the stale replies so every
    // connection is back in step, and drop them.
    try {
      finish_layer();
    } catch (const Error& e) {
      spdlog::warn("coordinator: dropped an unfinished layer: {}", e.message());
    }
  }
  const auto found = placement_.find(layer);
  if (found == placement_.end()) {
    fail_invalid("layer " + std::to_string(layer) + " is not a MoE layer of the placement map");
  }
  const std::vector<int>& owners = found->second;

  // Group the batch-union by owning worker, remapping rows to each worker's own rows.
  std::vector<Batch> batches(workers_.size());
  for (size_t i = 0; i < assignments.size(); ++i) {
    const ExpertAssignment& a = assignments[i];
    if (a.row >= num_rows) {
      fail_invalid("assignment " + std::to_string(i) + ": row " + std::to_string(a.row) +
                   " >= num_rows " + std::to_string(num_rows));
    }
    if (a.expert >= owners.size()) {
      fail_invalid("assignment " + std::to_string(i) + ": expert " + std::to_string(a.expert) +
                   " >= num_experts " + std::to_string(owners.size()) + " on layer " +
                   std::to_string(layer));
    }
    Batch& b = batches.at(static_cast<size_t>(owners[a.expert]));
    if (b.local_row.empty()) b.local_row.assign(num_rows, UINT32_MAX);
    if (b.local_row[a.row] == UINT32_MAX) {
      b.local_row[a.row] = static_cast<uint32_t>(b.rows.size());
      b.rows.push_back(a.row);
    }
    b.request.assignments.push_back({b.local_row[a.row], a.expert});
    b.origin.push_back(static_cast<uint32_t>(i));
  }

  pending_ = std::move(batches);
  pending_layer_ = layer;
  pending_hidden_size_ = hidden_size;
  pending_outputs_ = outputs;
  has_pending_ = true;
  // Every request goes out before any reply is read, so the workers compute in parallel.
  for (size_t w = 0; w < workers_.size(); ++w) {
    if (pending_[w].origin.empty()) continue;
    try {
      send_request(*workers_[w], pending_[w], layer, hidden_size, hidden);
    } catch (const Error& e) {
      fail_batch(w, pending_[w], e);
    }
  }
}

void ClusterDispatcher::finish_layer() {
  if (!has_pending_) fail_internal("finish_layer without begin_layer");
  has_pending_ = false;
  std::vector<Batch> batches = std::move(pending_);
  pending_.clear();
  for (size_t w = 0; w < workers_.size(); ++w) {
    if (!batches[w].in_flight || batches[w].error) continue;
    try {
      receive_reply(*workers_[w], batches[w], pending_layer_, pending_hidden_size_, pending_outputs_);
    } catch (const Error& e) {
      // A reply with an error field leaves the stream in step; anything else does not.
      if (e.category() == ErrorCategory::kUnavailable && workers_[w]->conn &&
          workers_[w]->conn->is_open()) {
        batches[w].error = Error(e.category(), workers_[w]->label + ", layer " +
                                                   std::to_string(pending_layer_) + ": " + e.message());
      } else {
        fail_batch(w, batches[w], e);
      }
    }
  }
  for (const Batch& b : batches) {
    if (!b.error) continue;
    if (b.error->category() == ErrorCategory::kProtocol) throw *b.error;
    fail_unavailable(b.error->message());
  }
}

void ClusterDispatcher::hint_layer(uint32_t layer, const std::vector<uint32_t>& experts) {
  const auto found = placement_.find(layer);
  if (found == placement_.end()) return;
  const std::vector<int>& owners = found->second;
  std::vector<PrefetchHintMsg> hints(workers_.size());
  for (uint32_t e : experts) {
    if (e < owners.size()) hints.at(static_cast<size_t>(owners[e])).experts.push_back(e);
  }
  for (size_t w = 0; w < workers_.size(); ++w) {
    Worker& worker = *workers_[w];
    // No reconnect for a hint: a broken connection is the next request's to report.
    if (hints[w].experts.empty() || !worker.conn || !worker.conn->is_open()) continue;
    hints[w].layer = layer;
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
  std::vector<WorkerStatus> out;
  for (const auto& w : workers_) {
    WorkerStatus s;
    s.name = w->spec.name;
    s.address = w->address;
    s.state = w->state;
    s.experts_held = w->experts_held;
    s.requests = w->requests;
    s.rtt_p50_ms = w->rtt.percentile(0.50);
    s.rtt_p99_ms = w->rtt.percentile(0.99);
    s.bytes_out = w->bytes_out;
    s.bytes_in = w->bytes_in;
    out.push_back(std::move(s));
  }
  return out;
}

}  // namespace charm
