// Malformed messages against a real worker over loopback (worker/rpc_server.h, common/
// wire.h): truncated frames, wrong protocol version, oversized counts and frames,
// out-of-range ids, garbage bytes, a peer that says nothing, too many peers. The worker
// answers with an error (layerResponse.error when the stream is still in step, an
// `error` frame and a close when it is not) and always serves the next client.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <thread>

#include "common/wire.h"
#include "tests/support/echo_worker.h"
#include "tests/support/expect_error.h"

using namespace charm;
using namespace charm::test;
using namespace std::chrono_literals;

namespace {

std::unique_ptr<FrameConnection> open(const EchoWorker& worker) {
  return FrameConnection::connect("127.0.0.1", worker.port(), 5s, "worker 'a'");
}

// A connection that has said hello successfully.
std::unique_ptr<FrameConnection> greeted(const EchoWorker& worker) {
  auto conn = open(worker);
  conn->send(encode_hello(HelloMsg{kProtocolVersion, kEchoFingerprint, "test", ""}), 5s);
  REQUIRE(decode_as<HelloReplyMsg>(conn->receive(5s)).ok);
  conn->set_max_frame_bytes(kDefaultMaxFrameBytes);  // trusted now, as the coordinator does
  return conn;
}

// Sends a layerRequest and returns the reply; the stream must still be in step.
LayerResponseMsg ask(FrameConnection& conn, const LayerRequest& req) {
  conn.send(encode_layer_request(req), 5s);
  LayerResponseMsg reply = decode_as<LayerResponseMsg>(conn.receive(5s));
  CHECK(reply.response.request_id == req.request_id);
  return reply;
}

// The worker's `error` frame, then the close.
std::string error_then_close(FrameConnection& conn) {
  const std::string message = decode_as<ErrorMsg>(conn.receive(5s)).message;
  expect_error([&] { conn.receive(5s); }, ErrorCategory::kUnavailable, {"closed"});
  return message;
}

// The worker still serves a fresh, well-behaved client.
void still_serves(const EchoWorker& worker) {
  auto conn = greeted(worker);
  const LayerResponseMsg reply = ask(*conn, echo_request(2, 77));
  CHECK(reply.error.empty());
  CHECK(reply.response.outputs.size() == 2 * kEchoHidden);  // one row per position, not per expert
}

// Sends raw bytes and closes at once (a peer that dies mid-frame).
void send_and_hang_up(const EchoWorker& worker, const Frame& bytes) {
  auto conn = open(worker);
  conn->send(bytes, 5s);
  conn->close();
}

}  // namespace

TEST_CASE("truncated frames: the peer is dropped, the worker lives") {
  EchoWorker worker;
  send_and_hang_up(worker, {64, 0});                    // half a length prefix
  send_and_hang_up(worker, {64, 0, 0, 0, 1, 2, 3, 4});  // 4 of 64 body bytes
  Frame hello = encode_hello(HelloMsg{kProtocolVersion, kEchoFingerprint, "t", ""});
  hello.resize(hello.size() - 5);                       // a real frame cut short
  send_and_hang_up(worker, hello);
  still_serves(worker);
}

TEST_CASE("wrong protocol version: helloReply names both, and no layer is served") {
  EchoWorker worker;
  auto conn = open(worker);
  conn->send(encode_hello(HelloMsg{kProtocolVersion + 7, kEchoFingerprint, "old", ""}), 5s);
  const auto reply = decode_as<HelloReplyMsg>(conn->receive(5s));
  CHECK_FALSE(reply.ok);
  CHECK(reply.error.find(std::to_string(kProtocolVersion + 7)) != std::string::npos);
  CHECK(reply.error.find(std::to_string(kProtocolVersion)) != std::string::npos);
  CHECK(ask(*conn, echo_request(1)).error.find("needs a successful hello") != std::string::npos);
  still_serves(worker);
}

