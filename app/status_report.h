// `charm status`: one table row per worker, joining what each worker says of itself
// (healthRequest over the wire protocol, timed as a ping) with what the coordinator has
// measured (GET http://<api_host>:<api_port>/cluster/status), and judging each worker
// against what the topology expects of it: the model fingerprint of topology.model
// (common/fingerprint.h, computed locally from the checkpoint's headers) and the number of
// (layer, expert) pairs Topology::placement assigns it.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "common/topology.h"
#include "common/wire.h"
#include "coordinator/dispatch/worker_status.h"

namespace charm {

/// One worker's row.
struct WorkerStatusRow {
  std::string name;
  std::string address;                  ///< host:port from the topology
  bool up = false;                      ///< answered the health request in time
  /// "up" (answered and matches the topology), "down" (did not answer), "wrong-protocol",
  /// "wrong-model" (fingerprint differs from the topology's model), "wrong-weights" (an
  /// expert's content identity differs from the model's cached manifest) or
  /// "wrong-experts" (holds a different number of (layer, expert) pairs than the
  /// placement assigns it).
  /// Empty (a row not yet judged) reads as "up" or "down" from `up`.
  std::string state;
  std::string error;                    ///< why not up, or what does not match (both values)
  std::optional<uint64_t> expected_experts;  ///< pairs the placement assigns, when known
  std::optional<HealthReplyMsg> health; ///< the worker's own counters, when up
  std::optional<HelloReplyMsg> hello;   ///< its helloReply (held experts, identities, lossy form), when asked
  double ping_ms = 0;                   ///< health request round trip, milliseconds
  std::optional<WorkerStatus> coordinator;  ///< the coordinator's view, when reachable
};

/// The whole report.
struct ClusterStatus {
  std::vector<WorkerStatusRow> workers;
  bool coordinator_reachable = false;
  std::string coordinator_address;  ///< api_host:api_port
  std::string coordinator_error;    ///< why not reachable
  /// model_fingerprint() of topology.model; empty when the directory could not be read
  /// (then fingerprints are not checked and `notes` says why).
  std::string expected_fingerprint;
  /// Checks that could not be made (model unreadable, placement invalid), one line each.
  std::vector<std::string> notes;
  /// Every worker is in state "up" and the coordinator answered (the CLI exits 1
  /// otherwise).
  bool all_up = true;
};

/// What the topology expects of each worker, for judge_worker.
struct StatusExpectations {
  std::string fingerprint;  ///< empty: do not check fingerprints
  ExpertIdentities identities;  ///< from the cached manifest only; empty: do not check weights
  std::vector<std::optional<uint64_t>> experts;  ///< per topology.workers index; empty/nullopt: do not check
  std::vector<std::string> notes;  ///< why a check is skipped
  /// The model's shape, which bounds the frames a worker may send before it is trusted
  /// (max_hello_reply_bytes, max_health_reply_bytes); 0 when the model could not be read
  /// (then kStatusFallbackMoeLayers x kStatusFallbackExperts is assumed).
  uint32_t num_moe_layers = 0;
  uint32_t num_experts = 0;
};

/// The shape assumed for frame caps when `charm status` cannot read the model: larger
/// than any model charm serves (DeepSeek-V3: 58 MoE layers of 256 experts), so a real
/// worker is never cut off, while a stranger still cannot make it allocate more than
/// about 1 MiB.
constexpr uint32_t kStatusFallbackMoeLayers = 256;
constexpr uint32_t kStatusFallbackExperts = 1024;

/// Reads topology.model (Checkpoint::open + model_fingerprint; ModelConfig::parse +
/// Topology::placement over moe_layer_ids(); the expert manifest as cached, never
/// hashing: worker/experts/expert_manifest.h). Never throws: a check that cannot be made is
/// skipped and named in `notes` (experts with no cached identity too). In single-node
/// mode nothing is expected of workers.
StatusExpectations expected_status(const Topology& topology);

/// Sets row.state and row.error from what the worker reported (row.health, row.hello)
/// against `fingerprint` (empty: not checked), `identities` (the experts' content
/// identities; empty or no row.hello: not checked; the error names the layer, expert and
/// both hashes) and row.expected_experts (nullopt: not checked). A row that did not
/// answer stays "down".
void judge_worker(WorkerStatusRow& row, const std::string& fingerprint, const ExpertIdentities& identities = {});

/// A byte count as one table word in binary units: "512B", "1.5KiB", "12.0MiB" (the
/// tables of `charm status` and `charm plan` split on whitespace).
std::string bytes_cell(uint64_t bytes);

/// Layer-frame bytes per token through the model (bytes_per_token of
/// coordinator/dispatch/worker_status.h) as a bytes_cell: the IN/TOK and OUT/TOK columns.
std::string per_token_cell(uint64_t layer_bytes, const WorkerStatus& s);

/// Queries every worker (in parallel, each within `timeout_ms`: connect, the hello (with
/// the shared-secret handshake when topology.cluster_secret is set) when the model's
/// fingerprint is known, healthRequest; every frame a worker sends capped at what a
/// legitimate reply can be for the model's shape, so a row says "exceeds the cap" rather
/// than the process allocating a gigabyte) and the
/// coordinator's /cluster/status (within `timeout_ms`, with topology.api_key as a bearer
/// token when set; a body over max_cluster_status_bytes makes the coordinator
/// unreachable, naming the cap), and judges each worker
/// (expected_status, judge_worker). Never throws for an unreachable peer or an unreadable
/// model: that is what the report is for.
ClusterStatus collect_status(const Topology& topology, int timeout_ms);

/// The largest /cluster/status body collect_status reads from a coordinator of
/// `workers` workers, in bytes: 1 MiB each (a worker's entry is a few hundred bytes, but
/// its last_error may hold a worker's error text of up to 64 KiB, JSON-escaped) plus
/// 1 MiB. Pure.
uint64_t max_cluster_status_bytes(size_t workers);

/// Parses a /cluster/status body ({"workers":[{"name","address","state","experts_held",
/// "requests","rtt_p50_ms","rtt_p99_ms","bytes_out","bytes_in"} plus the optional
/// "failovers","rejoins","last_seen_ms","slow","slow_reason","last_error","experts_by_tier"
/// (a coordinator built before them leaves them out; "last_seen_s", seconds, is read
/// when "last_seen_ms" is absent)]}). Throws Error(kProtocol) naming the field when it is
/// not that shape.
std::vector<WorkerStatus> parse_cluster_status(const std::string& body);

/// The table: a header line, then per worker name, address, state, the coordinator's
/// state of it (COORD: up, down, slow), experts, experts per tier (TIERS, "ram:56,disk:8"),
/// requests (served, as the worker counts them), ping ms, coordinator rtt p50/p99 ms,
/// RAM-tier hit rate (HIT_RATE: hits / (hits + misses) of its experts, "-" before any
/// lookup), bytes read from disk (DISK_READ, as the worker counts them), failovers,
/// rejoins, how long ago the coordinator last heard from it (LAST_SEEN, "120ms" under a
/// second, else "2.5s"), and bytes in/out as the coordinator counts them ("-" where the
/// coordinator is unreachable or a value is unknown), and the layer-frame bytes per token
/// in and out (IN/TOK, OUT/TOK: the coordinator's layer_bytes_in/out over the tokens it
/// has run, times the MoE layers; "-" before any token); then one line per worker not "up"
/// (why, naming both values for a mismatch), one per worker serving lossy experts (its
/// form), one per slow worker (both RTT numbers), one
/// per worker the coordinator holds down (its last error), one per note, and a line on
/// the coordinator when it is unreachable. With `layers`, then one line per worker and
/// MoE layer: hits, misses, hit rate, bytes read, I/O wait seen by requests, disk time,
/// prefetches used / issued.
std::string format_status(const ClusterStatus& status, bool layers = false);

/// collect_status + format_status. A worker that does not answer shows state "down".
std::string render_status(const Topology& topology, int timeout_ms);

}  // namespace charm
