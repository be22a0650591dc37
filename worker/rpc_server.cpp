#include "worker/rpc_server.h"

#include <algorithm>
#include <optional>
#include <type_traits>

#include <spdlog/spdlog.h>

#include "common/cluster_auth.h"
#include "common/error.h"
#include "common/secret.h"

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

size_t WorkerServer::connection_count() {
  std::lock_guard<std::mutex> lock(connections_mutex_);
  return connections_.size();
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
    if (connection_count() >= options_.max_connections) {
      spdlog::warn("worker {}: refusing {}: already serving {} connections", options_.worker_name,
                   conn->peer(), options_.max_connections);
      try {
        conn->send(encode_error("worker '" + options_.worker_name + "' is serving its maximum of " +
                                std::to_string(options_.max_connections) + " connections"),
                   std::chrono::milliseconds(100));
      } catch (const Error&) {
      }
      continue;
    }
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

// One connection's progress through the handshake.
struct WorkerServer::Session {
  bool authenticated = false;  // no secret: true from the start
  bool hello_ok = false;       // a hello matched (and, with a secret, was authenticated)
  std::optional<HelloMsg> pending_hello;  // sent authChallenge, awaiting authResponse
  std::string worker_nonce;
};

void WorkerServer::serve_connection(FrameConnection& conn) {
  spdlog::debug("worker {}: {} connected", options_.worker_name, conn.peer());
  Session session;
  session.authenticated = options_.shared_secret.empty();
  // Until a hello succeeds the peer is a stranger: small frames, and a deadline.
  conn.set_max_frame_bytes(std::min(kHandshakeMaxFrameBytes, options_.max_frame_bytes));
  const auto handshake_deadline = std::chrono::steady_clock::now() + options_.handshake_timeout;
  // Settled: the peer is authenticated (always, without a secret) and has had a message
  // answered; from then on it may stay idle as long as it likes.
  bool settled = false;
  try {
    while (!stopping_ && conn.is_open()) {
      WireMessage message;
      try {
        auto timeout = kForever;
        if (!settled) {
          timeout = std::chrono::duration_cast<std::chrono::milliseconds>(
              handshake_deadline - std::chrono::steady_clock::now());
          if (timeout.count() <= 0) fail_unavailable("no completed handshake within the handshake timeout");
        }
        FrameBody body = conn.receive(timeout, &stopping_);
        bytes_in_ += body.bytes + 4;
        message = decode_message(body, conn.max_frame_bytes());
      } catch (const Error& e) {
        if (e.category() != ErrorCategory::kProtocol) {
          // Peer gone, stopping, or a stranger that never completed its hello.
          if (!settled && !stopping_ && std::chrono::steady_clock::now() >= handshake_deadline) {
            spdlog::warn("worker {}: dropped {}: no completed handshake within {} ms", options_.worker_name,
                         conn.peer(), options_.handshake_timeout.count());
          }
          break;
        }
        spdlog::warn("worker {}: malformed frame from {}: {}; closing that connection",
                     options_.worker_name, conn.peer(), e.message());
        if (conn.is_open()) send(conn, encode_error(e.message()));
        break;
      }
      if (!handle(conn, message, session)) break;
      settled = settled || session.authenticated;
      if (session.hello_ok) conn.set_max_frame_bytes(options_.max_frame_bytes);
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
  reply.identities = service_.identities();
  reply.lossy_form = service_.lossy_form();
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

bool WorkerServer::refuse(FrameConnection& conn, const std::string& text) {
  send(conn, encode_error(text));
  return false;
}

bool WorkerServer::handle_auth(FrameConnection& conn, const AuthResponseMsg& response, Session& session) {
  if (!session.pending_hello) {
    spdlog::warn("worker {}: {} sent authResponse without a challenge; closing that connection",
                 options_.worker_name, conn.peer());
    return refuse(conn, "worker '" + options_.worker_name + "' sent no authChallenge to answer");
  }
  const HelloMsg hello = std::move(*session.pending_hello);
  session.pending_hello.reset();
  const AuthTranscript transcript{session.worker_nonce, hello.client_nonce, hello.client_name,
                                  options_.worker_name};
  if (!constant_time_equal(response.proof, auth_proof(options_.shared_secret, AuthRole::kClient, transcript))) {
    spdlog::error("worker {}: REJECTED {} ({}): wrong proof of the cluster's shared secret; dropping the peer",
                  options_.worker_name, hello.client_name, conn.peer());
    return refuse(conn, "authentication failed: the proof does not match worker '" + options_.worker_name +
                            "''s shared secret");
  }
  session.authenticated = true;
  HelloReplyMsg reply = answer_hello(hello, conn.peer());
  reply.worker_proof = auth_proof(options_.shared_secret, AuthRole::kWorker, transcript);
  session.hello_ok = reply.ok;
  send(conn, encode_hello_reply(reply));
  return true;
}

LayerResponseMsg WorkerServer::answer_layer(const ExpertRequest& request, const Session& session) {
  LayerResponseMsg response;
  response.response.request_id = request.request_id;
  if (!session.hello_ok) {
    response.error = "worker '" + options_.worker_name + "' needs a successful hello before layer requests";
    return response;
  }
  try {
    check_layer_request(request, options_.limits);
    response.response = service_.run(request);
    response.response.request_id = request.request_id;
  } catch (const std::exception& e) {
    response.error = "worker '" + options_.worker_name + "', layer " + std::to_string(request.layer) + ": " + e.what();
    response.response.outputs.clear();
    response.response.stats = {};
    spdlog::warn("worker {}: request {} failed: {}", options_.worker_name, request.request_id, response.error);
  }
  return response;
}

bool WorkerServer::handle(FrameConnection& conn, WireMessage& message, Session& session) {
  if (auto* hello = std::get_if<HelloMsg>(&message)) {
    if (!options_.shared_secret.empty() && !session.authenticated) {
      if (session.pending_hello) return refuse(conn, "a second hello before answering the authChallenge");
      session.worker_nonce = random_nonce();
      session.pending_hello = std::move(*hello);
      send(conn, encode_auth_challenge({session.worker_nonce, options_.worker_name}));
      return true;
    }
    HelloReplyMsg reply = answer_hello(*hello, conn.peer());
    session.hello_ok = reply.ok;
    send(conn, encode_hello_reply(reply));
    return true;
  }
  if (auto* response = std::get_if<AuthResponseMsg>(&message)) return handle_auth(conn, *response, session);
  if (!session.authenticated) {
    // With a secret, nothing but the handshake is answered to a stranger.
    spdlog::warn("worker {}: {} sent {} before authenticating; dropping the peer", options_.worker_name,
                 conn.peer(), message_name(message));
    return refuse(conn, "worker '" + options_.worker_name + "' requires the cluster's shared secret: send hello "
                        "and answer its authChallenge first");
  }
  if (auto* request = std::get_if<ExpertRequest>(&message)) {
    if (!debug_delay_elapsed()) return false;  // stopped while "computing": no reply
    LayerResponseMsg response = answer_layer(*request, session);
    ++requests_served_;  // before the reply, for the same reason as in send()
    send(conn, encode_layer_response(response));
    return true;
  }
  if (auto* hint = std::get_if<PrefetchHintMsg>(&message)) {
    // Fire-and-forget: no reply on any path, so the client's reply reading stays in step.
    ++hints_received_;
    if (!session.hello_ok) return true;
    try {
      // Ids out of the model's range never reach the store (the same limits as layerRequest).
      check_prefetch_hint(*hint, options_.limits);
    } catch (const Error& e) {
      spdlog::warn("worker {}: {} sent a prefetch hint it must not: {}; dropped", options_.worker_name, conn.peer(),
                   e.message());
      return true;
    }
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
  return refuse(conn, text);
}

}  // namespace charm
