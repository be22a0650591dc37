// Tests for `charm plan` (app/plan_model.h, app/plan_probes.h, app/plan.h,
// app/plan_check.h): the prediction arithmetic with injected rates, the bottleneck,
// resident sets and hit rates (uniform and from a usage file), the probe cache (round
// trip, malformed, over its size limit), the plan of the fixture topology with injected
// probes (never the real ones), its JSON shape, and the --check side (Prometheus text,
// comparisons). No clock, no network: links are injected too.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "app/plan.h"
#include "app/plan_check.h"
#include "app/plan_model.h"
#include "app/plan_probes.h"
#include "common/checkpoint.h"
#include "common/error.h"
#include "common/fingerprint.h"
#include "common/topology.h"
#include "tests/support/expect_error.h"
#include "tests/support/safetensors_writer.h"
#include "tests/support/temp_dir.h"

using namespace charm;
using charm::test::expect_error;
using charm::test::TempDir;

namespace {

const std::filesystem::path kTiny = std::filesystem::path(CHARM_SOURCE_DIR) / "tests/fixtures/models/qwen3-moe-tiny";

/// One worker, one layer of four experts of mass 1/4 each, two of them in RAM.
PlanInput one_worker() {
  PlanInput in;
  in.top_k = 2;
  in.dense_bytes = 1'000'000'000;
  in.coordinator.memory_gb_per_s = 10;
  in.wire = {100, 10, 50, 200};
  WorkerPlanInput w;
  w.name = "w0";
  w.expert_bytes = 100'000'000;
  w.machine = {10, 0.5};
  w.link = LinkRates{1.0, 1.0};
  w.layers[0] = {{0, 0.25, true}, {1, 0.25, true}, {2, 0.25, false}, {3, 0.25, false}};
  in.workers.push_back(w);
  return in;
}

/// Probes that return fixed rates and count their calls.
struct FakeProbes {
  int memory_calls = 0, disk_calls = 0;
  Probes probes() {
    Probes p;
    p.memory = [this] {
      ++memory_calls;
      return 20.0;
    };
    p.disk = [this](const std::filesystem::path& file) {
      ++disk_calls;
      DiskProbe d;
      d.file = file.string();
      d.bytes = 4096;
      d.gb_per_s = 2.0;
      return d;
    };
    p.link = [](const WorkerSpec& spec, const std::string&) {
      LinkReport l;
      l.reachable = spec.name != "w1";  // w1 "unreachable": the default RTT applies
      l.rates.rtt_ms = 0.25;
      l.error = l.reachable ? "" : "connection refused";
      return l;
    };
    return p;
  }
};

/// A two-worker topology of the tiny fixture (8 experts each) with `extra` per worker.
Topology tiny_cluster(const TempDir& dir, const std::string& extra) {
  const std::string yaml = "model: " + kTiny.string() +
                           "\nworkers:\n"
                           "  - {name: w0, port: 7701, experts: \"0-7\", usage_file: none" + extra + "}\n"
                           "  - {name: w1, port: 7702, experts: \"8-15\", usage_file: none" + extra + "}\n";
  charm::testing::write_bytes(dir / "t.yaml", yaml);
  return Topology::load(dir / "t.yaml");
}

/// `bytes` as a ram_gb value, exactly (std::to_string keeps only 6 decimals).
std::string gib_text(uint64_t bytes) {
  char text[64];
  std::snprintf(text, sizeof text, "%.17g", static_cast<double>(bytes) / double(1ull << 30));
  return text;
}

PlanOptions fixed_host() {
  PlanOptions o;
  o.host_identity = "test-host";
  o.default_rtt_ms = 2.0;
  o.link_gbps = 8.0;  // 1 GB/s
  return o;
}

}  // namespace

