// Topology YAML reader (format documented key by key in docs/configuration.md). Every
// error names the file and the key path ("workers[1].port") so a user can fix the file
// without reading code; unknown keys are errors so a typo never silently means "default".
#include "common/topology.h"

#include "common/cpu_threads.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <charconv>
#include <regex>
#include <set>
#include <tuple>

#include "common/error.h"
#include "common/ggml_quantize.h"
#include "common/text_file.h"

namespace charm {
namespace {

/// The API's model name when the YAML gives none: the folder's name, or a GGUF file's
/// without ".gguf" and without a gguf-split suffix ("m-00001-of-00003.gguf" -> "m").
std::string default_model_name(const std::filesystem::path& model) {
  std::string name = model.filename().string();
  if (model.extension() != ".gguf") return name;
  name = model.stem().string();
  static const std::regex split_suffix("-[0-9]{5}-of-[0-9]{5}$");
  return std::regex_replace(name, split_suffix, "");
}

// Ids larger than this are surely typos; the cap also bounds what a range "0-N" allocates.
constexpr int64_t kMaxId = (1 << 20) - 1;

/// Reads one YAML file, turning every problem into an Error naming file and key path.
class Reader {
 public:
  explicit Reader(std::string file) : file_(std::move(file)) {}

  [[noreturn]] void fail(const std::string& path, const std::string& message) const {
    fail_invalid(where(path) + message);
  }

  /// "<file>: <path>: " for messages.
  std::string where(const std::string& path) const {
    return file_ + ": " + (path.empty() ? "" : path + ": ");
  }

  /// Requires a mapping whose keys are all in `allowed`, each present once.
  void check_keys(const YAML::Node& node, const std::string& path, const std::vector<std::string>& allowed) const {
    if (!node.IsMap()) fail(path, "expected a mapping of keys, got " + describe(node));
    std::set<std::string> seen;
    for (const auto& kv : node) {
      if (!kv.first.IsScalar()) fail(path, "keys must be plain names");
      const std::string key = kv.first.Scalar();
      const std::string at = join(path, key);
      if (std::find(allowed.begin(), allowed.end(), key) == allowed.end()) {
        std::string list;
        for (const auto& a : allowed) list += (list.empty() ? "" : ", ") + a;
        fail(at, "unknown key (expected one of: " + list + ")");
      }
      if (!seen.insert(key).second) fail(at, "key given twice");
    }
  }

  std::string string_value(const YAML::Node& node, const std::string& path) const {
    if (!node.IsScalar() || node.Scalar().empty()) fail(path, "expected a non-empty string, got " + describe(node));
    return node.Scalar();
  }

  bool bool_value(const YAML::Node& node, const std::string& path) const {
    if (node.IsScalar()) {
      const std::string& v = node.Scalar();
      if (v == "true") return true;
      if (v == "false") return false;
    }
    fail(path, "expected true or false, got " + describe(node));
  }

  int64_t int_value(const YAML::Node& node, const std::string& path, int64_t lo, int64_t hi) const {
    const std::string range = "expected an integer " + std::to_string(lo) + "-" + std::to_string(hi);
    if (!node.IsScalar()) fail(path, range + ", got " + describe(node));
    const auto v = parse_int(node.Scalar());
    if (!v || *v < lo || *v > hi) fail(path, range + ", got '" + node.Scalar() + "'");
    return *v;
  }

  /// Expert or layer ids: an int, a range string "a-b" (inclusive), or a list mixing both.
  /// Returns them sorted; an id given twice is an error.
  std::vector<int64_t> id_list(const YAML::Node& node, const std::string& path) const {
    std::vector<int64_t> ids;
    if (node.IsScalar()) {
      add_ids(node.Scalar(), path, ids);
    } else if (node.IsSequence()) {
      if (node.size() == 0) fail(path, "empty list");
      for (size_t i = 0; i < node.size(); ++i) {
        const std::string at = path + "[" + std::to_string(i) + "]";
        if (!node[i].IsScalar()) fail(at, "expected an id or a range \"a-b\", got " + describe(node[i]));
        add_ids(node[i].Scalar(), at, ids);
      }
    } else {
      fail(path, "expected an id, a range \"a-b\" or a list of them, got " + describe(node));
    }
    std::sort(ids.begin(), ids.end());
    const auto dup = std::adjacent_find(ids.begin(), ids.end());
    if (dup != ids.end()) fail(path, "id " + std::to_string(*dup) + " is listed twice");
    return ids;
  }

