// A worker that stops answering without closing its sockets (stopped process, host asleep,
// cut link) must not stall the coordinator: layer replies, heartbeats, prefetch hints,
// rejoin handshakes, startup connects and `charm status` are each bounded well below
// request_ms (coordinator/dispatch/cluster_dispatch.h, docs/architecture.md "Silent workers").
// The silence comes from a FreezeRelay in front of an in-process worker (tests/support/
// freeze_relay.h). Bounds are functional (seconds against a request_ms of 20 s), not
// speed assertions; docs/benchmarks.md has the measured figures.
#include <doctest/doctest.h>

#include <chrono>
#include <thread>

#include "app/status_report.h"
#include "common/error.h"
#include "coordinator/dispatch/cluster_dispatch.h"
#include "tests/support/expect_error.h"
#include "tests/support/freeze_relay.h"
#include "tests/support/rpc_cluster.h"

using namespace charm;
using namespace charm::rpc_test;
using charm::test::expect_error;
using charm::test::FreezeRelay;
using namespace std::chrono_literals;

namespace {

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

// Replicas whose worker "b" is reached through a relay that can be frozen; request_ms is
// far above every bound checked below, so only the silence handling can meet them.
struct FrozenB : Replicas {
  FreezeRelay relay{b.server->port()};
  static constexpr int64_t kRequestMs = 20000;

  FrozenB() {
    topology.workers[1].port = relay.port();
    topology.request_timeout_ms = kRequestMs;
  }
};

// A few layers, so every worker has round trips to learn its deadlines from.
void warm_up(ClusterDispatcher& d, const std::vector<float>& hidden, uint32_t rows,
             const std::vector<ExpertAssignment>& assignments, const std::vector<int64_t>& want) {
  for (int i = 0; i < 10; ++i) {
    std::vector<int64_t> got(want.size(), -7);
    d.run_layer(0, hidden.data(), rows, kHidden, assignments, got.data());
    REQUIRE(same_bytes(want, got));
  }
}

}  // namespace

TEST_CASE("a frozen worker with a live replica: the layer completes on the replica long before request_ms, "
          "bytes unchanged; thawed, it rejoins and serves") {
  FrozenB r;
  ClusterDispatcher d(r.topology, r.placement, r.model.fingerprint, r.model.identities);
  const uint32_t rows = 5;
  const std::vector<float> hidden = noise(rows * kHidden, 31);
  const auto assignments = routing(rows);
  const auto want = expected(r.model, 0, hidden, rows, assignments);
  warm_up(d, hidden, rows, assignments, want);

  r.relay.freeze();
  std::vector<int64_t> got(want.size(), -7);
  const auto start = Clock::now();
  d.run_layer(0, hidden.data(), rows, kHidden, assignments, got.data());
  const double stalled = ms_since(start);
  MESSAGE("frozen worker -> layer done on the replica in " << stalled << " ms (request_ms " << FrozenB::kRequestMs
                                                           << ")");
  CHECK(same_bytes(want, got));
  CHECK(stalled < 5000);
  WorkerStatus b = named(d.status(), "b");
  CHECK(b.state == "down");
  CHECK(b.failovers == 1);
  CHECK(b.last_error.find("probe") != std::string::npos);

  // While it is down the replica serves everything, at once.
  const auto again = Clock::now();
  d.run_layer(0, hidden.data(), rows, kHidden, assignments, got.data());
  CHECK(ms_since(again) < 5000);
  CHECK(same_bytes(want, got));

  r.relay.thaw();
  REQUIRE(eventually([&] { return named(d.status(), "b").state == "up"; }));
  CHECK(named(d.status(), "b").rejoins == 1);
  const uint64_t before = named(d.status(), "b").requests;
  std::fill(got.begin(), got.end(), -7);
  d.run_layer(0, hidden.data(), rows, kHidden, assignments, got.data());
  CHECK(same_bytes(want, got));
  CHECK(named(d.status(), "b").requests == before + 1);  // it takes traffic again
}

