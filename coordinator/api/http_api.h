// The OpenAI-compatible HTTP API over an Engine (cpp-httplib): /health, /v1/models,
// /v1/completions, /v1/chat/completions (whole or streamed as Server-Sent Events, as the
// OpenAI API sends them), /cluster/status, /metrics (Prometheus text), and the live
// dashboard: its page at / (static files compiled in) and the JSON it polls,
// /dashboard/state. With an API key every endpoint but /health and the dashboard's static
// files needs `Authorization: Bearer <key>`. Endpoints, fields and errors are documented
// in docs/api.md.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>

#include "coordinator/api/http_guard.h"
#include "coordinator/api/metrics.h"
#include "coordinator/engine.h"

namespace charm {

/// The rule of common/listen_check.h for the HTTP API about to listen on host:port (the
/// topology's api.host / api.port or the command line's): beyond loopback it needs an API
/// key or `api.insecure: true`. Throws Error(kInvalidInput) saying how to create a key
/// (`charm secret new`), and what is_loopback_host throws. Call before loading the model.
void check_api_listen(const Topology& topology, const std::string& host, uint16_t port);

/// Serves one Engine over HTTP. The server runs on its own thread pool; the Engine must
/// outlive the HttpApi (it batches concurrent generations itself). Not copyable.
class HttpApi {
 public:
  /// Does not bind yet. `port` 0 asks the OS for a free port (see port()). `metrics`
  /// (must outlive the HttpApi) receives every request and generation and is served at
  /// /metrics; null: the HttpApi keeps its own (HTTP and token metrics only). `guard`
  /// bounds slow and crowding clients (coordinator/api/http_guard.h).
  HttpApi(Engine& engine, std::string host, uint16_t port, Metrics* metrics = nullptr,
          HttpGuardOptions guard = {});
  /// Stops the server if it is running.
  ~HttpApi();
  HttpApi(const HttpApi&) = delete;
  HttpApi& operator=(const HttpApi&) = delete;

  /// Binds host:port and starts serving on a background thread; returns once the
  /// socket listens. Throws Error(kIo) naming the address when it cannot bind, and
  /// Error(kInternal) when called twice.
  void start();

  /// Requires `Authorization: Bearer <api_key>` on every endpoint but /health and the
  /// dashboard's static files (/, /dashboard/<file>; /dashboard/state needs it) (401 with
  /// an OpenAI-style error otherwise; compared in constant time). Empty: no key. Call
  /// before start().
  void set_api_key(std::string api_key) { api_key_ = std::move(api_key); }

  /// Stops accepting, waits for the server thread to end. Requests in flight finish
  /// their current write. Idempotent.
  void stop();

  /// The port bound (the OS's choice when constructed with 0); 0 before start().
  uint16_t port() const { return bound_port_; }
  const std::string& host() const { return host_; }

 private:
  void install_routes();
  /// / and /dashboard/<file> (the embedded files), /dashboard/state (the JSON); `read`
  /// wraps a handler as install_routes does.
  template <class Read>
  void install_dashboard_routes(const Read& read);

  Engine& engine_;
  std::unique_ptr<Metrics> own_metrics_;  // when the caller gave none
  Metrics& metrics_;
  std::string api_key_;
  std::string host_;
  uint16_t port_;
  uint16_t bound_port_ = 0;
  int64_t started_at_ = 0;  ///< Unix seconds, reported as the model's "created"
  std::chrono::steady_clock::time_point started_steady_;  ///< for /dashboard/state's uptime_s
  std::atomic<bool> stopping_{false};  ///< cancels generations in flight on stop()
  std::atomic<bool> listen_ended_{false};
  std::unique_ptr<GuardedHttpServer> server_;
  std::thread thread_;
};

}  // namespace charm