TEST_CASE("predict: one worker's memory, disk and network parts and the dense part") {
  const PlanResult r = predict(one_worker());
  // k = 2 * 1 = 2 experts of 1e8 bytes at 10 GB/s; misses 2 * 0.5 at 0.5 GB/s; p = 1.
  CHECK(r.compute_s == doctest::Approx(0.1));
  CHECK(r.memory_s == doctest::Approx(0.02));
  CHECK(r.disk_s == doctest::Approx(0.2));
  CHECK(r.network_s == doctest::Approx(0.001 + (100 + 50 + 2 * (10 + 200)) / 1e9));
  CHECK(r.token_s == doctest::Approx(r.compute_s + r.memory_s + r.disk_s + r.network_s));
  CHECK(r.tokens_per_s == doctest::Approx(1 / r.token_s));
  CHECK(r.hit_rate == doctest::Approx(0.5));
  CHECK(r.bottleneck == "disk");
  REQUIRE(r.workers.size() == 1);
  CHECK(r.workers[0].experts_per_token == doctest::Approx(2));
  CHECK(r.workers[0].contact_probability == doctest::Approx(1));
  CHECK(r.workers[0].layer_round_trip_s == doctest::Approx(r.network_s + r.memory_s + r.disk_s));
}

TEST_CASE("predict: the slowest worker of each layer sets the layer's time; contact probability") {
  PlanInput in = one_worker();
  in.dense_bytes = 0;
  for (auto& e : in.workers[0].layers[0]) e.in_ram = true;  // w0: all hits
  in.workers[0].layers[0].resize(2);                        // w0 holds mass 0.5 ...
  WorkerPlanInput w1 = in.workers[0];
  w1.name = "w1";
  w1.layers[0] = {{2, 0.25, false}, {3, 0.25, false}};      // ... w1 the other half, all misses
  in.workers.push_back(w1);
  const PlanResult r = predict(in);
  const double p = 1 - std::pow(0.5, 2);
  CHECK(r.workers[0].contact_probability == doctest::Approx(p));
  CHECK(r.workers[1].disk_s == doctest::Approx(1 * 1e8 / 0.5e9));
  CHECK(r.disk_s == doctest::Approx(r.workers[1].disk_s));  // the slow worker's parts
  CHECK(r.memory_s == doctest::Approx(r.workers[1].memory_s));
  CHECK(r.compute_s == 0);
  CHECK(r.workers[0].hit_rate == 1);
  CHECK(r.workers[1].hit_rate == 0);
  CHECK(r.hit_rate == doctest::Approx(0.5));
  CHECK(r.bottleneck == "disk");
}

TEST_CASE("predict: a fast disk and a slow link make the network the bottleneck; in-process has none") {
  PlanInput in = one_worker();
  in.dense_bytes = 0;
  in.workers[0].machine.disk_gb_per_s = 1000;
  in.workers[0].link = LinkRates{50.0, 1.0};
  CHECK(predict(in).bottleneck == "network");
  in.workers[0].link.reset();  // single-node: no network part
  const PlanResult local = predict(in);
  CHECK(local.network_s == 0);
  CHECK(local.workers[0].layer_round_trip_s == 0);
  CHECK(local.bottleneck == "memory");
}

TEST_CASE("bottleneck_of names the largest part, ties in the order compute, memory, disk, network") {
  CHECK(bottleneck_of(1, 2, 3, 4) == "network");
  CHECK(bottleneck_of(5, 2, 3, 4) == "compute");
  CHECK(bottleneck_of(1, 9, 3, 4) == "memory");
  CHECK(bottleneck_of(1, 2, 3, 3) == "disk");
  CHECK(bottleneck_of(0, 0, 0, 0) == "compute");
}

TEST_CASE("predict refuses bad inputs, naming them") {
  PlanInput in = one_worker();
  in.top_k = 0;
  expect_error([&] { predict(in); }, ErrorCategory::kInvalidInput, {"top_k"});
  in = one_worker();
  in.workers[0].machine.disk_gb_per_s = 0;
  expect_error([&] { predict(in); }, ErrorCategory::kInvalidInput, {"worker 'w0'", "disk bandwidth"});
  in = one_worker();
  in.workers[0].layers[0][1].mass = 1.5;
  expect_error([&] { predict(in); }, ErrorCategory::kInvalidInput, {"expert 1", "outside [0, 1]"});
}

