// worker/rpc_server.h + coordinator/dispatch/cluster_dispatch.h + app/status_report.h over
// loopback: two in-process WorkerServers on ephemeral ports, each holding half of a tiny
// checkpoint's experts (written to a temp dir), against a local ExpertExecutor.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include <httplib.h>
#include <nlohmann/json.hpp>

#include "app/status_report.h"
#include "common/checkpoint.h"
#include "common/error.h"
#include "common/fingerprint.h"
#include "common/json_reader.h"
#include "common/wire.h"
#include "coordinator/dispatch/cluster_dispatch.h"
#include "tests/support/expect_error.h"
#include "tests/support/rpc_cluster.h"
#include "tests/support/safetensors_writer.h"
#include "worker/experts/expert_executor.h"
#include "worker/experts/expert_store.h"
#include "worker/rpc_server.h"

using namespace charm;
using namespace charm::testing;
using namespace std::chrono_literals;

namespace {

using namespace charm::rpc_test;

}  // namespace

TEST_CASE("two remote workers produce the bytes the local executor produces") {
  Cluster cluster;
  auto local_store = cluster.model.store({0, 1, 2, 3});
  ExpertExecutor local(*local_store);
  ClusterDispatcher dispatcher(cluster.topology, cluster.placement, cluster.model.fingerprint, cluster.model.identities);

  for (uint32_t num_rows : {1u, 5u, 16u}) {
    for (uint32_t layer : kLayers) {
      const std::vector<float> hidden = noise(num_rows * kHidden, 100 + num_rows + layer);
      const auto assignments = routing(num_rows);
      std::vector<int64_t> want(num_rows * kHidden, 0);
      std::vector<int64_t> got(num_rows * kHidden, -7);
      local.run_into(layer, hidden.data(), num_rows, assignments, want.data());
      dispatcher.run_layer(layer, hidden.data(), num_rows, kHidden, assignments, got.data());
      CHECK(want == got);
    }
  }
  // A layer whose union lives on one worker only: the other gets no request.
  const std::vector<float> hidden = noise(2 * kHidden, 5);
  const std::vector<ExpertAssignment> only_a = {{1, 2}, {0, 0}, {1, 0}};
  std::vector<int64_t> want(2 * kHidden, 0), got(2 * kHidden, -7);
  local.run_into(0, hidden.data(), 2, only_a, want.data());
  dispatcher.run_layer(0, hidden.data(), 2, kHidden, only_a, got.data());
  CHECK(want == got);

  const auto status = dispatcher.status();
  REQUIRE(status.size() == 2);
  CHECK(status[0].name == "a");
  CHECK(status[0].state == "up");
  CHECK(status[0].experts_held == 4);
  // 1 row routes to experts 0 and 2 (both on "a"), so "b" got no request then.
  CHECK(status[0].requests == 7);  // 3 batch sizes x 2 layers + the one-worker layer
  CHECK(status[1].requests == 4);
  CHECK(status[0].rtt_p50_ms > 0);
  CHECK(status[0].rtt_p99_ms >= status[0].rtt_p50_ms);
  CHECK(status[0].bytes_out > 0);
  CHECK(status[0].bytes_in > 0);
  // The worker counts the same bytes the coordinator does (hello included).
  const HealthReplyMsg health = cluster.a.server->health();
  CHECK(health.requests_served == 7);
  CHECK(health.bytes_in == status[0].bytes_out);
  CHECK(health.bytes_out == status[0].bytes_in);
}

TEST_CASE("begin_layer returns with requests in flight; an abandoned layer is read and dropped") {
  Cluster cluster;
  auto local_store = cluster.model.store({0, 1, 2, 3});
  ExpertExecutor local(*local_store);
  ClusterDispatcher dispatcher(cluster.topology, cluster.placement, cluster.model.fingerprint, cluster.model.identities);
  const std::vector<float> hidden = noise(5 * kHidden, 21);
  const auto assignments = routing(5);
  std::vector<int64_t> want(5 * kHidden, 0);
  local.run_into(2, hidden.data(), 5, assignments, want.data());

  // Begun and never finished (the caller threw): its replies are still on the wire.
  std::vector<int64_t> abandoned(5 * kHidden);
  dispatcher.begin_layer(2, hidden.data(), 5, kHidden, assignments, abandoned.data());
  dispatcher.drop_unfinished();  // the next forward pass starts

  std::vector<int64_t> got(5 * kHidden, -7);
  dispatcher.begin_layer(2, hidden.data(), 5, kHidden, assignments, got.data());
  std::fill(abandoned.begin(), abandoned.end(), 0);  // zeroed by its begin_layer; must stay so
  dispatcher.finish_layer();
  CHECK(cluster.a.server->health().requests_served == 2);  // the abandoned one was answered and dropped
  CHECK(want == got);  // its replies were not added twice
  CHECK(std::all_of(abandoned.begin(), abandoned.end(), [](int64_t v) { return v == 0; }));  // nor into the old buffer
  test::expect_error([&] { dispatcher.finish_layer(); }, ErrorCategory::kInternal, {"begin_layer"});
}

