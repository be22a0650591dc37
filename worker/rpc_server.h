// The worker's TCP server: accepts coordinator (and `charm status`) connections and
// answers hello, layerRequest and healthRequest frames (schema/charm.capnp, common/wire.h),
// one thread per connection. The computation itself is behind LayerService so the server
// can be tested without a checkpoint.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common/error.h"
#include "common/moe_types.h"
#include "common/wire.h"
#include "common/wire_layer.h"
#include "worker/experts/expert_executor.h"

namespace charm {

/// What a WorkerServer serves. Implementations must be safe to call from several
/// connection threads at once.
class LayerService {
 public:
  virtual ~LayerService() = default;
  /// Runs one request whose shapes the wire decoder has already validated (its prefetch,
  /// if any, checked by check_prefetch_hint too). A service that can prefetch starts
  /// request.prefetch once the request's own reads are queued; others ignore it. Throws
  /// charm::Error (or any std::exception); its text goes back as layerResponse.error.
  virtual LayerResponse run(const LayerRequest& request) = 0;
  /// Whether run_in_place serves requests (then the worker reads a request's rows from
  /// its frame and writes the outputs into the reply frame, with no copies between).
  virtual bool runs_in_place() const { return false; }
  /// Runs one request read in place (validated as for run()), adding each request row's
  /// fixed-point sum of weight * output (common/fixed_point.h) into `outputs`
  /// ([num_rows, hidden_size] int64, zeroed), and returns its stats. Called only when
  /// runs_in_place(); throws as run() does.
  virtual LayerStats run_in_place(const LayerRequestView& /*request*/, int64_t* /*outputs*/) {
    fail_internal("LayerService::run_in_place called on a service that does not run in place");
  }
  /// Experts held: layer -> expert ids, ascending.
  virtual std::map<uint32_t, std::vector<uint32_t>> held() const = 0;
  /// The content identity of every held expert's bytes (ExpertStore::identities), asked
  /// at every hello: after a read found an expert's bytes changed, it reports the hash read.
  virtual ExpertIdentities identities() const = 0;
  /// "" when the experts are the checkpoint's values exactly, else their lossy form.
  virtual std::string lossy_form() const { return {}; }
  /// A prefetchHint: starts loading `experts` of `layer` if that helps, without waiting
  /// for the loads and without changing any later result. The default ignores hints (a
  /// store that holds everything in RAM has nothing to load). Must not block on I/O.
  virtual void prefetch(uint32_t /*layer*/, const std::vector<uint32_t>& /*experts*/) {}
  /// Adds the expert-tier counters to a health reply (default: none).
  virtual void add_tier_stats(HealthReplyMsg& health) const {}
};

/// LayerService over a worker's ExpertExecutor (which must outlive it).
class ExecutorService final : public LayerService {
 public:
  explicit ExecutorService(const ExpertExecutor& executor) : executor_(executor) {}
  LayerResponse run(const LayerRequest& request) override { return executor_.run(request); }
  bool runs_in_place() const override { return true; }
  /// Gathers the request's rows from the frame straight into the executor's inputs;
  /// starts its prefetch once its own reads are queued.
  LayerStats run_in_place(const LayerRequestView& request, int64_t* outputs) override;
  std::map<uint32_t, std::vector<uint32_t>> held() const override {
    return executor_.store().held();
  }
  ExpertIdentities identities() const override { return executor_.store().identities(); }
  std::string lossy_form() const override { return executor_.store().lossy_form(); }
  /// Starts async reads of the hinted experts the store owns (ExpertStore::prefetch).
  void prefetch(uint32_t layer, const std::vector<uint32_t>& experts) override {
    executor_.store().prefetch(layer, experts);
  }
  void add_tier_stats(HealthReplyMsg& health) const override {
    const ExpertStore& store = executor_.store();
    health.tier_layers = store.layer_stats();
    health.tier = TierCounters{};
    for (const auto& [layer, t] : health.tier_layers) health.tier += t;
    health.slot_bytes = store.cache().slot_bytes();
    health.slots = store.cache().slot_count();
    health.residency = store.residency();
  }