TEST_CASE("a frozen sole owner: the layer fails with the named error long before request_ms; thawed, the "
          "next layer is served") {
  FrozenB r;
  ClusterDispatcher d(r.topology, r.only(1), r.model.fingerprint, r.model.identities);
  const uint32_t rows = 4;
  const std::vector<float> hidden = noise(rows * kHidden, 32);
  const auto assignments = routing(rows);
  const auto want = expected(r.model, 2, hidden, rows, assignments);
  std::vector<int64_t> got(want.size(), -7);
  for (int i = 0; i < 10; ++i) d.run_layer(2, hidden.data(), rows, kHidden, assignments, got.data());
  REQUIRE(same_bytes(want, got));

  r.relay.freeze();
  const auto start = Clock::now();
  expect_error([&] { d.run_layer(2, hidden.data(), rows, kHidden, assignments, got.data()); },
               ErrorCategory::kUnavailable, {"layer 2", "no live replica", "experts 0-3", "worker 'b'"});
  const double failed = ms_since(start);
  MESSAGE("frozen sole owner -> named error in " << failed << " ms (request_ms " << FrozenB::kRequestMs << ")");
  CHECK(failed < 5000);

  r.relay.thaw();
  REQUIRE(eventually([&] { return named(d.status(), "b").state == "up"; }));
  std::fill(got.begin(), got.end(), -7);
  d.run_layer(2, hidden.data(), rows, kHidden, assignments, got.data());
  CHECK(same_bytes(want, got));
}

TEST_CASE("a busy worker answers its probes: its request is waited for, not failed over") {
  Replicas r(700ms);  // b takes 700 ms per request, far over any learned deadline
  r.topology.request_timeout_ms = 20000;
  // Probes go out every 50 ms; a loaded test machine must not make one look unanswered.
  r.topology.probe_floor_ms = r.topology.probe_cap_ms = 2000;
  ClusterDispatcher d(r.topology, r.placement, r.model.fingerprint, r.model.identities);
  const uint32_t rows = 3;
  const std::vector<float> hidden = noise(rows * kHidden, 33);
  const auto assignments = routing(rows);
  const auto want = expected(r.model, 0, hidden, rows, assignments);
  std::vector<int64_t> got(want.size(), -7);
  d.run_layer(0, hidden.data(), rows, kHidden, assignments, got.data());
  CHECK(same_bytes(want, got));
  const WorkerStatus b = named(d.status(), "b");
  CHECK(b.state == "up");
  CHECK(b.failovers == 0);
  CHECK(b.requests == 1);
  CHECK(r.b.server->health().requests_served == 1);
}

TEST_CASE("a heartbeat to a frozen worker holds no layer back") {
  FrozenB r;
  r.topology.heartbeat_ms = 3000;
  ClusterDispatcher d(r.topology, r.placement, r.model.fingerprint, r.model.identities);
  const uint32_t rows = 5;
  const std::vector<float> hidden = noise(rows * kHidden, 34);
  const auto assignments = routing(rows);
  const auto want = expected(r.model, 0, hidden, rows, assignments);
  r.relay.freeze();
  // b's first heartbeat goes out ~3 s after the connect and is never answered.
  std::this_thread::sleep_for(3300ms);
  std::vector<int64_t> got(want.size(), -7);
  const auto start = Clock::now();
  d.run_layer(0, hidden.data(), rows, kHidden, assignments, got.data());
  const double stalled = ms_since(start);
  MESSAGE("layer during a heartbeat to a frozen worker: " << stalled << " ms");
  CHECK(same_bytes(want, got));
  CHECK(stalled < 1000);
  CHECK(named(d.status(), "b").state == "down");
}

TEST_CASE("a frozen worker holds up neither the heartbeats nor the rejoins of the others") {
  FrozenB r;
  r.topology.heartbeat_ms = 100;
  r.topology.handshake_timeout_ms = 20000;  // a rejoin handshake to the frozen b hangs this long
  ClusterDispatcher d(r.topology, r.placement, r.model.fingerprint, r.model.identities);
  r.relay.freeze();
  REQUIRE(eventually([&] { return named(d.status(), "b").state == "down"; }));
  std::this_thread::sleep_for(300ms);  // b's rejoin handshakes are hanging now
  // a goes away and comes back: found by its own heartbeat, back by its own rejoin.
  r.a.server->stop();
  const bool down = eventually([&] { return named(d.status(), "a").state == "down"; }, 5000ms);
  CHECK(down);
  r.a.restart();
  const auto start = Clock::now();
  const bool up = eventually([&] { return named(d.status(), "a").state == "up"; }, 5000ms);
  CHECK(up);
  CHECK(named(d.status(), "a").rejoins == 1);
  MESSAGE("a rejoined " << ms_since(start) << " ms after its restart while b hangs");
  CHECK(named(d.status(), "b").state == "down");
}

