// FrameConnection::abort and wait_readable (common/wire.h, common/wire_socket.cpp): what
// the coordinator uses to wait on several workers at once and to end a read or write to a
// worker that went silent. Loopback only; the bounds are functional (an abort ends a wait
// of 20 s within a few seconds), not speed assertions.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>

#include "common/error.h"
#include "common/wire.h"
#include "tests/support/expect_error.h"

using namespace charm;
using namespace std::chrono_literals;

namespace {

using Clock = std::chrono::steady_clock;

// A connected pair over loopback: `client` from FrameConnection::connect, `server` accepted.
struct Pair {
  std::unique_ptr<FrameListener> listener = FrameListener::listen("127.0.0.1", 0);
  std::unique_ptr<FrameConnection> client = FrameConnection::connect("127.0.0.1", listener->port(), 5s, "peer");
  std::unique_ptr<FrameConnection> server = listener->accept(5s);
};

double ms_since(Clock::time_point t) { return std::chrono::duration<double, std::milli>(Clock::now() - t).count(); }

}  // namespace

TEST_CASE("abort ends a receive from a silent peer at once, and every later call") {
  Pair p;
  REQUIRE(p.server);
  std::thread aborter([&] {
    std::this_thread::sleep_for(100ms);
    p.client->abort();
  });
  const auto start = Clock::now();
  test::expect_error([&] { p.client->receive(20s); }, ErrorCategory::kUnavailable, {"aborted"});  // not a frame
  CHECK(ms_since(start) < 5000);
  aborter.join();
  CHECK(p.client->aborted());
  CHECK_THROWS_AS(p.client->send(encode_health_request(), 1s), Error);
  CHECK_THROWS_AS(p.client->receive(1s), Error);
  p.client->abort();  // idempotent
}

TEST_CASE("abort ends a send that blocks because the peer stopped reading") {
  Pair p;
  REQUIRE(p.server);
  // One frame far larger than both socket buffers: the write blocks until the abort.
  LayerRequest big;
  big.hidden_size = 1024;
  big.num_rows = 16384;  // 64 MiB of floats
  big.hidden.assign(size_t{big.num_rows} * big.hidden_size, 0.5f);
  const Frame frame = encode_layer_request(big);
  std::thread aborter([&] {
    std::this_thread::sleep_for(200ms);
    p.client->abort();
  });
  const auto start = Clock::now();
  CHECK_THROWS_AS(p.client->send(frame, 20s), Error);
  CHECK(ms_since(start) < 5000);
  aborter.join();
}

TEST_CASE("wait_readable: empty after its time with silent peers; the ready ones, frames left whole") {
  Pair a, b;
  REQUIRE(a.server);
  REQUIRE(b.server);
  std::vector<FrameConnection*> both = {a.client.get(), b.client.get()};
  const auto start = Clock::now();
  CHECK(wait_readable(both, 50ms).empty());
  CHECK(ms_since(start) >= 50);

  b.server->send(encode_health_request(), 1s);
  CHECK(wait_readable(both, 5000ms) == std::vector<size_t>{1});
  decode_as<HealthRequestMsg>(b.client->receive(1s));  // nothing was consumed by the wait

  a.client->abort();  // aborted: ready at once (a receive fails without waiting)
  CHECK(wait_readable(both, 5000ms) == std::vector<size_t>{0});
  CHECK(wait_readable({}, 10ms).empty());
}

TEST_CASE("wait_readable wakes when another thread aborts a connection it waits on") {
  Pair p;
  REQUIRE(p.server);
  std::thread aborter([&] {
    std::this_thread::sleep_for(100ms);
    p.client->abort();
  });
  const auto start = Clock::now();
  CHECK(wait_readable({p.client.get()}, 20000ms) == std::vector<size_t>{0});
  CHECK(ms_since(start) < 5000);
  aborter.join();
}

TEST_CASE("read_while_sending: two peers sending big frames at once both finish; frames read meanwhile come in order") {
  // Each side's 16 MiB frame is far beyond what the socket buffers hold, so without reads
  // alongside the sends both would block until their timeouts (the pipelining deadlock).
  Pair p;
  REQUIRE(p.server);
  p.client->set_max_frame_bytes(kDefaultMaxFrameBytes);
  p.server->set_max_frame_bytes(kDefaultMaxFrameBytes);
  p.client->set_read_while_sending(true);
  const Frame big_up = encode_error(std::string(16u << 20, 'u'));
  const Frame big_down = encode_error(std::string(16u << 20, 'd'));
  const Frame small = encode_health_request();
  std::thread server([&] {
    // Sends two frames before reading anything, as a worker answering two pipelined
    // requests would.
    p.server->send(big_down, 20s);
    p.server->send(small, 20s);
    const FrameBody got = p.server->receive(20s);
    CHECK(got.bytes + 4 == big_up.size());
  });
  p.client->send(big_up, 20s);  // reads the server's frames meanwhile
  const std::vector<size_t> ready = wait_readable({p.client.get()}, 0ms);
  CHECK(ready.size() == 1);  // what it read is ready without touching the socket
  const FrameBody first = p.client->receive(20s);
  CHECK(first.bytes + 4 == big_down.size());
  CHECK(std::memcmp(first.words.data(), big_down.data() + 4, first.bytes) == 0);
  const FrameBody second = p.client->receive(20s);
  CHECK(second.bytes + 4 == small.size());
  server.join();
}

TEST_CASE("read_while_sending: a send returns once written, without waiting for the peer's reply") {
  // A pipelined request must not wait a round trip for the previous request's reply (it
  // did: the read alongside kept the event loop running until the peer answered or a
  // 100 ms slice ended, serialising the round trips to every worker). The peer here
  // answers only after the send returned; a send given 90 ms, less than that slice, then
  // times out if it waits for a read. Up to three tries on fresh connections, so a
  // scheduling stall on a loaded machine does not fail it; waiting for the read fails all.
  bool returned_in_time = false;
  for (int attempt = 0; attempt < 3 && !returned_in_time; ++attempt) {
    Pair p;
    REQUIRE(p.server);
    p.client->set_read_while_sending(true);
    std::atomic<bool> sent{false};
    std::thread server([&] {
      CHECK(p.server->receive(20s).bytes + 4 == encode_health_request().size());
      for (int i = 0; i < 2000 && !sent; ++i) std::this_thread::sleep_for(10ms);
      try {
        p.server->send(encode_health_request(), 5s);
      } catch (const Error&) {  // the client gave up and closed: that try failed already
      }
    });
    try {
      p.client->send(encode_health_request(), 90ms);
      returned_in_time = true;
    } catch (const Error&) {
    }
    sent = true;
    if (returned_in_time) CHECK(p.client->receive(20s).bytes + 4 == encode_health_request().size());
    server.join();
  }
  CHECK(returned_in_time);
}

TEST_CASE("read_while_sending: a peer that closes during the send is reported by the next receive") {
  Pair p;
  REQUIRE(p.server);
  p.client->set_read_while_sending(true);
  p.server->send(encode_health_request(), 5s);
  p.server->close();
  std::this_thread::sleep_for(50ms);
  // The send may succeed or fail (the peer is gone); what was read before the close is
  // returned first either way, then the close itself.
  try {
    p.client->send(encode_health_request(), 5s);
  } catch (const Error&) {
  }
  const FrameBody first = p.client->receive(5s);
  CHECK(first.bytes + 4 == encode_health_request().size());
  test::expect_error([&] { p.client->receive(5s); }, ErrorCategory::kUnavailable, {});
}