  static std::string join(const std::string& path, const std::string& key) {
    return path.empty() ? key : path + "." + key;
  }

 private:
  std::string file_;

  static std::optional<int64_t> parse_int(std::string_view text) {
    while (!text.empty() && text.front() == ' ') text.remove_prefix(1);
    while (!text.empty() && text.back() == ' ') text.remove_suffix(1);
    int64_t v = 0;
    const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
    if (text.empty() || ec != std::errc() || end != text.data() + text.size()) return std::nullopt;
    return v;
  }

  static std::string describe(const YAML::Node& node) {
    if (!node.IsDefined() || node.IsNull()) return "nothing";
    if (node.IsSequence()) return "a list";
    if (node.IsMap()) return "a mapping";
    return "'" + node.Scalar() + "'";
  }

  void add_ids(const std::string& text, const std::string& path, std::vector<int64_t>& ids) const {
    const std::string bad = "expected an id 0-" + std::to_string(kMaxId) + " or a range \"a-b\", got '" + text + "'";
    const auto trimmed_start = text.find_first_not_of(' ');
    if (trimmed_start != std::string::npos && text[trimmed_start] == '-') fail(path, "negative id in '" + text + "'");
    const auto dash = text.find('-');
    const auto a = parse_int(text.substr(0, dash));
    const auto b = dash == std::string::npos ? a : parse_int(text.substr(dash + 1));
    if (!a || !b) fail(path, bad);
    if (*a < 0 || *b < 0) fail(path, "negative id in '" + text + "'");
    if (*a > kMaxId || *b > kMaxId) fail(path, bad);
    if (*b < *a) fail(path, "range '" + text + "' ends before it starts");
    for (int64_t id = *a; id <= *b; ++id) ids.push_back(id);
  }
};

YAML::Node parse_yaml(const std::string& text, const std::filesystem::path& path) {
  try {
    return YAML::Load(text);
  } catch (const YAML::Exception& e) {
    fail_invalid(path.string() + ": YAML does not parse at line " + std::to_string(e.mark.line + 1) + ", column " +
                 std::to_string(e.mark.column + 1) + ": " + e.msg);
  }
}

double number_value(const Reader& r, const YAML::Node& node, const std::string& path) {
  if (node.IsScalar()) {
    try {
      size_t used = 0;
      const double v = std::stod(node.Scalar(), &used);
      if (used == node.Scalar().size() && v > 0 && v < 1e9) return v;
    } catch (const std::exception&) {
    }
  }
  r.fail(path, "expected a positive number of GiB, got '" + (node.IsScalar() ? node.Scalar() : std::string("?")) + "'");
}

const std::vector<std::string> kStoreKeys = {"ram_gb", "vram_gb", "pin", "container", "io", "io_threads",
                                             "cache_policy", "usage_file"};

/// The `serving:` section.
ServingSpec parse_serving(const Reader& r, const YAML::Node& node) {
  r.check_keys(node, "serving",
               {"max_batch_tokens", "max_num_seqs", "max_waiting", "kv_cache_gb", "micro_batches", "prefix_cache"});
  ServingSpec s;
  if (node["max_batch_tokens"]) s.max_batch_tokens = r.int_value(node["max_batch_tokens"], "serving.max_batch_tokens", 1, 1 << 20);
  if (node["max_num_seqs"]) s.max_num_seqs = r.int_value(node["max_num_seqs"], "serving.max_num_seqs", 1, 4096);
  if (node["max_waiting"]) s.max_waiting = r.int_value(node["max_waiting"], "serving.max_waiting", 0, 1 << 16);
  if (node["micro_batches"]) s.micro_batches = r.int_value(node["micro_batches"], "serving.micro_batches", 0, 2);
  if (node["prefix_cache"]) s.prefix_cache = r.bool_value(node["prefix_cache"], "serving.prefix_cache");
  if (node["kv_cache_gb"]) {
    s.kv_cache_gb = number_value(r, node["kv_cache_gb"], "serving.kv_cache_gb");
    if (!(*s.kv_cache_gb > 0 && *s.kv_cache_gb <= kMaxKvCacheGb)) {  // NaN fails too
      r.fail("serving.kv_cache_gb", "must be a number of GiB in (0, " + std::to_string(int64_t(kMaxKvCacheGb)) + "]");
    }
  }
  if (s.max_batch_tokens < s.max_num_seqs) {
    r.fail("serving.max_batch_tokens", "must be at least max_num_seqs (" + std::to_string(s.max_num_seqs) +
                                           "): every running sequence decodes one token per step");
  }
  return s;
}

/// The tier keys of a worker entry (or of `store:` in single-node mode).
StoreSpec parse_store(const Reader& r, const YAML::Node& node, const std::string& path, const std::filesystem::path& base) {
  StoreSpec s;
  auto at = [&](const char* key) { return Reader::join(path, key); };
  auto resolve = [&](const std::string& p) { return UserPath::resolve(p, base); };
  if (node["ram_gb"]) s.ram_gb = number_value(r, node["ram_gb"], at("ram_gb"));
  if (node["vram_gb"]) s.vram_gb = number_value(r, node["vram_gb"], at("vram_gb"));
  if (node["pin"]) {
    s.pin = r.string_value(node["pin"], at("pin"));
    if (s.pin != "auto" && s.pin != "none") s.pin_file = resolve(s.pin);
  }
  if (node["container"]) s.container = resolve(r.string_value(node["container"], at("container")));
  if (node["io"]) {
    s.io = r.string_value(node["io"], at("io"));
    if (s.io != "pread" && s.io != "odirect") r.fail(at("io"), "expected 'pread' or 'odirect', got '" + s.io + "'");
  }
  if (node["io_threads"]) s.io_threads = r.int_value(node["io_threads"], at("io_threads"), 1, 256);
  if (node["cache_policy"]) {
    s.cache_policy = r.string_value(node["cache_policy"], at("cache_policy"));
    if (s.cache_policy != "lrfu" && s.cache_policy != "lru") {
      r.fail(at("cache_policy"), "expected 'lrfu' or 'lru', got '" + s.cache_policy + "'");
    }
  }
  if (node["usage_file"]) {
    s.usage_file = UserPath(r.string_value(node["usage_file"], at("usage_file")));
    if (s.usage_file != "none") s.usage_file = resolve(s.usage_file.string());
  }
  return s;
}

WorkerSpec parse_worker(const Reader& r, const YAML::Node& node, const std::string& path,
                        const std::filesystem::path& base) {
  std::vector<std::string> keys = {"name", "host", "port", "experts", "layers"};
  keys.insert(keys.end(), kStoreKeys.begin(), kStoreKeys.end());
  r.check_keys(node, path, keys);
  for (const char* key : {"name", "port", "experts"}) {
    if (!node[key]) r.fail(Reader::join(path, key), "required key is missing");
  }
  WorkerSpec w;
  w.name = r.string_value(node["name"], path + ".name");
  if (node["host"]) w.host = r.string_value(node["host"], path + ".host");
  w.port = static_cast<uint16_t>(r.int_value(node["port"], path + ".port", 1, 65535));
  w.experts = r.id_list(node["experts"], path + ".experts");
  if (const auto layers = node["layers"]; layers && !(layers.IsScalar() && layers.Scalar() == "all")) {
    w.layers = r.id_list(layers, path + ".layers");
  }
  w.store = parse_store(r, node, path, base);
  return w;
}

/// A secret named by `<prefix>_file` (relative to the YAML's folder) or `<prefix>_env` in
/// `node`, read with read_secret; "" when neither key is present.
std::string parse_secret(const Reader& r, const YAML::Node& node, const std::string& path,
                         const std::string& prefix, const std::filesystem::path& base) {
  const std::string file_key = prefix + "_file", env_key = prefix + "_env";
  if (node[file_key] && node[env_key]) {
    r.fail(Reader::join(path, file_key), "give " + file_key + " or " + env_key + ", not both");
  }
  // "<file>: <key path>" (Reader::where ends with ": " for a message to follow).
  auto key_of = [&](const std::string& key_path) {
    std::string where = r.where(key_path);
    return where.substr(0, where.size() - 2);
  };
  SecretSource source;
  if (node[file_key]) {
    source.file = UserPath::resolve(r.string_value(node[file_key], Reader::join(path, file_key)), base);
    source.key = key_of(Reader::join(path, file_key));
  } else if (node[env_key]) {
    source.env = r.string_value(node[env_key], Reader::join(path, env_key));
    source.key = key_of(Reader::join(path, env_key));
  }
  return read_secret(source);
}

/// `<path>.insecure` (default false): serving beyond loopback without the secret that
/// `<prefix>_file` / `<prefix>_env` would configure. Both at once is a contradiction.
bool parse_insecure(const Reader& r, const YAML::Node& node, const std::string& path, const std::string& prefix) {
  const std::string key = Reader::join(path, "insecure");
  if (!node["insecure"] || !r.bool_value(node["insecure"], key)) return false;
  if (node[prefix + "_file"] || node[prefix + "_env"]) {
    r.fail(key, "true waives the " + prefix + "_file / " + prefix + "_env this section also gives; remove one");
  }
  return true;
}

/// Parses `workers:`, rejecting duplicate names and duplicate host:port pairs.
std::vector<WorkerSpec> parse_workers(const Reader& r, const YAML::Node& node, const std::filesystem::path& base) {
  if (!node.IsSequence() || node.size() == 0) r.fail("workers", "expected a non-empty list of workers");
  std::vector<WorkerSpec> workers;
  std::map<std::string, size_t> names;
  std::map<std::string, size_t> endpoints;
  for (size_t i = 0; i < node.size(); ++i) {
    const std::string path = "workers[" + std::to_string(i) + "]";
    WorkerSpec w = parse_worker(r, node[i], path, base);
    if (const auto [it, ok] = names.emplace(w.name, i); !ok) {
      r.fail(path + ".name", "duplicate worker name '" + w.name + "' (also workers[" + std::to_string(it->second) + "])");
    }
    const std::string endpoint = w.host + ":" + std::to_string(w.port);
    if (const auto [it, ok] = endpoints.emplace(endpoint, i); !ok) {
      r.fail(path + ".port", "duplicate address " + endpoint + " (also workers[" + std::to_string(it->second) + "])");
    }
    workers.push_back(std::move(w));
  }
  return workers;
}

}  // namespace

Topology Topology::load(const UserPath& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) fail_io("topology file " + path.describe() + " does not exist");
  return parse(read_text_file(path, kMaxFileBytes, "a topology file"), path);
}

