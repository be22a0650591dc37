// worker/rpc_server.h: the connection budgets (issue 12, item 5). Strangers that connect,
// get one message answered (a healthRequest, or a hello whose authChallenge they never
// answer) and then idle must not lock out the coordinator or `charm status`: every
// connection that has not completed its handshake has a deadline whatever it sent, the
// pending pool is capped in total and per source address (the oldest is evicted, with an
// `error` frame), and handshaken connections have a budget of their own.
//
// The idlers are raw sockets bound to source addresses in 127.0.0.0/8 (all of it is
// loopback on Linux), so the per-address cap can be told from the total one.
#include <doctest/doctest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "app/status_report.h"
#include "common/cluster_auth.h"
#include "common/wire.h"
#include "coordinator/dispatch/cluster_dispatch.h"
#include "tests/support/echo_worker.h"

using namespace charm;
using namespace charm::test;
using namespace std::chrono_literals;

namespace {

const std::string kSecret = "a shared secret of enough bytes";

// One idle stranger: connects from `source`, sends `frame`, reads the one frame the
// worker answers (a healthReply or an authChallenge), then says nothing more.
class Idler {
 public:
  Idler(const std::string& source, uint16_t port, const Frame& frame) : source_(source) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    REQUIRE(fd_ >= 0);
    timeval tv{5, 0};
    ::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    sockaddr_in from{};
    from.sin_family = AF_INET;
    ::inet_pton(AF_INET, source.c_str(), &from.sin_addr);
    REQUIRE(::bind(fd_, reinterpret_cast<sockaddr*>(&from), sizeof from) == 0);
    sockaddr_in to{};
    to.sin_family = AF_INET;
    to.sin_port = htons(port);
    ::inet_pton(AF_INET, "127.0.0.1", &to.sin_addr);
    REQUIRE(::connect(fd_, reinterpret_cast<sockaddr*>(&to), sizeof to) == 0);
    REQUIRE(::send(fd_, frame.data(), frame.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(frame.size()));
    first_answer_ = read_frame();
    // A worker out of room may refuse at once (an `error` frame, then the close).
    if (const auto* error = std::get_if<ErrorMsg>(&first_answer_)) {
      error_ = error->message;
      closed_ = true;
    }
  }
  ~Idler() { ::close(fd_); }
  Idler(const Idler&) = delete;
  Idler& operator=(const Idler&) = delete;

  const std::string& source() const { return source_; }

  // True while the worker has neither sent anything more nor closed (looks without
  // waiting). Once it has, records the `error` frame's text, if any, and stays false.
  bool open() {
    if (closed_) return false;
    pollfd p{fd_, POLLIN, 0};
    if (::poll(&p, 1, 0) == 0) return true;
    try {
      const WireMessage got = read_frame();
      if (const auto* error = std::get_if<ErrorMsg>(&got)) error_ = error->message;
    } catch (const Error&) {
      // closed without a word (the deadline) or reset
    }
    closed_ = true;
    return false;
  }
  const std::string& error() const { return error_; }

 private:
  bool read_exact(void* data, size_t size) {
    auto* p = static_cast<uint8_t*>(data);
    for (size_t got = 0; got < size;) {
      const ssize_t n = ::recv(fd_, p + got, size - got, 0);
      if (n <= 0) return false;
      got += static_cast<size_t>(n);
    }
    return true;
  }
  WireMessage read_frame() {
    Frame frame(4);
    if (!read_exact(frame.data(), 4)) fail_unavailable("closed");
    const uint64_t length = frame_length(frame.data(), kHandshakeMaxFrameBytes, "worker");
    frame.resize(4 + length);
    if (!read_exact(frame.data() + 4, length)) fail_unavailable("closed");
    return decode_message(split_frame(frame.data(), frame.size()));
  }

