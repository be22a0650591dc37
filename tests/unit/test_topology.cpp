// Tests for common/topology: the shipped configs, defaults, every validation error (each
// naming the file and key path), and the placement map.
#include <doctest/doctest.h>

#include "common/error.h"
#include "common/topology.h"
#include "common/user_path.h"
#include "tests/support/expect_error.h"
#include "tests/support/safetensors_writer.h"
#include "tests/support/temp_dir.h"

using namespace charm;
using charm::test::expect_error;
using charm::test::TempDir;

namespace {

/// Writes `yaml` to <dir>/t.yaml and loads it.
Topology load_text(const TempDir& dir, const std::string& yaml) {
  charm::testing::write_bytes(dir / "t.yaml", yaml);
  return Topology::load(dir / "t.yaml");
}

/// Requires `yaml` to be rejected with a message naming the file, then "<key path>: ",
/// then `detail`.
void expect_invalid(const std::string& yaml, const std::string& key_path, const std::string& detail) {
  CAPTURE(yaml);
  TempDir dir("topo");
  const std::string file = (dir / "t.yaml").string();
  const std::string prefix = key_path.empty() ? file + ": " : file + ": " + key_path + ": ";
  expect_error([&] { load_text(dir, yaml); }, ErrorCategory::kInvalidInput, {prefix, detail});
}

const std::string kModel = "model: ../m\n";
const std::string kTwoWorkers = kModel +
                                "workers:\n"
                                "  - {name: a, port: 7701, experts: \"0-3\"}\n"
                                "  - {name: b, port: 7702, experts: [4, \"5-7\"]}\n";

}  // namespace

TEST_CASE("the shipped configs load and place the default model's 16 experts") {
  const std::filesystem::path configs = std::filesystem::path(CHARM_SOURCE_DIR) / "configs";
  const auto model = (std::filesystem::path(CHARM_SOURCE_DIR) / "tests/fixtures/models/qwen3-moe-tiny").lexically_normal();

  const Topology single = Topology::load(configs / "single-node.yaml");
  CHECK(single.single_node);
  CHECK(single.workers.empty());
  CHECK(single.model == model);
  CHECK(single.model_name == "qwen3-moe-tiny");
  const auto all_local = single.placement({0, 1}, 16);
  CHECK(all_local.at(1) == std::vector<std::vector<int>>(16, {0}));

  const Topology two = Topology::load(configs / "local-cluster.yaml");
  CHECK_FALSE(two.single_node);
  CHECK(two.model == model);
  REQUIRE(two.workers.size() == 2);
  CHECK(two.workers[0].port == 7701);
  CHECK(two.workers[1].port == 7702);
  const auto halves = two.placement({0, 1, 2}, 16);
  for (int e = 0; e < 16; ++e) CHECK(halves.at(2)[e] == std::vector<int>{e < 8 ? 0 : 1});

  const Topology three = Topology::load(configs / "three-workers-uneven.yaml");
  REQUIRE(three.workers.size() == 3);
  CHECK(three.workers[2].port == 7713);
  const auto uneven = three.placement({0, 1}, 16);
  const std::vector<int> owner = {0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2};
  for (int e = 0; e < 16; ++e) CHECK(uneven.at(0)[e] == std::vector<int>{owner[e]});

  const Topology replicas = Topology::load(configs / "replicas.yaml");
  REQUIRE(replicas.workers.size() == 3);
  const auto spread = replicas.placement({0, 2, 3}, 16);
  for (int e = 0; e < 16; ++e) CHECK(spread.at(3)[e].size() == 2);  // any one worker may go
  CHECK(spread.at(0)[0] == std::vector<int>{0, 2});
  CHECK(spread.at(0)[7] == std::vector<int>{0, 1});
  CHECK(spread.at(0)[15] == std::vector<int>{1, 2});
}

