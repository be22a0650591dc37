// `charm plan`: gathers the plan's inputs (topology, checkpoint headers, usage files,
// probes) into app/plan_model.h's arithmetic, and prints the report.
#include "app/plan.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <future>
#include <set>

#include "app/status_report.h"
#include "common/checkpoint.h"
#include "common/cluster_auth.h"
#include "common/error.h"
#include "common/fingerprint.h"
#include "common/ggml_quantize.h"
#include "common/model_config.h"
#include "common/wire.h"
#include "coordinator/models/checkpoint_families.h"
#include "worker/experts/expert_container.h"
#include "worker/experts/expert_layout.h"
#include "worker/experts/expert_source.h"
#include "worker/experts/expert_store.h"
#include "worker/experts/store_factory.h"
#include "worker/experts/usage_log.h"

namespace charm {
namespace {

using Clock = std::chrono::steady_clock;

std::string fixed(double value, int decimals) {
  char text[64];
  std::snprintf(text, sizeof text, "%.*f", decimals, value);
  return text;
}

std::string message_of(const std::exception& e) {
  const auto* error = dynamic_cast<const Error*>(&e);
  return error ? error->message() : e.what();
}

/// A worker on this machine (its probes apply to it).
bool is_local_host(const std::string& host) {
  return host == "localhost" || host == "::1" || host.rfind("127.", 0) == 0;
}

/// Frame sizes of a one-row decode layer request and its reply, from the real encoders.
WireSizes wire_sizes(int64_t hidden_size) {
  auto request = [&](size_t experts) {
    LayerRequest r;
    r.hidden_size = static_cast<uint32_t>(hidden_size);
    r.num_rows = 1;
    r.hidden.assign(static_cast<size_t>(hidden_size), 0.0f);
    for (size_t e = 0; e < experts; ++e) r.assignments.push_back({0, static_cast<uint32_t>(e)});
    return static_cast<double>(encode_layer_request(r).size());
  };
  // The reply is one fixed-point row per position, however many experts it used there.
  LayerResponseMsg reply;
  reply.response.outputs.assign(static_cast<size_t>(hidden_size), 0);
  constexpr size_t kN = 8;
  WireSizes w;
  w.request_bytes = request(0);
  w.request_bytes_per_expert = (request(kN) - w.request_bytes) / kN;
  w.reply_bytes = static_cast<double>(encode_layer_response(reply).size());
  w.reply_bytes_per_expert = 0;
  return w;
}

/// Adds every count of `from` to `into`.
void merge(UsageCounts& into, const UsageCounts& from) {
  for (const auto& [key, count] : from) into[key] += count;
}

/// Reads a usage file the user named: it must exist and parse.
UsageCounts read_required_usage(const std::string& given, const std::string& fingerprint) {
  const UserPath path = UserPath::from_command_line(given);
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) {
    fail_invalid("--usage " + path.describe() +
                 (std::filesystem::exists(path, ec) ? " is not a regular file" : " does not exist"));
  }
  std::string warning;
  UsageCounts counts = read_usage_file(path, fingerprint, &warning);
  if (!warning.empty()) {
    // The worker's wording ends "; ignored, it will be replaced": not so here.
    fail_invalid("--usage: " + warning.substr(0, warning.find("; ignored")));
  }
  return counts;
}

/// The usage file a worker pins from (pin: FILE, or pin: auto's usage file); "" for none.
std::filesystem::path pin_source(const StoreSpec& spec, const std::string& fingerprint) {
  if (spec.pin == "none") return {};
  if (spec.pin != "auto") return spec.pin_file;
  return usage_file_for(spec, fingerprint);
}

/// The machine rates of this host: cached under `host` unless reprobe, else measured now
/// (and written back to the cache by the caller).
MachineReport this_machine(ProbeCache& cache, const std::string& host, const std::filesystem::path& disk_file,
                           const PlanOptions& options, const Probes& probes) {
  MachineReport m;
  HostProbes& h = cache[host];
  if (h.memory_gb_per_s && !options.reprobe) {
    m.memory_source = "cached";
  } else {
    h.memory_gb_per_s = probes.memory();
    m.memory_source = "measured";
  }
  m.rates.memory_gb_per_s = *h.memory_gb_per_s;
  const std::string key = disk_file.string();
  const auto it = h.disk.find(key);
  if (it != h.disk.end() && !options.reprobe) {
    m.disk_source = "cached";
  } else {
    h.disk[key] = probes.disk(disk_file);
    m.disk_source = "measured";
  }
  const DiskProbe& d = h.disk[key];
  m.rates.disk_gb_per_s = d.gb_per_s;
  m.disk_kind = d.kind();
  m.disk_file = key;
  return m;
}

/// The checkpoint file a disk probe reads: the largest one holding tensors.
std::filesystem::path largest_file(const Checkpoint& checkpoint) {
  std::filesystem::path best;
  uintmax_t best_size = 0;
  std::set<std::filesystem::path> seen;
  for (const std::string& name : checkpoint.tensor_names()) {
    const std::filesystem::path& file = checkpoint.find(name)->file;
    if (!seen.insert(file).second) continue;
    std::error_code ec;
    const uintmax_t size = std::filesystem::file_size(file, ec);
    if (!ec && size >= best_size) {
      best = file;
      best_size = size;
    }
  }
  return best;
}

/// Bytes a decode token reads of dense tensor `t`: as stored, or under quant_dense the
/// blocks quantize_dense makes of a matrix of whole blocks not in GGML blocks already
/// (common/ggml_quantize.h). Approximate: the few matrices kept exact (routers, the
/// shared expert's gate, the DSA indexer's weights_proj) count as quantised, and those
/// the coordinator widens to f32 (MLA's kv_b_proj, fp8 blocks) at their stored size.
uint64_t held_bytes(const TensorInfo& t, std::optional<GgmlType> quant_dense) {
  if (!quant_dense || t.shape.size() != 2) return t.nbytes;
  const std::optional<uint64_t> row = dense_quant_row_bytes(*quant_dense, t.block_type.has_value(), t.shape[1]);
  return row ? *row * static_cast<uint64_t>(t.shape[0]) : t.nbytes;
}

/// What build_plan reads from the checkpoint once.
struct ModelFacts {
  std::unique_ptr<Checkpoint> checkpoint;
  ModelConfig config;
  std::string fingerprint;
  std::vector<int64_t> moe_layers;
  std::map<ExpertKey, uint64_t> blob_bytes;  ///< checkpoint layout of every expert
  uint64_t dense_bytes = 0;
};

ModelFacts read_model(const Topology& topology) {
  ModelFacts f;
  f.checkpoint = Checkpoint::open(topology.model);
  f.config = ModelConfig::parse(f.checkpoint->config_json(), f.checkpoint->config_origin(), checkpoint_families());
  f.fingerprint = model_fingerprint(*f.checkpoint);
  f.moe_layers = f.config.moe_layer_ids();
  for (int64_t l : f.moe_layers) {
    for (int64_t e = 0; e < f.config.num_experts; ++e) {
      const ExpertSlices s = f.checkpoint->locate_expert(f.config.expert_tensors, static_cast<int>(l), static_cast<int>(e),
                                                         f.config.hidden_size, f.config.moe_intermediate_size);
      f.blob_bytes[{static_cast<uint32_t>(l), static_cast<uint32_t>(e)}] = layout_of(s).bytes;
    }
  }
  // A decode token reads one row of the input embedding (unless it is also the tied
  // lm_head) and every other dense tensor whole (held_bytes).
  for (const TensorInfo* t : f.checkpoint->non_expert_tensors(f.config.expert_tensors)) {
    if (t->name == "model.embed_tokens.weight" && !f.config.tie_word_embeddings) continue;
    f.dense_bytes += held_bytes(*t, topology.quant_dense);
  }
  return f;
}

/// The routing mass of each (layer, expert): usage counts over the layer's total, 1/E on a
/// layer nobody counted. Throws Error(kInvalidInput) naming the first count of an expert
/// the model does not route to (a layer that is not a MoE layer, an id >= num_experts),
/// whose mass would otherwise vanish from the prediction.
std::map<ExpertKey, double> routing_mass(const UsageCounts& usage, const ModelFacts& m) {
  const std::set<int64_t> moe_layers(m.moe_layers.begin(), m.moe_layers.end());
  std::map<uint32_t, double> totals;
  for (const auto& [key, count] : usage) {
    if (!moe_layers.count(key.first) || key.second >= m.config.num_experts) {
      fail_invalid("usage counts name layer " + std::to_string(key.first) + " expert " + std::to_string(key.second) +
                   ", which the model does not route to (" + std::to_string(m.moe_layers.size()) +
                   " MoE layers, num_experts " + std::to_string(m.config.num_experts) + ")");
    }
    totals[key.first] += static_cast<double>(count);
  }
  std::map<ExpertKey, double> mass;
  for (int64_t l : m.moe_layers) {
    const auto layer = static_cast<uint32_t>(l);
    const double total = totals.count(layer) ? totals[layer] : 0;
    for (int64_t e = 0; e < m.config.num_experts; ++e) {
      const ExpertKey key{layer, static_cast<uint32_t>(e)};
      const auto it = usage.find(key);
      mass[key] = total > 0 ? (it == usage.end() ? 0.0 : static_cast<double>(it->second) / total)
                            : 1.0 / static_cast<double>(m.config.num_experts);
    }
  }
  return mass;
}

/// Expert blob bytes for one worker: its container's layouts when it has one that opens,
/// else the checkpoint's.
std::map<ExpertKey, uint64_t> worker_blob_bytes(const StoreSpec& spec, const ModelFacts& m,
                                                const std::vector<ExpertKey>& owned, const std::string& name,
                                                std::vector<std::string>& notes) {
  std::map<ExpertKey, uint64_t> out;
  if (!spec.container.empty()) {
    try {
      auto container = ExpertContainer::open(spec.container, m.fingerprint, m.config.hidden_size,
                                             m.config.moe_intermediate_size);
      for (const ExpertKey& key : owned) {
        const ExpertLayout* layout = container->layout(key);
        if (!layout) fail_invalid("holds no layer " + std::to_string(key.first) + " expert " + std::to_string(key.second));
        out[key] = layout->bytes;
      }
      return out;
    } catch (const Error& e) {
      notes.push_back("note: worker '" + name + "': container " + spec.container.string() + " not used for sizes (" +
                      e.message() + "): the checkpoint's expert sizes are assumed");
      out.clear();
    }
  }
  for (const ExpertKey& key : owned) out[key] = m.blob_bytes.at(key);
  return out;
}

/// Machine rates for a worker: this host's when local, else this host's as an assumption.
MachineReport worker_machine(const WorkerSpec* spec, const MachineReport& local, std::vector<std::string>& notes) {
  MachineReport m = local;
  if (spec && !is_local_host(spec->host)) {
    m.memory_source = "assumed (this machine's)";
    m.disk_source = "assumed (this machine's)";
    notes.push_back("note: worker '" + spec->name + "' runs on " + spec->host +
                    ": its memory and disk rates are this machine's (run charm plan there to measure them)");
  }
  return m;
}

/// The (layer, expert) pairs worker `wi` holds, ascending; `replicas` gets each one's
/// number of holders.
std::vector<ExpertKey> owned_by(const Placement& placement, int wi, std::map<ExpertKey, int>& replicas) {
  std::vector<ExpertKey> owned;
  for (const auto& [layer, owners] : placement) {
    for (size_t e = 0; e < owners.size(); ++e) {
      if (std::find(owners[e].begin(), owners[e].end(), wi) == owners[e].end()) continue;
      const ExpertKey key{static_cast<uint32_t>(layer), static_cast<uint32_t>(e)};
      owned.push_back(key);
      replicas[key] = static_cast<int>(owners[e].size());
    }
  }
  return owned;
}

/// Per layer, the worker's experts with their mass and whether they are expected in RAM:
/// its slots and pins as the worker will plan them (plan_slots over its pin or usage
/// file; its errors), the LRU slots then filled by mass. Sets w.pinned and w.ram_slots.
std::map<uint32_t, std::vector<PlanExpert>> resident_layers(const StoreSpec& store, const std::string& fingerprint,
                                                            const std::vector<ExpertKey>& owned,
                                                            const std::map<ExpertKey, int>& replicas,
                                                            const std::map<ExpertKey, double>& mass, WorkerReport& w,
                                                            std::vector<std::string>& notes) {
  UsageCounts pin_usage;
  const std::filesystem::path pins = pin_source(store, fingerprint);
  std::string warning;
  if (!pins.empty()) pin_usage = read_usage_file(pins, fingerprint, &warning);
  if (!warning.empty()) notes.push_back("note: worker '" + w.name + "': " + warning);
  std::map<uint32_t, std::vector<PlanExpert>> layers;
  for (const auto& [layer, p] : plan_slots(owned, w.slot_bytes, w.ram_bytes, pin_usage, w.name)) {
    std::vector<PlanExpert>& experts = layers[layer];
    for (uint32_t e : p.owned) experts.push_back({e, mass.at({layer, e}) / replicas.at({layer, e}), false});
    mark_resident(experts, p.pinned, p.lru_slots);
    w.pinned += p.pinned.size();
    w.ram_slots += p.pinned.size() + p.lru_slots;
  }
  return layers;
}

/// A probed link with the stated assumptions filled in: the bandwidth always, the RTT of
/// an unreachable worker (and a note saying so).
LinkReport with_assumptions(LinkReport link, const PlanOptions& options, const std::string& name,
                            std::vector<std::string>& notes) {
  link.rates.bandwidth_gb_per_s = options.link_gbps / 8;
  link.bandwidth_source = "assumed (--link-gbps " + fixed(options.link_gbps, 3) + "): the protocol has no bulk echo to time";
  if (!link.reachable) {
    link.rates.rtt_ms = options.default_rtt_ms;
    link.rtt_source = "assumed (--default-rtt-ms): unreachable";
    notes.push_back("note: worker '" + name + "' is unreachable (" + link.error + "): RTT " +
                    fixed(options.default_rtt_ms, 2) + " ms assumed");
  }
  return link;
}

}  // namespace