TEST_CASE("prefetch hints never block the engine on a frozen worker") {
  FrozenB r;
  r.topology.request_timeout_ms = 6000;  // what a blocked hint send used to wait
  ClusterDispatcher d(r.topology, r.placement, r.model.fingerprint, r.model.identities);
  const uint32_t rows = 5;
  const std::vector<float> hidden = noise(rows * kHidden, 35);
  const auto assignments = routing(rows);
  const auto want = expected(r.model, 0, hidden, rows, assignments);
  warm_up(d, hidden, rows, assignments, want);
  r.relay.freeze();
  // Until b's socket buffers are full and past: hints are ~100 bytes.
  double longest = 0;
  const auto start = Clock::now();
  for (int i = 0; i < 200000 && ms_since(start) < 15000; ++i) {
    const auto one = Clock::now();
    d.hint_layer(0, {0, 1, 2, 3});
    longest = std::max(longest, ms_since(one));
  }
  MESSAGE("longest hint_layer call to a frozen worker: " << longest << " ms");
  CHECK(longest < 2000);
  std::vector<int64_t> got(want.size(), -7);
  d.run_layer(0, hidden.data(), rows, kHidden, assignments, got.data());
  CHECK(same_bytes(want, got));
}

TEST_CASE("startup: silent workers cost one handshake timeout together, not startup_ms each") {
  Replicas r;
  // b, c and d: three silent "replicas" (relays to b's server, frozen from the start).
  FreezeRelay rb(r.b.server->port(), true), rc(r.b.server->port(), true), rd(r.b.server->port(), true);
  r.topology.workers[1].port = rb.port();
  r.topology.workers.push_back(WorkerSpec{"c", "127.0.0.1", rc.port(), {0, 1, 2, 3}, {}, {}});
  r.topology.workers.push_back(WorkerSpec{"d", "127.0.0.1", rd.port(), {0, 1, 2, 3}, {}, {}});
  for (uint32_t layer : kLayers) r.placement[layer] = {{0, 1, 2, 3}, {0, 1, 2, 3}, {0, 1, 2, 3}, {0, 1, 2, 3}};
  r.topology.startup_timeout_ms = 20000;
  r.topology.handshake_timeout_ms = 1500;
  const auto start = Clock::now();
  ClusterDispatcher d(r.topology, r.placement, r.model.fingerprint, r.model.identities);
  const double took = ms_since(start);
  MESSAGE("startup with three silent replicas: " << took << " ms (handshake_ms 1500, startup_ms 20000)");
  CHECK(took < 4000);  // one handshake timeout; one after another would be 4500 ms
  CHECK(named(d.status(), "a").state == "up");
  for (const char* w : {"b", "c", "d"}) CHECK(named(d.status(), w).state == "down");
  rb.thaw();
  rc.thaw();
  rd.thaw();
  REQUIRE(eventually([&] {
    const auto s = d.status();
    return std::all_of(s.begin(), s.end(), [](const WorkerStatus& w) { return w.state == "up"; });
  }));
}

TEST_CASE("charm status: a silent worker costs its row the timeout, not the others") {
  Replicas r;
  FreezeRelay relay(r.b.server->port(), true);
  r.topology.workers[1].port = relay.port();
  r.topology.api_port = Cluster::unused_port();  // no coordinator: refused at once
  const auto start = Clock::now();
  const ClusterStatus status = collect_status(r.topology, 1000);
  const double took = ms_since(start);
  MESSAGE("charm status with a silent worker: " << took << " ms (--timeout-ms 1000)");
  CHECK(took < 4000);
  REQUIRE(status.workers.size() == 2);
  CHECK(status.workers[0].up);
  CHECK_FALSE(status.workers[1].up);
  CHECK(status.workers[1].error.find("timed out") != std::string::npos);
}

TEST_CASE("learned deadlines: 4x the p99, clamped to [floor, cap]; the floor until 8 samples; size classes") {
  RttWindow rtt;
  for (int i = 0; i < 7; ++i) rtt.add(30.0);
  CHECK(learned_deadline(rtt, 50ms, 1000ms) == 50ms);  // 7 samples: too few to know
  rtt.add(30.0);
  CHECK(learned_deadline(rtt, 50ms, 1000ms) == 120ms);
  CHECK(learned_deadline(rtt, 200ms, 1000ms) == 200ms);
  CHECK(learned_deadline(rtt, 50ms, 100ms) == 100ms);
  rtt.add(0.3);  // rounded up to whole milliseconds: 4 * 30.0 stays the p99
  CHECK(learned_deadline(rtt, 1ms, 1000ms) == 120ms);
  RttWindow fast;
  for (int i = 0; i < 100; ++i) fast.add(0.2);
  CHECK(learned_deadline(fast, 1ms, 1000ms) == 1ms);
  CHECK(rtt_size_class(0) == 0);
  CHECK(rtt_size_class(1) == 0);
  CHECK(rtt_size_class(2) == 1);
  CHECK(rtt_size_class(3) == 1);
  CHECK(rtt_size_class(512) == 9);
  CHECK(rtt_size_class(UINT32_MAX) == kRttSizeClasses - 1);
}