TEST_CASE("mark_resident: the pinned, then the heaviest of the rest; hit rates uniform and skewed") {
  std::vector<PlanExpert> uniform = {{0, 0.25, false}, {1, 0.25, false}, {2, 0.25, false}, {3, 0.25, false}};
  mark_resident(uniform, {}, 1);
  CHECK(uniform[0].in_ram);  // ties go to the lower id
  CHECK_FALSE(uniform[1].in_ram);
  CHECK(layer_hit_rate(uniform) == doctest::Approx(0.25));
  std::vector<PlanExpert> skewed = {{0, 0.1, false}, {1, 0.6, false}, {2, 0.2, false}, {3, 0.1, false}};
  mark_resident(skewed, {3}, 1);  // 3 pinned, then the heaviest: 1
  CHECK(skewed[3].in_ram);
  CHECK(skewed[1].in_ram);
  CHECK_FALSE(skewed[2].in_ram);
  CHECK(layer_hit_rate(skewed) == doctest::Approx(0.7));
  CHECK(layer_hit_rate({}) == 1);
}

TEST_CASE("the probe cache round-trips, and a malformed or oversized file is ignored with a warning") {
  TempDir dir("plan-cache");
  ProbeCache cache;
  cache["host-a"].memory_gb_per_s = 12.5;
  cache["host-a"].disk["/m/x.safetensors"] = DiskProbe{"/m/x.safetensors", 4096, 1.5, 0.25};
  write_probe_cache(dir / "sub" / "p.json", cache);
  std::string warning;
  const ProbeCache back = read_probe_cache(dir / "sub" / "p.json", &warning);
  CHECK(warning.empty());
  REQUIRE(back.count("host-a"));
  CHECK(*back.at("host-a").memory_gb_per_s == 12.5);
  const DiskProbe& d = back.at("host-a").disk.at("/m/x.safetensors");
  CHECK(d.gb_per_s == 1.5);
  CHECK(d.bytes == 4096);
  CHECK(d.kind() == "cached read");
  CHECK(DiskProbe{"f", 1, 1, 0.01}.kind() == "disk");

  CHECK(read_probe_cache(dir / "absent.json", &warning).empty());
  CHECK(warning.empty());

  const std::vector<std::pair<std::string, std::string>> bad = {
      {"{\"format\": \"charm-plan-probes\", \"version\": 1, \"hosts\"", "p.json"},
      {"{\"format\": \"other\", \"version\": 1, \"hosts\": {}}", "not a charm-plan-probes version 1 file"},
      {"{\"format\": \"charm-plan-probes\", \"version\": 1, \"hosts\": {\"h\": {\"memory_gb_per_s\": -1}}}",
       "memory_gb_per_s must be > 0"},
      {"{\"format\": \"charm-plan-probes\", \"version\": 1, \"hosts\": {\"h\": {\"disk\": {\"f\": {\"bytes\": 1, "
       "\"gb_per_s\": 1, \"resident_fraction\": 2}}}}}",
       "resident_fraction must be in [0, 1]"},
      {std::string(kMaxProbeCacheBytes + 1, ' '), "over the limit"}};
  for (const auto& [text, expected] : bad) {
    CAPTURE(expected);
    charm::testing::write_bytes(dir / "p.json", text);
    warning.clear();
    CHECK(read_probe_cache(dir / "p.json", &warning).empty());
    CHECK(warning.find(expected) != std::string::npos);
    CHECK(warning.find("ignored") != std::string::npos);
  }
}

TEST_CASE("build_plan: under quant_dense the dense part is the blocks the coordinator quantises it to") {
  TempDir dir("plan");
  FakeProbes fake;
  Topology topology = tiny_cluster(dir, "");
  const auto dense_bytes = [&](std::optional<GgmlType> quant) {
    topology.quant_dense = quant;
    return build_plan(topology, fixed_host(), fake.probes(), dir / "probes.json").dense_bytes;
  };
  // The fixture (bf16, embeddings tied to the lm_head, so read whole) has hidden_size 64:
  // every dense matrix is whole 32-value blocks; norms stay as stored.
  const auto ckpt = Checkpoint::open(kTiny);
  uint64_t matrix_values = 0, other_bytes = 0;
  for (const std::string& name : ckpt->tensor_names()) {
    const TensorInfo* t = ckpt->find(name);
    if (name.find(".mlp.experts.") != std::string::npos) continue;
    if (t->shape.size() == 2) {
      REQUIRE(t->shape[1] % 32 == 0);
      REQUIRE(t->dtype == DType::kBF16);
      matrix_values += t->numel();
    } else {
      other_bytes += t->nbytes;
    }
  }
  CHECK(dense_bytes(std::nullopt) == matrix_values * 2 + other_bytes);
  CHECK(dense_bytes(GgmlType::kQ8_0) == matrix_values / 32 * 34 + other_bytes);
  CHECK(dense_bytes(GgmlType::kQ4_0) == matrix_values / 32 * 18 + other_bytes);
}