TEST_CASE("two layers in flight (pipelined on each connection) finish in order with the bytes of each alone") {
  Cluster cluster;
  auto local_store = cluster.model.store({0, 1, 2, 3});
  ExpertExecutor local(*local_store);
  ClusterDispatcher dispatcher(cluster.topology, cluster.placement, cluster.model.fingerprint, cluster.model.identities);
  for (uint32_t rows : {1u, 7u, 64u}) {
    const std::vector<float> h0 = noise(rows * kHidden, 300 + rows), h1 = noise(rows * kHidden, 400 + rows);
    const auto assignments = routing(rows);
    std::vector<int64_t> want0(rows * kHidden, 0), want1(rows * kHidden, 0);
    local.run_into(0, h0.data(), rows, assignments, want0.data());
    local.run_into(2, h1.data(), rows, assignments, want1.data());
    std::vector<int64_t> got0(rows * kHidden, -7), got1(rows * kHidden, -7);
    dispatcher.begin_layer(0, h0.data(), rows, kHidden, assignments, got0.data());
    dispatcher.begin_layer(2, h1.data(), rows, kHidden, assignments, got1.data());
    dispatcher.finish_layer();  // the older one
    CHECK(want0 == got0);
    dispatcher.finish_layer();
    CHECK(want1 == got1);
  }
  // A third begin while two are unfinished drops them (their caller threw).
  const std::vector<float> h = noise(3 * kHidden, 9);
  const auto assignments = routing(3);
  std::vector<int64_t> a(3 * kHidden), b(3 * kHidden), c(3 * kHidden, -7), want(3 * kHidden, 0);
  local.run_into(0, h.data(), 3, assignments, want.data());
  dispatcher.begin_layer(0, h.data(), 3, kHidden, assignments, a.data());
  dispatcher.begin_layer(0, h.data(), 3, kHidden, assignments, b.data());
  dispatcher.begin_layer(0, h.data(), 3, kHidden, assignments, c.data());
  dispatcher.finish_layer();
  CHECK(want == c);
  test::expect_error([&] { dispatcher.finish_layer(); }, ErrorCategory::kInternal, {"begin_layer"});
}

TEST_CASE("bytes on the wire per token per layer") {
  // Request: per row hidden_size*4 bytes + 16 bytes per assignment (composite list
  // element: row, expert, weight in two data words) + a fixed envelope; response:
  // hidden_size*8 bytes per row (one int64 fixed-point sum), whatever top_k, + a fixed
  // envelope.
  for (uint32_t rows : {1u, 64u}) {
    for (uint32_t top_k : {1u, 8u}) {
      const uint32_t hidden_size = 2048;
      LayerRequest req;
      req.hidden_size = hidden_size;
      req.num_rows = rows;
      req.hidden.assign(size_t{rows} * hidden_size, 1.0f);
      for (uint32_t r = 0; r < rows; ++r) {
        for (uint32_t k = 0; k < top_k; ++k) req.assignments.push_back({r, k, 0.125f});
      }
      LayerResponseMsg resp;
      resp.response.outputs.assign(size_t{rows} * hidden_size, 1);
      const size_t up = encode_layer_request(req).size();
      const size_t down = encode_layer_response(resp).size();
      const size_t up_payload = size_t{rows} * (hidden_size * 4 + 16 * top_k);
      const size_t down_payload = size_t{rows} * hidden_size * 8;
      MESSAGE("rows=" << rows << " H=" << hidden_size << " k=" << top_k << ": request " << up << " B ("
                      << up / rows << " B/token), response " << down << " B (" << down / rows << " B/token)");
      CHECK(up >= up_payload);
      CHECK(up - up_payload < 128);  // the envelope is a handful of words
      CHECK(down >= down_payload);
      CHECK(down - down_payload < 160);  // + LayerStats with the tier counters: 7 words
      CHECK(double(down) <= 1.1 * double(down_payload) + 160);  // the issue-17 goal, framing included
    }
  }
}

TEST_CASE("a model fingerprint mismatch is rejected naming both fingerprints") {
  Cluster cluster;
  const std::string wrong = "0123456789abcdef";
  test::expect_error([&] { ClusterDispatcher(cluster.topology, cluster.placement, wrong, cluster.model.identities); },
                ErrorCategory::kProtocol, {"worker 'a'", wrong, cluster.model.fingerprint});
  // And the raw reply says ok=false with both values.
  auto conn = FrameConnection::connect("127.0.0.1", cluster.a.server->port(), 5s, "a");
  conn->send(encode_hello(HelloMsg{kProtocolVersion, wrong, "test", ""}), 5s);
  const auto reply = decode_as<HelloReplyMsg>(conn->receive(5s));
  CHECK_FALSE(reply.ok);
  CHECK(reply.error.find(wrong) != std::string::npos);
  CHECK(reply.error.find(cluster.model.fingerprint) != std::string::npos);
  // A wrong protocol version names both versions.
  conn->send(encode_hello(HelloMsg{kProtocolVersion + 41, cluster.model.fingerprint, "test", ""}), 5s);
  const auto reply2 = decode_as<HelloReplyMsg>(conn->receive(5s));
  CHECK_FALSE(reply2.ok);
  CHECK(reply2.error.find(std::to_string(kProtocolVersion + 41)) != std::string::npos);
  CHECK(reply2.error.find(std::to_string(kProtocolVersion)) != std::string::npos);
}