Topology Topology::parse(const std::string& yaml, const std::filesystem::path& path) {
  const Reader r(path.string());
  const YAML::Node root = parse_yaml(yaml, path);
  r.check_keys(root, "",
               {"model", "model_name", "mode", "api", "threads", "timeouts", "store", "workers", "cluster", "prefetch",
                "serving", "activations", "quant_dense", "gpu"});

  Topology t;
  t.source = path;
  if (!root["model"]) r.fail("model", "required key is missing (the checkpoint directory)");
  // Relative paths are against the YAML's folder, made absolute so every message can
  // print the path as opened (UserPath::describe).
  const std::filesystem::path base = path.parent_path();
  t.model = UserPath::resolve(r.string_value(root["model"], "model"), base);
  if (root["model_name"]) {
    t.model_name = r.string_value(root["model_name"], "model_name");
  } else {
    const std::filesystem::path& model = t.model;
    const auto trimmed = model.has_filename() ? model : model.parent_path();  // "dir/" -> "dir"
    t.model_name = default_model_name(trimmed);
  }

  if (root["mode"]) {
    const std::string mode = r.string_value(root["mode"], "mode");
    if (mode != "cluster" && mode != "single-node") r.fail("mode", "expected 'cluster' or 'single-node', got '" + mode + "'");
    t.single_node = mode == "single-node";
  }
  if (const auto api = root["api"]) {
    r.check_keys(api, "api", {"host", "port", "api_key_file", "api_key_env", "insecure"});
    if (api["host"]) t.api_host = r.string_value(api["host"], "api.host");
    if (api["port"]) t.api_port = static_cast<uint16_t>(r.int_value(api["port"], "api.port", 1, 65535));
    t.api_insecure = parse_insecure(r, api, "api", "api_key");
    t.api_key = parse_secret(r, api, "api", "api_key", base);
  }
  if (const auto cluster = root["cluster"]) {
    r.check_keys(cluster, "cluster", {"secret_file", "secret_env", "insecure"});
    t.cluster_insecure = parse_insecure(r, cluster, "cluster", "secret");
    t.cluster_secret = parse_secret(r, cluster, "cluster", "secret", base);
  }
  if (root["threads"]) t.threads = r.int_value(root["threads"], "threads", 0, kMaxThreads);
  if (root["prefetch"]) t.prefetch = r.bool_value(root["prefetch"], "prefetch");
  // Known, so that the user hears what is missing rather than "unknown key".
  if (root["gpu"] && r.bool_value(root["gpu"], "gpu")) {
    r.fail("gpu", "the coordinator's dense part (attention, KV cache, routers, lm_head) on the GPU is not built "
                  "yet; leave gpu out (or false). The routed experts can use a GPU: vram_gb");
  }
  if (root["activations"]) {
    const std::string mode = r.string_value(root["activations"], "activations");
    if (mode != "f32" && mode != "q8") r.fail("activations", "expected 'f32' or 'q8', got '" + mode + "'");
    t.activations = parse_activation_mode(mode, "activations");
  }
  if (root["quant_dense"]) {
    const std::string type = r.string_value(root["quant_dense"], "quant_dense");
    if (type != "q8_0" && type != "q4_0" && type != "none") {
      r.fail("quant_dense", "expected 'q8_0', 'q4_0' or 'none', got '" + type + "'");
    }
    t.quant_dense = parse_dense_quant(type, "quant_dense");
  }
  if (const auto serving = root["serving"]) t.serving = parse_serving(r, serving);
  if (const auto timeouts = root["timeouts"]) {
    r.check_keys(timeouts, "timeouts",
                 {"connect_ms", "handshake_ms", "request_ms", "startup_ms", "heartbeat_ms", "rejoin_min_ms",
                  "rejoin_max_ms", "slow_ms", "hedge_floor_ms", "hedge_cap_ms", "probe_floor_ms", "probe_cap_ms"});
    constexpr int64_t kDayMs = 86'400'000;
    const std::pair<const char*, int64_t*> keys[] = {
        {"connect_ms", &t.connect_timeout_ms}, {"handshake_ms", &t.handshake_timeout_ms},
        {"request_ms", &t.request_timeout_ms}, {"startup_ms", &t.startup_timeout_ms},
        {"heartbeat_ms", &t.heartbeat_ms},     {"rejoin_min_ms", &t.rejoin_min_ms},
        {"rejoin_max_ms", &t.rejoin_max_ms},   {"slow_ms", &t.slow_ms},
        {"hedge_floor_ms", &t.hedge_floor_ms}, {"hedge_cap_ms", &t.hedge_cap_ms},
        {"probe_floor_ms", &t.probe_floor_ms}, {"probe_cap_ms", &t.probe_cap_ms}};
    for (const auto& [key, value] : keys) {
      // 0 means "off" only where the key says so (startup: do not wait; heartbeat; slow_ms).
      const std::string k = key;
      const int64_t lo = (k == "startup_ms" || k == "heartbeat_ms" || k == "slow_ms") ? 0 : 1;
      if (timeouts[key]) *value = r.int_value(timeouts[key], "timeouts." + k, lo, kDayMs);
    }
    // A cap below its floor: each pair is a range a learned deadline is clamped to.
    const std::tuple<const char*, const char*, int64_t, int64_t> ranges[] = {
        {"rejoin_max_ms", "rejoin_min_ms", t.rejoin_max_ms, t.rejoin_min_ms},
        {"hedge_cap_ms", "hedge_floor_ms", t.hedge_cap_ms, t.hedge_floor_ms},
        {"probe_cap_ms", "probe_floor_ms", t.probe_cap_ms, t.probe_floor_ms}};
    for (const auto& [cap, floor, cap_value, floor_value] : ranges) {
      if (cap_value < floor_value) {
        r.fail(std::string("timeouts.") + cap,
               std::string("must be at least ") + floor + " (" + std::to_string(floor_value) + ")");
      }
    }
  }

  // Workers are an error in single-node mode rather than ignored: a file that lists
  // workers but serves everything in-process is almost surely a mistake.
  if (t.single_node && root["workers"]) {
    r.fail("workers", "not allowed with mode: single-node (experts run in-process); remove it or use mode: cluster");
  }
  if (!t.single_node) {
    if (!root["workers"]) r.fail("workers", "required in cluster mode (or set mode: single-node)");
    t.workers = parse_workers(r, root["workers"], base);
  }
  if (const auto store = root["store"]) {
    if (!t.single_node) r.fail("store", "only with mode: single-node (in cluster mode each worker entry takes these keys)");
    r.check_keys(store, "store", kStoreKeys);
    t.store = parse_store(r, store, "store", base);
  }
  return t;
}

