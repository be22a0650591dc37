// Noticing, mid-generation, that an HTTP client has hung up. cpp-httplib 0.11 (the
// Debian 12 package) gives a non-streaming handler no way to ask, so a request whose
// client left would run to max_tokens while every other request queued behind it. The
// connection's socket is found among this process's descriptors by its peer address and
// polled for a hang-up, without reading from it.
#pragma once

#include <string>

namespace charm {

/// Watches the TCP connection of one HTTP request (Linux: /proc/self/fd, getpeername,
/// poll with POLLRDHUP).
class ClientWatch {
 public:
  /// Finds this process's socket whose peer is `ip`:`port` (httplib::Request's
  /// remote_addr and remote_port). When there is none, gone() stays false. Never throws.
  ClientWatch(const std::string& ip, int port);

  /// True once the peer has closed or reset its side. Bytes waiting to be read (a
  /// pipelined next request) do not count.
  bool gone() const;

  /// Whether the connection's socket was found.
  bool found() const { return fd_ >= 0; }

 private:
  int fd_ = -1;
};

}  // namespace charm