TEST_CASE("oversized frames: capped small before hello, at max_frame_bytes after") {
  EchoWorker worker;  // max_frame_bytes 1 MiB
  SUBCASE("before hello") {
    auto conn = open(worker);
    // Only the prefix of a 100000-byte frame: the worker answers after reading it, and a
    // client still writing the body would see its connection reset.
    conn->send(Frame{0xa0, 0x86, 0x01, 0x00}, 5s);
    CHECK(error_then_close(*conn).find("exceeds the cap of " + std::to_string(kHandshakeMaxFrameBytes)) !=
          std::string::npos);
  }
  SUBCASE("after hello") {
    auto conn = greeted(worker);
    CHECK(ask(*conn, echo_request(2048)).error.empty());  // 80 KiB: fine once greeted
    conn->send(Frame{0, 0, 0x20, 0}, 5s);                // 2 MiB announced
    CHECK(error_then_close(*conn).find("exceeds the cap of 1048576") != std::string::npos);
  }
  SUBCASE("a length that is not whole words") {
    auto conn = open(worker);
    conn->send(Frame{12, 0, 0, 0}, 5s);
    CHECK(error_then_close(*conn).find("not a whole number of 8-byte") != std::string::npos);
  }
  still_serves(worker);
}

TEST_CASE("out-of-range ids and shapes get layerResponse.error; the stream stays in step") {
  EchoWorker worker;
  auto conn = greeted(worker);
  LayerRequest req = echo_request(2, 5);
  req.layer = 3;
  CHECK(ask(*conn, req).error.find("layerRequest.layer 3 is out of range (the model has 3 layers)") !=
        std::string::npos);
  req.layer = 1;
  CHECK(ask(*conn, req).error.find("layerRequest.layer 1 is not an MoE layer") != std::string::npos);
  req = echo_request(2, 6);
  req.assignments[1].expert = 4;
  CHECK(ask(*conn, req).error.find("assignments[1].expert = 4 is out of range (num_experts = 4)") !=
        std::string::npos);
  req.assignments[1].expert = 0xffffffffu;
  CHECK(ask(*conn, req).error.find("is out of range") != std::string::npos);
  req = echo_request(2, 7);
  req.assignments[1].expert = 3;  // in range, not held here: the service says so
  CHECK(ask(*conn, req).error.find("expert 3 is not held") != std::string::npos);
  // More assignments than rows * experts (duplicates): a count no router produces.
  req = echo_request(1, 8);
  req.assignments.assign(5, ExpertAssignment{0, 0});
  CHECK(ask(*conn, req).error.find("5 assignments, more than numRows * num_experts = 4") != std::string::npos);
  // hiddenSize of another model (rows consistent with it).
  req = echo_request(1, 9);
  req.hidden_size = 4;
  req.num_rows = 2;
  CHECK(ask(*conn, req).error.find("hiddenSize 4 differs from the model's hidden_size 8") != std::string::npos);
  // After all that, the same connection still computes.
  const auto ok = ask(*conn, echo_request(1, 10));
  CHECK(ok.error.empty());
  CHECK(ok.response.outputs.size() == 1 * kEchoHidden);
}

TEST_CASE("counts that disagree with the payload break the frame: error frame and close") {
  EchoWorker worker;
  SUBCASE("numRows * hiddenSize * 4 != hidden bytes") {
    auto conn = greeted(worker);
    LayerRequest req = echo_request(2);
    Frame frame = encode_layer_request(req);
    // numRows is the u32 at data-section offset 16 of LayerRequest (after requestId,
    // layer, hiddenSize); find it by value: 2 rows of 8 floats -> patch the first "2, 0,
    // 0, 0" that follows "8, 0, 0, 0" (hiddenSize).
    const Frame pattern = {8, 0, 0, 0, 2, 0, 0, 0};
    auto at = std::search(frame.begin(), frame.end(), pattern.begin(), pattern.end());
    REQUIRE(at != frame.end());
    at[4] = 3;  // numRows 3
    conn->send(frame, 5s);
    CHECK(error_then_close(*conn).find("numRows (3) * hiddenSize (8) * 4 = 96") != std::string::npos);
  }
  SUBCASE("hiddenSize 0") {
    auto conn = greeted(worker);
    LayerRequest req;
    req.hidden_size = 0;
    conn->send(encode_layer_request(req), 5s);
    CHECK(error_then_close(*conn).find("hiddenSize is 0") != std::string::npos);
  }
  SUBCASE("a nonce of the wrong size") {
    auto conn = open(worker);
    conn->send(encode_hello(HelloMsg{kProtocolVersion, kEchoFingerprint, "t", "short"}), 5s);
    CHECK(error_then_close(*conn).find("hello.clientNonce is 5 bytes, expected 32 or none") != std::string::npos);
  }
  SUBCASE("a client name with a newline (log injection)") {
    auto conn = open(worker);
    conn->send(encode_hello(HelloMsg{kProtocolVersion, kEchoFingerprint, "x\nERROR forged", ""}), 5s);
    CHECK(error_then_close(*conn).find("hello.clientName holds a byte that is not printable") != std::string::npos);
  }
  SUBCASE("a client name over the cap") {
    auto conn = open(worker);
    conn->send(encode_hello(HelloMsg{kProtocolVersion, kEchoFingerprint, std::string(300, 'n'), ""}), 5s);
    CHECK(error_then_close(*conn).find("over the cap of 256") != std::string::npos);
  }
  still_serves(worker);
}

