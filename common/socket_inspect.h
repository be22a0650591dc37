// What the kernel knows of this process's TCP connections (Linux): which sockets are
// connections accepted on a local port, how many bytes their peers have sent, how many
// wait unread, and a shutdown that cannot hit a reused descriptor number. For servers
// whose library gives no hook at accept (coordinator/api/http_guard.h).
#pragma once

#include <cstdint>
#include <map>
#include <string>

namespace charm {

/// "address port" of a connection's peer, the address as getnameinfo(NI_NUMERICHOST)
/// writes it (as cpp-httplib's Request::remote_addr): "127.0.0.1 40112", "::1 40112".
using PeerKey = std::string;

/// Every connected socket of this process whose local port is `port` (the listener
/// itself excluded), by peer key, with its descriptor (from /proc/self/fd; a descriptor
/// the owner closes meanwhile is simply missed). Never throws.
std::map<PeerKey, int> connections_on_port(uint16_t port);

/// A connection's input as the kernel counts it.
struct TcpInput {
  uint64_t received = 0;  ///< bytes received from the peer since the connection opened
  int unread = 0;         ///< bytes received that the process has not read yet
};

/// TcpInput of `fd` (zeros for what the kernel does not report). Never throws.
TcpInput tcp_input(int fd);

/// Shuts down (both ways) the connection that was `key` at `fd`, through a duplicate of
/// the descriptor checked to still be that connection on local `port` (the owner may have
/// closed `fd` and the number been reused). The owner's blocked read then fails. Returns
/// whether it was still that connection. Never throws.
bool shutdown_connection(int fd, const PeerKey& key, uint16_t port);

}  // namespace charm
