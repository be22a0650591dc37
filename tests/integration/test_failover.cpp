// Replicas, failover, rejoin and heartbeats of coordinator/dispatch/cluster_dispatch.h over
// loopback, with in-process WorkerServers (tests/support/rpc_cluster.h). Workers are killed
// mid-layer (server stopped while a delayed request is in flight), made to time out
// (WorkerServerOptions::debug_delay, test-only), or replaced by a fake that sends a
// malformed reply. Every answer is compared byte for byte with the local executor.
#include <doctest/doctest.h>

#include <cstring>
#include <functional>
#include <limits>
#include <thread>

#include "app/status_report.h"
#include "common/error.h"
#include "coordinator/api/metrics.h"
#include "coordinator/dispatch/cluster_dispatch.h"
#include "tests/support/expect_error.h"
#include "tests/support/rpc_cluster.h"

using namespace charm;
using namespace charm::rpc_test;
using charm::test::expect_error;
using namespace std::chrono_literals;


TEST_CASE("replicas, no replicas and each replica alone give identical bytes; work is spread") {
  Replicas r;
  const uint32_t rows = 6;
  const std::vector<float> hidden = noise(rows * kHidden, 77);
  const auto assignments = routing(rows);
  const auto want = expected(r.model, 2, hidden, rows, assignments);

  ClusterDispatcher both(r.topology, r.placement, r.model.fingerprint, r.model.identities);
  ClusterDispatcher only_a(r.topology, r.only(0), r.model.fingerprint, r.model.identities);
  ClusterDispatcher only_b(r.topology, r.only(1), r.model.fingerprint, r.model.identities);
  for (ClusterDispatcher* d : {&both, &only_a, &only_b}) {
    std::vector<int64_t> got(want.size(), -7);
    d->run_layer(2, hidden.data(), rows, kHidden, assignments, got.data());
    CHECK(same_bytes(want, got));
  }
  // Spread: every expert is used, so each replica got one request from `both`.
  CHECK(named(both.status(), "a").requests == 1);
  CHECK(named(both.status(), "b").requests == 1);
  CHECK(named(only_a.status(), "b").requests == 0);
}

TEST_CASE("a worker killed mid-layer: its share goes to the replica, bytes unchanged, then it rejoins") {
  Replicas r(300ms);  // b holds each request 300 ms: long enough to be killed mid-request
  ClusterDispatcher d(r.topology, r.placement, r.model.fingerprint, r.model.identities);
  const uint32_t rows = 5;
  const std::vector<float> hidden = noise(rows * kHidden, 5);
  const auto assignments = routing(rows);
  const auto want = expected(r.model, 0, hidden, rows, assignments);

  std::vector<int64_t> got(want.size(), -7);
  d.begin_layer(0, hidden.data(), rows, kHidden, assignments, got.data());
  r.b.server->stop();  // b closes its connection without answering
  d.finish_layer();
  CHECK(same_bytes(want, got));
  auto status = d.status();
  CHECK(named(status, "b").state == "down");
  CHECK(named(status, "b").failovers == 1);
  CHECK(named(status, "b").last_error.find("layer 0") != std::string::npos);
  CHECK(named(status, "a").state == "up");
  CHECK(named(status, "a").requests == 2);  // its own share, then b's

  // While b is down, a serves everything.
  std::fill(got.begin(), got.end(), -7);
  d.run_layer(0, hidden.data(), rows, kHidden, assignments, got.data());
  CHECK(same_bytes(want, got));

  // Restarted on the same port: the background thread reconnects it (hello again).
  r.b.restart();
  REQUIRE(eventually([&] { return named(d.status(), "b").state == "up"; }));
  CHECK(named(d.status(), "b").rejoins == 1);
  const uint64_t before = r.b.server->health().requests_served;
  std::fill(got.begin(), got.end(), -7);
  d.run_layer(0, hidden.data(), rows, kHidden, assignments, got.data());
  CHECK(same_bytes(want, got));
  CHECK(r.b.server->health().requests_served == before + 1);  // it takes traffic again
}

