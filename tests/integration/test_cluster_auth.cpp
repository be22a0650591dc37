// common/cluster_auth.h + common/secret.h + the worker's and the coordinator's ends of
// the shared-secret handshake, over real loopback sockets: matching secrets, mismatch,
// no secret on either side, a secret on one side only, an impostor worker, a replayed
// proof; `charm status` with a secret; secrets read from files and the environment.
#include <doctest/doctest.h>

#include <cstdlib>
#include <thread>

#include "app/status_report.h"
#include "common/cluster_auth.h"
#include "common/secret.h"
#include "common/topology.h"
#include "coordinator/dispatch/cluster_dispatch.h"
#include "tests/support/echo_worker.h"
#include "tests/support/expect_error.h"
#include "tests/support/safetensors_writer.h"
#include "tests/support/temp_dir.h"

using namespace charm;
using namespace charm::test;
using namespace charm::testing;
using namespace std::chrono_literals;

namespace {

const std::string kSecret = "correct horse battery staple 0123456789";
const std::string kOtherSecret = "incorrect donkey battery staple 987654";

// Runs one layer through `dispatcher` and checks the echo sums: each row went to experts
// 0 and 1 (weight 1), so its sum is row * 1 + row * 2 (exact: the rows are halves).
void check_layer(ClusterDispatcher& dispatcher) {
  const LayerRequest req = echo_request(2);
  std::vector<int64_t> out(req.num_rows * kEchoHidden, -1);
  dispatcher.run_layer(0, req.hidden.data(), req.num_rows, kEchoHidden, req.assignments, out.data());
  for (size_t i = 0; i < out.size(); ++i) CHECK(from_fixed(out[i]) == req.hidden[i] * 3.0f);
}

std::unique_ptr<ClusterDispatcher> dispatcher_for(const EchoWorker& worker, const std::string& secret) {
  return std::make_unique<ClusterDispatcher>(worker.topology(secret), EchoWorker::placement(), kEchoFingerprint,
                                             echo_identities());
}

// A raw client connection that has sent hello and holds the worker's challenge.
struct Challenged {
  std::unique_ptr<FrameConnection> conn;
  HelloMsg hello;
  AuthChallengeMsg challenge;

  explicit Challenged(uint16_t port) {
    conn = FrameConnection::connect("127.0.0.1", port, 5s, "worker 'a'");
    hello = HelloMsg{kProtocolVersion, kEchoFingerprint, "raw", random_nonce()};
    conn->send(encode_hello(hello), 5s);
    challenge = decode_as<AuthChallengeMsg>(conn->receive(5s));
  }
  AuthTranscript transcript() const {
    return {challenge.worker_nonce, hello.client_nonce, hello.client_name, challenge.worker_name};
  }
};

}  // namespace

TEST_CASE("proofs depend on the secret, the role and every transcript field") {
  const AuthTranscript t{std::string(32, 'w'), std::string(32, 'c'), "coordinator", "a"};
  const std::string p = auth_proof(kSecret, AuthRole::kClient, t);
  CHECK(p.size() == kAuthProofBytes);
  CHECK(p == auth_proof(kSecret, AuthRole::kClient, t));
  CHECK(p != auth_proof(kOtherSecret, AuthRole::kClient, t));
  CHECK(p != auth_proof(kSecret, AuthRole::kWorker, t));  // no reflection
  for (int field = 0; field < 4; ++field) {
    AuthTranscript u = t;
    std::string* f[] = {&u.worker_nonce, &u.client_nonce, &u.client_name, &u.worker_name};
    f[field]->back() ^= 1;
    CHECK(p != auth_proof(kSecret, AuthRole::kClient, u));
  }
  // Length prefixes: moving a byte from one field to the next changes the proof.
  AuthTranscript shifted = t;
  shifted.client_name = "coordinatora";
  shifted.worker_name = "";
  CHECK(p != auth_proof(kSecret, AuthRole::kClient, shifted));
  CHECK(random_nonce().size() == kAuthNonceBytes);
  CHECK(random_nonce() != random_nonce());
  CHECK(constant_time_equal("abc", "abc"));
  CHECK_FALSE(constant_time_equal("abc", "abd"));
  CHECK_FALSE(constant_time_equal("abc", "abcd"));
}

TEST_CASE("matching secrets: the coordinator connects and layers run") {
  EchoWorker worker(kSecret);
  auto dispatcher = dispatcher_for(worker, kSecret);
  check_layer(*dispatcher);
  CHECK(dispatcher->status()[0].state == "up");
  CHECK(dispatcher->status()[0].last_seen_ms >= 0);
}

TEST_CASE("no secret on either side: the cluster runs open as before") {
  EchoWorker worker;
  auto dispatcher = dispatcher_for(worker, "");
  check_layer(*dispatcher);
}