TEST_CASE("build_plan on the fixture: placement, bytes, uniform hit rate under a budget, cache reuse") {
  TempDir dir("plan");
  FakeProbes fake;
  const PlanOptions options = fixed_host();
  // Without a budget every expert is resident: all hits, no disk part.
  const PlanReport all = build_plan(tiny_cluster(dir, ""), options, fake.probes(), dir / "probes.json");
  REQUIRE(all.workers.size() == 2);
  CHECK(all.top_k == 4);
  CHECK(all.num_experts == 16);
  const uint64_t owned = 8 * all.moe_layers;
  CHECK(all.workers[0].experts == owned);
  CHECK(all.workers[0].ram_slots == owned);
  CHECK(all.workers[0].slot_bytes % 4096 == 0);
  CHECK(all.workers[0].expert_bytes >= owned * 3 * 64 * 32 * 2);  // gate, up, down of 64 x 32, >= 2 bytes each
  CHECK(all.prediction.hit_rate == 1);
  CHECK(all.prediction.disk_s == 0);
  CHECK(all.dense_bytes > 0);
  CHECK(all.workers[0].link->reachable);
  CHECK(all.workers[0].link->rates.rtt_ms == 0.25);
  CHECK(all.workers[0].link->rates.bandwidth_gb_per_s == 1.0);
  CHECK_FALSE(all.workers[1].link->reachable);
  CHECK(all.workers[1].link->rates.rtt_ms == 2.0);  // --default-rtt-ms
  CHECK(all.coordinator.rates.memory_gb_per_s == 20);
  CHECK(all.coordinator.memory_source == "measured");
  CHECK(fake.memory_calls == 1);
  CHECK(fake.disk_calls == 1);

  // Half the experts fit: uniform routing hits half of each worker's mass; the probes
  // come from the cache this time.
  const PlanReport half = build_plan(tiny_cluster(dir, ", ram_gb: " + gib_text(all.workers[0].slot_bytes * owned / 2)), options,
                                     fake.probes(), dir / "probes.json");
  CHECK(fake.memory_calls == 1);
  CHECK(fake.disk_calls == 1);
  CHECK(half.coordinator.memory_source == "cached");
  CHECK(half.workers[0].ram_slots == owned / 2);
  CHECK(half.prediction.workers[0].hit_rate == doctest::Approx(0.5));
  CHECK(half.prediction.hit_rate == doctest::Approx(0.5));
  CHECK(half.prediction.disk_s > 0);
  CHECK(half.workers[0].usage_source == "uniform");

  PlanOptions again = options;
  again.reprobe = true;
  build_plan(tiny_cluster(dir, ""), again, fake.probes(), dir / "probes.json");
  CHECK(fake.memory_calls == 2);
  again.reprobe = false;
  again.host_identity = "another-host";  // another machine's cache entry: measured there
  build_plan(tiny_cluster(dir, ""), again, fake.probes(), dir / "probes.json");
  CHECK(fake.memory_calls == 3);
}

