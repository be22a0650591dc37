// Bounds what an HTTP client can hold before it has sent a whole request. cpp-httplib
// (0.11) serves each connection on a thread of a fixed pool and times out each read, not
// a whole request, so a few clients that send their request a byte a second (slowloris)
// held every thread and nothing else was answered. GuardedHttpServer watches every
// connection that is being read on a thread (its request not whole yet, no unread bytes
// waiting: a connection with bytes waiting is queued for a thread and holds none) and
// shuts it down when, past a grace period, its client sends slower than a minimum rate,
// when its request takes longer than a cap, or when its address (an IPv6 /64) already
// has the most such connections allowed.
//
// httplib gives no hook at accept (process_and_close_socket is private), so a watchdog
// thread finds the server's connections itself: the sockets of this process whose local
// port is the server's and that have a peer (/proc/self/fd), keyed by the peer's address
// and port, which is also what a handler sees in Request::remote_addr / remote_port.
// Linux only, as the rest of charm.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <thread>

#include <httplib.h>

namespace charm {

/// The limits of GuardedHttpServer. A request that arrives within `grace` is never cut.
struct HttpGuardOptions {
  std::chrono::milliseconds grace{2000};                  ///< reading time always allowed
  uint64_t min_bytes_per_s = 64 * 1024;                   ///< after it, at least this rate
  std::chrono::milliseconds request_read_timeout{30000};  ///< a whole request head + body
  size_t max_reading_per_address = 8;  ///< threads one address (IPv6: /64) may hold reading
  size_t threads = 64;                 ///< the pool serving connections
};

/// httplib::Server with the bounds above. Call guard(port) once the server is bound.
/// Route handlers call request_read(req) first (the request, body included, has arrived:
/// no deadline while it is handled and its response streams); the logger calls
/// response_done(req) (a keep-alive connection starts reading its next request).
/// Thread-safety: as httplib::Server, and the three calls above are thread-safe. The
/// destructor stops the watchdog.
class GuardedHttpServer : public httplib::Server {
 public:
  explicit GuardedHttpServer(HttpGuardOptions options = {});
  ~GuardedHttpServer() override;
  GuardedHttpServer(const GuardedHttpServer&) = delete;
  GuardedHttpServer& operator=(const GuardedHttpServer&) = delete;

  /// Starts the watchdog over the connections accepted on local `port`. Once.
  void guard(uint16_t port);
  /// `req`'s connection has delivered its request whole; its deadline stops.
  void request_read(const httplib::Request& req);
  /// `req`'s response is written; the connection's next request's deadline starts.
  void response_done(const httplib::Request& req);

  /// Connections shut down since start: reading too slowly or too long, and beyond their
  /// address's cap.
  size_t too_slow() const;
  size_t over_cap() const;

 private:
  struct Connection {
    bool reading = true;  // its request is not whole yet (or, kept alive, not begun)
    std::chrono::steady_clock::time_point since;  // reading on a thread since then
    uint64_t bytes_at_since = 0;  // bytes received from the client by then
    bool seen = false;            // found by the last scan
  };
  void watchdog();
  void scan_and_cut();

  HttpGuardOptions options_;
  uint16_t port_ = 0;
  mutable std::mutex mutex_;
  std::condition_variable wake_;
  bool stopping_ = false;
  std::map<std::string, Connection> connections_;  // by "address port" of the peer
  size_t too_slow_ = 0;
  size_t over_cap_ = 0;
  std::thread watchdog_;
};

}  // namespace charm