const WorkerSpec& Topology::worker(const std::string& name) const {
  for (const auto& w : workers) {
    if (w.name == name) return w;
  }
  std::string known;
  for (const auto& w : workers) known += (known.empty() ? "" : ", ") + w.name;
  fail_invalid(source.string() + ": no worker named '" + name + "' (known: " + (known.empty() ? "none" : known) + ")");
}

Placement Topology::placement(const std::vector<int64_t>& moe_layers, int64_t num_experts) const {
  const std::string where = source.string() + ": placement: ";
  if (num_experts <= 0) fail_invalid(where + "num_experts must be positive, got " + std::to_string(num_experts));
  Placement owners;
  const std::vector<std::vector<int>> initial(static_cast<size_t>(num_experts),
                                              single_node ? std::vector<int>{0} : std::vector<int>{});
  for (int64_t layer : moe_layers) {
    if (!owners.emplace(layer, initial).second) {
      fail_invalid(where + "MoE layer " + std::to_string(layer) + " listed twice by the model");
    }
  }
  if (single_node) return owners;  // the in-process worker owns everything

  // Workers are visited in index order, so each owner list comes out ascending; an
  // expert listed by several workers gets several owners (replicas).
  for (size_t wi = 0; wi < workers.size(); ++wi) {
    const WorkerSpec& w = workers[wi];
    for (int64_t layer : w.layers.empty() ? moe_layers : w.layers) {
      const auto it = owners.find(layer);
      if (it == owners.end()) {
        fail_invalid(where + "worker '" + w.name + "' lists layer " + std::to_string(layer) +
                     ", which is not an MoE layer of the model");
      }
      for (int64_t e : w.experts) {
        if (e >= num_experts) {
          fail_invalid(where + "worker '" + w.name + "' lists expert " + std::to_string(e) + " but the model has " +
                       std::to_string(num_experts) + " experts (0-" + std::to_string(num_experts - 1) + ")");
        }
        it->second[static_cast<size_t>(e)].push_back(static_cast<int>(wi));
      }
    }
  }
  // Every uncovered expert at once, so one edit of the file fixes them all.
  std::string uncovered;
  for (const auto& [layer, experts] : owners) {
    std::vector<int64_t> missing;
    for (size_t e = 0; e < experts.size(); ++e) {
      if (experts[e].empty()) missing.push_back(static_cast<int64_t>(e));
    }
    if (missing.empty()) continue;
    uncovered += (uncovered.empty() ? "" : "; ") + std::string("layer ") + std::to_string(layer) +
                 (missing.size() == 1 ? " expert " : " experts ") + id_ranges(missing);
  }
  if (!uncovered.empty()) {
    std::string names;
    for (const auto& w : workers) names += (names.empty() ? "" : ", ") + w.name;
    fail_invalid(where + "no worker holds " + uncovered + " (workers: " + names + ")");
  }
  return owners;
}

std::string id_ranges(const std::vector<int64_t>& ids) {
  std::string out;
  for (size_t i = 0; i < ids.size();) {
    size_t j = i;
    while (j + 1 < ids.size() && ids[j + 1] == ids[j] + 1) ++j;
    if (!out.empty()) out += ", ";
    out += std::to_string(ids[i]);
    if (j > i) {
      out += '-';  // appends, not "-" + std::to_string(...): GCC 12 warns falsely (-Wrestrict)
      out += std::to_string(ids[j]);
    }
    i = j + 1;
  }
  return out;
}

}  // namespace charm