TEST_CASE("build_plan with a usage file: the routing mass follows the counts") {
  TempDir dir("plan-usage");
  FakeProbes fake;
  PlanOptions options = fixed_host();
  const Topology plain = tiny_cluster(dir, "");
  const PlanReport probe = build_plan(plain, options, fake.probes(), "");
  const uint64_t owned = 8 * probe.moe_layers;
  const Topology topology = tiny_cluster(dir, ", ram_gb: " + gib_text(probe.workers[0].slot_bytes * owned / 4));
  // Every layer: experts 0 and 1 (w0) fire 30 and 10 times, 8 (w1) 40 times, 2-7 and
  // 9-15 never. w0 holds 2 slots per layer: experts 0 and 1, all of its mass.
  const std::string fingerprint = model_fingerprint(*Checkpoint::open(kTiny));
  std::string counts;
  REQUIRE(probe.input.workers[0].layers.size() == probe.moe_layers);
  for (const auto& [layer, experts] : probe.input.workers[0].layers) {  // the MoE layer ids (0, 2, 3)
    const std::string l = std::to_string(layer);
    counts += std::string(counts.empty() ? "" : ",") + "[" + l + ",0,30],[" + l + ",1,10],[" + l + ",8,40]";
  }
  charm::testing::write_bytes(dir / "usage.json", "{\"format\": \"charm-expert-usage\", \"version\": 1, "
                                                  "\"model_fingerprint\": \"" + fingerprint + "\", \"counts\": [" +
                                                  counts + "]}");
  options.usage_file = (dir / "usage.json").string();
  const PlanReport r = build_plan(topology, options, fake.probes(), "");
  CHECK(r.workers[0].usage_source == (dir / "usage.json").string());
  CHECK(r.prediction.workers[0].hit_rate == doctest::Approx(1.0));  // 0 and 1 in RAM
  CHECK(r.prediction.workers[1].hit_rate == doctest::Approx(1.0));  // 8 is w1's heaviest
  // w0 gets half of the mass: top_k * 0.5 experts per layer.
  CHECK(r.prediction.workers[0].experts_per_token == doctest::Approx(4 * 0.5 * r.moe_layers));
  CHECK(r.prediction.disk_s == doctest::Approx(0));

  // Without --usage: the usage file the workers are configured with, for the mass and
  // (pin: auto) the pins: of 2 slots per layer, 1 is pinned (a quarter stays LRU).
  const std::string budget = gib_text(probe.workers[0].slot_bytes * owned / 4);
  charm::testing::write_bytes(dir / "configured.yaml",
                              "model: " + kTiny.string() + "\nworkers:\n"
                              "  - {name: w0, port: 7701, experts: \"0-7\", ram_gb: " + budget + ", usage_file: " +
                                  (dir / "usage.json").string() + "}\n"
                              "  - {name: w1, port: 7702, experts: \"8-15\", ram_gb: " + budget + ", usage_file: " +
                                  (dir / "usage.json").string() + "}\n");
  PlanOptions configured = fixed_host();
  const PlanReport c = build_plan(Topology::load(dir / "configured.yaml"), configured, fake.probes(), "");
  CHECK(c.workers[0].usage_source == (dir / "usage.json").string());
  CHECK(c.workers[0].pinned == c.moe_layers);
  CHECK(c.prediction.workers[0].hit_rate == doctest::Approx(1.0));
  CHECK(c.prediction.workers[0].experts_per_token == doctest::Approx(4 * 0.5 * c.moe_layers));

  options.usage_file = (dir / "missing.json").string();
  expect_error([&] { build_plan(topology, options, fake.probes(), ""); }, ErrorCategory::kInvalidInput,
               {"--usage", "missing.json", "does not exist"});
  charm::testing::write_bytes(dir / "bad.json", "{\"format\": \"charm-expert-usage\", \"counts\": [[0, 1");
  options.usage_file = (dir / "bad.json").string();
  expect_error([&] { build_plan(topology, options, fake.probes(), ""); }, ErrorCategory::kInvalidInput,
               {"--usage", "bad.json"});
  // Counts of experts the model does not have (layer 1 is dense; 99 >= num_experts 16):
  // refused, not silently dropped from the mass.
  for (const std::string& entry : {std::string("[0,99,5]"), std::string("[1,0,5]")}) {
    charm::testing::write_bytes(dir / "stray.json", "{\"format\": \"charm-expert-usage\", \"version\": 1, "
                                                    "\"model_fingerprint\": \"" + fingerprint + "\", \"counts\": [" +
                                                    entry + "]}");
    options.usage_file = (dir / "stray.json").string();
    expect_error([&] { build_plan(topology, options, fake.probes(), ""); }, ErrorCategory::kInvalidInput,
                 {"usage counts name layer", "which the model does not route to", "num_experts 16"});
  }
}

