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

// One accepted connection. `handshaken` and `evict_reason` are written under
// connections_mutex_ (`handshaken` by the connection's own thread, which also reads it
// without the lock); `evicted` and `finished` are also read without it.
struct WorkerServer::Connection {
  std::shared_ptr<FrameConnection> conn;
  std::string address;  // the source IP: the per-address budget's key
  std::chrono::steady_clock::time_point accepted;
  std::thread thread;
  bool handshaken = false;         // in the handshaken budget (sticky)
  std::string evict_reason;        // set with `evicted`
  std::atomic<bool> evicted{false};
  std::atomic<bool> finished{false};
  bool pending() const { return !handshaken && !evicted && !finished; }
};

// One connection's progress through the handshake.
struct WorkerServer::Session {
  FrameConnection* conn = nullptr;
  Connection* connection = nullptr;
  std::chrono::steady_clock::time_point deadline;  // to complete the handshake by
  bool authenticated = false;  // no secret: true from the start
  bool hello_ok = false;       // a hello matched (and, with a secret, was authenticated)
  std::optional<HelloMsg> pending_hello;  // sent authChallenge, awaiting authResponse
  std::string worker_nonce;
};

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
  std::vector<std::shared_ptr<Connection>> connections;
  {
    std::lock_guard<std::mutex> lock(connections_mutex_);
    connections.swap(connections_);
  }
  // Idle reads end at once rather than at their next look at stopping_.
  for (auto& c : connections) c->conn->interrupt();
  for (auto& c : connections) c->thread.join();
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
    if ((*it)->finished) {
      (*it)->thread.join();
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
    if (conn) admit(std::move(conn));
  }
}

void WorkerServer::admit(std::unique_ptr<FrameConnection> accepted) {
  auto connection = std::make_shared<Connection>();
  connection->conn = std::move(accepted);
  connection->address = connection->conn->remote_address();
  connection->accepted = std::chrono::steady_clock::now();
  std::shared_ptr<Connection> victim;
  {
    std::lock_guard<std::mutex> lock(connections_mutex_);
    // connections_ is in accept order: the first pending match is the oldest.
    size_t pending = 0, from_address = 0;
    std::shared_ptr<Connection> oldest, oldest_from_address;
    for (const auto& c : connections_) {
      if (!c->pending()) continue;
      ++pending;
      if (!oldest) oldest = c;
      if (c->address == connection->address) {
        ++from_address;
        if (!oldest_from_address) oldest_from_address = c;
      }
    }
    const std::string worker = "worker '" + options_.worker_name + "'";
    if (from_address >= options_.max_pending_per_address && oldest_from_address) {
      victim = oldest_from_address;
      victim->evict_reason = worker + " dropped this connection: " + std::to_string(from_address) +
                             " connections from " + connection->address +
                             " had not completed a handshake (the cap per address is " +
                             std::to_string(options_.max_pending_per_address) + "; the oldest goes first)";
    } else if (pending >= options_.max_pending_connections && oldest) {
      victim = oldest;
      victim->evict_reason = worker + " dropped this connection: " + std::to_string(pending) +
                             " connections had not completed a handshake (the cap is " +
                             std::to_string(options_.max_pending_connections) + "; the oldest goes first)";
    }
    if (victim) victim->evicted = true;
    connections_.push_back(connection);
  }
  if (victim) {
    victim->conn->interrupt();  // its thread sends the reason and closes
    ++evictions_;
    // One line a second at most: a flood must not flood the log too.
    const auto now = std::chrono::steady_clock::now();
    if (now - eviction_logged_ >= std::chrono::seconds(1)) {
      eviction_logged_ = now;
      spdlog::warn("worker {}: evicted {} (no completed handshake) to admit {}: {} evictions since start",
                   options_.worker_name, victim->conn->peer(), connection->conn->peer(), evictions_);
    }
  }
  try {
    Connection* c = connection.get();
    connection->thread = std::thread([this, c] {
      serve_connection(*c);
      c->finished = true;
    });
  } catch (const std::system_error& e) {
    // Out of threads: this connection is refused, the worker lives.
    spdlog::error("worker {}: cannot start a thread for {}: {}", options_.worker_name, connection->conn->peer(),
                  e.what());
    try {
      connection->conn->send(encode_error("worker '" + options_.worker_name + "' cannot serve another connection now"),
                             std::chrono::milliseconds(100));
    } catch (const Error&) {
    }
    connection->conn->close();
    std::lock_guard<std::mutex> lock(connections_mutex_);
    connections_.erase(std::find(connections_.begin(), connections_.end(), connection));
  }
}

std::optional<std::string> WorkerServer::claim_handshaken_slot(Connection& connection) {
  std::lock_guard<std::mutex> lock(connections_mutex_);
  if (connection.handshaken) return std::nullopt;
  if (connection.evicted) return connection.evict_reason;
  size_t handshaken = 0;
  for (const auto& c : connections_) handshaken += c->handshaken && !c->finished;
  if (handshaken >= options_.max_connections) {
    return "worker '" + options_.worker_name + "' is serving its maximum of " +
           std::to_string(options_.max_connections) + " connections";
  }
  connection.handshaken = true;
  return std::nullopt;
}

