// Tests for coordinator/api/http_guard.cpp: slow clients cannot hold the HTTP server's
// threads, and one address cannot hold more than its connections.
#include <doctest/doctest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include <httplib.h>

#include "coordinator/api/http_guard.h"

using namespace std::chrono_literals;
using charm::GuardedHttpServer;
using charm::HttpGuardOptions;

namespace {

// A connection to 127.0.0.1:port from `source` (any 127.x address is this machine).
int connect_loopback(int port, const char* source = "127.0.0.1") {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(fd >= 0);
  timeval timeout{10, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
  sockaddr_in from{};
  from.sin_family = AF_INET;
  REQUIRE(::inet_pton(AF_INET, source, &from.sin_addr) == 1);
  REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&from), sizeof from) == 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
  return fd;
}

// A server with two routes that mark their request read as HttpApi's routes do: /health,
// and /slow, which takes 300 ms to answer.
struct Guarded {
  GuardedHttpServer server;
  std::thread thread;
  int port = 0;
  explicit Guarded(HttpGuardOptions options) : server(options) {
    server.Get("/health", [this](const httplib::Request& req, httplib::Response& res) {
      server.request_read(req);
      res.set_content("ok", "text/plain");
    });
    server.Get("/slow", [this](const httplib::Request& req, httplib::Response& res) {
      server.request_read(req);
      std::this_thread::sleep_for(300ms);
      res.set_content("ok", "text/plain");
    });
    server.set_logger([this](const httplib::Request& req, const httplib::Response&) { server.response_done(req); });
    port = server.bind_to_any_port("127.0.0.1");
    server.guard(static_cast<uint16_t>(port));
    thread = std::thread([this] { server.listen_after_bind(); });
    while (!server.is_running()) std::this_thread::sleep_for(1ms);
  }
  ~Guarded() {
    server.stop();
    thread.join();
  }
};

// Clients that send a request head a byte at a time, every 200 ms, for at most `for_at_most`.
class Slowloris {
 public:
  Slowloris(int port, int count, std::chrono::seconds for_at_most, const char* source = "127.0.0.1") {
    for (int i = 0; i < count; ++i) {
      threads_.emplace_back([this, port, for_at_most, source] {
        const int fd = connect_loopback(port, source);
        const std::string head = "GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: ";
        const auto until = std::chrono::steady_clock::now() + for_at_most;
        for (size_t k = 0; !stop_ && std::chrono::steady_clock::now() < until; ++k) {
          const char c = k < head.size() ? head[k] : 'a';
          if (::send(fd, &c, 1, MSG_NOSIGNAL) != 1) {
            ++cut_;
            break;
          }
          std::this_thread::sleep_for(200ms);
        }
        ::close(fd);
      });
    }
  }
  ~Slowloris() {
    stop_ = true;
    for (auto& t : threads_) t.join();
  }
  int cut() const { return cut_; }

 private:
  std::atomic<bool> stop_{false};
  std::atomic<int> cut_{0};
  std::vector<std::thread> threads_;
};

}  // namespace

HttpGuardOptions options(std::chrono::milliseconds grace, size_t per_address, size_t threads) {
  HttpGuardOptions o;
  o.grace = grace;
  o.max_reading_per_address = per_address;
  o.threads = threads;
  return o;
}

