#include "coordinator/api/http_guard.h"

#include <arpa/inet.h>
#include <netinet/in.h>

#include <algorithm>
#include <vector>

#include <spdlog/spdlog.h>

#include "common/error.h"
#include "common/socket_inspect.h"

namespace charm {
namespace {

using Clock = std::chrono::steady_clock;

std::string key_of(const std::string& address, int port) { return address + " " + std::to_string(port); }

// The address a connection's key counts against: the IP, or for IPv6 its /64, which one
// user is commonly given whole.
std::string address_group(const std::string& key) {
  const std::string address = key.substr(0, key.rfind(' '));
  if (address.find(':') == std::string::npos || address.rfind("::ffff:", 0) == 0) return address;
  in6_addr a{};
  if (::inet_pton(AF_INET6, address.substr(0, address.find('%')).c_str(), &a) != 1) return address;
  std::fill(a.s6_addr + 8, a.s6_addr + 16, uint8_t{0});
  char text[INET6_ADDRSTRLEN] = {};
  ::inet_ntop(AF_INET6, &a, text, sizeof text);
  return std::string(text) + "/64";
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
  c.since = {};  // the next scan starts its clock, with the bytes received by then
}

size_t GuardedHttpServer::too_slow() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return too_slow_;
}

size_t GuardedHttpServer::over_cap() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return over_cap_;
}

void GuardedHttpServer::watchdog() {
  // A tenth of the grace between looks (at most 250 ms): a slow client holds a thread
  // little longer than the grace.
  const auto tick = std::clamp(options_.grace / 10, std::chrono::milliseconds(10), std::chrono::milliseconds(250));
  std::unique_lock<std::mutex> lock(mutex_);
  while (!wake_.wait_for(lock, tick, [this] { return stopping_; })) {
    lock.unlock();
    scan_and_cut();
    lock.lock();
  }
}

void GuardedHttpServer::scan_and_cut() {
  const std::map<PeerKey, int> open = connections_on_port(port_);
  std::map<PeerKey, TcpInput> input;
  for (const auto& [key, fd] : open) input[key] = tcp_input(fd);
  const auto now = Clock::now();
  std::vector<std::string> to_cut;
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto& [key, c] : connections_) c.seen = false;
  for (const auto& [key, fd] : open) connections_[key].seen = true;
  std::erase_if(connections_, [](const auto& entry) { return !entry.second.seen; });
  std::map<std::string, std::vector<std::pair<Clock::time_point, std::string>>> reading;  // by address group
  for (auto& [key, c] : connections_) {
    if (!c.reading) continue;
    const TcpInput& in = input.at(key);
    if (in.unread > 0 || c.since == Clock::time_point{}) {
      // Bytes wait unread: the connection is queued for a thread and holds none (or it
      // is new). Its reading clock starts when a thread has taken them.
      c.since = now;
      c.bytes_at_since = in.received;
      continue;
    }
    const auto elapsed = now - c.since;
    const double seconds = std::chrono::duration<double>(elapsed).count();
    const double rate = static_cast<double>(in.received - c.bytes_at_since) / std::max(seconds, 1e-9);
    if (elapsed >= options_.request_read_timeout || (elapsed >= options_.grace && rate < options_.min_bytes_per_s)) {
      to_cut.push_back(key);
      ++too_slow_;
      spdlog::warn("http api: dropped the connection of {}: {:.0f} B/s for {:.1f} s without a whole request", key,
                   rate, seconds);
      continue;
    }
    reading[address_group(key)].emplace_back(c.since, key);
  }
  // Per address, the newest connections beyond the cap of those holding a thread reading.
  for (auto& [group, list] : reading) {
    if (list.size() <= options_.max_reading_per_address) continue;
    std::sort(list.begin(), list.end());
    for (size_t i = options_.max_reading_per_address; i < list.size(); ++i) to_cut.push_back(list[i].second);
    over_cap_ += list.size() - options_.max_reading_per_address;
    spdlog::warn("http api: {} holds {} threads reading requests, over the cap of {}; dropped the newest", group,
                 list.size(), options_.max_reading_per_address);
  }
  for (const std::string& key : to_cut) shutdown_connection(open.at(key), key, port_);
}

}  // namespace charm
