// Tests for coordinator/http_guard.cpp: slow clients cannot hold the HTTP server's
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

#include "coordinator/http_guard.h"

using namespace std::chrono_literals;
using charm::GuardedHttpServer;
using charm::HttpGuardOptions;

namespace {

int connect_loopback(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(fd >= 0);
  timeval timeout{10, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
  return fd;
}

// A server with one route, /health, that marks its request read as HttpApi's routes do.
struct Guarded {
  GuardedHttpServer server;
  std::thread thread;
  int port = 0;
  explicit Guarded(HttpGuardOptions options) : server(options) {
    server.Get("/health", [this](const httplib::Request& req, httplib::Response& res) {
      server.request_read(req);
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
  Slowloris(int port, int count, std::chrono::seconds for_at_most) {
    for (int i = 0; i < count; ++i) {
      threads_.emplace_back([this, port, for_at_most] {
        const int fd = connect_loopback(port);
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

TEST_CASE("clients that never finish their request are dropped at the deadline, and others are served") {
  // 4 threads, 16 slow clients: without the deadline every thread stays held (httplib
  // times out each read, 5 s, not the request) and /health is never answered.
  Guarded g(HttpGuardOptions{1000ms, 100, 4});
  Slowloris slow(g.port, 16, 20s);
  std::this_thread::sleep_for(300ms);  // they hold the threads now
  httplib::Client client("127.0.0.1", g.port);
  client.set_read_timeout(15, 0);
  client.set_connection_timeout(15, 0);
  const auto start = std::chrono::steady_clock::now();
  auto res = client.Get("/health");
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  MESSAGE("/health answered after " << waited << " s beside 16 slow clients (deadline 1 s)");
  REQUIRE(res);
  CHECK(res->status == 200);
  CHECK(waited < 12);  // far below the 20 s the slow clients would hold the threads
  CHECK(g.server.timed_out() >= 4);
}

TEST_CASE("one address holds at most its cap of connections still reading a request") {
  Guarded g(HttpGuardOptions{10000ms, 3, 8});
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
