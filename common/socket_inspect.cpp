#include "common/socket_inspect.h"

#include <dirent.h>
#include <linux/tcp.h>  // struct tcp_info with tcpi_bytes_received (glibc's lacks it)
#include <netdb.h>
#include <netinet/in.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>

namespace charm {
namespace {

// "address port" of a socket address, the address as httplib writes Request::remote_addr
// (getnameinfo, NI_NUMERICHOST); "" for other families.
std::string endpoint_key(const sockaddr_storage& addr, socklen_t len) {
  int port = 0;
  if (addr.ss_family == AF_INET) {
    port = ntohs(reinterpret_cast<const sockaddr_in*>(&addr)->sin_port);
  } else if (addr.ss_family == AF_INET6) {
    port = ntohs(reinterpret_cast<const sockaddr_in6*>(&addr)->sin6_port);
  } else {
    return "";
  }
  char host[NI_MAXHOST] = {};
  if (::getnameinfo(reinterpret_cast<const sockaddr*>(&addr), len, host, sizeof host, nullptr, 0, NI_NUMERICHOST) != 0) {
    return "";
  }
  return std::string(host) + " " + std::to_string(port);
}

// The peer key of `fd` when it is a connected socket on local `port`; "" otherwise.
std::string connection_key(int fd, uint16_t port) {
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISSOCK(st.st_mode)) return "";
  sockaddr_storage local{}, peer{};
  socklen_t local_len = sizeof local, peer_len = sizeof peer;
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &local_len) != 0) return "";
  const std::string local_key = endpoint_key(local, local_len);
  if (local_key.empty() || local_key.substr(local_key.rfind(' ') + 1) != std::to_string(port)) return "";
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &peer_len) != 0) return "";  // the listener
  return endpoint_key(peer, peer_len);
}

}  // namespace

std::map<PeerKey, int> connections_on_port(uint16_t port) {
  std::map<PeerKey, int> out;
  DIR* dir = ::opendir("/proc/self/fd");
  if (dir == nullptr) return out;
  const int own = ::dirfd(dir);
  while (const dirent* entry = ::readdir(dir)) {
    char* end = nullptr;
    const long fd = std::strtol(entry->d_name, &end, 10);
    if (end == entry->d_name || *end != '\0' || fd == own) continue;
    const std::string key = connection_key(static_cast<int>(fd), port);
    if (!key.empty()) out[key] = static_cast<int>(fd);
  }
  ::closedir(dir);
  return out;
}

bool shutdown_connection(int fd, const PeerKey& key, uint16_t port) {
  const int dup = ::dup(fd);
  if (dup < 0) return false;
  const bool same = connection_key(dup, port) == key;
  if (same) ::shutdown(dup, SHUT_RDWR);  // the serving thread's read fails; httplib closes it
  ::close(dup);
  return same;
}

TcpInput tcp_input(int fd) {
  TcpInput st;
  tcp_info info{};
  socklen_t len = sizeof info;
  if (::getsockopt(fd, IPPROTO_TCP, TCP_INFO, &info, &len) == 0) st.received = info.tcpi_bytes_received;
  if (::ioctl(fd, FIONREAD, &st.unread) != 0) st.unread = 0;
  return st;
}

}  // namespace charm