Probes real_probes(const Topology& topology, const PlanOptions& options) {
  Probes p;
  p.memory = [] { return probe_memory(); };
  p.disk = [](const std::filesystem::path& file) { return probe_disk(file); };
  p.link = [secret = topology.cluster_secret, options](const WorkerSpec& spec, const std::string& fingerprint) {
    LinkReport link;
    const std::chrono::milliseconds timeout(options.timeout_ms);
    const std::string label = "worker '" + spec.name + "'";
    try {
      auto conn = FrameConnection::connect(spec.host, spec.port, timeout, label);
      if (!secret.empty() || !fingerprint.empty()) {
        HelloMsg hello;
        hello.client_name = "charm plan";
        hello.model_fingerprint = fingerprint;
        client_handshake(*conn, hello, secret, timeout, label,
                         max_hello_reply_bytes(kStatusFallbackMoeLayers, kStatusFallbackExperts));
      }
      conn->set_max_frame_bytes(max_health_reply_bytes(kStatusFallbackMoeLayers, kStatusFallbackExperts));
      // One untimed round trip first: the first reply after the handshake is slower
      // (the worker's thread wakes, caches are cold) and would skew a small median.
      conn->send(encode_health_request(), timeout);
      decode_as<HealthReplyMsg>(conn->receive(timeout), conn->max_frame_bytes());
      std::vector<double> ms;
      for (int i = 0; i < std::max(1, options.pings); ++i) {
        const auto start = Clock::now();
        conn->send(encode_health_request(), timeout);
        decode_as<HealthReplyMsg>(conn->receive(timeout), conn->max_frame_bytes());
        ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - start).count());
      }
      std::sort(ms.begin(), ms.end());
      link.reachable = true;
      link.rates.rtt_ms = ms[ms.size() / 2];
      link.rtt_source = "measured (median of " + std::to_string(ms.size()) + " health round trips)";
    } catch (const std::exception& e) {
      link.error = message_of(e);
    }
    return link;
  };
  return p;
}