TEST_CASE("garbage bytes, in many shapes, never crash the worker") {
  EchoWorker worker;
  std::mt19937 rng(1234);
  for (int trial = 0; trial < 40; ++trial) {
    auto conn = open(worker);
    const size_t words = 1 + rng() % 16;
    Frame frame = {uint8_t(words * 8), 0, 0, 0};
    for (size_t i = 0; i < words * 8; ++i) frame.push_back(uint8_t(rng()));
    // Every other trial keeps a plausible segment table (1 segment of words-1 words),
    // so the bytes reach the pointer-walking code.
    if (trial % 2) {
      const uint32_t segment_words = uint32_t(words - 1);
      std::memset(frame.data() + 4, 0, 4);
      std::memcpy(frame.data() + 8, &segment_words, 4);
    }
    conn->send(frame, 5s);
    try {
      // A rare garbage frame may decode to a valid message; what the worker answers is
      // then a reply, which is fine. It must answer something or close, not crash.
      decode_message(conn->receive(5s));
    } catch (const Error&) {
    }
  }
  still_serves(worker);
}

TEST_CASE("a peer that connects and says nothing is dropped; others are served meanwhile") {
  EchoWorker worker("", "a", 300ms);
  auto silent = open(worker);
  still_serves(worker);  // while the silent peer holds its connection
  expect_error([&] { silent->receive(5s); }, ErrorCategory::kUnavailable, {"closed"});
  // A greeted client may stay idle past the timeout; one that only asked for health has
  // not completed a handshake, so it is dropped like a silent one (issue 12, item 5).
  auto idle = greeted(worker);
  auto monitor = open(worker);
  monitor->send(encode_health_request(), 5s);
  CHECK(decode_as<HealthReplyMsg>(monitor->receive(5s)).worker_name == "a");
  std::this_thread::sleep_for(500ms);
  CHECK(ask(*idle, echo_request(1, 3)).error.empty());
  expect_error([&] { monitor->receive(5s); }, ErrorCategory::kUnavailable, {"closed"});
}

TEST_CASE("with a secret, a peer that never answers the challenge is dropped") {
  EchoWorker worker("a shared secret of enough bytes", "a", 300ms);
  auto conn = open(worker);
  conn->send(encode_hello(HelloMsg{kProtocolVersion, kEchoFingerprint, "t", ""}), 5s);
  CHECK(decode_as<AuthChallengeMsg>(conn->receive(5s)).worker_name == "a");
  expect_error([&] { conn->receive(5s); }, ErrorCategory::kUnavailable, {"closed"});
}

TEST_CASE("a hello over max_connections handshaken connections gets an error frame") {
  EchoWorker worker("", "a", 10s, 2);
  auto first = greeted(worker);
  auto second = greeted(worker);
  auto third = open(worker);
  // Pending connections have a budget of their own: the third may connect and ask for
  // health, but its hello would make a third handshaken connection.
  third->send(encode_health_request(), 5s);
  CHECK(decode_as<HealthReplyMsg>(third->receive(5s)).worker_name == "a");
  third->send(encode_hello(HelloMsg{kProtocolVersion, kEchoFingerprint, "test", ""}), 5s);
  CHECK(error_then_close(*third).find("maximum of 2 connections") != std::string::npos);
  second->close();
  // The slot frees once the worker notices the close (it polls every ~100 ms).
  bool served = false;
  for (int attempt = 0; attempt < 50 && !served; ++attempt) {
    std::this_thread::sleep_for(100ms);
    try {
      auto conn = open(worker);
      conn->send(encode_hello(HelloMsg{kProtocolVersion, kEchoFingerprint, "test", ""}), 5s);
      served = std::holds_alternative<HelloReplyMsg>(decode_message(conn->receive(5s)));
    } catch (const Error&) {
    }
  }
  CHECK(served);
}