TEST_CASE("a worker killed with two layers in flight: both its shares go to the replica, bytes unchanged") {
  Replicas r(300ms);
  ClusterDispatcher d(r.topology, r.placement, r.model.fingerprint, r.model.identities);
  const uint32_t rows = 5;
  const std::vector<float> h0 = noise(rows * kHidden, 15), h2 = noise(rows * kHidden, 16);
  const auto assignments = routing(rows);
  const auto want0 = expected(r.model, 0, h0, rows, assignments);
  const auto want2 = expected(r.model, 2, h2, rows, assignments);
  std::vector<int64_t> got0(want0.size(), -7), got2(want2.size(), -7);
  d.begin_layer(0, h0.data(), rows, kHidden, assignments, got0.data());
  d.begin_layer(2, h2.data(), rows, kHidden, assignments, got2.data());
  r.b.server->stop();  // both of b's requests are lost
  d.finish_layer();
  CHECK(same_bytes(want0, got0));
  d.finish_layer();
  CHECK(same_bytes(want2, got2));
  const WorkerStatus b = named(d.status(), "b");
  CHECK(b.state == "down");
  CHECK(b.failovers == 1);  // one failure, which both layers recovered from
  CHECK(named(d.status(), "a").requests == 4);  // its two shares, then b's two
}

TEST_CASE("a worker that does not answer within request_ms is failed over") {
  Replicas r(3000ms);
  r.topology.request_timeout_ms = 150;
  ClusterDispatcher d(r.topology, r.placement, r.model.fingerprint, r.model.identities);
  const std::vector<float> hidden = noise(3 * kHidden, 8);
  const auto assignments = routing(3);
  const auto want = expected(r.model, 2, hidden, 3, assignments);
  std::vector<int64_t> got(want.size(), -7);
  d.run_layer(2, hidden.data(), 3, kHidden, assignments, got.data());
  CHECK(same_bytes(want, got));
  const WorkerStatus b = named(d.status(), "b");
  CHECK(b.failovers == 1);
  CHECK(b.last_error.find("worker 'b'") != std::string::npos);
  CHECK(b.last_error.find("timed out") != std::string::npos);
}

TEST_CASE("a malformed reply is failed over to the replica") {
  Replicas r;
  // What the fake "b" answers the layer request with, and what the coordinator says of it.
  std::function<std::vector<int64_t>(const LayerRequest&)> outputs;
  std::string why;
  SUBCASE("too few values (not one row per position)") {
    outputs = [](const LayerRequest&) { return std::vector<int64_t>(1, 5); };
    why = "layerResponse.outputs has 1 values, expected numRows";
  }
  SUBCASE("a row per position, but a value no sum of its terms can reach") {
    outputs = [](const LayerRequest& req) {
      std::vector<int64_t> v(size_t{req.num_rows} * req.hidden_size, 0);
      v[3] = std::numeric_limits<int64_t>::max();  // would overflow the coordinator's total
      return v;
    };
    why = "layerResponse.outputs row 0 value 3 is out of range";
  }
  // A fake "b": passes the handshake, then answers the layer request with `outputs`.
  auto listener = FrameListener::listen("127.0.0.1", 0);
  r.topology.workers[1].port = listener->port();
  r.topology.rejoin_min_ms = r.topology.rejoin_max_ms = 60000;  // the fake answers one hello only
  std::thread fake([&] {
    // Two connections, data then probe, each with its handshake.
    auto accept = [&] {
      auto conn = listener->accept(10s);
      if (!conn) return conn;
      decode_as<HelloMsg>(conn->receive(10s));
      HelloReplyMsg hello;
      hello.ok = true;
      hello.worker_name = "b";
      hello.model_fingerprint = r.model.fingerprint;
      for (uint32_t layer : kLayers) hello.held[layer] = {0, 1, 2, 3};
      hello.identities = r.model.identities;
      conn->send(encode_hello_reply(hello), 10s);
      decode_as<HealthRequestMsg>(conn->receive(10s));  // the coordinator asks for its RAM slots
      conn->send(encode_health_reply(HealthReplyMsg{}), 10s);
      return conn;
    };
    auto conn = accept();
    auto probe = accept();
    if (!conn || !probe) return;
    const LayerRequest req = decode_as<LayerRequest>(conn->receive(10s));
    LayerResponseMsg reply;
    reply.response.request_id = req.request_id;
    reply.response.outputs = outputs(req);
    conn->send(encode_layer_response(reply), 10s);
    try {
      conn->receive(10s);  // until the coordinator hangs up
    } catch (const Error&) {
    }
  });
  {
    ClusterDispatcher d(r.topology, r.placement, r.model.fingerprint, r.model.identities);
    const std::vector<float> hidden = noise(4 * kHidden, 9);
    const auto assignments = routing(4);
    const auto want = expected(r.model, 0, hidden, 4, assignments);
    std::vector<int64_t> got(want.size(), -7);
    d.run_layer(0, hidden.data(), 4, kHidden, assignments, got.data());
    CHECK(same_bytes(want, got));
    const WorkerStatus b = named(d.status(), "b");
    CHECK(b.failovers == 1);
    CHECK(b.last_error.find(why) != std::string::npos);
    CHECK(named(d.status(), "a").requests == 2);  // its own share, then b's, added once
  }
  fake.join();
}