TEST_CASE("plan_json has the documented fields; format_plan one row per worker") {
  TempDir dir("plan-json");
  FakeProbes fake;
  const PlanReport r = build_plan(tiny_cluster(dir, ""), fixed_host(), fake.probes(), "");
  const nlohmann::json j = plan_json(r);
  CHECK(j["format"] == "charm-plan");
  CHECK(j["version"] == 1);
  for (const char* key : {"model", "top_k", "moe_layers", "num_experts", "hidden_size", "dense_bytes", "wire",
                          "coordinator", "workers", "prediction", "formula", "notes"}) {
    CHECK_MESSAGE(j.contains(key), key);
  }
  REQUIRE(j["workers"].size() == 2);
  const auto& w = j["workers"][0];
  for (const char* key : {"name", "address", "experts", "expert_bytes", "slot_bytes", "ram_budget_bytes", "ram_slots",
                          "pinned", "usage_source", "machine", "link"}) {
    CHECK_MESSAGE(w.contains(key), key);
  }
  CHECK(w["ram_budget_bytes"].is_null());
  CHECK(w["link"]["rtt_ms"] == 0.25);
  CHECK(j["workers"][1]["link"]["reachable"] == false);
  CHECK(j["prediction"]["tokens_per_s"].get<double>() == doctest::Approx(r.prediction.tokens_per_s));
  CHECK(j["prediction"]["parts"].contains("network_s"));
  // Protocol 4: one int64 row of hidden_size per position, whatever number of experts.
  CHECK(j["wire"]["reply_bytes"].get<double>() >= 64 * 8);
  CHECK(j["wire"]["reply_bytes"].get<double>() < 64 * 8 + 160);
  CHECK(j["wire"]["reply_bytes_per_expert"].get<double>() == 0);
  const std::string table = format_plan(r);
  CHECK(table.rfind("WORKER", 0) == 0);
  CHECK(table.find("\nw0 ") != std::string::npos);
  CHECK(table.find("\nw1 ") != std::string::npos);
  CHECK(table.find("bottleneck: " + r.prediction.bottleneck) != std::string::npos);
  CHECK(table.find("worker 'w1' is unreachable (connection refused)") != std::string::npos);
}

TEST_CASE("build_plan: single-node has one in-process row without a network; replicas split an expert's mass") {
  TempDir dir("plan-modes");
  FakeProbes fake;
  charm::testing::write_bytes(dir / "single.yaml", "model: " + kTiny.string() + "\nmode: single-node\nstore: {usage_file: none}\n");
  const PlanReport single = build_plan(Topology::load(dir / "single.yaml"), fixed_host(), fake.probes(), "");
  REQUIRE(single.workers.size() == 1);
  CHECK(single.workers[0].name == "local");
  CHECK(single.workers[0].address == "in-process");
  CHECK_FALSE(single.workers[0].link);
  CHECK(single.prediction.network_s == 0);
  CHECK(single.workers[0].experts == 16 * single.moe_layers);
  CHECK(single.prediction.workers[0].experts_per_token == doctest::Approx(4.0 * single.moe_layers));
  CHECK(format_plan(single).find("link bandwidth") == std::string::npos);

  // Experts 0-7 on both workers, 8-15 on w1 only: w0 gets half of 0-7's mass (a quarter
  // of the layer), w1 the rest.
  charm::testing::write_bytes(dir / "replicas.yaml", "model: " + kTiny.string() +
                                                        "\nworkers:\n"
                                                        "  - {name: w0, port: 7701, experts: \"0-7\", usage_file: none}\n"
                                                        "  - {name: w1, port: 7702, experts: \"0-15\", usage_file: none}\n");
  const PlanReport replicas = build_plan(Topology::load(dir / "replicas.yaml"), fixed_host(), fake.probes(), "");
  const double layers = static_cast<double>(replicas.moe_layers);
  CHECK(replicas.prediction.workers[0].experts_per_token == doctest::Approx(4 * 0.25 * layers));
  CHECK(replicas.prediction.workers[1].experts_per_token == doctest::Approx(4 * 0.75 * layers));
  CHECK(replicas.workers[1].experts == 16 * replicas.moe_layers);
}