TEST_CASE("different secrets: the coordinator fails naming the worker and the shared secret") {
  EchoWorker worker(kSecret);
  expect_error([&] { dispatcher_for(worker, kOtherSecret); }, ErrorCategory::kProtocol,
               {"worker 'a'", "shared secret"});
  // The worker dropped that peer but serves the next one.
  auto dispatcher = dispatcher_for(worker, kSecret);
  check_layer(*dispatcher);
}

TEST_CASE("a secret on one side only is an error naming the shared secret") {
  SUBCASE("worker has one, coordinator none") {
    EchoWorker worker(kSecret);
    expect_error([&] { dispatcher_for(worker, ""); }, ErrorCategory::kProtocol,
                 {"worker 'a'", "requires the cluster's shared secret", "cluster.secret_file"});
  }
  SUBCASE("coordinator has one, worker none: an unauthenticated worker could be anyone") {
    EchoWorker worker;
    expect_error([&] { dispatcher_for(worker, kSecret); }, ErrorCategory::kProtocol,
                 {"worker 'a'", "did not ask for the cluster's shared secret"});
  }
}

TEST_CASE("with a secret the worker answers nothing but the handshake to a stranger") {
  EchoWorker worker(kSecret);
  SUBCASE("healthRequest") {
    auto conn = FrameConnection::connect("127.0.0.1", worker.port(), 5s, "a");
    conn->send(encode_health_request(), 5s);
    const auto error = decode_as<ErrorMsg>(conn->receive(5s));
    CHECK(error.message.find("requires the cluster's shared secret") != std::string::npos);
    expect_error([&] { conn->receive(5s); }, ErrorCategory::kUnavailable, {"closed"});
  }
  SUBCASE("layerRequest") {
    auto conn = FrameConnection::connect("127.0.0.1", worker.port(), 5s, "a");
    conn->send(encode_layer_request(echo_request(1)), 5s);
    CHECK(decode_as<ErrorMsg>(conn->receive(5s)).message.find("shared secret") != std::string::npos);
    expect_error([&] { conn->receive(5s); }, ErrorCategory::kUnavailable, {"closed"});
  }
  SUBCASE("a layerRequest while the challenge is unanswered") {
    Challenged c(worker.port());
    CHECK(c.challenge.worker_name == "a");
    c.conn->send(encode_layer_request(echo_request(1)), 5s);
    CHECK(decode_as<ErrorMsg>(c.conn->receive(5s)).message.find("shared secret") != std::string::npos);
  }
  SUBCASE("prefetchHint (no reply when authenticated, refused before)") {
    auto conn = FrameConnection::connect("127.0.0.1", worker.port(), 5s, "a");
    conn->send(encode_prefetch_hint(PrefetchHintMsg{0, {1}}), 5s);
    CHECK(decode_as<ErrorMsg>(conn->receive(5s)).message.find("shared secret") != std::string::npos);
    expect_error([&] { conn->receive(5s); }, ErrorCategory::kUnavailable, {"closed"});
    CHECK(worker.service.hints().empty());
  }
  SUBCASE("a prefetchHint while the challenge is unanswered") {
    Challenged c(worker.port());
    c.conn->send(encode_prefetch_hint(PrefetchHintMsg{0, {1}}), 5s);
    CHECK(decode_as<ErrorMsg>(c.conn->receive(5s)).message.find("shared secret") != std::string::npos);
    CHECK(worker.service.hints().empty());
  }
  SUBCASE("an authResponse without a challenge") {
    auto conn = FrameConnection::connect("127.0.0.1", worker.port(), 5s, "a");
    conn->send(encode_auth_response({std::string(kAuthProofBytes, 'x')}), 5s);
    CHECK(decode_as<ErrorMsg>(conn->receive(5s)).message.find("no authChallenge") != std::string::npos);
  }
  auto dispatcher = dispatcher_for(worker, kSecret);
  check_layer(*dispatcher);
}

TEST_CASE("a proof recorded on one connection is refused on the next") {
  EchoWorker worker(kSecret);
  Challenged first(worker.port());
  const std::string proof = auth_proof(kSecret, AuthRole::kClient, first.transcript());
  first.conn->send(encode_auth_response({proof}), 5s);
  const auto reply = decode_as<HelloReplyMsg>(first.conn->receive(5s));
  CHECK(reply.ok);
  CHECK(reply.worker_proof == auth_proof(kSecret, AuthRole::kWorker, first.transcript()));

  // Same hello, same proof: the worker's nonce is fresh, so the proof no longer fits.
  auto conn = FrameConnection::connect("127.0.0.1", worker.port(), 5s, "a");
  conn->send(encode_hello(first.hello), 5s);
  const auto challenge = decode_as<AuthChallengeMsg>(conn->receive(5s));
  CHECK(challenge.worker_nonce != first.challenge.worker_nonce);
  conn->send(encode_auth_response({proof}), 5s);
  const auto error = decode_as<ErrorMsg>(conn->receive(5s));
  CHECK(error.message.find("shared secret") != std::string::npos);
  expect_error([&] { conn->receive(5s); }, ErrorCategory::kUnavailable, {"closed"});
}