PlanReport build_plan(const Topology& topology, const PlanOptions& options, const Probes& probes,
                      const std::filesystem::path& cache_file) {
  PlanReport r;
  const ModelFacts m = read_model(topology);
  const Placement placement = topology.placement(m.moe_layers, m.config.num_experts);
  r.model = topology.model.string();
  r.top_k = m.config.num_experts_per_tok;
  r.moe_layers = m.moe_layers.size();
  r.num_experts = m.config.num_experts;
  r.hidden_size = m.config.hidden_size;
  r.dense_bytes = m.dense_bytes;

  // The workers (single-node: one in-process store, topology.store).
  std::vector<const WorkerSpec*> specs;
  for (const WorkerSpec& w : topology.workers) specs.push_back(&w);
  if (topology.single_node) specs = {nullptr};
  auto store_of = [&](const WorkerSpec* s) -> const StoreSpec& { return s ? s->store : topology.store; };

  // Routing mass: --usage, else every configured usage file merged.
  UsageCounts usage;
  std::string usage_source = "uniform";
  if (!options.usage_file.empty()) {
    usage = read_required_usage(options.usage_file, m.fingerprint);
    usage_source = UserPath::from_command_line(options.usage_file).string();
  } else {
    std::set<std::filesystem::path> read;
    for (const WorkerSpec* s : specs) {
      const std::filesystem::path file = usage_file_for(store_of(s), m.fingerprint);
      if (file.empty() || !read.insert(file).second) continue;
      std::string warning;
      const UsageCounts counts = read_usage_file(file, m.fingerprint, &warning);
      if (!warning.empty()) r.notes.push_back("note: " + warning);
      if (!counts.empty()) {
        merge(usage, counts);
        usage_source = usage_source == "uniform" ? file.string() : "merged usage files";
      }
    }
  }
  const std::map<ExpertKey, double> mass = routing_mass(usage, m);
  if (usage.empty()) r.notes.push_back("note: no usage counts: routing assumed uniform (each expert 1/" +
                                       std::to_string(m.config.num_experts) + " of a layer's selections)");

  // This machine's rates (the coordinator's, and the local workers').
  ProbeCache cache;
  std::string warning;
  if (!cache_file.empty()) cache = read_probe_cache(cache_file, &warning);
  if (!warning.empty()) r.notes.push_back("note: " + warning);
  const std::string host = options.host_identity.empty() ? this_host_identity() : options.host_identity;
  const MachineReport local = this_machine(cache, host, largest_file(*m.checkpoint), options, probes);
  r.coordinator = local;
  std::map<std::filesystem::path, MachineReport> by_disk;  // container files probed here

  // Links, in parallel (N dead workers cost one timeout).
  std::vector<std::future<LinkReport>> links;
  for (const WorkerSpec* s : specs) {
    if (s) links.push_back(std::async(std::launch::async, probes.link, *s, m.fingerprint));
  }

  r.input.top_k = r.top_k;
  r.input.dense_bytes = r.dense_bytes;
  r.input.coordinator = local.rates;
  r.input.wire = wire_sizes(m.config.hidden_size);
  size_t link_index = 0;
  for (size_t wi = 0; wi < specs.size(); ++wi) {
    const WorkerSpec* s = specs[wi];
    const StoreSpec& store = store_of(s);
    WorkerReport w;
    w.name = s ? s->name : "local";
    w.address = s ? s->host + ":" + std::to_string(s->port) : "in-process";
    std::map<ExpertKey, int> replicas;  // owned (layer, expert) -> how many workers hold it
    const std::vector<ExpertKey> owned = owned_by(placement, static_cast<int>(wi), replicas);
    const auto bytes = worker_blob_bytes(store, m, owned, w.name, r.notes);
    for (const auto& [key, b] : bytes) {
      w.expert_bytes += b;
      w.slot_bytes = std::max(w.slot_bytes, align_up(b, kRecordAlignment));
    }
    w.experts = owned.size();
    if (store.ram_gb) w.ram_bytes = static_cast<uint64_t>(std::llround(*store.ram_gb * double(1ull << 30)));
    WorkerPlanInput in;
    in.name = w.name;
    in.expert_bytes = owned.empty() ? 0 : w.expert_bytes / owned.size();
    in.layers = resident_layers(store, m.fingerprint, owned, replicas, mass, w, r.notes);
    w.usage_source = usage_source;
    // Disk tier: its container's data file when it has one here, else the checkpoint.
    w.machine = worker_machine(s, local, r.notes);
    const std::filesystem::path data = store.container.empty() ? std::filesystem::path{} : store.container / "experts.bin";
    std::error_code ec;
    if (!data.empty() && std::filesystem::is_regular_file(data, ec) && (!s || is_local_host(s->host))) {
      if (!by_disk.count(data)) by_disk[data] = this_machine(cache, host, data, options, probes);
      w.machine = by_disk[data];
    }
    in.machine = w.machine.rates;
    if (s) {
      w.link = with_assumptions(links[link_index++].get(), options, w.name, r.notes);
      in.link = w.link->rates;
    }
    r.input.workers.push_back(std::move(in));
    r.workers.push_back(std::move(w));
  }
  if (!cache_file.empty()) {
    try {
      write_probe_cache(cache_file, cache);
    } catch (const Error& e) {
      r.notes.push_back("note: probe results not cached: " + e.message());
    }
  }
  if (local.disk_kind != "disk") {
    r.notes.push_back("note: the disk probe of " + local.disk_file +
                      " read mostly from the page cache (a running process maps it?): DISK_GB/S is a cached read, "
                      "not the disk's rate");
  }
  r.prediction = predict(r.input);
  return r;
}

