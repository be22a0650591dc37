#include "coordinator/http_guard.h"

#include <dirent.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <vector>

#include <spdlog/spdlog.h>

#include "common/error.h"

namespace charm {
namespace {

using Clock = std::chrono::steady_clock;

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

std::string key_of(const std::string& address, int port) { return address + " " + std::to_string(port); }

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

// The open connections of local `port`: peer key -> descriptor.
std::map<std::string, int> server_connections(uint16_t port) {
  std::map<std::string, int> out;
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

// Shuts down the connection `key` found at `fd`, through a duplicate checked to still be
// that connection: the serving thread may have closed `fd` and the number been reused.
bool cut(int fd, const std::string& key, uint16_t port) {
  const int dup = ::dup(fd);
  if (dup < 0) return false;
  const bool same = connection_key(dup, port) == key;
  if (same) ::shutdown(dup, SHUT_RDWR);  // the serving thread's read fails; httplib closes it
  ::close(dup);
  return same;
}

}  // namespace

GuardedHttpServer::GuardedHttpServer(HttpGuardOptions options) : options_(options) {
  const size_t threads = options_.threads;
  new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
}

GuardedHttpServer::~GuardedHttpServer() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (watchdog_.joinable()) watchdog_.join();
}

void GuardedHttpServer::guard(uint16_t port) {
  if (watchdog_.joinable()) fail_internal("GuardedHttpServer::guard called twice");
  port_ = port;
  watchdog_ = std::thread([this] { watchdog(); });
}

void GuardedHttpServer::request_read(const httplib::Request& req) {
  std::lock_guard<std::mutex> lock(mutex_);
  Connection& c = connections_[key_of(req.remote_addr, req.remote_port)];
  c.reading = false;
}

void GuardedHttpServer::response_done(const httplib::Request& req) {
  std::lock_guard<std::mutex> lock(mutex_);
  Connection& c = connections_[key_of(req.remote_addr, req.remote_port)];
  c.reading = true;
  c.since = Clock::now();
}

size_t GuardedHttpServer::timed_out() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return timed_out_;
}

size_t GuardedHttpServer::over_cap() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return over_cap_;
}

void GuardedHttpServer::watchdog() {
  // A tenth of the deadline between looks (at most 250 ms): a slow client holds a thread
  // little longer than the deadline, and a crowd beyond its cap a quarter second.
  const auto tick = std::clamp(options_.request_read_timeout / 10, std::chrono::milliseconds(10),
                               std::chrono::milliseconds(250));
  std::unique_lock<std::mutex> lock(mutex_);
  while (!wake_.wait_for(lock, tick, [this] { return stopping_; })) {
    lock.unlock();
    scan_and_cut();
    lock.lock();
  }
}

void GuardedHttpServer::scan_and_cut() {
  const std::map<std::string, int> open = server_connections(port_);
  const auto now = Clock::now();
  std::vector<std::pair<std::string, int>> to_cut;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& [key, c] : connections_) c.seen = false;
    for (const auto& [key, fd] : open) {
      auto [it, added] = connections_.try_emplace(key);
      if (added) it->second.since = now;  // first seen now: its request is being read
      it->second.seen = true;
    }
    std::erase_if(connections_, [](const auto& entry) { return !entry.second.seen; });
    // Reading past the deadline; then, per address, the newest readers beyond the cap.
    std::map<std::string, std::vector<std::pair<Clock::time_point, std::string>>> reading;
    for (const auto& [key, c] : connections_) {
      if (!c.reading) continue;
      if (now - c.since >= options_.request_read_timeout) {
        to_cut.emplace_back(key, open.at(key));
        ++timed_out_;
        spdlog::warn("http api: dropped the connection of {}: no whole request within {} ms", key,
                     options_.request_read_timeout.count());
        continue;
      }
      reading[key.substr(0, key.rfind(' '))].emplace_back(c.since, key);
    }
    for (auto& [address, list] : reading) {
      if (list.size() <= options_.max_connections_per_address) continue;
      std::sort(list.begin(), list.end());
      for (size_t i = options_.max_connections_per_address; i < list.size(); ++i) {
        to_cut.emplace_back(list[i].second, open.at(list[i].second));
        ++over_cap_;
      }
      spdlog::warn("http api: {} has {} connections reading a request, over the cap of {}; dropped the newest",
                   address, list.size(), options_.max_connections_per_address);
    }
  }
  for (const auto& [key, fd] : to_cut) cut(fd, key, port_);
}

}  // namespace charm
