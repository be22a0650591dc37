// app/status_report.h: the columns added with the metrics and failover (TIERS,
// LAST_SEEN, FAILOVERS, REJOINS, COORD), filled from the coordinator's /cluster/status view, and a /cluster/status
// body from a coordinator built before them.
#include <doctest/doctest.h>

#include <sstream>
#include <thread>

#include <httplib.h>

#include "app/status_report.h"
#include "common/wire.h"

using namespace charm;

namespace {

// The table's cells as a map per worker row, from the whitespace-split header and row.
std::map<std::string, std::string> row_cells(const std::string& table, const std::string& worker) {
  std::istringstream lines(table);
  std::string header_line, line;
  std::getline(lines, header_line);
  auto split = [](const std::string& text) {
    std::istringstream in(text);
    std::vector<std::string> out;
    for (std::string cell; in >> cell;) out.push_back(cell);
    return out;
  };
  const auto header = split(header_line);
  while (std::getline(lines, line)) {
    const auto cells = split(line);
    if (cells.empty() || cells[0] != worker) continue;
    std::map<std::string, std::string> out;
    for (size_t i = 0; i < header.size() && i < cells.size(); ++i) out[header[i]] = cells[i];
    return out;
  }
  FAIL("no row for " << worker);
  return {};
}

}  // namespace

TEST_CASE("status table: tiers, last seen and failovers from the coordinator's view") {
  ClusterStatus status;
  status.coordinator_reachable = true;
  WorkerStatusRow row;
  row.name = "w1";
  row.address = "127.0.0.1:5001";
  row.up = true;
  row.health = HealthReplyMsg{"w1", "up", 64, 12, 0, 0, 1000, kProtocolVersion, "0123456789abcdef"};
  row.coordinator = parse_cluster_status(
      R"({"workers":[{"name":"w1","address":"127.0.0.1:5001","state":"up","experts_held":64,)"
      R"("requests":12,"rtt_p50_ms":1.5,"rtt_p99_ms":3.25,"bytes_out":2048,"bytes_in":1048576,)"
      R"("last_seen_ms":2460,"failovers":3,"rejoins":1,"experts_by_tier":{"ram":56,"vram":8}}]})")[0];
  status.workers.push_back(row);
  // A worker the coordinator does not know: tiers from its own count, the rest "-".
  WorkerStatusRow lone = row;
  lone.name = "w2";
  lone.coordinator.reset();
  status.workers.push_back(lone);

  const std::string table = format_status(status);
  INFO(table);
  auto w1 = row_cells(table, "w1");
  CHECK(w1["TIERS"] == "vram:8,ram:56");
  CHECK(w1["LAST_SEEN"] == "2.5s");
  CHECK(w1["FAILOVERS"] == "3");
  CHECK(w1["REJOINS"] == "1");
  CHECK(w1["COORD"] == "up");
  CHECK(w1["RTT_P99_MS"] == "3.25");
  auto w2 = row_cells(table, "w2");
  CHECK(w2["TIERS"] == "ram:64");
  CHECK(w2["LAST_SEEN"] == "-");
  CHECK(w2["FAILOVERS"] == "-");
}

TEST_CASE("a /cluster/status body without the newer fields still parses") {
  const auto view = parse_cluster_status(
      R"({"workers":[{"name":"w1","address":"a","state":"up","experts_held":4,"requests":0,)"
      R"("rtt_p50_ms":0,"rtt_p99_ms":0,"bytes_out":0,"bytes_in":0}]})");
  REQUIRE(view.size() == 1);
  CHECK(view[0].last_seen_ms == -1);
  CHECK(view[0].rejoins == 0);
  CHECK(view[0].failovers == 0);
  CHECK(view[0].experts_by_tier.empty());
  CHECK_THROWS_AS(parse_cluster_status(
                      R"({"workers":[{"name":"w1","address":"a","state":"up","experts_held":4,"requests":0,)"
                      R"("rtt_p50_ms":0,"rtt_p99_ms":0,"bytes_out":0,"bytes_in":0,"failovers":"many"}]})"),
                  Error);
}

TEST_CASE("LAST_SEEN: milliseconds under a second; last_seen_s from a pre-merge metrics coordinator") {
  auto view = [](const std::string& seen) {
    return parse_cluster_status(R"({"workers":[{"name":"w1","address":"a","state":"up","experts_held":4,)"
                                R"("requests":0,"rtt_p50_ms":0,"rtt_p99_ms":0,"bytes_out":0,"bytes_in":0,)" +
                                seen + "}]}")[0];
  };
  CHECK(view(R"("last_seen_s":0.25)").last_seen_ms == doctest::Approx(250));
  CHECK(view(R"("last_seen_s":-1)").last_seen_ms == -1);
  CHECK(view(R"("last_seen_ms":40,"last_seen_s":9)").last_seen_ms == 40);  // ms wins

  ClusterStatus status;
  status.coordinator_reachable = true;
  WorkerStatusRow row;
  row.name = "w1";
  row.address = "a";
  row.coordinator = view(R"("last_seen_ms":120.4)");
  status.workers.push_back(row);
  CHECK(row_cells(format_status(status), "w1")["LAST_SEEN"] == "120ms");
}

TEST_CASE("charm status reads no /cluster/status body over its cap (whatever answers at the API's address)") {
  // Valid JSON, padded past the cap for one worker: read whole, it would parse.
  const std::string workers =
      R"({"workers":[{"name":"w1","address":"-","state":"up","experts_held":4,"requests":0,)"
      R"("rtt_p50_ms":1,"rtt_p99_ms":2,"bytes_out":0,"bytes_in":0}],"pad":")";
  const std::string body = workers + std::string(max_cluster_status_bytes(1) + 1, 'x') + "\"}";
  httplib::Server server;
  server.Get("/cluster/status", [&](const httplib::Request&, httplib::Response& res) {
    res.set_content(body, "application/json");
  });
  const int port = server.bind_to_any_port("127.0.0.1");
  std::thread thread([&] { server.listen_after_bind(); });
  while (!server.is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  Topology topology;
  topology.workers = {WorkerSpec{"w1", "127.0.0.1", 1, {0}, {}}};  // nothing listens on port 1
  topology.api_port = static_cast<uint16_t>(port);
  const ClusterStatus status = collect_status(topology, 5000);
  server.stop();
  thread.join();
  CHECK_FALSE(status.coordinator_reachable);
  CHECK_MESSAGE(status.coordinator_error.find("exceeds the cap of " + std::to_string(max_cluster_status_bytes(1))) !=
                    std::string::npos,
                status.coordinator_error);
  CHECK(max_cluster_status_bytes(1) == 2u << 20);
}