 private:
  const ExpertExecutor& executor_;
};

struct WorkerServerOptions {
  std::string worker_name;         ///< reported in helloReply / healthReply
  std::string host = "127.0.0.1";  ///< bound exactly (no wildcard unless asked: "0.0.0.0")
  uint16_t port = 0;               ///< 0 = ephemeral (tests); see WorkerServer::port()
  std::string model_fingerprint;   ///< model_fingerprint() of the served checkpoint; checked
                                   ///< at hello, reported in healthReply
  uint64_t max_frame_bytes = kDefaultMaxFrameBytes;  ///< once a client's hello succeeded;
                                                    ///< kHandshakeMaxFrameBytes before
  std::chrono::milliseconds send_timeout{60000};  ///< per reply frame
  /// The cluster's shared secret (common/cluster_auth.h); empty: the worker is open to
  /// anyone who can reach its port (a trusted LAN).
  std::string shared_secret;
  /// The served model's shape: every layerRequest is checked against it
  /// (check_layer_request); zeros are not checked (tests without a model).
  ModelLimits limits;
  /// How long a client may take from connecting to a completed handshake (a successful
  /// hello; with a shared secret, authenticated too), whatever it sends meanwhile: a
  /// peer that says nothing, only asks for health, or starts the handshake and stops, is
  /// dropped then. A client whose handshake completed may idle forever.
  std::chrono::milliseconds handshake_timeout{10000};
  /// Connections whose handshake completed, served at once; a hello that would make one
  /// more gets an `error` frame and the connection is closed.
  size_t max_connections = 256;
  /// Connections that have not completed their handshake, in total and from one source
  /// address: a separate budget, so strangers never take a handshaken client's slot. When
  /// a new connection finds its address (else the whole pool) at the cap, the oldest
  /// such connection is evicted (an `error` frame naming the cap, then closed) to make
  /// room: a flood of idlers cannot lock out a client that handshakes in milliseconds,
  /// and one address never holds more than its cap.
  size_t max_pending_connections = 64;
  size_t max_pending_per_address = 8;
  /// TEST ONLY (`charm worker --debug-delay-ms`): wait this long before answering each
  /// layerRequest, to stand in for a slow or hung worker. A stop() during the wait closes
  /// the connection without a reply, as a killed worker would.
  std::chrono::milliseconds debug_delay{0};
};

/// The server. Protocol per connection: the client sends `hello`; with a shared secret
/// the server first sends `authChallenge` and checks the client's `authResponse` (a wrong
/// proof: logged at error level, an `error` frame naming the shared secret, connection
/// closed), then answers `helloReply` (ok=false, naming both values, when the protocol
/// version or the model fingerprint differ — and logs it at error level), which lists
/// the held experts with their content identities and the lossy form (the client judges
/// those: it knows what its own checkpoint holds).
/// `layerRequest` is answered with a `layerResponse` (errors, including "no successful
/// hello yet" and check_layer_request's, go in its error field and the connection stays
/// up). `healthRequest` needs no hello, but with a shared secret it needs the
/// authentication. `prefetchHint` gets no reply on any path (the one exception to
/// one-reply-per-request, so the replies that follow stay in step): after a successful
/// hello and check_prefetch_hint it is passed to LayerService::prefetch; before a hello,
/// failing the check (logged at warn level) or when the prefetch throws (logged) it is
/// dropped. A frame that does not decode, a message a client must not send, or any
/// message (a hint too) before authentication, gets an `error` frame and the connection
/// is closed; a client that has not completed its handshake within handshake_timeout is
/// dropped, and pending and handshaken connections have budgets of their own (see
/// max_pending_connections). Other connections are unaffected.
/// Thread-safety: start/stop/port/health from any one controlling thread.
class WorkerServer {
 public:
  /// `service` must outlive the server.
  WorkerServer(WorkerServerOptions options, LayerService& service);
  /// Calls stop().
  ~WorkerServer();
  WorkerServer(const WorkerServer&) = delete;
  WorkerServer& operator=(const WorkerServer&) = delete;

  /// Binds options.host:options.port and starts accepting on a background thread.
  /// Throws Error(kUnavailable) naming the address when it cannot bind.
  void start();
  /// Stops accepting, ends every connection (within ~100 ms of their current request),
  /// joins all threads. Idempotent.
  void stop();

  /// The bound port (valid after start()).
  uint16_t port() const { return port_; }
  /// The counters a healthRequest reports, with this worker's name, protocol version
  /// and options.model_fingerprint (so `charm status` can spot a worker serving another
  /// model).
  HealthReplyMsg health() const;
  /// Prefetch hints received since start: prefetchHint messages and layerRequests that
  /// carry one (all connections, dropped ones too).
  uint64_t hints_received() const { return hints_received_.load(); }

 private:
  struct Session;     // one connection's handshake state
  struct Connection;  // one accepted connection: its thread, budget and eviction state
  void accept_loop();
  // Registers `conn` in the pending budget (evicting the oldest pending connection of its
  // address, else of the pool, when full) and starts its thread.
  void admit(std::unique_ptr<FrameConnection> conn);
  void serve_connection(Connection& connection);
  // Moves `connection` into the handshaken budget; the reason it cannot when not.
  std::optional<std::string> claim_handshaken_slot(Connection& connection);
  // Handles one decoded message; false when the connection must close.
  bool handle(FrameConnection& conn, WireMessage& message, Session& session);
  bool handle_auth(FrameConnection& conn, const AuthResponseMsg& response, Session& session);
  // Sends a helloReply, once `reply.ok` has a handshaken slot; false when it has none.
  bool reply_hello(FrameConnection& conn, HelloReplyMsg reply, Session& session);
  bool refuse(Session& session, const std::string& text);
  LayerResponseMsg answer_layer(const LayerRequest& request, const Session& session);
  /// A layerRequest read in place, answered with one reply frame: in place when the
  /// service runs in place, else through answer_layer. Returns handle()'s verdict.
  bool handle_layer(LayerRequestView& request, Session& session);
  void send(Session& session, const Frame& frame);
  HelloReplyMsg answer_hello(const HelloMsg& hello, const std::string& peer);
  void reap_finished();
  // Waits options_.debug_delay; false when stop() came first.
  bool debug_delay_elapsed() const;

  WorkerServerOptions options_;
  LayerService& service_;
  std::unique_ptr<FrameListener> listener_;
  uint16_t port_ = 0;
  std::atomic<bool> stopping_{false};
  std::thread accept_thread_;
  std::mutex connections_mutex_;
  std::vector<std::shared_ptr<Connection>> connections_;  // in accept order
  uint64_t evictions_ = 0;  // pending connections evicted since start (accept thread)
  std::chrono::steady_clock::time_point eviction_logged_;  // last eviction warning
  std::chrono::steady_clock::time_point started_;
  std::atomic<uint64_t> requests_served_{0};
  std::atomic<uint64_t> hints_received_{0};
  std::atomic<uint64_t> bytes_in_{0};
  std::atomic<uint64_t> bytes_out_{0};
  uint64_t experts_held_ = 0;
};

}  // namespace charm