  std::string source_;
  int fd_ = -1;
  WireMessage first_answer_;
  bool closed_ = false;
  std::string error_;
};

using Idlers = std::vector<std::unique_ptr<Idler>>;

// `count` idlers spread round-robin over `addresses` source addresses 127.0.0.10 ...
Idlers flood(uint16_t port, size_t count, size_t addresses, const Frame& frame) {
  Idlers idlers;
  for (size_t i = 0; i < count; ++i) {
    idlers.push_back(std::make_unique<Idler>("127.0.0." + std::to_string(10 + i % addresses), port, frame));
  }
  return idlers;
}

struct OpenCount {
  size_t total = 0;
  size_t max_per_address = 0;
};

OpenCount count_open(Idlers& idlers) {
  OpenCount out;
  std::map<std::string, size_t> per_address;
  for (auto& idler : idlers) {
    if (idler->open()) {
      ++out.total;
      out.max_per_address = std::max(out.max_per_address, ++per_address[idler->source()]);
    }
  }
  return out;
}

// Polls until `done` or `limit` passes (a functional bound, far from the expected time).
template <typename F>
bool eventually(F&& done, std::chrono::seconds limit = 20s) {
  const auto until = std::chrono::steady_clock::now() + limit;
  while (!done()) {
    if (std::chrono::steady_clock::now() >= until) return false;
    std::this_thread::sleep_for(20ms);
  }
  return true;
}

}  // namespace

// The defaults: 256 handshaken, 64 pending in all, 8 pending per source address.
TEST_CASE("300 strangers that got one answer and idle lock out neither the coordinator nor charm status") {
  std::string secret;
  Frame first;  // what each stranger sends before idling
  SUBCASE("open cluster: each had a healthRequest answered") { first = encode_health_request(); }
  SUBCASE("shared secret: each sent hello, got its authChallenge, never answered it") {
    secret = kSecret;
    first = encode_hello(HelloMsg{kProtocolVersion, kEchoFingerprint, "idler", ""});
  }
  // A deadline far past the test's length: only the budgets can make room here.
  EchoWorker worker(secret, "a", 600s);
  auto early = FrameConnection::connect("127.0.0.1", worker.port(), 5s, "worker 'a'");
  client_handshake(*early, HelloMsg{kProtocolVersion, kEchoFingerprint, "early", ""}, secret, 5s, "worker 'a'",
                   max_hello_reply_bytes(2, 4));

  Idlers idlers = flood(worker.port(), 300, 30, first);  // 10 from each of 30 addresses

  // The coordinator connects (its own connection evicts the oldest stranger) ...
  Topology topology = worker.topology(secret);
  topology.api_port = 1;  // nothing listens: status's coordinator column is "-"
  std::unique_ptr<ClusterDispatcher> dispatcher;
  CHECK_NOTHROW(dispatcher = std::make_unique<ClusterDispatcher>(topology, EchoWorker::placement(), kEchoFingerprint, echo_identities()));
  CHECK((dispatcher && dispatcher->status()[0].state == "up"));
  // ... and so does `charm status`.
  const ClusterStatus status = collect_status(topology, 5000);
  REQUIRE(status.workers.size() == 1);
  CHECK_MESSAGE(status.workers[0].up, status.workers[0].error);

  // The strangers left hold at most the pending budget, and at most 8 per address.
  OpenCount open;
  CHECK(eventually([&] {
    open = count_open(idlers);
    return open.total <= 64 && open.max_per_address <= 8;
  }));
  INFO("open strangers: " << open.total << ", at most " << open.max_per_address << " from one address");
  CHECK(open.total <= 64);
  CHECK(open.max_per_address <= 8);
  size_t told = 0;
  for (auto& idler : idlers) {
    if (idler->error().find("had not completed a handshake") != std::string::npos) ++told;
  }
  CHECK(told >= 300 - 64);  // every evicted stranger got an `error` frame saying why

  // One address alone cannot hold more than its cap, however many it opens.
  Idlers same = flood(worker.port(), 20, 1, first);  // all from 127.0.0.10
  CHECK(eventually([&] { return count_open(same).total <= 8; }));
  bool per_address_told = false;
  for (auto& idler : same) per_address_told |= idler->error().find("the cap per address is 8") != std::string::npos;
  CHECK(per_address_told);

  // A handshaken connection is never evicted: the early client still computes.
  early->set_max_frame_bytes(kDefaultMaxFrameBytes);
  early->send(encode_layer_request(echo_request(1, 5)), 5s);
  const auto reply = decode_as<LayerResponseMsg>(early->receive(5s));
  CHECK(reply.error.empty());
  CHECK((dispatcher && dispatcher->status()[0].state == "up"));
}

