#include "coordinator/api/client_watch.h"

#include <arpa/inet.h>
#include <poll.h>
#include <sys/socket.h>

#include <array>
#include <cstdlib>
#include <filesystem>
#include <system_error>

namespace charm {
namespace {

/// The numeric address and port of `fd`'s peer, or false when it is not a connected
/// IPv4/IPv6 socket.
bool peer_of(int fd, std::string& ip, int& port) {
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) return false;
  std::array<char, INET6_ADDRSTRLEN> text{};
  if (addr.ss_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(&addr);
    if (!inet_ntop(AF_INET, &in->sin_addr, text.data(), text.size())) return false;
    port = ntohs(in->sin_port);
  } else if (addr.ss_family == AF_INET6) {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(&addr);
    if (!inet_ntop(AF_INET6, &in6->sin6_addr, text.data(), text.size())) return false;
    port = ntohs(in6->sin6_port);
  } else {
    return false;
  }
  ip = text.data();
  return true;
}

}  // namespace

ClientWatch::ClientWatch(const std::string& ip, int port) {
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd", ec)) {
    const std::string name = entry.path().filename().string();
    char* end = nullptr;
    const long fd = std::strtol(name.c_str(), &end, 10);
    if (end == name.c_str() || *end != '\0') continue;
    std::string peer_ip;
    int peer_port = 0;
    if (peer_of(static_cast<int>(fd), peer_ip, peer_port) && peer_port == port && peer_ip == ip) {
      fd_ = static_cast<int>(fd);
      return;
    }
  }
}

bool ClientWatch::gone() const {
  if (fd_ < 0) return false;
  pollfd p{fd_, POLLRDHUP, 0};
  if (poll(&p, 1, 0) <= 0) return false;
  return (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0;
}

}  // namespace charm