TEST_CASE("defaults, relative model paths and the full set of keys") {
  TempDir dir("topo");
  const Topology t = load_text(dir, kTwoWorkers);
  CHECK(t.source == dir / "t.yaml");
  CHECK(t.model == (dir.path().parent_path() / "m").lexically_normal());
  CHECK(t.model_name == "m");
  CHECK_FALSE(t.single_node);
  CHECK(t.api_host == "127.0.0.1");
  CHECK(t.api_port == 8080);
  CHECK(t.threads == 0);
  CHECK(t.connect_timeout_ms == 2000);
  CHECK(t.handshake_timeout_ms == 5000);
  CHECK(t.request_timeout_ms == 60000);
  CHECK(t.heartbeat_ms == 1000);
  CHECK(t.rejoin_min_ms == 250);
  CHECK(t.rejoin_max_ms == 10000);
  CHECK(t.slow_ms == 0);
  CHECK(t.workers[0].host == "127.0.0.1");
  CHECK(t.workers[0].experts == std::vector<int64_t>{0, 1, 2, 3});
  CHECK(t.workers[1].experts == std::vector<int64_t>{4, 5, 6, 7});
  CHECK(t.workers[0].layers.empty());
  CHECK(&t.worker("b") == &t.workers[1]);

  const Topology full = load_text(dir,
                                  "model: /abs/models/big/\n"
                                  "model_name: big-moe\n"
                                  "mode: cluster\n"
                                  "api: {host: 0.0.0.0, port: 9000}\n"
                                  "threads: 12\n"
                                  "timeouts: {connect_ms: 100, request_ms: 2000, handshake_ms: 300, heartbeat_ms: 0,\n"
                                  "           rejoin_min_ms: 50, rejoin_max_ms: 800, slow_ms: 40, startup_ms: 0}\n"
                                  "workers:\n"
                                  "  - name: x\n"
                                  "    host: 10.0.0.5\n"
                                  "    port: 7000\n"
                                  "    experts: [\"6-7\", 0, \"2 - 3\"]\n"
                                  "    layers: [1, \"3-4\"]\n");
  CHECK(full.model == "/abs/models/big/");
  CHECK(full.model_name == "big-moe");
  CHECK(full.api_host == "0.0.0.0");
  CHECK(full.api_port == 9000);
  CHECK(full.threads == 12);
  CHECK(full.connect_timeout_ms == 100);
  CHECK(full.request_timeout_ms == 2000);
  CHECK(full.handshake_timeout_ms == 300);
  CHECK(full.heartbeat_ms == 0);
  CHECK(full.rejoin_min_ms == 50);
  CHECK(full.rejoin_max_ms == 800);
  CHECK(full.slow_ms == 40);
  CHECK(full.startup_timeout_ms == 0);
  CHECK(full.workers[0].host == "10.0.0.5");
  CHECK(full.workers[0].experts == std::vector<int64_t>{0, 2, 3, 6, 7});
  CHECK(full.workers[0].layers == std::vector<int64_t>{1, 3, 4});

  // The default name comes from the folder even with a trailing slash.
  CHECK(load_text(dir, "model: /abs/models/big/\nmode: single-node\n").model_name == "big");
  CHECK(load_text(dir, "model: /abs/models/big-Q4_K_M.gguf\nmode: single-node\n").model_name == "big-Q4_K_M");
  CHECK(load_text(dir, "model: /abs/m-00001-of-00003.gguf\nmode: single-node\n").model_name == "m");
  CHECK(load_text(dir, "model: m\nmode: single-node\n").model == (dir / "m").lexically_normal());
}

TEST_CASE("worker() lists the known names when asked for an absent one") {
  TempDir dir("topo");
  const Topology t = load_text(dir, kTwoWorkers);
  expect_error([&] { t.worker("zz"); }, ErrorCategory::kInvalidInput, {"'zz'", "a, b", (dir / "t.yaml").string()});
}