TEST_CASE("a placement the worker does not hold is rejected at the handshake") {
  Cluster cluster;
  auto placement = cluster.placement;
  placement[0] = {{1}, {0}, {0}, {1}};  // claims "a" holds expert 1
  test::expect_error([&] { ClusterDispatcher(cluster.topology, placement, cluster.model.fingerprint, cluster.model.identities); },
                ErrorCategory::kProtocol, {"worker 'a'", "expert 1 of layer 0"});
}

TEST_CASE("malformed frames get an error and a close; the server keeps serving") {
  Cluster cluster;
  const uint16_t port = cluster.a.server->port();

  SUBCASE("garbage body") {
    auto conn = FrameConnection::connect("127.0.0.1", port, 5s, "a");
    Frame garbage = {16, 0, 0, 0};
    for (int i = 0; i < 16; ++i) garbage.push_back(static_cast<uint8_t>(0xa5 ^ (i * 37)));
    conn->send(garbage, 5s);
    const auto error = decode_as<ErrorMsg>(conn->receive(5s));
    CHECK(error.message.find("malformed") != std::string::npos);
    test::expect_error([&] { conn->receive(5s); }, ErrorCategory::kUnavailable, {"closed"});
  }
  SUBCASE("length over the cap") {
    auto conn = FrameConnection::connect("127.0.0.1", port, 5s, "a");
    conn->send(Frame{0xf8, 0xff, 0xff, 0xff}, 5s);
    const auto error = decode_as<ErrorMsg>(conn->receive(5s));
    CHECK(error.message.find("exceeds the cap") != std::string::npos);
    test::expect_error([&] { conn->receive(5s); }, ErrorCategory::kUnavailable, {"closed"});
  }
  SUBCASE("a bad layerRequest (row out of range)") {
    auto conn = FrameConnection::connect("127.0.0.1", port, 5s, "a");
    conn->send(encode_hello(HelloMsg{kProtocolVersion, cluster.model.fingerprint, "t", ""}), 5s);
    CHECK(decode_as<HelloReplyMsg>(conn->receive(5s)).ok);
    LayerRequest req;
    req.hidden_size = kHidden;
    req.num_rows = 1;
    req.hidden.assign(kHidden, 0.5f);
    req.assignments = {{0, 0}};
    Frame frame = encode_layer_request(req);
    // Patch the only assignment's row (first 32 bits of its first data word; the second
    // holds its weight, the frame's last word) to 9.
    const size_t row_word = frame.size() - 16;
    frame[row_word] = 9;
    conn->send(frame, 5s);
    const auto error = decode_as<ErrorMsg>(conn->receive(5s));
    CHECK(error.message.find("layerRequest.assignments[0].row = 9") != std::string::npos);
  }
  SUBCASE("a message clients must not send") {
    auto conn = FrameConnection::connect("127.0.0.1", port, 5s, "a");
    conn->send(encode_health_reply(HealthReplyMsg{}), 5s);
    const auto error = decode_as<ErrorMsg>(conn->receive(5s));
    CHECK(error.message.find("healthReply") != std::string::npos);
  }
  SUBCASE("a client that hangs up mid-frame") {
    auto conn = FrameConnection::connect("127.0.0.1", port, 5s, "a");
    conn->send(Frame{64, 0, 0, 0, 1, 2, 3}, 5s);
    conn->close();
  }

  // The next client is served normally.
  ClusterDispatcher dispatcher(cluster.topology, cluster.placement, cluster.model.fingerprint, cluster.model.identities);
  const std::vector<float> hidden = noise(3 * kHidden, 9);
  const auto assignments = routing(3);
  std::vector<int64_t> got(3 * kHidden);
  dispatcher.run_layer(2, hidden.data(), 3, kHidden, assignments, got.data());
  CHECK(dispatcher.status()[0].state == "up");
}

