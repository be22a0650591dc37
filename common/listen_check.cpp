// Which listening sockets need authentication; see listen_check.h.
#include "common/listen_check.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cstring>
#include <memory>

#include <spdlog/spdlog.h>

#include "common/error.h"

namespace charm {
namespace {

bool is_loopback(const sockaddr* address) {
  if (address->sa_family == AF_INET) {
    const auto* v4 = reinterpret_cast<const sockaddr_in*>(address);
    return (ntohl(v4->sin_addr.s_addr) >> 24) == 127;  // 127.0.0.0/8
  }
  if (address->sa_family == AF_INET6) {
    const in6_addr& v6 = reinterpret_cast<const sockaddr_in6*>(address)->sin6_addr;
    if (IN6_IS_ADDR_LOOPBACK(&v6)) return true;
    return IN6_IS_ADDR_V4MAPPED(&v6) && v6.s6_addr[12] == 127;  // ::ffff:127.x.y.z
  }
  return false;
}

}  // namespace

bool is_loopback_host(const std::string& host) {
  if (host.empty()) return false;  // the wildcard: every interface
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* found = nullptr;
  if (const int rc = getaddrinfo(host.c_str(), nullptr, &hints, &found); rc != 0) {
    fail_unavailable("cannot resolve listen address '" + host + "': " + gai_strerror(rc));
  }
  const std::unique_ptr<addrinfo, decltype(&freeaddrinfo)> owned(found, &freeaddrinfo);
  for (const addrinfo* a = found; a != nullptr; a = a->ai_next) {
    if (!is_loopback(a->ai_addr)) return false;
  }
  return found != nullptr;
}

void check_listen(const ListenSpec& spec) {
  if (spec.authenticated) return;
  const std::string where = spec.host + ":" + std::to_string(spec.port);
  if (is_loopback_host(spec.host)) {
    spdlog::info("{} listens on {} without authentication: only processes on this machine can reach it", spec.what,
                 where);
    return;
  }
  if (spec.insecure) {
    spdlog::warn("{} listens on {} WITHOUT AUTHENTICATION because {} is true: anyone who can reach this address "
                 "can use it", spec.what, where, spec.insecure_key);
    return;
  }
  fail_invalid(spec.what + " would listen on " + where + ", which other machines can reach, without " +
               "authentication, so anyone who reaches it could use it; refusing to start. " + spec.remedy +
               " To serve without authentication anyway (a trusted network only), set " + spec.insecure_key +
               ": true.");
}

}  // namespace charm