TEST_CASE("files that cannot be read or parsed") {
  TempDir dir("topo");
  expect_error([&] { Topology::load(dir / "absent.yaml"); }, ErrorCategory::kIo, {"absent.yaml"});
  expect_invalid("model: [unclosed\n", "", "YAML does not parse at line");
  expect_invalid("", "", "expected a mapping");
  expect_invalid("- a\n- b\n", "", "expected a mapping");
}

TEST_CASE("a topology nested very deeply or far too large is refused naming the file, never a crash") {
  // yaml-cpp's parser recurses per level and stops itself at a depth limit; both block and
  // flow nesting must end in an error naming the file.
  expect_invalid(kModel + "x: " + std::string(100000, '[') + std::string(100000, ']') + "\n", "",
                 "YAML does not parse");
  std::string block = kModel + "x:";
  for (int i = 0; i < 20000; ++i) block += " -";
  expect_invalid(block + " 1\n", "", "YAML does not parse");
  TempDir dir("topo");
  charm::testing::write_bytes(dir / "big.yaml", kModel + "# " + std::string(17u << 20, 'x') + "\n");
  expect_error([&] { Topology::load(dir / "big.yaml"); }, ErrorCategory::kInvalidInput,
               {"big.yaml", "over the limit of 16777216 bytes for a topology file"});
}

TEST_CASE("missing model, unknown and repeated keys") {
  expect_invalid("mode: single-node\n", "model", "required key is missing");
  expect_invalid("model:\nmode: single-node\n", "model", "expected a non-empty string, got nothing");
  expect_invalid("model: [a]\nmode: single-node\n", "model", "expected a non-empty string, got a list");
  expect_invalid(kModel + "mode: single-node\nthreds: 4\n", "threds", "unknown key");
  expect_invalid(kModel + "mode: single-node\napi: {host: h, prot: 1}\n", "api.prot", "unknown key");
  expect_invalid(kModel + "mode: single-node\ntimeouts: {connect: 1}\n", "timeouts.connect", "unknown key");
  expect_invalid(kModel + "mode: single-node\nmodel: other\n", "model", "key given twice");
  expect_invalid(kModel + "workers:\n  - {name: a, port: 1, experts: 0, expert: 1}\n", "workers[0].expert",
                 "unknown key");
}

TEST_CASE("wrong types and out-of-range scalars") {
  const std::string single = kModel + "mode: single-node\n";
  expect_invalid(kModel + "mode: local\n", "mode", "expected 'cluster' or 'single-node', got 'local'");
  expect_invalid(single + "api: 8080\n", "api", "expected a mapping");
  expect_invalid(single + "api: {port: abc}\n", "api.port", "expected an integer 1-65535, got 'abc'");
  expect_invalid(single + "api: {port: 70000}\n", "api.port", "expected an integer 1-65535, got '70000'");
  expect_invalid(single + "api: {port: 0}\n", "api.port", "expected an integer 1-65535");
  expect_invalid(single + "api: {port: 80.5}\n", "api.port", "expected an integer 1-65535");
  expect_invalid(single + "api: {host: [a]}\n", "api.host", "expected a non-empty string");
  expect_invalid(single + "threads: -1\n", "threads", "expected an integer 0-");
  expect_invalid(single + "threads: many\n", "threads", "got 'many'");
  expect_invalid(single + "timeouts: {connect_ms: 0}\n", "timeouts.connect_ms", "expected an integer 1-");
  expect_invalid(single + "timeouts: {request_ms: [1]}\n", "timeouts.request_ms", "got a list");
  expect_invalid(single + "timeouts: []\n", "timeouts", "expected a mapping");
  expect_invalid(single + "prefetch: yes\n", "prefetch", "expected true or false");
  expect_invalid(single + "prefetch: [true]\n", "prefetch", "expected true or false");
  expect_invalid(single + "timeouts: {handshake_ms: 0}\n", "timeouts.handshake_ms", "expected an integer 1-");
  expect_invalid(single + "timeouts: {heartbeat_ms: -1}\n", "timeouts.heartbeat_ms", "expected an integer 0-");
  expect_invalid(single + "timeouts: {rejoin_min_ms: 500, rejoin_max_ms: 100}\n", "timeouts.rejoin_max_ms",
                 "at least rejoin_min_ms (500)");
}

