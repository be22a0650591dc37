// The client side of the handshake (issue 12, item 6): whatever answers at a worker's
// address is a stranger until its helloReply is accepted, so ClusterDispatcher (at start
// and on every rejoin), `charm status` and any other client read no frame bigger than a
// legitimate reply for the model's shape. A fake worker that answers with the length
// prefix of a 1 GiB frame (and nothing more) must be refused at once, naming the peer
// and the cap, without the client allocating the gigabyte or waiting for its timeout.
#include <doctest/doctest.h>

#include <sys/resource.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "app/status_report.h"
#include "common/cluster_auth.h"
#include "common/wire.h"
#include "coordinator/dispatch/cluster_dispatch.h"
#include "tests/support/echo_worker.h"
#include "tests/support/expect_error.h"

using namespace charm;
using namespace charm::test;
using namespace std::chrono_literals;

namespace {

const std::string kSecret = "a shared secret of enough bytes";
const std::string kGiB = std::to_string(uint64_t{1} << 30);

// Answers the first frame of every connection with the prefix of a 1 GiB frame, then
// holds the connection, saying nothing, until the client hangs up or the fake stops.
class GigabyteWorker {
 public:
  explicit GigabyteWorker(uint16_t port = 0) : listener_(FrameListener::listen("127.0.0.1", port)) {
    thread_ = std::thread([this] {
      while (!stop_) {
        std::unique_ptr<FrameConnection> conn = listener_->accept(50ms);
        if (!conn) continue;
        try {
          conn->receive(5s, &stop_);
          ++answered_;  // before the send: the client may fail on it before this thread runs on
          conn->send(Frame{0, 0, 0, 0x40}, 5s);  // 0x40000000 bytes announced
          conn->receive(60s, &stop_);  // returns when the client closes
        } catch (const Error&) {
        }
      }
    });
  }
  ~GigabyteWorker() {
    stop_ = true;
    thread_.join();
  }
  uint16_t port() const { return listener_->port(); }
  int answered() const { return answered_; }

 private:
  std::unique_ptr<FrameListener> listener_;
  std::atomic<bool> stop_{false};
  std::atomic<int> answered_{0};
  std::thread thread_;
};

Topology fake_topology(uint16_t port, const std::string& secret) {
  Topology t;
  t.workers = {WorkerSpec{"a", "127.0.0.1", port, {0, 1}, {}}};
  t.connect_timeout_ms = 5000;
  t.handshake_timeout_ms = 60000;  // the failure must come long before this
  t.request_timeout_ms = 5000;
  t.startup_timeout_ms = 0;
  t.cluster_secret = secret;
  t.api_port = 1;  // nothing listens there
  return t;
}

// Peak resident set of this process, MiB.
long peak_rss_mib() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_maxrss / 1024;
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

// First in the file, so the peak RSS before it is this executable's start-up footprint.
TEST_CASE("the coordinator refuses a 1 GiB first frame at once, naming the peer and the cap") {
  const long rss_before = peak_rss_mib();
  for (const std::string secret : {std::string(), kSecret}) {
    CAPTURE(secret);
    GigabyteWorker fake;
    const auto start = std::chrono::steady_clock::now();
    // EchoWorker's placement: MoE layers 0 and 2, two experts each.
    expect_error([&] { ClusterDispatcher(fake_topology(fake.port(), secret), EchoWorker::placement(), kEchoFingerprint, echo_identities()); },
                 ErrorCategory::kProtocol,
                 {"worker 'a'", "frame length " + kGiB + " bytes", "exceeds the cap of " +
                                                                        std::to_string(max_hello_reply_bytes(2, 2))});
    CHECK(seconds_since(start) < 30);  // not the 60 s handshake timeout
    CHECK(fake.answered() == 1);
  }
  MESSAGE("peak RSS " << rss_before << " MiB before, " << peak_rss_mib() << " MiB after");
  CHECK(peak_rss_mib() - rss_before < 256);  // the gigabyte was never allocated
}

TEST_CASE("a rejoin attempt is capped the same way") {
  auto worker = std::make_unique<EchoWorker>();
  const uint16_t port = worker->port();
  Topology topology = worker->topology("");
  topology.heartbeat_ms = 100;
  topology.rejoin_min_ms = 50;
  topology.rejoin_max_ms = 200;
  topology.handshake_timeout_ms = 60000;
  ClusterDispatcher dispatcher(topology, EchoWorker::placement(), kEchoFingerprint, echo_identities());
  REQUIRE(dispatcher.status()[0].state == "up");
  worker.reset();                 // the worker goes away ...
  GigabyteWorker impostor(port);  // ... and something else answers at its address
  std::string last_error;
  const auto deadline = std::chrono::steady_clock::now() + 30s;
  while (std::chrono::steady_clock::now() < deadline) {
    last_error = dispatcher.status()[0].last_error;
    if (last_error.find("exceeds the cap") != std::string::npos) break;
    std::this_thread::sleep_for(20ms);
  }
  INFO(last_error);
  CHECK(last_error.find("frame length " + kGiB + " bytes from worker 'a' exceeds the cap of " +
                        std::to_string(max_hello_reply_bytes(2, 2))) != std::string::npos);
  CHECK(dispatcher.status()[0].state == "down");
}

TEST_CASE("charm status refuses a 1 GiB first frame, with and without a secret") {
  for (const std::string secret : {std::string(), kSecret}) {
    CAPTURE(secret);
    GigabyteWorker fake;
    const auto start = std::chrono::steady_clock::now();
    // The topology names no readable model: the caps come from the fallback shape.
    const ClusterStatus status = collect_status(fake_topology(fake.port(), secret), 60000);
    CHECK(seconds_since(start) < 30);
    REQUIRE(status.workers.size() == 1);
    const WorkerStatusRow& row = status.workers[0];
    CHECK_FALSE(row.up);
    const uint64_t cap = secret.empty() ? max_health_reply_bytes(kStatusFallbackMoeLayers, kStatusFallbackExperts)
                                        : max_hello_reply_bytes(kStatusFallbackMoeLayers, kStatusFallbackExperts);
    CHECK_MESSAGE(row.error.find("frame length " + kGiB + " bytes from worker 'a' exceeds the cap of " +
                                 std::to_string(cap)) != std::string::npos,
                  row.error);
  }
}

TEST_CASE("a new FrameConnection is capped at kHandshakeMaxFrameBytes until raised") {
  // Any other client (charm run --stats-json's health request) gets the small cap unasked.
  GigabyteWorker fake;
  auto conn = FrameConnection::connect("127.0.0.1", fake.port(), 5s, "worker 'a'");
  CHECK(conn->max_frame_bytes() == kHandshakeMaxFrameBytes);
  conn->send(encode_health_request(), 5s);
  expect_error([&] { conn->receive(60s); }, ErrorCategory::kProtocol,
               {"frame length " + kGiB + " bytes from worker 'a' exceeds the cap of 65536"});
}

TEST_CASE("a real worker's replies fit the caps: the coordinator and charm status still connect") {
  EchoWorker worker(kSecret);
  Topology topology = worker.topology(kSecret);
  topology.api_port = 1;
  ClusterDispatcher dispatcher(topology, EchoWorker::placement(), kEchoFingerprint, echo_identities());
  CHECK(dispatcher.status()[0].state == "up");
  const ClusterStatus status = collect_status(topology, 5000);
  CHECK_MESSAGE(status.workers[0].up, status.workers[0].error);
}