TEST_CASE("parse_prometheus reads charm's samples and names a malformed line") {
  const auto samples = parse_prometheus(
      "# HELP charm_completion_tokens_total Tokens generated.\n"
      "charm_completion_tokens_total 12\n"
      "charm_expert_hits_total{worker=\"w0\"} 30\n"
      "charm_x{a=\"q\\\"uote\",b=\"2\"} 1.5e3 1700000000\n"
      "\n");
  REQUIRE(samples.size() == 3);
  CHECK(samples[1].labels.at("worker") == "w0");
  CHECK(samples[1].value == 30);
  CHECK(samples[2].labels.at("a") == "q\"uote");
  CHECK(samples[2].value == 1500);
  expect_error([] { parse_prometheus("ok 1\nbroken{worker=\"w0\" 3\n"); }, ErrorCategory::kProtocol, {"line 2"});
  expect_error([] { parse_prometheus("x abc\n"); }, ErrorCategory::kProtocol, {"line 1", "not a number"});
  expect_error([] { parse_prometheus(std::string(kMaxMetricsBytes + 1, '#')); }, ErrorCategory::kProtocol,
               {"over the limit"});
}

TEST_CASE("compare_plan: decode tok/s, hit rates and layer RTTs with relative errors") {
  PlanReport plan;
  plan.prediction.tokens_per_s = 50;
  plan.prediction.hit_rate = 0.5;
  WorkerReport w;
  w.name = "w0";
  w.link = LinkReport{};
  plan.workers.push_back(w);
  WorkerPlan p;
  p.name = "w0";
  p.hit_rate = 0.5;
  p.layer_round_trip_s = 0.002;
  plan.prediction.workers.push_back(p);

  const auto samples = parse_prometheus(
      "charm_time_per_output_token_seconds_sum 0.5\ncharm_time_per_output_token_seconds_count 20\n"
      "charm_expert_hits_total{worker=\"w0\"} 60\ncharm_expert_misses_total{worker=\"w0\"} 40\n");
  WorkerStatus status;
  status.name = "w0";
  status.requests = 5;
  status.rtt_p50_ms = 4;
  const MeasuredRun run = measured_run(samples, {status});
  CHECK(*run.decode_tokens_per_s == doctest::Approx(40));
  const auto rows = compare_plan(plan, run);
  REQUIRE(rows.size() == 4);
  CHECK(rows[0].what == "decode tok/s");
  CHECK(*rows[0].relative_error() == doctest::Approx(0.25));  // (50 - 40) / 40
  CHECK(*rows[1].measured == doctest::Approx(0.6));
  CHECK(*rows[2].relative_error() == doctest::Approx((0.5 - 0.6) / 0.6));
  CHECK(rows[3].what == "layer RTT w0 (ms)");
  CHECK(*rows[3].relative_error() == doctest::Approx(-0.5));  // 2 ms predicted, 4 measured
  const std::string table = format_check(rows);
  CHECK(table.find("+25.0%") != std::string::npos);
  CHECK(check_json(rows)[0]["relative_error"].get<double>() == doctest::Approx(0.25));

  const MeasuredRun nothing = measured_run({}, {});
  const auto empty = compare_plan(plan, nothing);
  CHECK_FALSE(empty[0].measured);
  CHECK_FALSE(empty[0].relative_error());
  CHECK(format_check(empty).find("decode tok/s: not measured") != std::string::npos);
  CHECK(check_json(empty)[0]["measured"].is_null());
}

TEST_CASE("--check refuses a coordinator that serves another model") {
  const std::string list = R"({"object": "list", "data": [{"id": "qwen3-moe-tiny", "object": "model"}]})";
  charm::require_served_model(list, "qwen3-moe-tiny", "127.0.0.1:8080");  // no throw
  expect_error([&] { charm::require_served_model(list, "qwen2.5-0.5b-moe", "127.0.0.1:8080"); },
               ErrorCategory::kInvalidInput,
               {"127.0.0.1:8080 serves 'qwen3-moe-tiny', not this config's model 'qwen2.5-0.5b-moe'"});
  for (const std::string& bad : {std::string("not json"), std::string("{\"data\": 3}"), std::string("{\"data\": [{}]}")}) {
    expect_error([&] { charm::require_served_model(bad, "m", "h:1"); }, ErrorCategory::kProtocol, {"h:1/v1/models"});
  }
}