TEST_CASE("clients that send their request too slowly are dropped past the grace, and others are served") {
  // 4 threads, 16 slow clients: without the guard every thread stays held (httplib
  // times out each read, 5 s, not the request) and /health is never answered.
  Guarded g(options(1000ms, 100, 4));
  Slowloris slow(g.port, 16, 20s);
  std::this_thread::sleep_for(300ms);  // they hold the threads now
  httplib::Client client("127.0.0.1", g.port);
  client.set_read_timeout(15, 0);
  client.set_connection_timeout(15, 0);
  const auto start = std::chrono::steady_clock::now();
  auto res = client.Get("/health");
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  MESSAGE("/health answered after " << waited << " s beside 16 slow clients (grace 1 s, 4 threads)");
  REQUIRE(res);
  CHECK(res->status == 200);
  CHECK(waited < 12);  // far below the 20 s the slow clients would hold the threads
  // The guard cuts each held thread's client once its grace ends; /health may be served
  // by the first thread freed, before the others' cuts are counted (CI saw 3 of 4).
  const auto until = std::chrono::steady_clock::now() + 12s;
  while (g.server.too_slow() < 4 && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(50ms);
  CHECK(g.server.too_slow() >= 4);
}

TEST_CASE("slow clients from several addresses hold at most their cap of threads each") {
  // 16 threads; 3 addresses x 12 slow clients, each address capped at 4 threads reading:
  // 12 threads at most are theirs, whatever the grace, so a normal request is answered.
  Guarded g(options(20000ms, 4, 16));
  Slowloris a(g.port, 12, 15s, "127.0.0.2"), b(g.port, 12, 15s, "127.0.0.3"), c(g.port, 12, 15s, "127.0.0.4");
  std::this_thread::sleep_for(1000ms);
  httplib::Client client("127.0.0.1", g.port);
  client.set_read_timeout(15, 0);
  const auto start = std::chrono::steady_clock::now();
  auto res = client.Get("/health");
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  MESSAGE("/health answered after " << waited << " s beside 36 slow clients from 3 addresses (cap 4 each, 16 threads)");
  REQUIRE(res);
  CHECK(res->status == 200);
  CHECK(waited < 5);  // the slow clients would hold every thread for 15 s
  // Each address's 8 beyond its cap are cut once a thread takes them (they connect over
  // a second or more: the listen backlog is short), long before the clients give up.
  const auto until = std::chrono::steady_clock::now() + 12s;
  while (g.server.over_cap() < 3 * 8 && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(50ms);
  CHECK(g.server.over_cap() >= 3 * 8);
  CHECK(g.server.too_slow() == 0);
}

TEST_CASE("requests queued for a thread are not slow clients: a crowd is served whole") {
  // 2 threads, 24 whole requests at once to a handler taking 300 ms: most wait in the
  // queue for several times the grace, with their bytes unread; none may be cut.
  Guarded g(options(500ms, 2, 2));
  std::atomic<int> ok{0};
  std::vector<std::thread> clients;
  for (int i = 0; i < 24; ++i) {
    clients.emplace_back([&] {
      httplib::Client client("127.0.0.1", g.port);
      client.set_read_timeout(30, 0);
      auto res = client.Get("/slow");
      if (res && res->status == 200) ++ok;
    });
  }
  for (auto& t : clients) t.join();
  CHECK(ok == 24);
  CHECK(g.server.too_slow() == 0);
  CHECK(g.server.over_cap() == 0);
}

TEST_CASE("one address holds at most its cap of threads reading a request") {
  Guarded g(options(10000ms, 3, 8));
  std::vector<int> idle;
  for (int i = 0; i < 5; ++i) {
    idle.push_back(connect_loopback(g.port));
    std::this_thread::sleep_for(300ms);  // seen by a scan in order: the last two are the newest
  }
  std::this_thread::sleep_for(500ms);
  CHECK(g.server.over_cap() == 2);
  char byte;
  CHECK(::recv(idle[4], &byte, 1, 0) == 0);  // the newest were shut down, nothing sent
  CHECK(::recv(idle[3], &byte, 1, 0) == 0);
  // The oldest three are still open: a whole request on one of them is answered.
  const std::string get = "GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
  REQUIRE(::send(idle[0], get.data(), get.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(get.size()));
  char reply[64] = {};
  CHECK(::recv(idle[0], reply, sizeof reply - 1, 0) > 0);
  CHECK(std::string(reply).rfind("HTTP/1.1 200", 0) == 0);
  for (int fd : idle) ::close(fd);
}