TEST_CASE("errors inside a request come back as layerResponse.error; the connection survives") {
  Cluster cluster;
  auto conn = FrameConnection::connect("127.0.0.1", cluster.a.server->port(), 5s, "a");
  LayerRequest req;
  req.request_id = 41;
  req.layer = 0;
  req.hidden_size = kHidden;
  req.num_rows = 1;
  req.hidden.assign(kHidden, 0.25f);
  req.assignments = {{0, 1}};  // expert 1 lives on "b"

  // Before hello: refused, politely.
  conn->send(encode_layer_request(req), 5s);
  auto r1 = decode_as<LayerResponseMsg>(conn->receive(5s));
  CHECK(r1.response.request_id == 41);
  CHECK(r1.error.find("hello") != std::string::npos);

  conn->send(encode_hello(HelloMsg{kProtocolVersion, cluster.model.fingerprint, "t", ""}), 5s);
  CHECK(decode_as<HelloReplyMsg>(conn->receive(5s)).ok);
  conn->send(encode_layer_request(req), 5s);
  auto r2 = decode_as<LayerResponseMsg>(conn->receive(5s));
  CHECK(r2.error.find("expert 1") != std::string::npos);
  CHECK(r2.response.outputs.empty());

  // Same connection still works.
  req.assignments = {{0, 2}};
  conn->send(encode_layer_request(req), 5s);
  auto r3 = decode_as<LayerResponseMsg>(conn->receive(5s));
  CHECK(r3.error.empty());
  CHECK(r3.response.outputs.size() == kHidden);
  conn->send(encode_health_request(), 5s);
  auto health = decode_as<HealthReplyMsg>(conn->receive(5s));
  CHECK(health.worker_name == "a");
  CHECK(health.state == "up");
  CHECK(health.experts_held == 4);
  CHECK(health.requests_served == 3);
}

TEST_CASE("a worker without a replica that goes away fails run_layer naming the worker, layer and experts") {
  Cluster cluster;
  ClusterDispatcher dispatcher(cluster.topology, cluster.placement, cluster.model.fingerprint, cluster.model.identities);
  cluster.b.server->stop();
  const std::vector<float> hidden = noise(4 * kHidden, 3);
  const auto assignments = routing(4);
  std::vector<int64_t> got(4 * kHidden);
  test::expect_error([&] { dispatcher.run_layer(2, hidden.data(), 4, kHidden, assignments, got.data()); },
                ErrorCategory::kUnavailable, {"worker 'b'", "layer 2", "experts 1, 3"});
  const auto status = dispatcher.status();
  CHECK(status[0].state == "up");
  CHECK(status[1].state == "down");
  CHECK(status[1].failovers == 1);
  // The dispatcher is still usable: a layer that needs only "a" is served.
  const std::vector<ExpertAssignment> only_a = {{0, 0}, {1, 2}};
  dispatcher.run_layer(2, hidden.data(), 4, kHidden, only_a, got.data());
  CHECK(dispatcher.status()[0].state == "up");
}

// A stand-in coordinator: serves GET /cluster/status on an ephemeral loopback port with
// the given workers' counters, so collect_status sees a reachable coordinator.
struct FakeCoordinator {
  httplib::Server server;
  std::thread thread;
  int port = 0;

  explicit FakeCoordinator(const std::vector<std::string>& names) {
    nlohmann::json workers = nlohmann::json::array();
    for (const std::string& name : names) {
      workers.push_back({{"name", name}, {"address", "-"}, {"state", "up"}, {"experts_held", 4},
                         {"requests", 0}, {"rtt_p50_ms", 1.0}, {"rtt_p99_ms", 2.0},
                         {"bytes_out", 0}, {"bytes_in", 0}});
    }
    const std::string body = nlohmann::json{{"workers", workers}}.dump();
    server.Get("/cluster/status", [body](const httplib::Request&, httplib::Response& res) {
      res.set_content(body, "application/json");
    });
    port = server.bind_to_any_port("127.0.0.1");
    thread = std::thread([this] { server.listen_after_bind(); });
    // The socket already listens (bind_to_any_port); wait for the accept loop so stop()
    // in the destructor cannot run before it and leave listen_after_bind blocked.
    while (!server.is_running()) std::this_thread::sleep_for(1ms);
  }
  ~FakeCoordinator() {
    server.stop();
    thread.join();
  }
};

TEST_CASE("charm status: all up only with a reachable coordinator and matching workers") {
  Cluster cluster;
  FakeCoordinator coordinator({"a", "b"});
  cluster.topology.api_port = static_cast<uint16_t>(coordinator.port);
  cluster.model.cache_manifest();  // as the coordinator's start does: status then checks the weights too
  ClusterStatus status = collect_status(cluster.topology, 2000);
  std::string table = format_status(status);
  INFO(table);
  CHECK(status.coordinator_reachable);
  CHECK(status.expected_fingerprint == cluster.model.fingerprint);
  CHECK(status.notes.empty());
  REQUIRE(status.workers.size() == 2);
  CHECK(status.workers[0].state == "up");
  CHECK(status.workers[0].expected_experts == 4u);  // experts 0, 2 on layers 0, 2
  CHECK(status.workers[0].health->model_fingerprint == cluster.model.fingerprint);
  CHECK(status.workers[0].coordinator.has_value());
  CHECK(status.all_up);
  CHECK(table.find("unreachable") == std::string::npos);
}