TEST_CASE("prefetch is off unless the key says true") {
  TempDir dir("topo");
  CHECK_FALSE(load_text(dir, kModel + "mode: single-node\n").prefetch);
  CHECK(load_text(dir, kModel + "mode: single-node\nprefetch: true\n").prefetch);
  CHECK_FALSE(load_text(dir, kModel + "mode: single-node\nprefetch: false\n").prefetch);
}

TEST_CASE("serving.micro_batches: automatic (0) unless given; only 0, 1 and 2") {
  TempDir dir("topo");
  const std::string single = kModel + "mode: single-node\n";
  CHECK(load_text(dir, single).serving.micro_batches == 0);
  CHECK(load_text(dir, single + "serving: {micro_batches: 2}\n").serving.micro_batches == 2);
  CHECK(load_text(dir, single + "serving: {micro_batches: 1}\n").serving.micro_batches == 1);
  expect_invalid(single + "serving: {micro_batches: 3}\n", "serving.micro_batches", "expected an integer 0-2");
  expect_invalid(single + "serving: {micro_batches: -1}\n", "serving.micro_batches", "expected an integer 0-2");
}

TEST_CASE("serving.prefix_cache: on unless the key says false") {
  TempDir dir("topo");
  const std::string single = kModel + "mode: single-node\n";
  CHECK(load_text(dir, single).serving.prefix_cache);
  CHECK_FALSE(load_text(dir, single + "serving: {prefix_cache: false}\n").serving.prefix_cache);
  CHECK(load_text(dir, single + "serving: {prefix_cache: true}\n").serving.prefix_cache);
  expect_invalid(single + "serving: {prefix_cache: off}\n", "serving.prefix_cache", "expected true or false");
}

TEST_CASE("activations: f32 unless the key says q8; any other value is refused naming the key") {
  TempDir dir("topo");
  CHECK(load_text(dir, kModel + "mode: single-node\n").activations == ActivationMode::kF32);
  CHECK(load_text(dir, kModel + "mode: single-node\nactivations: q8\n").activations == ActivationMode::kQ8);
  CHECK(load_text(dir, kModel + "mode: single-node\nactivations: f32\n").activations == ActivationMode::kF32);
  const std::string single = kModel + "mode: single-node\n";
  expect_invalid(single + "activations: int8\n", "activations", "expected 'f32' or 'q8', got 'int8'");
  expect_invalid(single + "activations: [q8]\n", "activations", "expected a non-empty string");
}

TEST_CASE("quant_dense: none unless the key names q8_0 or q4_0; any other value is refused naming the key") {
  TempDir dir("topo");
  const std::string single = kModel + "mode: single-node\n";
  CHECK_FALSE(load_text(dir, single).quant_dense.has_value());
  CHECK(load_text(dir, single + "quant_dense: q8_0\n").quant_dense == GgmlType::kQ8_0);
  CHECK(load_text(dir, single + "quant_dense: q4_0\n").quant_dense == GgmlType::kQ4_0);
  CHECK_FALSE(load_text(dir, single + "quant_dense: none\n").quant_dense.has_value());
  expect_invalid(single + "quant_dense: int8\n", "quant_dense", "expected 'q8_0', 'q4_0' or 'none', got 'int8'");
  expect_invalid(single + "quant_dense: {type: q8_0}\n", "quant_dense", "expected a non-empty string");
}