std::string format_plan(const PlanReport& r) {
  using Row = std::vector<std::string>;
  std::vector<Row> table = {{"WORKER", "ADDRESS", "EXPERTS", "BYTES", "RAM_BUDGET", "FIT", "PINNED", "HIT_RATE",
                             "MEM_GB/S", "DISK_GB/S", "DISK", "RTT_MS", "LINK_GB/S", "EXPERTS/TOK", "LAYER_MS"}};
  for (size_t i = 0; i < r.workers.size(); ++i) {
    const WorkerReport& w = r.workers[i];
    const WorkerPlan& p = r.prediction.workers[i];
    table.push_back({w.name, w.address, std::to_string(w.experts), bytes_cell(w.expert_bytes),
                     w.ram_bytes ? bytes_cell(*w.ram_bytes) : "all", std::to_string(w.ram_slots),
                     std::to_string(w.pinned), fixed(100 * p.hit_rate, 1) + "%",
                     fixed(w.machine.rates.memory_gb_per_s, 2), fixed(w.machine.rates.disk_gb_per_s, 2),
                     w.machine.disk_kind == "disk" ? "disk" : "cached",
                     w.link ? fixed(w.link->rates.rtt_ms, 3) + (w.link->reachable ? "" : "?") : "-",
                     w.link ? fixed(w.link->rates.bandwidth_gb_per_s, 3) : "-", fixed(p.experts_per_token, 2),
                     w.link ? fixed(1e3 * p.layer_round_trip_s, 3) : "-"});
  }
  std::vector<size_t> width(table[0].size(), 0);
  for (const Row& row : table) {
    for (size_t i = 0; i < row.size(); ++i) width[i] = std::max(width[i], row[i].size());
  }
  std::string out;
  for (const Row& row : table) {
    std::string line;
    for (size_t i = 0; i < row.size(); ++i) line += row[i] + std::string(width[i] - row[i].size() + 2, ' ');
    while (!line.empty() && line.back() == ' ') line.pop_back();
    out += line + "\n";
  }
  const PlanResult& p = r.prediction;
  out += "model: " + r.model + " (" + std::to_string(r.moe_layers) + " MoE layers, " + std::to_string(r.num_experts) +
         " experts, top-" + std::to_string(r.top_k) + ")\n";
  out += "coordinator: dense part " + bytes_cell(r.dense_bytes) + " per token at " +
         fixed(r.coordinator.rates.memory_gb_per_s, 2) + " GB/s (" + r.coordinator.memory_source + ") = " +
         fixed(1e3 * p.compute_s, 3) + " ms\n";
  out += "per token: compute " + fixed(1e3 * p.compute_s, 3) + " ms, memory " + fixed(1e3 * p.memory_s, 3) +
         " ms, disk " + fixed(1e3 * p.disk_s, 3) + " ms, network " + fixed(1e3 * p.network_s, 3) + " ms\n";
  out += "predicted decode (one stream): " + fixed(p.tokens_per_s, 1) + " tok/s, expected hit rate " +
         fixed(100 * p.hit_rate, 1) + "%, bottleneck: " + p.bottleneck + "\n";
  for (const std::string& note : r.notes) out += note + "\n";
  const bool networked = std::any_of(r.workers.begin(), r.workers.end(), [](const WorkerReport& w) { return w.link.has_value(); });
  if (networked) {
    out += "note: link bandwidth is assumed, not measured (--link-gbps); RTT_MS ending in '?' is assumed (unreachable)\n";
  }
  return out;
}