TEST_CASE("charm status: coordinator unreachable or a worker down makes all_up false") {
  Cluster cluster;  // api_port: nothing listens there
  ClusterStatus status = collect_status(cluster.topology, 2000);
  CHECK_FALSE(status.all_up);
  CHECK_FALSE(status.coordinator_reachable);
  REQUIRE(status.workers.size() == 2);
  CHECK(status.workers[0].up);
  CHECK(status.workers[0].state == "up");  // the workers themselves are fine
  CHECK(status.workers[1].state == "up");
  CHECK(status.workers[0].health->experts_held == 4);
  std::string table = format_status(status);
  INFO(table);
  CHECK(table.find("WORKER") == 0);
  const std::string where = "coordinator at 127.0.0.1:" + std::to_string(cluster.topology.api_port) +
                            " is unreachable";
  CHECK(table.find(where) != std::string::npos);
  CHECK(table.find(" down") == std::string::npos);

  cluster.b.server->stop();
  status = collect_status(cluster.topology, 2000);
  CHECK_FALSE(status.all_up);
  CHECK(status.workers[0].up);
  CHECK_FALSE(status.workers[1].up);
  CHECK(status.workers[1].state == "down");
  table = render_status(cluster.topology, 2000);
  CHECK(table.find(" down") != std::string::npos);
}

TEST_CASE("charm status: a worker serving another model is wrong-model") {
  Cluster cluster;
  FakeCoordinator coordinator({"a", "b"});
  cluster.topology.api_port = static_cast<uint16_t>(coordinator.port);
  // Worker "a" restarted on a checkpoint with another fingerprint, same experts.
  cluster.a.server->stop();
  WorkerServerOptions options;
  options.worker_name = "a";
  options.model_fingerprint = "00000000deadbeef";
  WorkerServer other(options, *cluster.a.service);
  other.start();
  cluster.topology.workers[0].port = other.port();

  ClusterStatus status = collect_status(cluster.topology, 2000);
  const std::string table = format_status(status);
  INFO(table);
  CHECK(status.coordinator_reachable);
  CHECK_FALSE(status.all_up);
  REQUIRE(status.workers.size() == 2);
  CHECK(status.workers[0].up);
  CHECK(status.workers[0].state == "wrong-model");
  CHECK(status.workers[1].state == "up");
  // The row says so, and a line names both fingerprints.
  CHECK(table.find("wrong-model") != std::string::npos);
  CHECK(table.find("00000000deadbeef") != std::string::npos);
  CHECK(table.find(cluster.model.fingerprint) != std::string::npos);
  // Columns still line up.
  const size_t header_col = table.find("STATE");
  const size_t row_start = table.find('\n') + 1;
  CHECK(table.find("wrong-model", row_start) - row_start == header_col);
}

TEST_CASE("charm status: a worker holding other experts than the placement is wrong-experts") {
  Cluster cluster;
  FakeCoordinator coordinator({"a", "b"});
  cluster.topology.api_port = static_cast<uint16_t>(coordinator.port);
  // The topology gives "a" experts 0-2 and "b" expert 3, but the workers hold 0,2 / 1,3.
  cluster.topology.workers[0].experts = {0, 1, 2};
  cluster.topology.workers[1].experts = {3};
  ClusterStatus status = collect_status(cluster.topology, 2000);
  const std::string table = format_status(status);
  INFO(table);
  CHECK_FALSE(status.all_up);
  REQUIRE(status.workers.size() == 2);
  CHECK(status.workers[0].state == "wrong-experts");
  CHECK(status.workers[0].expected_experts == 6u);
  CHECK(status.workers[1].state == "wrong-experts");
  CHECK(table.find("a is wrong-experts: holds 4 (layer, expert) pairs, the topology's placement assigns it 6") !=
        std::string::npos);
}

TEST_CASE("charm status: an unreadable model skips those checks and says so") {
  Cluster cluster;
  FakeCoordinator coordinator({"a", "b"});
  cluster.topology.api_port = static_cast<uint16_t>(coordinator.port);
  cluster.topology.model = cluster.model.dir / "no-such-model";
  ClusterStatus status = collect_status(cluster.topology, 2000);
  const std::string table = format_status(status);
  INFO(table);
  CHECK(status.expected_fingerprint.empty());
  REQUIRE(status.notes.size() == 1);
  CHECK(table.find("note: cannot read the model at") != std::string::npos);
  CHECK(table.find("not checked") != std::string::npos);
  CHECK(status.workers[0].state == "up");
  CHECK(status.all_up);

  // A worker reporting no fingerprint (older build) is not taken on trust.
  WorkerStatusRow row;
  row.up = true;
  row.health = HealthReplyMsg{"w1", "up", 4, 0, 0, 0, 0, kProtocolVersion, ""};
  judge_worker(row, cluster.model.fingerprint);
  CHECK(row.state == "wrong-model");
  CHECK(row.error.find("no model fingerprint") != std::string::npos);
  row.health->protocol_version = kProtocolVersion + 1;
  judge_worker(row, cluster.model.fingerprint);
  CHECK(row.state == "wrong-protocol");
}