TEST_CASE("no replica left: an error naming layer, experts and workers tried; then it recovers") {
  Replicas r;
  ClusterDispatcher d(r.topology, r.placement, r.model.fingerprint, r.model.identities);
  r.a.server->stop();
  r.b.server->stop();
  const std::vector<float> hidden = noise(4 * kHidden, 10);
  const auto assignments = routing(4);
  std::vector<int64_t> got(4 * kHidden);
  expect_error([&] { d.run_layer(2, hidden.data(), 4, kHidden, assignments, got.data()); },
               ErrorCategory::kUnavailable, {"layer 2", "experts 0-3", "worker 'a'", "worker 'b'"});
  r.a.restart();
  r.b.restart();
  REQUIRE(eventually([&] {
    const auto s = d.status();
    return s[0].state == "up" && s[1].state == "up";
  }));
  d.run_layer(2, hidden.data(), 4, kHidden, assignments, got.data());
  CHECK(same_bytes(expected(r.model, 2, hidden, 4, assignments), got));
}

TEST_CASE("heartbeats find an idle worker gone; it rejoins when back") {
  Replicas r;
  r.topology.heartbeat_ms = 30;
  // A failed rejoin attempt replaces last_error ("closed the connection"): the first one
  // comes a second after going down, long after the snapshot below (was flaky at 20 ms).
  r.topology.rejoin_min_ms = r.topology.rejoin_max_ms = 1000;
  ClusterDispatcher d(r.topology, r.placement, r.model.fingerprint, r.model.identities);
  REQUIRE(eventually([&] { return r.b.server->health().bytes_in > 0 && named(d.status(), "b").bytes_out > 200; }));
  r.b.server->stop();
  WorkerStatus down;
  REQUIRE(eventually([&] {
    down = named(d.status(), "b");
    return down.state == "down";
  }));
  CHECK(down.last_error.find("heartbeat") != std::string::npos);
  CHECK(down.failovers == 0);  // no layer was failed over
  r.b.restart();
  REQUIRE(eventually([&] { return named(d.status(), "b").state == "up"; }));
  CHECK(named(d.status(), "b").rejoins == 1);
  CHECK(named(d.status(), "b").last_seen_ms >= 0);
}

TEST_CASE("with a shared secret: failover, a refused and an authenticated rejoin; /metrics counts what status does") {
  const std::string secret = "failover secret 0123456789abcdef";
  Replicas r(300ms);
  for (TestWorker* w : {&r.a, &r.b}) {
    w->server->stop();
    w->options.shared_secret = secret;
  }
  r.a.restart();
  r.b.restart(300ms);
  r.topology.cluster_secret = secret;
  ClusterDispatcher d(r.topology, r.placement, r.model.fingerprint, r.model.identities);
  Metrics metrics;
  d.set_metrics(&metrics);
  const uint32_t rows = 5;
  const std::vector<float> hidden = noise(rows * kHidden, 11);
  const auto assignments = routing(rows);
  const auto want = expected(r.model, 0, hidden, rows, assignments);

  std::vector<int64_t> got(want.size(), -7);
  d.begin_layer(0, hidden.data(), rows, kHidden, assignments, got.data());
  r.b.server->stop();
  d.finish_layer();
  CHECK(same_bytes(want, got));
  CHECK(named(d.status(), "b").failovers == 1);
  CHECK(metrics.failovers("b") == 1);  // one count, two views
  CHECK(metrics.failovers("a") == 0);
  const std::string text = metrics.render(d.status());
  CAPTURE(text);
  CHECK(text.find("charm_worker_errors_total{worker=\"b\"} 1\n") != std::string::npos);
  CHECK(text.find("charm_worker_failovers_total{worker=\"b\"} 1\n") != std::string::npos);
  // a answered its own share and then b's: both round trips are recorded.
  CHECK(text.find("charm_worker_rpc_seconds_count{worker=\"a\"} 2\n") != std::string::npos);

  // Back with another secret: the rejoin's handshake fails and b stays down, saying why.
  r.b.options.shared_secret = "not the cluster's secret 0000000";
  r.b.restart();
  REQUIRE(eventually([&] { return named(d.status(), "b").last_error.find("shared secret") != std::string::npos; }));
  CHECK(named(d.status(), "b").state == "down");
  CHECK(named(d.status(), "b").rejoins == 0);

  // Back with the right one: it rejoins.
  r.b.server->stop();
  r.b.options.shared_secret = secret;
  r.b.restart();
  REQUIRE(eventually([&] { return named(d.status(), "b").state == "up"; }));
  CHECK(named(d.status(), "b").rejoins == 1);
}