TEST_CASE("insecure: off unless api / cluster say true, and never beside the secret it waives") {
  TempDir dir("topo");
  const Topology plain = load_text(dir, kTwoWorkers);
  CHECK_FALSE(plain.api_insecure);
  CHECK_FALSE(plain.cluster_insecure);
  const Topology both = load_text(dir, kTwoWorkers + "api: {insecure: true}\ncluster: {insecure: true}\n");
  CHECK(both.api_insecure);
  CHECK(both.cluster_insecure);
  const Topology api_only = load_text(dir, kTwoWorkers + "api: {insecure: true}\ncluster: {insecure: false}\n");
  CHECK(api_only.api_insecure);
  CHECK_FALSE(api_only.cluster_insecure);
  expect_invalid(kTwoWorkers + "cluster: {insecure: yes please}\n", "cluster.insecure", "expected true or false");
  expect_invalid(kTwoWorkers + "cluster: {insecure: true, secret_env: CHARM_X}\n", "cluster.insecure",
                 "waives the secret_file / secret_env");
  expect_invalid(kTwoWorkers + "api: {insecure: true, api_key_file: k}\n", "api.insecure", "waives the api_key_file");
  expect_invalid(kTwoWorkers + "insecure: true\n", "insecure", "unknown key");
}

TEST_CASE("workers: required in cluster mode, forbidden in single-node mode, well-formed") {
  expect_invalid(kModel, "workers", "required in cluster mode");
  expect_invalid(kModel + "mode: cluster\nworkers: []\n", "workers", "non-empty list");
  expect_invalid(kModel + "workers: {name: a}\n", "workers", "non-empty list");
  expect_invalid(kModel + "mode: single-node\nworkers:\n  - {name: a, port: 1, experts: 0}\n", "workers",
                 "not allowed with mode: single-node");
  expect_invalid(kModel + "workers:\n  - a\n", "workers[0]", "expected a mapping");
  expect_invalid(kModel + "workers:\n  - {port: 1, experts: 0}\n", "workers[0].name", "required key is missing");
  expect_invalid(kModel + "workers:\n  - {name: a, experts: 0}\n", "workers[0].port", "required key is missing");
  expect_invalid(kModel + "workers:\n  - {name: a, port: 1}\n", "workers[0].experts", "required key is missing");
  expect_invalid(kModel + "workers:\n  - {name: a, port: 7701, experts: 0}\n  - {name: b, port: abc, experts: 1}\n",
                 "workers[1].port", "expected an integer 1-65535, got 'abc'");
  expect_invalid(kModel + "workers:\n  - {name: a, host: '', port: 1, experts: 0}\n", "workers[0].host",
                 "non-empty string");
}

TEST_CASE("duplicate worker names and addresses") {
  expect_invalid(kModel + "workers:\n  - {name: a, port: 1, experts: 0}\n  - {name: a, port: 2, experts: 1}\n",
                 "workers[1].name", "duplicate worker name 'a' (also workers[0])");
  expect_invalid(kModel +
                     "workers:\n  - {name: a, port: 1, experts: 0}\n  - {name: b, port: 2, experts: 1}\n"
                     "  - {name: c, host: 127.0.0.1, port: 2, experts: 2}\n",
                 "workers[2].port", "duplicate address 127.0.0.1:2 (also workers[1])");
  // The same port on different hosts is fine.
  TempDir dir("topo");
  CHECK(load_text(dir, kModel + "workers:\n  - {name: a, host: h1, port: 1, experts: 0}\n"
                                "  - {name: b, host: h2, port: 1, experts: 1}\n")
            .workers.size() == 2);
}