TEST_CASE("charm status table joins the coordinator's /cluster/status view") {
  ClusterStatus status;
  WorkerStatusRow row;
  row.name = "w1";
  row.address = "127.0.0.1:5001";
  row.up = true;
  row.health = HealthReplyMsg{"w1", "up", 64, 12, 0, 0, 1000, kProtocolVersion, "0123456789abcdef"};
  row.ping_ms = 0.25;
  row.coordinator = parse_cluster_status(
      R"({"workers":[{"name":"w1","address":"127.0.0.1:5001","state":"up","experts_held":64,)"
      R"("requests":12,"rtt_p50_ms":1.5,"rtt_p99_ms":3.25,"bytes_out":2048,"bytes_in":1048576}]})")[0];
  status.workers.push_back(row);
  status.coordinator_reachable = true;
  const std::string table = format_status(status);
  INFO(table);
  CHECK(table.find("1.50") != std::string::npos);
  CHECK(table.find("3.25") != std::string::npos);
  CHECK(table.find("1.0MiB") != std::string::npos);  // table cells are one word each
  CHECK(table.find("2.0KiB") != std::string::npos);
  // Columns line up: every line has the ADDRESS column at the same offset.
  const size_t header_col = table.find("ADDRESS");
  CHECK(table.find("127.0.0.1:5001") - table.find('\n') - 1 == header_col);

  test::expect_error([] { parse_cluster_status("{\"workers\":[{\"name\":\"w1\"}]}"); },
                ErrorCategory::kProtocol, {"workers[0].address"});
  test::expect_error([] { parse_cluster_status("not json"); }, ErrorCategory::kProtocol, {"/cluster/status", "not valid JSON"});
}

namespace {

// An ExecutorService that records every prefetch hint it is given.
class RecordingService final : public LayerService {
 public:
  explicit RecordingService(const ExpertExecutor& executor) : inner_(executor) {}
  LayerResponse run(const LayerRequest& request) override {
    if (request.prefetch) {
      std::lock_guard<std::mutex> lock(mutex_);
      carried_.emplace_back(request.request_id, *request.prefetch);
    }
    return inner_.run(request);
  }
  std::map<uint32_t, std::vector<uint32_t>> held() const override { return inner_.held(); }
  ExpertIdentities identities() const override { return inner_.identities(); }
  void prefetch(uint32_t layer, const std::vector<uint32_t>& experts) override {
    std::lock_guard<std::mutex> lock(mutex_);
    hints_.emplace_back(layer, experts);
    if (layer == 99) throw Error(ErrorCategory::kInvalidInput, "no such layer");  // must be dropped
  }
  std::vector<std::pair<uint32_t, std::vector<uint32_t>>> hints() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return hints_;
  }
  /// The prefetches carried by layer requests: (request id, hint).
  std::vector<std::pair<uint64_t, PrefetchHintMsg>> carried() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return carried_;
  }

 private:
  ExecutorService inner_;
  mutable std::mutex mutex_;
  std::vector<std::pair<uint32_t, std::vector<uint32_t>>> hints_;  // prefetchHint messages
  std::vector<std::pair<uint64_t, PrefetchHintMsg>> carried_;
};

// A worker like TestWorker whose service records hints.
struct HintWorker {
  std::unique_ptr<ExpertStore> store;
  std::unique_ptr<ExpertExecutor> executor;
  std::unique_ptr<RecordingService> service;
  std::unique_ptr<WorkerServer> server;

  HintWorker(const TinyModel& model, const std::string& name, const std::vector<uint32_t>& experts) {
    store = model.store(experts);
    executor = std::make_unique<ExpertExecutor>(*store);
    service = std::make_unique<RecordingService>(*executor);
    WorkerServerOptions options;
    options.worker_name = name;
    options.model_fingerprint = model.fingerprint;
    server = std::make_unique<WorkerServer>(options, *service);
    server->start();
  }
};

}  // namespace

TEST_CASE("prefetchHint gets no reply: the replies that follow stay in step") {
  TinyModel model;
  HintWorker worker(model, "a", {0, 1, 2, 3});
  auto conn = FrameConnection::connect("127.0.0.1", worker.server->port(), 5s, "a");

  // Before hello: dropped, and no reply (the next frame read answers the health request).
  conn->send(encode_prefetch_hint(PrefetchHintMsg{0, {1}}), 5s);
  conn->send(encode_health_request(), 5s);
  CHECK(decode_as<HealthReplyMsg>(conn->receive(5s)).worker_name == "a");
  CHECK(worker.service->hints().empty());

  conn->send(encode_hello(HelloMsg{kProtocolVersion, model.fingerprint, "t"}), 5s);
  REQUIRE(decode_as<HelloReplyMsg>(conn->receive(5s)).ok);
  LayerRequest req;
  req.request_id = 41;
  req.layer = 2;
  req.hidden_size = kHidden;
  req.num_rows = 1;
  req.hidden = noise(kHidden, 3);
  req.assignments = {{0, 1}};
  // Hint, request, a hint the service rejects (dropped, connection stays), request.
  conn->send(encode_prefetch_hint(PrefetchHintMsg{2, {1, 3}}), 5s);
  conn->send(encode_layer_request(req), 5s);
  conn->send(encode_prefetch_hint(PrefetchHintMsg{99, {0}}), 5s);
  req.request_id = 42;
  conn->send(encode_layer_request(req), 5s);
  const auto first = decode_as<LayerResponseMsg>(conn->receive(5s));
  const auto second = decode_as<LayerResponseMsg>(conn->receive(5s));
  CHECK(first.error.empty());
  CHECK(first.response.request_id == 41);
  CHECK(second.error.empty());
  CHECK(second.response.request_id == 42);
  CHECK(first.response.outputs == second.response.outputs);
  conn->send(encode_health_request(), 5s);
  CHECK(decode_as<HealthReplyMsg>(conn->receive(5s)).requests_served == 2);

  const auto hints = worker.service->hints();
  REQUIRE(hints.size() == 2);
  CHECK(hints[0].first == 2);
  CHECK(hints[0].second == std::vector<uint32_t>{1, 3});
  CHECK(hints[1].first == 99);
  CHECK(worker.server->hints_received() == 3);

  // A prefetch carried by a request reaches the service with it, and changes no bit.
  req.request_id = 43;
  req.prefetch = PrefetchHintMsg{2, {0, 3}};
  conn->send(encode_layer_request(req), 5s);
  const auto third = decode_as<LayerResponseMsg>(conn->receive(5s));
  CHECK(third.error.empty());
  CHECK(third.response.outputs == first.response.outputs);
  const auto carried = worker.service->carried();
  REQUIRE(carried.size() == 1);
  CHECK(carried[0].first == 43);
  CHECK(carried[0].second.experts == std::vector<uint32_t>{0, 3});
  CHECK(worker.server->hints_received() == 4);
}