TEST_CASE("heartbeats over an authenticated connection keep a worker up") {
  const std::string secret = "heartbeat secret 0123456789abcdef";
  Replicas r;
  for (TestWorker* w : {&r.a, &r.b}) {
    w->server->stop();
    w->options.shared_secret = secret;
    w->restart();
  }
  r.topology.cluster_secret = secret;
  r.topology.heartbeat_ms = 20;
  ClusterDispatcher d(r.topology, r.placement, r.model.fingerprint, r.model.identities);
  const uint64_t before = r.b.server->health().bytes_in;
  // Several heartbeats answered (the worker counts their bytes); b never went down, as it
  // would if one went out unauthenticated (the worker drops such a peer).
  REQUIRE(eventually([&] { return r.b.server->health().bytes_in > before + 100; }));
  CHECK(named(d.status(), "b").state == "up");
  CHECK(named(d.status(), "b").rejoins == 0);
  CHECK(named(d.status(), "b").last_error.empty());
}

TEST_CASE("startup: an unreachable replica is left to rejoin; an unreachable sole owner is an error") {
  Replicas r;
  r.b.server->stop();
  r.topology.startup_timeout_ms = 0;
  {
    ClusterDispatcher d(r.topology, r.placement, r.model.fingerprint, r.model.identities);
    CHECK(named(d.status(), "a").state == "up");
    CHECK(named(d.status(), "b").state == "down");
    r.b.restart();
    REQUIRE(eventually([&] { return named(d.status(), "b").state == "up"; }));
    CHECK(named(d.status(), "b").rejoins == 0);  // first connection, not a rejoin
  }
  r.b.server->stop();
  expect_error([&] { ClusterDispatcher(r.topology, r.only(1), r.model.fingerprint, r.model.identities); },
               ErrorCategory::kUnavailable, {"worker 'b'", "layer 0 experts 0-3", "layer 2 experts 0-3"});
}

TEST_CASE("slow_workers: over slow_ms, or 4x the others' median and 2 ms above it") {
  const std::vector<size_t> many = {100, 100, 100};
  CHECK(slow_workers({1.0, 1.2, 9.0}, many, 0) == std::vector<std::string>{"", "", slow_workers({1.0, 1.2, 9.0}, many, 0)[2]});
  CHECK(slow_workers({1.0, 1.2, 9.0}, many, 0)[2].find("9.00 ms") != std::string::npos);
  CHECK(slow_workers({1.0, 1.2, 9.0}, many, 0)[2].find("1.00 ms") != std::string::npos);
  CHECK(slow_workers({0.1, 0.1, 0.9}, many, 0)[2].empty());         // 9x, but under 2 ms apart
  CHECK(slow_workers({1.0, 1.2, 3.0}, many, 0)[2].empty());         // under 4x
  CHECK(slow_workers({1.0, 1.2, 3.0}, many, 2.5)[2].find("slow_ms") != std::string::npos);
  CHECK(slow_workers({1.0, 9.0}, {100, 3}, 0)[1].empty());          // too few samples to judge
  CHECK(slow_workers({9.0}, {100}, 0)[0].empty());                  // nobody to compare with
}

TEST_CASE("charm status shows the coordinator's view: slow, down with its error, failovers, rejoins") {
  ClusterStatus status;
  status.coordinator_reachable = true;
  WorkerStatusRow fast, slow;
  fast.name = "w0";
  fast.up = true;
  fast.state = "up";
  fast.coordinator = WorkerStatus{"w0", "h:1", WorkerState::kDown, 8, 3, 1.0, 2.0, 10, 20, 4, 2, 1500.0, false, "",
                                  "heartbeat: timed out", {{"ram", 8}}};
  slow.name = "w1";
  slow.up = true;
  slow.state = "up";
  slow.coordinator = WorkerStatus{"w1", "h:2", WorkerState::kUp, 8, 30, 9.0, 12.0, 10, 20, 0, 0, 3.0, true,
                                  "layer RTT p50 9.00 ms is over 4x the other workers' median 1.00 ms", "", {{"ram", 8}}};
  status.workers = {fast, slow};
  const std::string table = format_status(status);
  CAPTURE(table);
  CHECK(table.find("COORD") != std::string::npos);
  CHECK(table.find("FAILOVERS") != std::string::npos);
  CHECK(table.find("w0 is down in the coordinator: heartbeat: timed out") != std::string::npos);
  CHECK(table.find("w1 is slow: layer RTT p50 9.00 ms") != std::string::npos);
  CHECK(table.find(" slow ") != std::string::npos);
}