nlohmann::json plan_json(const PlanReport& r) {
  auto machine = [](const MachineReport& m) {
    return nlohmann::json{{"memory_gb_per_s", m.rates.memory_gb_per_s}, {"memory_source", m.memory_source},
                          {"disk_gb_per_s", m.rates.disk_gb_per_s},     {"disk_source", m.disk_source},
                          {"disk_kind", m.disk_kind},                   {"disk_file", m.disk_file}};
  };
  nlohmann::json workers = nlohmann::json::array();
  for (size_t i = 0; i < r.workers.size(); ++i) {
    const WorkerReport& w = r.workers[i];
    nlohmann::json j = {{"name", w.name},
                        {"address", w.address},
                        {"experts", w.experts},
                        {"expert_bytes", w.expert_bytes},
                        {"slot_bytes", w.slot_bytes},
                        {"ram_budget_bytes", w.ram_bytes ? nlohmann::json(*w.ram_bytes) : nlohmann::json(nullptr)},
                        {"ram_slots", w.ram_slots},
                        {"pinned", w.pinned},
                        {"usage_source", w.usage_source},
                        {"machine", machine(w.machine)},
                        {"link", nullptr}};
    if (w.link) {
      j["link"] = {{"reachable", w.link->reachable},
                   {"rtt_ms", w.link->rates.rtt_ms},
                   {"rtt_source", w.link->rtt_source},
                   {"bandwidth_gb_per_s", w.link->rates.bandwidth_gb_per_s},
                   {"bandwidth_source", w.link->bandwidth_source},
                   {"error", w.link->error}};
    }
    workers.push_back(j);
  }
  return {{"format", "charm-plan"},
          {"version", 1},
          {"model", r.model},
          {"top_k", r.top_k},
          {"moe_layers", r.moe_layers},
          {"num_experts", r.num_experts},
          {"hidden_size", r.hidden_size},
          {"dense_bytes", r.dense_bytes},
          {"wire", {{"request_bytes", r.input.wire.request_bytes},
                    {"request_bytes_per_expert", r.input.wire.request_bytes_per_expert},
                    {"reply_bytes", r.input.wire.reply_bytes},
                    {"reply_bytes_per_expert", r.input.wire.reply_bytes_per_expert}}},
          {"coordinator", machine(r.coordinator)},
          {"workers", workers},
          {"prediction", prediction_json(r.prediction)},
          {"formula", kPlanFormula},
          {"notes", r.notes}};
}

}  // namespace charm