TEST_CASE("bad expert and layer ids") {
  auto worker = [](const std::string& experts, const std::string& extra = "") {
    return kModel + "workers:\n  - {name: a, port: 1, experts: " + experts + extra + "}\n";
  };
  expect_invalid(worker("\"7-3\""), "workers[0].experts", "range '7-3' ends before it starts");
  expect_invalid(worker("-1"), "workers[0].experts", "negative id in '-1'");
  expect_invalid(worker("\"-2-4\""), "workers[0].experts", "negative id");
  expect_invalid(worker("[0, -3]"), "workers[0].experts[1]", "negative id");
  expect_invalid(worker("\"a-b\""), "workers[0].experts", "expected an id");
  expect_invalid(worker("\"1-\""), "workers[0].experts", "expected an id");
  expect_invalid(worker("\"1-2-3\""), "workers[0].experts", "expected an id");
  expect_invalid(worker("1.5"), "workers[0].experts", "expected an id");
  expect_invalid(worker("\"0-99999999999\""), "workers[0].experts", "expected an id 0-1048575");
  expect_invalid(worker("[]"), "workers[0].experts", "empty list");
  expect_invalid(worker("[[1]]"), "workers[0].experts[0]", "expected an id");
  expect_invalid(worker("{a: 1}"), "workers[0].experts", "expected an id");
  expect_invalid(worker("[\"0-3\", 2]"), "workers[0].experts", "id 2 is listed twice");
  expect_invalid(worker("0", ", layers: some"), "workers[0].layers", "expected an id");
  expect_invalid(worker("0", ", layers: [\"4-2\"]"), "workers[0].layers[0]", "ends before it starts");
  expect_invalid(worker("0", ", layers: []"), "workers[0].layers", "empty list");
}

TEST_CASE("placement maps every (layer, expert) to its owners; overlapping workers are replicas") {
  TempDir dir("topo");
  const Topology t = load_text(dir, kModel +
                                        "workers:\n"
                                        "  - {name: a, port: 1, experts: \"0-3\", layers: [1]}\n"
                                        "  - {name: b, port: 2, experts: \"0-3\", layers: [3]}\n"
                                        "  - {name: c, port: 3, experts: \"4-5\"}\n");
  const auto owner = t.placement({1, 3}, 6);
  REQUIRE(owner.size() == 2);
  using Owners = std::vector<std::vector<int>>;
  CHECK(owner.at(1) == Owners{{0}, {0}, {0}, {0}, {2}, {2}});
  CHECK(owner.at(3) == Owners{{1}, {1}, {1}, {1}, {2}, {2}});

  const Topology overlap = load_text(dir, kModel +
                                              "workers:\n"
                                              "  - {name: a, port: 1, experts: \"0-4\"}\n"
                                              "  - {name: b, port: 2, experts: \"4-7\", layers: [5]}\n"
                                              "  - {name: c, port: 3, experts: \"5-7\"}\n");
  const auto replicas = overlap.placement({2, 5}, 8);
  CHECK(replicas.at(2) == Owners{{0}, {0}, {0}, {0}, {0}, {2}, {2}, {2}});
  CHECK(replicas.at(5) == Owners{{0}, {0}, {0}, {0}, {0, 1}, {1, 2}, {1, 2}, {1, 2}});
  CHECK(id_ranges({0, 1, 2, 3, 5, 8, 9}) == "0-3, 5, 8-9");
  CHECK(id_ranges({}) == "");
}

TEST_CASE("placement names every uncovered expert and the workers") {
  TempDir dir("topo");
  const std::string file = (dir / "t.yaml").string();
  const Topology gap = load_text(dir, kTwoWorkers);  // experts 0-7
  expect_error([&] { gap.placement({0, 2}, 9); }, ErrorCategory::kInvalidInput,
               {file, "no worker holds layer 0 expert 8; layer 2 expert 8 (workers: a, b)"});
  expect_error([&] { gap.placement({0}, 12); }, ErrorCategory::kInvalidInput, {"layer 0 experts 8-11"});
  expect_error([&] { gap.placement({0}, 7); }, ErrorCategory::kInvalidInput,
               {"worker 'b' lists expert 7 but the model has 7 experts"});
  expect_error([&] { gap.placement({0}, 0); }, ErrorCategory::kInvalidInput, {"num_experts"});
  expect_error([&] { gap.placement({0, 0}, 8); }, ErrorCategory::kInvalidInput, {"layer 0 listed twice"});

  const Topology partial = load_text(dir, kModel + "workers:\n  - {name: a, port: 1, experts: 0, layers: [4]}\n");
  expect_error([&] { partial.placement({1}, 1); }, ErrorCategory::kInvalidInput,
               {"worker 'a' lists layer 4, which is not an MoE layer"});
  const Topology one_layer = load_text(dir, kModel + "workers:\n  - {name: a, port: 1, experts: 0, layers: [1]}\n");
  expect_error([&] { one_layer.placement({1, 2}, 1); }, ErrorCategory::kInvalidInput,
               {"no worker holds layer 2 expert 0 (workers: a)"});
}