TEST_CASE("an impostor worker that does not know the secret is found out") {
  // It challenges, ignores the proof and answers ok with a made-up proof.
  auto listener = FrameListener::listen("127.0.0.1", 0);
  std::thread impostor([&] {
    auto conn = listener->accept(5s);
    REQUIRE(conn);
    const auto hello = decode_as<HelloMsg>(conn->receive(5s));
    conn->send(encode_auth_challenge({random_nonce(), "a"}), 5s);
    decode_as<AuthResponseMsg>(conn->receive(5s));
    HelloReplyMsg reply;
    reply.ok = true;
    reply.worker_name = "a";
    reply.model_fingerprint = hello.model_fingerprint;
    reply.held = {{0, {0, 1}}, {2, {0, 1}}};
    reply.identities = echo_identities();
    reply.worker_proof = auth_proof(kOtherSecret, AuthRole::kWorker, {});
    conn->send(encode_hello_reply(reply), 5s);
  });
  auto conn = FrameConnection::connect("127.0.0.1", listener->port(), 5s, "a");
  expect_error([&] { client_handshake(*conn, HelloMsg{}, kSecret, 5s, "worker 'a'", kHandshakeMaxFrameBytes); }, ErrorCategory::kProtocol,
               {"worker 'a'", "could not prove it holds the cluster's shared secret"});
  impostor.join();
}

TEST_CASE("charm status authenticates with the topology's secret") {
  EchoWorker worker(kSecret);
  Topology topology = worker.topology(kSecret);
  topology.api_port = 1;  // nothing listens: the coordinator column is "-"
  ClusterStatus status = collect_status(topology, 2000);
  REQUIRE(status.workers.size() == 1);
  CHECK(status.workers[0].up);
  CHECK(status.workers[0].health->worker_name == "a");

  topology.cluster_secret = "";
  status = collect_status(topology, 2000);
  CHECK_FALSE(status.workers[0].up);
  CHECK(status.workers[0].error.find("shared secret") != std::string::npos);

  topology.cluster_secret = kOtherSecret;
  status = collect_status(topology, 2000);
  CHECK_FALSE(status.workers[0].up);
  CHECK(status.workers[0].error.find("shared secret") != std::string::npos);
}

TEST_CASE("topology: secrets come from a file or the environment, never inline") {
  TempDir dir("charm-auth");
  const std::string head = "model: m\nworkers:\n  - {name: a, port: 5001, experts: 0-3}\n";
  auto load = [&](const std::string& yaml) {
    write_bytes(dir / "t.yaml", head + yaml);
    return Topology::load(dir / "t.yaml");
  };
  // Secret files are refused unless only their owner (and at most the group, reading)
  // may access them: test_secret.cpp checks that; these are 0600.
  auto write_secret = [](const std::filesystem::path& path, const std::string& text) {
    write_bytes(path, text);
    std::filesystem::permissions(path, std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);
  };
  write_secret(dir / "secret", kSecret + "\n");
  write_secret(dir / "key", "sk-0123456789abcdef0123\n");
  Topology t = load("cluster: {secret_file: secret}\napi: {port: 8080, api_key_file: key}\n");
  CHECK(t.cluster_secret == kSecret);  // the final newline dropped
  CHECK(t.api_key == "sk-0123456789abcdef0123");
  CHECK(load("").cluster_secret.empty());

  ::setenv("CHARM_TEST_SECRET", kOtherSecret.c_str(), 1);
  CHECK(load("cluster: {secret_env: CHARM_TEST_SECRET}\n").cluster_secret == kOtherSecret);
  ::unsetenv("CHARM_TEST_SECRET");
  expect_error([&] { load("cluster: {secret_env: CHARM_TEST_SECRET}\n"); }, ErrorCategory::kInvalidInput,
               {"cluster.secret_env", "CHARM_TEST_SECRET", "is not set"});
  expect_error([&] { load("cluster: {secret_file: nope}\n"); }, ErrorCategory::kInvalidInput,
               {"cluster.secret_file", "nope", "cannot be read"});
  write_secret(dir / "short", "hunter2\n");
  expect_error([&] { load("cluster: {secret_file: short}\n"); }, ErrorCategory::kInvalidInput,
               {"cluster.secret_file", "7 bytes", "at least 16", "charm secret new"});
  expect_error([&] { load("cluster: {secret_file: secret, secret_env: X}\n"); }, ErrorCategory::kInvalidInput,
               {"cluster.secret_file", "not both"});
  expect_error([&] { load("cluster: {secret: inline-secret-is-not-allowed}\n"); }, ErrorCategory::kInvalidInput,
               {"cluster.secret", "unknown key"});
  expect_error([&] { load("api: {api_key_env: CHARM_TEST_NO_SUCH_KEY}\n"); }, ErrorCategory::kInvalidInput,
               {"api.api_key_env", "is not set"});
}