void WorkerServer::send(Session& session, const Frame& frame) {
  // A stranger gets no more time than its handshake deadline, however slowly it reads,
  // and an evicted one a moment for the frame that says why.
  auto timeout = options_.send_timeout;
  if (session.connection->evicted) {
    timeout = std::min<std::chrono::milliseconds>(timeout, std::chrono::milliseconds(100));
  } else if (!session.connection->handshaken) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(session.deadline - std::chrono::steady_clock::now());
    timeout = std::clamp(left, std::chrono::milliseconds(1), timeout);
  }
  // Counted before writing, so a client that has read the reply sees it in health.
  bytes_out_ += frame.size();
  session.conn->send(frame, timeout);
}

void WorkerServer::serve_connection(Connection& connection) {
  FrameConnection& conn = *connection.conn;
  spdlog::debug("worker {}: {} connected", options_.worker_name, conn.peer());
  Session session;
  session.conn = &conn;
  session.connection = &connection;
  session.authenticated = options_.shared_secret.empty();
  // Until its handshake completes the peer is a stranger: small frames (the connection's
  // initial cap), and one deadline from the accept whatever it sends meanwhile.
  conn.set_max_frame_bytes(std::min(kHandshakeMaxFrameBytes, options_.max_frame_bytes));
  session.deadline = connection.accepted + options_.handshake_timeout;
  // Read without the lock: only this thread writes it.
  const auto handshaken = [&] { return connection.handshaken; };
  try {
    while (!stopping_ && conn.is_open()) {
      WireMessage message;
      std::optional<LayerRequestView> layer_request;  // the data path: read in place
      try {
        auto timeout = kForever;
        if (!handshaken()) {
          timeout = std::chrono::duration_cast<std::chrono::milliseconds>(
              session.deadline - std::chrono::steady_clock::now());
          if (timeout.count() <= 0) fail_unavailable("no completed handshake within the handshake timeout");
        }
        FrameBody body = conn.receive(timeout, &stopping_);
        bytes_in_ += body.bytes + 4;
        // A stranger's layerRequest takes the generic path, which refuses it.
        if (session.authenticated && is_layer_request(body, conn.max_frame_bytes())) {
          layer_request = decode_layer_request_view(std::move(body), conn.max_frame_bytes());
        } else {
          message = decode_message(body, conn.max_frame_bytes());
        }
      } catch (const Error& e) {
        if (e.category() != ErrorCategory::kProtocol) {
          // Evicted for a newer stranger, stopping, peer gone, or no handshake in time.
          if (connection.evicted && !stopping_ && conn.is_open()) {
            std::string reason;
            {
              std::lock_guard<std::mutex> lock(connections_mutex_);
              reason = connection.evict_reason;
            }
            spdlog::debug("worker {}: {}: {}", options_.worker_name, conn.peer(), reason);
            send(session, encode_error(reason));
          } else if (!handshaken() && !stopping_ && std::chrono::steady_clock::now() >= session.deadline) {
            spdlog::warn("worker {}: dropped {}: no completed handshake within {} ms", options_.worker_name,
                         conn.peer(), options_.handshake_timeout.count());
          }
          break;
        }
        spdlog::warn("worker {}: malformed frame from {}: {}; closing that connection",
                     options_.worker_name, conn.peer(), e.message());
        if (conn.is_open()) send(session, encode_error(e.message()));
        break;
      }
      if (!(layer_request ? handle_layer(*layer_request, session) : handle(conn, message, session))) break;
      if (session.hello_ok) conn.set_max_frame_bytes(options_.max_frame_bytes);
    }
  } catch (const std::exception& e) {
    // A send that failed or anything unforeseen: this connection ends, the worker lives.
    // (An evicted stranger's cancelled reply is expected: the eviction was logged.)
    if (connection.evicted) {
      spdlog::debug("worker {}: evicted connection {} ended: {}", options_.worker_name, conn.peer(), e.what());
    } else {
      spdlog::warn("worker {}: connection {} ended: {}", options_.worker_name, conn.peer(), e.what());
    }
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

bool WorkerServer::refuse(Session& session, const std::string& text) {
  send(session, encode_error(text));
  return false;
}

bool WorkerServer::handle_auth(FrameConnection& conn, const AuthResponseMsg& response, Session& session) {
  if (!session.pending_hello) {
    spdlog::warn("worker {}: {} sent authResponse without a challenge; closing that connection",
                 options_.worker_name, conn.peer());
    return refuse(session, "worker '" + options_.worker_name + "' sent no authChallenge to answer");
  }
  const HelloMsg hello = std::move(*session.pending_hello);
  session.pending_hello.reset();
  const AuthTranscript transcript{session.worker_nonce, hello.client_nonce, hello.client_name,
                                  options_.worker_name};
  if (!constant_time_equal(response.proof, auth_proof(options_.shared_secret, AuthRole::kClient, transcript))) {
    spdlog::error("worker {}: REJECTED {} ({}): wrong proof of the cluster's shared secret; dropping the peer",
                  options_.worker_name, hello.client_name, conn.peer());
    return refuse(session, "authentication failed: the proof does not match worker '" + options_.worker_name +
                            "''s shared secret");
  }
  session.authenticated = true;
  HelloReplyMsg reply = answer_hello(hello, conn.peer());
  reply.worker_proof = auth_proof(options_.shared_secret, AuthRole::kWorker, transcript);
  return reply_hello(conn, std::move(reply), session);
}

bool WorkerServer::reply_hello(FrameConnection& conn, HelloReplyMsg reply, Session& session) {
  if (reply.ok) {
    if (std::optional<std::string> why = claim_handshaken_slot(*session.connection)) {
      spdlog::warn("worker {}: refusing {}: {}", options_.worker_name, conn.peer(), *why);
      return refuse(session, *why);
    }
  }
  session.hello_ok = reply.ok;
  send(session, encode_hello_reply(reply));
  return true;
}

LayerResponseMsg WorkerServer::answer_layer(const LayerRequest& request, const Session& session) {
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

LayerStats ExecutorService::run_in_place(const LayerRequestView& request, int64_t* outputs) {
  if (request.hidden_size != executor_.store().hidden_size()) {
    fail_invalid("layer " + std::to_string(request.layer) + ": hidden_size " + std::to_string(request.hidden_size) +
                 " does not match the model's " + std::to_string(executor_.store().hidden_size()));
  }
  std::function<void()> prefetch;
  if (request.prefetch) prefetch = [&] { executor_.start_prefetch(*request.prefetch); };
  return executor_.run_into(request.layer, request.hidden.data(), request.num_rows, request.assignments, outputs,
                            prefetch);
}

namespace {

// The owning copy of a view, for services that do not run in place.
LayerRequest owned(const LayerRequestView& view) {
  return {view.request_id, view.layer, view.hidden_size, view.num_rows,
          std::vector<float>(view.hidden.begin(), view.hidden.end()), view.assignments, view.prefetch};
}

}  // namespace

bool WorkerServer::handle_layer(LayerRequestView& request, Session& session) {
  if (!debug_delay_elapsed()) return false;  // stopped while "computing": no reply
  if (request.prefetch) {
    // Advice riding on the request: one the model's shape rules out is dropped, the
    // request still served (as a prefetchHint message would be dropped).
    ++hints_received_;
    try {
      check_prefetch_hint(*request.prefetch, options_.limits);
    } catch (const Error& e) {
      spdlog::warn("worker {}: request {} carries a prefetch it must not: {}; dropped", options_.worker_name,
                   request.request_id, e.message());
      request.prefetch.reset();
    }
  }
  Frame frame;
  if (session.hello_ok && service_.runs_in_place()) {
    try {
      check_layer_request(request, options_.limits);
      LayerResponseFrame reply(request.request_id, request.num_rows, request.hidden_size);
      frame = reply.finish(service_.run_in_place(request, reply.outputs()));
    } catch (const std::exception& e) {
      LayerResponseMsg failed;
      failed.response.request_id = request.request_id;
      failed.error = "worker '" + options_.worker_name + "', layer " + std::to_string(request.layer) + ": " + e.what();
      spdlog::warn("worker {}: request {} failed: {}", options_.worker_name, request.request_id, failed.error);
      frame = encode_layer_response(failed);
    }
  } else {
    frame = encode_layer_response(answer_layer(owned(request), session));
  }
  ++requests_served_;  // before the reply, for the same reason as in send()
  send(session, frame);
  return true;
}

bool WorkerServer::handle(FrameConnection& conn, WireMessage& message, Session& session) {
  if (auto* hello = std::get_if<HelloMsg>(&message)) {
    if (!options_.shared_secret.empty() && !session.authenticated) {
      if (session.pending_hello) return refuse(session, "a second hello before answering the authChallenge");
      session.worker_nonce = random_nonce();
      session.pending_hello = std::move(*hello);
      send(session, encode_auth_challenge({session.worker_nonce, options_.worker_name}));
      return true;
    }
    return reply_hello(conn, answer_hello(*hello, conn.peer()), session);
  }
  if (auto* response = std::get_if<AuthResponseMsg>(&message)) return handle_auth(conn, *response, session);
  if (!session.authenticated) {
    // With a secret, nothing but the handshake is answered to a stranger.
    spdlog::warn("worker {}: {} sent {} before authenticating; dropping the peer", options_.worker_name,
                 conn.peer(), message_name(message));
    return refuse(session, "worker '" + options_.worker_name + "' requires the cluster's shared secret: send hello "
                        "and answer its authChallenge first");
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
    send(session, encode_health_reply(health()));
    return true;
  }
  const std::string text = std::string("worker '") + options_.worker_name + "' does not accept " +
                           message_name(message) + " messages from clients";
  spdlog::warn("worker {}: {} sent {}; closing that connection", options_.worker_name,
               conn.peer(), message_name(message));
  return refuse(session, text);
}

}  // namespace charm