TEST_CASE("expert tier keys: defaults, values, paths resolved against the YAML folder") {
  TempDir dir("topo");
  const Topology t = load_text(dir, kModel +
                                        "workers:\n"
                                        "  - {name: a, port: 7701, experts: \"0-3\"}\n"
                                        "  - {name: b, port: 7702, experts: \"4-7\", ram_gb: 1.5, vram_gb: 8, pin: hot.json,\n"
                                        "     container: ../experts-b, io: odirect, io_threads: 2, cache_policy: lrfu, usage_file: none}\n");
  const StoreSpec& a = t.workers[0].store;
  CHECK_FALSE(a.ram_gb.has_value());
  CHECK_FALSE(a.vram_gb.has_value());
  CHECK(a.pin == "auto");
  CHECK(a.container.empty());
  CHECK(a.io == "pread");
  CHECK(a.io_threads == 4);
  CHECK(a.cache_policy == "lru");
  CHECK(a.usage_file.empty());
  const StoreSpec& b = t.workers[1].store;
  CHECK(*b.ram_gb == 1.5);
  CHECK(*b.vram_gb == 8);
  CHECK(b.pin_file == (dir.path() / "hot.json").lexically_normal());
  CHECK(b.container == (dir.path() / "../experts-b").lexically_normal());
  CHECK(b.io == "odirect");
  CHECK(b.io_threads == 2);
  CHECK(b.cache_policy == "lrfu");
  CHECK(b.usage_file == "none");

  const Topology single = load_text(dir, kModel + "mode: single-node\nstore: {ram_gb: 0.25, pin: none}\n");
  CHECK(*single.store.ram_gb == 0.25);
  CHECK(single.store.pin == "none");
}

TEST_CASE("expert tier keys: bad values are rejected naming the key") {
  const std::string w = kModel + "workers:\n  - {name: a, port: 7701, experts: 0, ";
  expect_invalid(w + "ram_gb: 0}\n", "workers[0].ram_gb", "expected a positive number of GiB, got '0'");
  expect_invalid(w + "ram_gb: lots}\n", "workers[0].ram_gb", "positive number of GiB");
  expect_invalid(w + "vram_gb: -2}\n", "workers[0].vram_gb", "expected a positive number of GiB, got '-2'");
  expect_invalid(kModel + "gpu: true\n", "gpu", "dense part (attention, KV cache, routers, lm_head) on the GPU is not built");
  CHECK_NOTHROW(load_text(TempDir("topo-gpu"), kModel + "mode: single-node\ngpu: false\n"));
  expect_invalid(w + "io: uring}\n", "workers[0].io", "expected 'pread' or 'odirect', got 'uring'");
  expect_invalid(w + "io_threads: 0}\n", "workers[0].io_threads", "expected an integer 1-256");
  expect_invalid(w + "cache_policy: arc}\n", "workers[0].cache_policy", "expected 'lrfu' or 'lru', got 'arc'");
  expect_invalid(w + "ram: 4}\n", "workers[0].ram", "unknown key");
  expect_invalid(kModel + "store: {ram_gb: 1}\nworkers:\n  - {name: a, port: 7701, experts: 0}\n", "store",
                 "only with mode: single-node");
  expect_invalid(kModel + "mode: single-node\nstore: {experts: 3}\n", "store.experts", "unknown key");
}