TEST_CASE("decoders: helloReply held lists, text caps, proofs") {
  auto decode = [](const Frame& frame) { return decode_message(split_frame(frame.data(), frame.size())); };
  HelloReplyMsg reply;
  for (uint32_t e : {1u, 3u}) reply.identities[{0, e}] = ContentHash{0, e};
  reply.held = {{0, {3, 1}}};
  expect_error([&] { decode(encode_hello_reply(reply)); }, ErrorCategory::kProtocol,
               {"helloReply.held[0].experts is not strictly ascending at index 1"});
  reply.held = {{0, {1, 1}}};
  expect_error([&] { decode(encode_hello_reply(reply)); }, ErrorCategory::kProtocol, {"strictly ascending"});
  reply.held = {{0, {1, 3}}};
  reply.worker_proof = "abc";
  expect_error([&] { decode(encode_hello_reply(reply)); }, ErrorCategory::kProtocol,
               {"helloReply.workerProof is 3 bytes, expected 32 or none"});
  reply.worker_proof = "";
  reply.model_fingerprint = std::string(65, 'f');
  expect_error([&] { decode(encode_hello_reply(reply)); }, ErrorCategory::kProtocol,
               {"helloReply.modelFingerprint", "over the cap of 64"});
  expect_error([&] { decode(encode_auth_response({std::string(31, 'p')})); }, ErrorCategory::kProtocol,
               {"authResponse.proof is 31 bytes, expected 32"});
  expect_error([&] { decode(encode_auth_challenge({"", "a"})); }, ErrorCategory::kProtocol,
               {"authChallenge.workerNonce is 0 bytes, expected 32"});
  expect_error([&] { decode(encode_error(std::string(kMaxWireTextBytes + 1, 'e'))); }, ErrorCategory::kProtocol,
               {"error.message", "over the cap"});
  // Round trips of the new messages.
  const auto challenge = std::get<AuthChallengeMsg>(decode(encode_auth_challenge({std::string(32, 'n'), "w1"})));
  CHECK(challenge.worker_nonce == std::string(32, 'n'));
  CHECK(challenge.worker_name == "w1");
  const auto hello = std::get<HelloMsg>(decode(encode_hello({kProtocolVersion, "ab", "c", std::string(32, 'x')})));
  CHECK(hello.client_nonce == std::string(32, 'x'));
}

TEST_CASE("prefetch hints with out-of-range ids never reach the service; replies stay in step") {
  EchoWorker worker;
  auto conn = greeted(worker);
  const PrefetchHintMsg bad[] = {
      {3, {0}},                                  // layer past the model's 3
      {1, {0}},                                  // a dense layer
      {0, {1, 4}},                               // expert 4 of 4
      {2, {0xffffffffu}},                        // far out
      {0, std::vector<uint32_t>(5, 1)},          // more ids than the layer has experts
  };
  for (const PrefetchHintMsg& hint : bad) conn->send(encode_prefetch_hint(hint), 5s);
  conn->send(encode_prefetch_hint(PrefetchHintMsg{2, {0, 1}}), 5s);  // fine: reaches the service
  // No reply to any hint: the next frame answers this request.
  const auto reply = ask(*conn, echo_request(1, 77));
  CHECK(reply.error.empty());
  CHECK(reply.response.request_id == 77);
  CHECK(worker.server->hints_received() == std::size(bad) + 1);
  const auto hints = worker.service.hints();
  REQUIRE(hints.size() == 1);
  CHECK(hints[0].first == 2);
  CHECK(hints[0].second == std::vector<uint32_t>{0, 1});

  check_prefetch_hint(PrefetchHintMsg{99, {1000}}, ModelLimits{});  // zero limits: not checked
  expect_error([&] { check_prefetch_hint(PrefetchHintMsg{1, {0}}, echo_limits()); }, ErrorCategory::kProtocol,
               {"prefetchHint.layer 1 is not an MoE layer"});
  expect_error([&] { check_prefetch_hint(PrefetchHintMsg{0, {1, 4}}, echo_limits()); }, ErrorCategory::kProtocol,
               {"experts[1] = 4 is out of range (num_experts = 4)"});
}

TEST_CASE("check_layer_request: zero limits are not checked") {
  LayerRequest req = echo_request(1);
  req.layer = 99;
  req.assignments[0].expert = 1000;
  check_layer_request(req, ModelLimits{});
  expect_error([&] { check_layer_request(req, echo_limits()); }, ErrorCategory::kProtocol,
               {"layerRequest.layer 99 is out of range"});
}