TEST_CASE("a prefetch carried by a request that the model rules out is dropped; the request is served") {
  TinyModel model;
  auto store = model.store({0, 1, 2, 3});
  ExpertExecutor executor(*store);
  RecordingService service(executor);
  WorkerServerOptions options;
  options.worker_name = "a";
  options.model_fingerprint = model.fingerprint;
  options.limits = ModelLimits{3, 4, kHidden, {0, 2}};
  WorkerServer server(options, service);
  server.start();
  auto conn = FrameConnection::connect("127.0.0.1", server.port(), 5s, "a");
  conn->send(encode_hello(HelloMsg{kProtocolVersion, model.fingerprint, "t"}), 5s);
  REQUIRE(decode_as<HelloReplyMsg>(conn->receive(5s)).ok);
  LayerRequest req{1, 0, kHidden, 1, noise(kHidden, 3), {{0, 1}}, std::nullopt};
  for (const PrefetchHintMsg& bad : {PrefetchHintMsg{1, {0}},     // layer 1 is dense
                                     PrefetchHintMsg{2, {0, 4}},  // expert 4 >= num_experts
                                     PrefetchHintMsg{9, {0}}}) {  // no layer 9
    req.prefetch = bad;
    conn->send(encode_layer_request(req), 5s);
    const auto reply = decode_as<LayerResponseMsg>(conn->receive(5s));
    CHECK(reply.error.empty());
  }
  CHECK(service.carried().empty());
  CHECK(server.hints_received() == 3);
  req.prefetch = PrefetchHintMsg{2, {3}};
  conn->send(encode_layer_request(req), 5s);
  CHECK(decode_as<LayerResponseMsg>(conn->receive(5s)).error.empty());
  REQUIRE(service.carried().size() == 1);
  server.stop();
}

TEST_CASE("ClusterDispatcher::hint_layer: each owner's share rides on its next request, or goes alone") {
  TinyModel model;
  HintWorker a(model, "a", {0, 2});
  HintWorker b(model, "b", {1, 3});
  Topology topology;
  topology.model = model.dir.path();
  topology.workers = {WorkerSpec{"a", "127.0.0.1", a.server->port(), {0, 2}, {}},
                      WorkerSpec{"b", "127.0.0.1", b.server->port(), {1, 3}, {}}};
  Placement placement;
  for (uint32_t layer : kLayers) placement[layer] = {{0}, {1}, {0}, {1}};
  ClusterDispatcher dispatcher(topology, placement, model.fingerprint, model.identities);

  const std::vector<float> hidden = noise(3 * kHidden, 5);
  const auto assignments = routing(3);  // experts on both workers
  std::vector<int64_t> plain(3 * kHidden), hinted(3 * kHidden);
  dispatcher.run_layer(0, hidden.data(), 3, kHidden, assignments, plain.data());

  dispatcher.hint_layer(1, {0});         // not a MoE layer of the placement: sent nowhere
  dispatcher.hint_layer(2, {0, 1, 3, 17});  // a gets {0}, b gets {1, 3}; 17 is out of range
  dispatcher.begin_layer(0, hidden.data(), 3, kHidden, assignments, hinted.data());
  dispatcher.finish_layer();
  CHECK(plain == hinted);
  auto ca = a.service->carried();
  auto cb = b.service->carried();
  REQUIRE(ca.size() == 1);
  REQUIRE(cb.size() == 1);
  CHECK(ca[0].second.layer == 2);
  CHECK(ca[0].second.experts == std::vector<uint32_t>{0});
  CHECK(cb[0].second.layer == 2);
  CHECK(cb[0].second.experts == std::vector<uint32_t>{1, 3});
  CHECK(a.service->hints().empty());
  CHECK(b.service->hints().empty());

  // b has no part in a layer that only uses expert 0: its share goes alone, and a hint
  // still staged at the next hint_layer goes alone too.
  const std::vector<ExpertAssignment> only_a = {{0, 0, 1.0f}, {1, 0, 0.5f}, {2, 2, 0.25f}};
  dispatcher.hint_layer(2, {2, 3});  // a {2}, b {3}
  dispatcher.run_layer(0, hidden.data(), 3, kHidden, only_a, hinted.data());
  dispatcher.hint_layer(0, {1});     // b {1}, staged ...
  dispatcher.hint_layer(2, {0});     // ... then sent alone by this one; a {0} staged
  dispatcher.run_layer(2, hidden.data(), 3, kHidden, only_a, hinted.data());
  // One more round trip to b guarantees it has read the hints sent alone.
  dispatcher.run_layer(2, hidden.data(), 3, kHidden, assignments, hinted.data());
  ca = a.service->carried();
  REQUIRE(ca.size() == 3);
  CHECK(ca[1].second.experts == std::vector<uint32_t>{2});
  CHECK(ca[2].second.layer == 2);
  CHECK(ca[2].second.experts == std::vector<uint32_t>{0});
  CHECK(b.service->carried().size() == 1);
  const auto hb = b.service->hints();
  REQUIRE(hb.size() == 2);
  CHECK(hb[0] == std::pair<uint32_t, std::vector<uint32_t>>{2, {3}});
  CHECK(hb[1] == std::pair<uint32_t, std::vector<uint32_t>>{0, {1}});
}

