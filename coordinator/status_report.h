// `charm status`: one table row per worker, joining what each worker says of itself
// (healthRequest over the wire protocol, timed as a ping) with what the coordinator has
// measured (GET http://<api_host>:<api_port>/cluster/status).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "common/topology.h"
#include "common/wire.h"
#include "coordinator/expert_dispatch.h"

namespace charm {

/// One worker's row.
struct WorkerStatusRow {
  std::string name;
  std::string address;                  ///< host:port from the topology
  bool up = false;                      ///< answered the health request in time
  std::string error;                    ///< why not up
  std::optional<HealthReplyMsg> health; ///< the worker's own counters, when up
  double ping_ms = 0;                   ///< health request round trip, milliseconds
  std::optional<WorkerStatus> coordinator;  ///< the coordinator's view, when reachable
};

/// The whole report.
struct ClusterStatus {
  std::vector<WorkerStatusRow> workers;
  bool coordinator_reachable = false;
  std::string coordinator_error;  ///< why not reachable
  bool all_up = true;             ///< every worker answered (the CLI exits 1 otherwise)
};

/// Queries every worker (in parallel, each within `timeout_ms`: connect + healthRequest)
/// and the coordinator's /cluster/status (within `timeout_ms`). Never throws for an
/// unreachable peer: that is what the report is for.
ClusterStatus collect_status(const Topology& topology, int timeout_ms);

/// Parses a /cluster/status body ({"workers":[{"name","address","state","experts_held",
/// "requests","rtt_p50_ms","rtt_p99_ms","bytes_out","bytes_in"}]}). Throws
/// Error(kProtocol) naming the field when it is not that shape.
std::vector<WorkerStatus> parse_cluster_status(const std::string& body);

/// The table: a header line, then per worker name, address, state, experts, requests
/// (served, as the worker counts them), ping ms, coordinator rtt p50/p99 ms, and bytes
/// in/out as the coordinator counts them ("-" where the coordinator is unreachable or a
/// value is unknown); then a line on the coordinator when it is unreachable.
std::string format_status(const ClusterStatus& status);

/// collect_status + format_status. A worker that does not answer shows state "down".
std::string render_status(const Topology& topology, int timeout_ms);

}  // namespace charm
