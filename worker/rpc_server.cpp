#include "worker/rpc_server.h"

#include <algorithm>
#include <type_traits>

#include <spdlog/spdlog.h>

#include "common/error.h"

namespace charm {
namespace {

// How often idle threads look at the stop flag.
constexpr std::chrono::milliseconds kPoll{100};
// A client may stay idle between requests for as long as it likes.
constexpr std::chrono::milliseconds kForever{std::chrono::milliseconds::max()};

}  // namespace

WorkerServer::WorkerServer(WorkerServerOptions options, LayerService& service)
    : options_(std::move(options)), service_(service) {}

WorkerServer::~WorkerServer() { stop(); }

void WorkerServer::start() {
  for (const auto& [layer, experts] : service_.held()) experts_held_ += experts.size();
  listener_ = FrameListener::listen(options_.host, options_.port);
  port_ = listener_->port();
  started_ = std::chrono::steady_clock::now();
  stopping_ = false;
  accept_thread_ = std::thread([this] { accept_loop(); });
  spdlog::info("worker {}: listening on {}:{} ({} experts, model fingerprint {})",
               options_.worker_name, options_.host, port_, experts_held_,
               options_.model_fingerprint);
}

void WorkerServer::stop() {
  stopping_ = true;
  if (accept_thread_.joinable()) accept_thread_.join();
  std::vector<ConnectionThread> connections;
  {
    std::lock_guard<std::mutex> lock(connections_mutex_);
    connections.swap(connections_);
  }
  for (auto& c : connections) c.thread.join();
  listener_.reset();
}

HealthReplyMsg WorkerServer::health() const {
  HealthReplyMsg h;
  h.worker_name = options_.worker_name;
  h.state = "up";
  h.experts_held = experts_held_;
  h.requests_served = requests_served_.load();
  h.bytes_in = bytes_in_.load();
  h.bytes_out = bytes_out_.load();
  h.uptime_ms = static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                          std::chrono::steady_clock::now() - started_)
                                          .count());
  h.protocol_version = kProtocolVersion;
  h.model_fingerprint = options_.model_fingerprint;
  service_.add_tier_stats(h);
  return h;
}

void WorkerServer::reap_finished() {
  std::lock_guard<std::mutex> lock(connections_mutex_);
  for (auto it = connections_.begin(); it != connections_.end();) {
    if (it->finished->load()) {
      it->thread.join();
      it = connections_.erase(it);
    } else {
      ++it;
    }
  }
}

void WorkerServer::accept_loop() {
  while (!stopping_) {
    std::unique_ptr<FrameConnection> conn;
    try {
      conn = listener_->accept(kPoll);
    } catch (const std::exception& e) {
      spdlog::error("worker {}: {}", options_.worker_name, e.what());
      continue;
    }
    reap_finished();
    if (!conn) continue;
    conn->set_max_frame_bytes(options_.max_frame_bytes);
    auto finished = std::make_shared<std::atomic<bool>>(false);
    std::thread thread([this, finished, c = std::shared_ptr<FrameConnection>(std::move(conn))] {
      serve_connection(*c);
      finished->store(true);
    });
    std::lock_guard<std::mutex> lock(connections_mutex_);
    connections_.push_back({std::move(thread), finished});
  }
}

void WorkerServer::send(FrameConnection& conn, const Frame& frame) {
  // Counted before writing, so a client that has read the reply sees it in health.
  bytes_out_ += frame.size();
  conn.send(frame, options_.send_timeout);
}

void WorkerServer::serve_connection(FrameConnection& conn) {
  spdlog::debug("worker {}: {} connected", options_.worker_name, conn.peer());
  bool hello_ok = false;
  try {
    while (!stopping_ && conn.is_open()) {
      WireMessage message;
      try {
        FrameBody body = conn.receive(kForever, &stopping_);
        bytes_in_ += body.bytes + 4;
        message = decode_message(body, options_.max_frame_bytes);
      } catch (const Error& e) {
        if (e.category() != ErrorCategory::kProtocol) break;  // peer gone or stopping
        spdlog::warn("worker {}: malformed frame from {}: {}; closing that connection",
                     options_.worker_name, conn.peer(), e.message());
        if (conn.is_open()) send(conn, encode_error(e.message()));
        break;
      }
      if (!handle(conn, message, hello_ok)) break;
    }
  } catch (const std::exception& e) {
    // A send that failed or anything unforeseen: this connection ends, the worker lives.
    spdlog::warn("worker {}: connection {} ended: {}", options_.worker_name, conn.peer(), e.what());
  }
  conn.close();
  spdlog::debug("worker {}: {} disconnected", options_.worker_name, conn.peer());
}