TEST_CASE("every connection without a completed handshake is dropped at the deadline, whatever it sent") {
  EchoWorker open_worker("", "a", 1s);
  EchoWorker secret_worker(kSecret, "b", 1s);
  // Fewer than the pending budget, so only the deadline can end them.
  Idlers idlers = flood(open_worker.port(), 40, 10, encode_health_request());
  Idlers challenged =
      flood(secret_worker.port(), 40, 10, encode_hello(HelloMsg{kProtocolVersion, kEchoFingerprint, "idler", ""}));
  for (auto& idler : challenged) idlers.push_back(std::move(idler));
  auto greeted = FrameConnection::connect("127.0.0.1", open_worker.port(), 5s, "worker 'a'");
  client_handshake(*greeted, HelloMsg{kProtocolVersion, kEchoFingerprint, "greeted", ""}, "", 5s, "worker 'a'",
                   max_hello_reply_bytes(2, 4));
  CHECK(eventually([&] { return count_open(idlers).total == 0; }));
  // The handshaken client is past the deadline too, and still served.
  std::this_thread::sleep_for(200ms);
  greeted->send(encode_health_request(), 5s);
  CHECK(decode_as<HealthReplyMsg>(greeted->receive(5s)).worker_name == "a");
}

TEST_CASE("pending budgets are options: a pool of 4, 2 per address") {
  WorkerServerOptions options;
  options.worker_name = "a";
  options.model_fingerprint = kEchoFingerprint;
  options.limits = echo_limits();
  options.max_pending_connections = 4;
  options.max_pending_per_address = 2;
  EchoService service;
  WorkerServer server(options, service);
  server.start();
  Idlers idlers = flood(server.port(), 6, 3, encode_health_request());  // 2 each from 3 addresses
  CHECK(eventually([&] { return count_open(idlers).total <= 4; }));
  // The oldest went first: idlers 0 and 1 (from .10 and .11), not the newest.
  CHECK_FALSE(idlers[0]->open());
  CHECK_FALSE(idlers[1]->open());
  CHECK(idlers[5]->open());
  CHECK(idlers[0]->error().find("the cap is 4") != std::string::npos);
  // Left: 2 (.12), 3 (.10), 4 (.11), 5 (.12). A third from .12 evicts .12's oldest, idler
  // 2, by the per-address cap (checked before the pool's).
  Idler extra("127.0.0.12", server.port(), encode_health_request());
  CHECK(eventually([&] { return !idlers[2]->open(); }));
  CHECK(idlers[2]->error().find("2 connections from 127.0.0.12") != std::string::npos);
  CHECK(idlers[3]->open());
  CHECK(idlers[4]->open());
  server.stop();
}

namespace {

// A stranger that pipelines `requests` healthRequests and never reads a reply: with a
// small receive buffer the worker soon blocks writing to it.
int non_reader(uint16_t port, int requests) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(fd >= 0);
  const int small = 4096;
  ::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &small, sizeof small);
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(port);
  ::inet_pton(AF_INET, "127.0.0.1", &to.sin_addr);
  REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&to), sizeof to) == 0);
  Frame many;
  const Frame one = encode_health_request();
  for (int i = 0; i < requests; ++i) many.insert(many.end(), one.begin(), one.end());
  ::fcntl(fd, F_SETFL, O_NONBLOCK);  // the worker stops reading once it is stuck
  for (size_t sent = 0; sent < many.size();) {
    const ssize_t n = ::send(fd, many.data() + sent, many.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) break;
    sent += static_cast<size_t>(n);
  }
  return fd;
}

// The worker closed its end with our requests unread: the kernel resets the connection.
bool was_reset(int fd) {
  pollfd p{fd, 0, 0};
  return ::poll(&p, 1, 0) == 1 && (p.revents & (POLLERR | POLLHUP));
}

}  // namespace

TEST_CASE("a stranger that does not read its replies holds its thread no longer than the deadline or its eviction") {
  WorkerServerOptions options;
  options.worker_name = "a";
  options.model_fingerprint = kEchoFingerprint;
  options.limits = echo_limits();
  options.send_timeout = 60s;  // a stuck write would hold the thread this long
  SUBCASE("the handshake deadline ends it") { options.handshake_timeout = 1s; }
  SUBCASE("an eviction ends it") {
    options.handshake_timeout = 600s;
    options.max_pending_connections = 2;
  }
  EchoService service;
  WorkerServer server(options, service);
  server.start();
  const int fd = non_reader(server.port(), 20000);
  std::this_thread::sleep_for(300ms);  // the worker is stuck writing by now
  Idlers newer;
  if (options.max_pending_connections == 2) newer = flood(server.port(), 2, 2, encode_health_request());
  CHECK(eventually([&] { return was_reset(fd); }));  // well before the 60 s send timeout
  ::close(fd);
  server.stop();
}
