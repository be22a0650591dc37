#include "app/status_report.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <future>
#include <map>
#include <memory>

#include <httplib.h>
#include <nlohmann/json.hpp>

#include "common/checkpoint.h"
#include "common/cluster_auth.h"
#include "common/error.h"
#include "common/fingerprint.h"
#include "common/json_reader.h"
#include "common/model_config.h"
#include "coordinator/models/checkpoint_families.h"
#include "worker/experts/expert_manifest.h"

namespace charm {
namespace {

using Clock = std::chrono::steady_clock;

WorkerStatusRow query_worker(const WorkerSpec& spec, int timeout_ms, const std::string& secret,
                             const StatusExpectations& expected) {
  WorkerStatusRow row;
  row.name = spec.name;
  row.address = spec.host + ":" + std::to_string(spec.port);
  const std::chrono::milliseconds timeout(timeout_ms);
  // Whatever answers at the address is a stranger: no frame over a legitimate reply.
  const bool shape_known = expected.num_moe_layers > 0 && expected.num_experts > 0;
  const uint32_t layers = shape_known ? expected.num_moe_layers : kStatusFallbackMoeLayers;
  const uint32_t experts = shape_known ? expected.num_experts : kStatusFallbackExperts;
  try {
    const std::string label = "worker '" + spec.name + "'";
    auto conn = FrameConnection::connect(spec.host, spec.port, timeout, label);
    // The helloReply lists the experts' content identities (judged against the model's
    // manifest), and a worker with a shared secret answers nothing before the handshake.
    // Its reply may say the fingerprints differ, which the health reply then shows as
    // wrong-model. Without a fingerprint to send (model unreadable) only health is asked.
    if (!secret.empty() || !expected.fingerprint.empty()) {
      HelloMsg hello;
      hello.client_name = "charm status";
      hello.model_fingerprint = expected.fingerprint;
      row.hello = client_handshake(*conn, hello, secret, timeout, label, max_hello_reply_bytes(layers, experts)).reply;
    }
    const auto start = Clock::now();
    conn->send(encode_health_request(), timeout);
    conn->set_max_frame_bytes(max_health_reply_bytes(layers, experts));
    row.health = decode_as<HealthReplyMsg>(conn->receive(timeout), conn->max_frame_bytes());
    row.ping_ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
    row.up = true;
  } catch (const std::exception& e) {
    row.error = e.what();
  }
  return row;
}

/// An optional field (absent from an older coordinator): `fallback` when missing.
template <typename T>
T optional_field(const nlohmann::json& object, const char* name, size_t index, T fallback);

template <typename T>
T field(const nlohmann::json& object, const char* name, size_t index) {
  const auto it = object.find(name);
  if (it == object.end()) {
    fail_protocol("/cluster/status: workers[" + std::to_string(index) + "]." + name + " is missing");
  }
  try {
    return it->get<T>();
  } catch (const nlohmann::json::exception&) {
    fail_protocol("/cluster/status: workers[" + std::to_string(index) + "]." + name +
                  " has the wrong type (" + it->type_name() + ")");
  }
}

template <typename T>
T optional_field(const nlohmann::json& object, const char* name, size_t index, T fallback) {
  return object.contains(name) ? field<T>(object, name, index) : fallback;
}

std::string fixed(double value, int decimals) {
  char text[64];
  std::snprintf(text, sizeof text, "%.*f", decimals, value);
  return text;
}

// The row's state; a row not judged yet reads from whether it answered.
std::string state_of(const WorkerStatusRow& row) {
  if (!row.state.empty()) return row.state;
  return row.up ? "up" : "down";
}

// The coordinator's view in one word: "up", "down", "slow", "in-process".
std::string coordinator_state(const WorkerStatus& s) {
  return s.slow && s.state == WorkerState::kUp ? "slow" : worker_state_name(s.state);
}

// Human-sized byte counts: 1023 B, 1.5 KiB, 12.0 MiB ...
std::string bytes_text(uint64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (value >= 1024 && unit < 4) {
    value /= 1024;
    ++unit;
  }
  return unit == 0 ? std::to_string(bytes) + " B" : fixed(value, 1) + " " + units[unit];
}

// How long ago, from milliseconds: "120ms" under a second, else "2.5s".
std::string ago_text(double ms) { return ms < 1000 ? fixed(ms, 0) + "ms" : fixed(ms / 1000, 1) + "s"; }

// Experts held per tier, "ram:64", "ram:48,disk:16" or "vram:8,ram:56": the coordinator's
// view when it has one, else split_by_tier over the worker's own health reply (experts
// held, RAM slots, the VRAM experts of its residency).
std::string tiers_text(const WorkerStatusRow& row) {
  std::map<std::string, uint64_t> tiers;
  if (row.coordinator && !row.coordinator->experts_by_tier.empty()) {
    tiers = row.coordinator->experts_by_tier;
  } else if (row.health) {
    tiers = split_by_tier(row.health->experts_held, row.health->slots, vram_experts_of(row.health->residency));
  } else {
    return "-";
  }
  std::string out;
  for (const char* tier : {"vram", "ram", "disk"}) {
    const auto it = tiers.find(tier);
    if (it != tiers.end()) out += (out.empty() ? "" : ",") + std::string(tier) + ":" + std::to_string(it->second);
  }
  return out.empty() ? "-" : out;
}

// Charm's Error carries its category in what(); the message alone reads better in a note.
std::string message_of(const std::exception& e) {
  const auto* error = dynamic_cast<const Error*>(&e);
  return error ? error->message() : e.what();
}

// GET /cluster/status within `timeout_ms`; fills the coordinator fields of `status` and
// returns the coordinator's per-worker view (empty when unreachable).
std::vector<WorkerStatus> query_coordinator(const Topology& topology, int timeout_ms,
                                            ClusterStatus& status) {
  httplib::Client client(topology.api_host, topology.api_port);
  const auto seconds = timeout_ms / 1000;
  const auto micros = (timeout_ms % 1000) * 1000;
  client.set_connection_timeout(seconds, micros);
  client.set_read_timeout(seconds, micros);
  client.set_write_timeout(seconds, micros);
  if (!topology.api_key.empty()) client.set_bearer_token_auth(topology.api_key.c_str());
  status.coordinator_address = topology.api_host + ":" + std::to_string(topology.api_port);
  // Whatever answers at the API's address is not trusted yet either: the body is read
  // up to what a coordinator of this many workers can send, no further.
  const uint64_t cap = max_cluster_status_bytes(topology.workers.size());
  std::string body;
  bool too_big = false;
  auto res = client.Get("/cluster/status", [&](const char* data, size_t size) {
    too_big = body.size() + size > cap;
    if (!too_big) body.append(data, size);
    return !too_big;
  });
  if (too_big) {
    status.coordinator_error = "GET /cluster/status: the body exceeds the cap of " + std::to_string(cap) +
                               " bytes for " + std::to_string(topology.workers.size()) + " workers";
    return {};
  }
  if (!res) {
    status.coordinator_error = "GET /cluster/status: " + httplib::to_string(res.error());
    return {};
  }
  if (res->status != 200) {
    status.coordinator_error = "GET /cluster/status answered HTTP " + std::to_string(res->status);
    return {};
  }
  try {
    auto view = parse_cluster_status(body);
    status.coordinator_reachable = true;
    return view;
  } catch (const Error& e) {
    status.coordinator_error = e.message();
    return {};
  }
}

// "87.5%", or "-" when nothing was looked up yet.
std::string hit_rate(const TierCounters& t) {
  const uint64_t lookups = t.hits + t.misses;
  return lookups == 0 ? "-" : fixed(100.0 * static_cast<double>(t.hits) / static_cast<double>(lookups), 1) + "%";
}

// What the worker's helloReply says it holds against the model's manifest; nothing when
// no hello was made or nothing is known to compare with.
std::vector<IdentityMismatch> weight_mismatches(const WorkerStatusRow& row, const ExpertIdentities& identities) {
  if (!row.hello || identities.empty()) return {};
  std::vector<ExpertKey> held;
  for (const auto& [layer, experts] : row.hello->held) {
    for (uint32_t e : experts) held.emplace_back(layer, e);
  }
  return compare_identities(identities, row.hello->identities, held);
}

// The model's expert identities from the manifest cache only (hashing a large checkpoint
// for a status report would take minutes); a note says how many are not known.
ExpertIdentities cached_identities(const Checkpoint& checkpoint, const ModelConfig& config,
                                   const std::string& fingerprint, std::vector<std::string>& notes) {
  std::vector<ExpertKey> all;
  for (int64_t l : config.moe_layer_ids()) {
    for (int64_t e = 0; e < config.num_experts; ++e) all.emplace_back(l, e);
  }
  ManifestOptions options;
  options.cache_file = manifest_cache_file(checkpoint, fingerprint);
  options.hash_missing = false;
  ExpertIdentities identities = load_expert_manifest(checkpoint, config, all, options);
  if (identities.size() < all.size()) {
    notes.push_back("note: the content identities of " + std::to_string(all.size() - identities.size()) + " of " +
                    std::to_string(all.size()) + " experts are not checked: no valid manifest of " +
                    checkpoint.dir().string() + " is cached" +
                    (options.cache_file.empty() ? "" : " at " + options.cache_file.string()) +
                    " (charm serve writes it at start)");
  }
  return identities;
}

std::string tier_line(const std::string& worker, uint32_t layer, const TierCounters& t) {
  const std::string vram = t.vram_hits ? " (" + std::to_string(t.vram_hits) + " from VRAM)" : "";
  return worker + " layer " + std::to_string(layer) + ": hits " + std::to_string(t.hits) + vram + ", misses " +
         std::to_string(t.misses) + " (" + hit_rate(t) + " hit), read " + bytes_text(t.bytes_read) + ", io wait " +
         fixed(static_cast<double>(t.io_wait_ns) / 1e6, 2) + " ms, disk " + fixed(static_cast<double>(t.disk_ns) / 1e6, 2) +
         " ms, prefetch used " + std::to_string(t.prefetch_hits) + "/" + std::to_string(t.prefetch_issued) + "\n";
}

}  // namespace

uint64_t max_cluster_status_bytes(size_t workers) { return (uint64_t{workers} + 1) << 20; }

StatusExpectations expected_status(const Topology& topology) {
  StatusExpectations out;
  if (topology.single_node || topology.workers.empty()) return out;
  std::unique_ptr<Checkpoint> checkpoint;
  try {
    checkpoint = Checkpoint::open(topology.model);
  } catch (const std::exception& e) {
    out.notes.push_back("note: cannot read the model at " + topology.model.string() + " (" +
                        message_of(e) + "): model fingerprints and expert counts not checked");
    return out;
  }
  out.fingerprint = model_fingerprint(*checkpoint);
  try {
    const ModelConfig config =
        ModelConfig::parse(checkpoint->config_json(), checkpoint->config_origin(), checkpoint_families());
    const std::vector<int64_t> moe_layers = config.moe_layer_ids();
    if (!moe_layers.empty() && config.num_experts > 0 && config.num_experts <= UINT32_MAX) {
      out.num_moe_layers = static_cast<uint32_t>(moe_layers.size());
      out.num_experts = static_cast<uint32_t>(config.num_experts);
    }
    out.identities = cached_identities(*checkpoint, config, out.fingerprint, out.notes);
    const auto placement = topology.placement(moe_layers, config.num_experts);
    std::vector<uint64_t> counts(topology.workers.size(), 0);
    for (const auto& [layer, owners] : placement) {
      for (const std::vector<int>& replicas : owners) {
        for (int owner : replicas) ++counts.at(static_cast<size_t>(owner));
      }
    }
    out.experts.assign(counts.begin(), counts.end());
  } catch (const std::exception& e) {
    out.notes.push_back("note: cannot work out the expert placement (" + message_of(e) +
                        "): expert counts not checked");
  }
  return out;
}

void judge_worker(WorkerStatusRow& row, const std::string& fingerprint, const ExpertIdentities& identities) {
  if (!row.up || !row.health) {
    row.state = "down";
    return;
  }
  const HealthReplyMsg& h = *row.health;
  // One verdict per row, the most fundamental first: a worker speaking another protocol
  // or serving another model makes its expert count meaningless.
  if (h.protocol_version != kProtocolVersion) {
    row.state = "wrong-protocol";
    row.error = "speaks protocol version " + std::to_string(h.protocol_version) +
                ", this charm speaks " + std::to_string(kProtocolVersion);
  } else if (!fingerprint.empty() && h.model_fingerprint != fingerprint) {
    row.state = "wrong-model";
    const std::string served = h.model_fingerprint.empty()
                                   ? "no model fingerprint (a build older than this charm)"
                                   : "model fingerprint " + h.model_fingerprint;
    row.error = "serves " + served + ", the topology's model has " + fingerprint;
  } else if (const auto mismatches = weight_mismatches(row, identities); !mismatches.empty()) {
    row.state = "wrong-weights";
    row.error = "holds other weights than the topology's model: " +
                describe_mismatches(mismatches, "on the worker", "in the model's manifest");
  } else if (row.expected_experts && h.experts_held != *row.expected_experts) {
    row.state = "wrong-experts";
    row.error = "holds " + std::to_string(h.experts_held) +
                " (layer, expert) pairs, the topology's placement assigns it " +
                std::to_string(*row.expected_experts);
  } else {
    row.state = "up";
    row.error.clear();
  }
}

std::vector<WorkerStatus> parse_cluster_status(const std::string& body) {
  nlohmann::json doc;
  try {
    doc = parse_json(body, "/cluster/status", kHttpJsonLimits);
  } catch (const Error& e) {
    fail_protocol(e.message());
  }
  if (!doc.is_object() || !doc.contains("workers") || !doc["workers"].is_array()) {
    fail_protocol("/cluster/status: expected an object with a \"workers\" array");
  }
  std::vector<WorkerStatus> out;
  size_t i = 0;
  for (const auto& w : doc["workers"]) {
    if (!w.is_object()) fail_protocol("/cluster/status: workers[" + std::to_string(i) + "] is not an object");
    WorkerStatus s;
    s.name = field<std::string>(w, "name", i);
    s.address = field<std::string>(w, "address", i);
    s.state = parse_worker_state(field<std::string>(w, "state", i));
    s.experts_held = field<uint64_t>(w, "experts_held", i);
    s.requests = field<uint64_t>(w, "requests", i);
    s.rtt_p50_ms = field<double>(w, "rtt_p50_ms", i);
    s.rtt_p99_ms = field<double>(w, "rtt_p99_ms", i);
    s.bytes_out = field<uint64_t>(w, "bytes_out", i);
    s.bytes_in = field<uint64_t>(w, "bytes_in", i);
    s.layer_bytes_out = optional_field<uint64_t>(w, "layer_bytes_out", i, 0);
    s.layer_bytes_in = optional_field<uint64_t>(w, "layer_bytes_in", i, 0);
    s.token_layers = optional_field<uint64_t>(w, "token_layers", i, 0);
    s.moe_layers = optional_field<uint32_t>(w, "moe_layers", i, 0);
    s.failovers = optional_field<uint64_t>(w, "failovers", i, 0);
    s.rejoins = optional_field<uint64_t>(w, "rejoins", i, 0);
    // Seconds from a coordinator of the metrics branch before the two were merged.
    s.last_seen_ms = w.contains("last_seen_ms") ? field<double>(w, "last_seen_ms", i)
                                                : optional_field<double>(w, "last_seen_s", i, -1) * 1000;
    if (s.last_seen_ms < 0) s.last_seen_ms = -1;
    s.slow = optional_field<bool>(w, "slow", i, false);
    s.slow_reason = optional_field<std::string>(w, "slow_reason", i, "");
    s.last_error = optional_field<std::string>(w, "last_error", i, "");
    s.experts_by_tier =
        optional_field<std::map<std::string, uint64_t>>(w, "experts_by_tier", i, {});
    out.push_back(std::move(s));
    ++i;
  }
  return out;
}

std::string bytes_cell(uint64_t bytes) {
  std::string text = bytes_text(bytes);
  text.erase(std::remove(text.begin(), text.end(), ' '), text.end());
  return text;
}

std::string per_token_cell(uint64_t layer_bytes, const WorkerStatus& s) {
  return bytes_cell(static_cast<uint64_t>(std::llround(bytes_per_token(layer_bytes, s))));
}

ClusterStatus collect_status(const Topology& topology, int timeout_ms) {
  ClusterStatus status;
  // The fingerprint first: an authenticated hello carries it, so a matching worker does
  // not log a rejection (reading the checkpoint's headers takes milliseconds).
  StatusExpectations expected = expected_status(topology);
  // Workers in parallel, so N dead workers cost one timeout, not N.
  std::vector<std::future<WorkerStatusRow>> pending;
  for (const WorkerSpec& spec : topology.workers) {
    pending.push_back(std::async(std::launch::async, query_worker, spec, timeout_ms, topology.cluster_secret,
                                 expected));  // a copy each: `expected` is moved from below
  }
  status.expected_fingerprint = expected.fingerprint;
  status.notes = std::move(expected.notes);
  const std::vector<WorkerStatus> coordinator_view = query_coordinator(topology, timeout_ms, status);

  status.all_up = status.coordinator_reachable;
  for (size_t i = 0; i < pending.size(); ++i) {
    WorkerStatusRow row = pending[i].get();
    for (const WorkerStatus& s : coordinator_view) {
      if (s.name == row.name) row.coordinator = s;
    }
    if (i < expected.experts.size()) row.expected_experts = expected.experts[i];
    judge_worker(row, status.expected_fingerprint, expected.identities);
    status.all_up = status.all_up && row.state == "up";
    status.workers.push_back(std::move(row));
  }
  return status;
}

std::string format_status(const ClusterStatus& status, bool layers) {
  using Row = std::vector<std::string>;
  std::vector<Row> table = {{"WORKER", "ADDRESS", "STATE", "COORD", "EXPERTS", "TIERS", "REQUESTS", "PING_MS",
                             "RTT_P50_MS", "RTT_P99_MS", "HIT_RATE", "DISK_READ", "FAILOVERS", "REJOINS",
                             "LAST_SEEN", "BYTES_IN", "BYTES_OUT", "IN/TOK", "OUT/TOK"}};
  for (const WorkerStatusRow& w : status.workers) {
    const auto& h = w.health;
    const auto& c = w.coordinator;
    table.push_back({w.name, w.address, state_of(w),
                     c ? coordinator_state(*c) : "-",
                     h ? std::to_string(h->experts_held) : "-",
                     tiers_text(w),
                     h ? std::to_string(h->requests_served) : "-",
                     w.up ? fixed(w.ping_ms, 2) : "-",
                     c ? fixed(c->rtt_p50_ms, 2) : "-",
                     c ? fixed(c->rtt_p99_ms, 2) : "-",
                     h ? hit_rate(h->tier) : "-",
                     h ? bytes_cell(h->tier.bytes_read) : "-",
                     c ? std::to_string(c->failovers) : "-",
                     c ? std::to_string(c->rejoins) : "-",
                     c && c->last_seen_ms >= 0 ? ago_text(c->last_seen_ms) : "-",
                     c ? bytes_cell(c->bytes_in) : "-",
                     c ? bytes_cell(c->bytes_out) : "-",
                     c && c->token_layers ? per_token_cell(c->layer_bytes_in, *c) : "-",
                     c && c->token_layers ? per_token_cell(c->layer_bytes_out, *c) : "-"});
  }
  std::vector<size_t> width(table[0].size(), 0);
  for (const Row& row : table) {
    for (size_t i = 0; i < row.size(); ++i) width[i] = std::max(width[i], row[i].size());
  }
  std::string out;
  for (const Row& row : table) {
    std::string line;
    for (size_t i = 0; i < row.size(); ++i) {
      line += row[i] + std::string(width[i] - row[i].size() + (i + 1 < row.size() ? 2 : 0), ' ');
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    out += line + "\n";
  }
  if (status.workers.empty()) out += "(no workers: single-node mode)\n";
  for (const WorkerStatusRow& w : status.workers) {
    const std::string state = state_of(w);
    if (state != "up") out += w.name + " is " + state + ": " + w.error + "\n";
    if (w.hello && !w.hello->lossy_form.empty()) {
      out += w.name + " serves LOSSY experts (" + w.hello->lossy_form + "): outputs differ from the checkpoint's\n";
    }
    if (!w.coordinator) continue;
    if (w.coordinator->slow) out += w.name + " is slow: " + w.coordinator->slow_reason + "\n";
    if (w.coordinator->state == WorkerState::kDown) {
      out += w.name + " is down in the coordinator: " +
             (w.coordinator->last_error.empty() ? "not connected" : w.coordinator->last_error) + "\n";
    }
  }
  for (const std::string& note : status.notes) out += note + "\n";
  if (layers) {
    for (const WorkerStatusRow& w : status.workers) {
      if (!w.health) continue;
      for (const auto& [layer, t] : w.health->tier_layers) out += tier_line(w.name, layer, t);
    }
  }
  if (!status.coordinator_reachable) {
    out += "coordinator at " + status.coordinator_address + " is unreachable (" +
           status.coordinator_error + "): RTT and byte columns are \"-\"\n";
  }
  return out;
}

std::string render_status(const Topology& topology, int timeout_ms) {
  return format_status(collect_status(topology, timeout_ms));
}

}  // namespace charm