HelloReplyMsg WorkerServer::answer_hello(const HelloMsg& hello, const std::string& peer) {
  HelloReplyMsg reply;
  reply.worker_name = options_.worker_name;
  reply.model_fingerprint = options_.model_fingerprint;
  reply.held = service_.held();
  if (hello.protocol_version != kProtocolVersion) {
    reply.error = "protocol version mismatch: client '" + hello.client_name + "' speaks " +
                  std::to_string(hello.protocol_version) + ", worker '" +
                  options_.worker_name + "' speaks " + std::to_string(kProtocolVersion);
  } else if (hello.model_fingerprint != options_.model_fingerprint) {
    reply.error = "model fingerprint mismatch: client '" + hello.client_name + "' has " +
                  hello.model_fingerprint + ", worker '" + options_.worker_name + "' has " +
                  options_.model_fingerprint + " (different checkpoints or configs)";
  }
  reply.ok = reply.error.empty();
  if (!reply.ok) {
    spdlog::error("worker {}: REJECTED {} ({}): {}", options_.worker_name, hello.client_name,
                  peer, reply.error);
  } else {
    spdlog::info("worker {}: hello from {} ({})", options_.worker_name, hello.client_name, peer);
  }
  return reply;
}

bool WorkerServer::debug_delay_elapsed() const {
  const auto until = std::chrono::steady_clock::now() + options_.debug_delay;
  while (std::chrono::steady_clock::now() < until) {
    if (stopping_) return false;
    std::this_thread::sleep_for(std::min<std::chrono::steady_clock::duration>(
        std::chrono::milliseconds(5), until - std::chrono::steady_clock::now()));
  }
  return !stopping_ || options_.debug_delay.count() == 0;
}

bool WorkerServer::handle(FrameConnection& conn, WireMessage& message, bool& hello_ok) {
  if (auto* hello = std::get_if<HelloMsg>(&message)) {
    HelloReplyMsg reply = answer_hello(*hello, conn.peer());
    hello_ok = reply.ok;
    send(conn, encode_hello_reply(reply));
    return true;
  }
  if (auto* request = std::get_if<ExpertRequest>(&message)) {
    if (!debug_delay_elapsed()) return false;  // stopped while "computing": no reply
    LayerResponseMsg response;
    response.response.request_id = request->request_id;
    if (!hello_ok) {
      response.error = "worker '" + options_.worker_name +
                       "' needs a successful hello before layer requests";
    } else {
      try {
        response.response = service_.run(*request);
        response.response.request_id = request->request_id;
      } catch (const std::exception& e) {
        response.error = "worker '" + options_.worker_name + "', layer " +
                         std::to_string(request->layer) + ": " + e.what();
        response.response.outputs.clear();
        spdlog::warn("worker {}: request {} failed: {}", options_.worker_name,
                     request->request_id, response.error);
      }
    }
    ++requests_served_;  // before the reply, for the same reason as in send()
    send(conn, encode_layer_response(response));
    return true;
  }
  if (auto* hint = std::get_if<PrefetchHintMsg>(&message)) {
    // Fire-and-forget: no reply on any path, so the client's reply reading stays in step.
    ++hints_received_;
    if (!hello_ok) return true;
    try {
      service_.prefetch(hint->layer, hint->experts);
    } catch (const std::exception& e) {
      spdlog::debug("worker {}: prefetch hint for layer {} dropped: {}", options_.worker_name, hint->layer,
                    e.what());
    }
    return true;
  }
  if (std::holds_alternative<HealthRequestMsg>(message)) {
    send(conn, encode_health_reply(health()));
    return true;
  }
  const std::string text = std::string("worker '") + options_.worker_name + "' does not accept " +
                           message_name(message) + " messages from clients";
  spdlog::warn("worker {}: {} sent {}; closing that connection", options_.worker_name,
               conn.peer(), message_name(message));
  send(conn, encode_error(text));
  return false;
}

}  // namespace charm