TEST_CASE("timeouts: the silent-worker deadlines' floors and caps") {
  TempDir dir("topo");
  const std::string single = kModel + "mode: single-node\n";
  const Topology defaults = load_text(dir, single);
  CHECK(defaults.hedge_floor_ms == 50);
  CHECK(defaults.hedge_cap_ms == 1000);
  CHECK(defaults.probe_floor_ms == 100);
  CHECK(defaults.probe_cap_ms == 1000);
  const Topology t = load_text(
      dir, single + "timeouts: {hedge_floor_ms: 20, hedge_cap_ms: 300, probe_floor_ms: 40, probe_cap_ms: 40}\n");
  CHECK(t.hedge_floor_ms == 20);
  CHECK(t.hedge_cap_ms == 300);
  CHECK(t.probe_floor_ms == 40);
  CHECK(t.probe_cap_ms == 40);
  expect_invalid(single + "timeouts: {hedge_floor_ms: 0}\n", "timeouts.hedge_floor_ms", "expected an integer 1-");
  expect_invalid(single + "timeouts: {probe_cap_ms: x}\n", "timeouts.probe_cap_ms", "got 'x'");
  expect_invalid(single + "timeouts: {hedge_floor_ms: 500, hedge_cap_ms: 100}\n", "timeouts.hedge_cap_ms",
                 "at least hedge_floor_ms (500)");
  expect_invalid(single + "timeouts: {probe_cap_ms: 10}\n", "timeouts.probe_cap_ms", "at least probe_floor_ms (100)");
}

TEST_CASE("every path in the YAML keeps what it was resolved from, for messages (issue 12, item 11)") {
  TempDir dir("topo");
  const Topology t = load_text(dir, "model: ../m\nmode: single-node\n"
                                    "store: {pin: hot.json, container: c, usage_file: u/usage.json}\n");
  const std::string base = dir.path().lexically_normal().string();
  CHECK(t.model.describe() == (dir.path().parent_path() / "m").lexically_normal().string() +
                                  " (resolved from '../m' against " + base + ")");
  CHECK(t.store.pin_file.describe().find("(resolved from 'hot.json' against " + base + ")") != std::string::npos);
  CHECK(t.store.container.describe().find("(resolved from 'c' against " + base + ")") != std::string::npos);
  CHECK(t.store.usage_file.describe().find("(resolved from 'u/usage.json' against " + base + ")") != std::string::npos);
}

TEST_CASE("a missing topology file and a missing secret file are named as resolved, with their origin") {
  TempDir dir("topo");
  expect_error([&] { Topology::load(UserPath::resolve("absent.yaml", dir.path())); }, ErrorCategory::kIo,
               {"topology file " + (dir / "absent.yaml").string() + " (resolved from 'absent.yaml' against " +
                    dir.path().string() + ") does not exist"});
  charm::testing::write_bytes(dir / "s.yaml", "model: m\nmode: single-node\ncluster: {secret_file: keys/s.key}\n");
  expect_error([&] { Topology::load(dir / "s.yaml"); }, ErrorCategory::kInvalidInput,
               {"cluster.secret_file", (dir / "keys/s.key").string() + " (resolved from 'keys/s.key' against " +
                                           dir.path().string() + ")",
                "does not exist"});
  charm::testing::write_bytes(dir / "k.yaml", "model: m\nmode: single-node\napi: {api_key_file: ../k.txt}\n");
  expect_error([&] { Topology::load(dir / "k.yaml"); }, ErrorCategory::kInvalidInput,
               {"api.api_key_file", "(resolved from '../k.txt' against " + dir.path().string() + ")"});
}