TEST_CASE("health carries the worker's tier counters; charm status shows hit rate, bytes read and layers") {
  Cluster cluster;
  ClusterDispatcher dispatcher(cluster.topology, cluster.placement, cluster.model.fingerprint, cluster.model.identities);
  const std::vector<float> hidden = noise(3 * kHidden, 9);
  const auto assignments = routing(3);
  std::vector<int64_t> got(3 * kHidden);
  for (uint32_t layer : kLayers) dispatcher.run_layer(layer, hidden.data(), 3, kHidden, assignments, got.data());
  // Everything resident (no budget): every lookup is a hit, nothing read after start.
  const HealthReplyMsg health = cluster.a.server->health();
  CHECK(health.tier.hits > 0);
  CHECK(health.tier.misses == 0);
  CHECK(health.tier.bytes_read == 0);
  CHECK(health.slots == 4);
  CHECK(health.slot_bytes == 4096);
  REQUIRE(health.tier_layers.size() == 2);
  CHECK(health.tier_layers.at(0).hits + health.tier_layers.at(2).hits == health.tier.hits);

  ClusterStatus status;
  WorkerStatusRow row;
  row.name = "a";
  row.address = "127.0.0.1:1";
  row.up = true;
  row.health = health;
  row.health->tier = {3, 1, 3 << 20, 2000000, 5000000, 4, 2};
  row.health->tier_layers = {{0, {3, 1, 3 << 20, 2000000, 5000000, 4, 2}}};
  status.workers.push_back(row);
  status.coordinator_reachable = true;
  const std::string table = format_status(status, /*layers=*/true);
  INFO(table);
  CHECK(table.find("HIT_RATE") != std::string::npos);
  CHECK(table.find("75.0%") != std::string::npos);
  CHECK(table.find("3.0MiB") != std::string::npos);  // DISK_READ
  CHECK(table.find("a layer 0: hits 3, misses 1 (75.0% hit), read 3.0 MiB, io wait 2.00 ms, disk 5.00 ms, "
                   "prefetch used 2/4") != std::string::npos);
  CHECK(format_status(status).find("a layer 0") == std::string::npos);
}

TEST_CASE("charm status: a streamed /cluster/status reply over the cap is cut off without holding it") {
  Cluster cluster;
  // Whatever answers at the API's address streams 80 MiB of spaces.
  httplib::Server server;
  server.Get("/cluster/status", [](const httplib::Request&, httplib::Response& res) {
    res.set_chunked_content_provider("application/json", [](size_t offset, httplib::DataSink& sink) {
      static const std::string chunk(1u << 20, ' ');
      if (offset >= (80u << 20)) {
        sink.done();
      } else {
        sink.write(chunk.data(), chunk.size());
      }
      return true;
    });
  });
  const int port = server.bind_to_any_port("127.0.0.1");
  std::thread thread([&] { server.listen_after_bind(); });
  while (!server.is_running()) std::this_thread::sleep_for(1ms);
  cluster.topology.api_port = static_cast<uint16_t>(port);
  ClusterStatus status = collect_status(cluster.topology, 10000);
  server.stop();
  thread.join();
  CHECK_FALSE(status.coordinator_reachable);
  CHECK_FALSE(status.all_up);
  CHECK_MESSAGE(status.coordinator_error.find("exceeds the cap of " +
                                              std::to_string(max_cluster_status_bytes(cluster.topology.workers.size()))) !=
                    std::string::npos,
                status.coordinator_error);
}
