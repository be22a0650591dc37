// The dashboard (coordinator/api/dashboard_state.h, the routes of http_api.cpp): the
// /dashboard/state document from fixed inputs, then over a real single-node engine on the
// committed fixture model (routing counts that grow with a completion, the in-process
// store's residency), the page and its files, and the API key rule.
#include <doctest/doctest.h>

#include <httplib.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <numeric>
#include <thread>

#include <nlohmann/json.hpp>

#include "common/topology.h"
#include "coordinator/api/dashboard_assets.h"
#include "coordinator/api/dashboard_state.h"
#include "coordinator/api/http_api.h"
#include "coordinator/api/metrics.h"
#include "coordinator/engine.h"

using namespace charm;
using json = nlohmann::json;

namespace {

const std::filesystem::path kModels = std::filesystem::path(CHARM_SOURCE_DIR) / "tests/fixtures/models";

WorkerStatus worker(const std::string& name, WorkerState state, std::map<uint32_t, LayerResidency> residency,
                    double age_ms) {
  WorkerStatus w;
  w.name = name;
  w.state = state;
  w.residency = std::move(residency);
  w.residency_age_ms = age_ms;
  return w;
}

/// The sum of every routing count in a /dashboard/state document.
uint64_t heat_total(const json& state) {
  uint64_t n = 0;
  for (const json& layer : state["heat"]["layers"])
    for (const json& c : layer["counts"]) n += c.get<uint64_t>();
  return n;
}

/// A single-node engine on the Qwen3-MoE fixture (its experts in-process, every one
/// pinned in RAM by default), with a KV cache size that does not depend on the host.
std::unique_ptr<Engine> tiny_engine(Metrics& metrics) {
  Topology topology;
  topology.model = kModels / "qwen3-moe-tiny";
  topology.single_node = true;
  topology.serving.kv_cache_gb = 64.0 * 16 * 1024 / (1u << 30);
  EngineOptions options;
  options.metrics = &metrics;
  options.available_memory_bytes = 1u << 30;
  return Engine::create(topology, options);
}

json get_state(httplib::Client& client, const httplib::Headers& headers = {}) {
  auto res = client.Get("/dashboard/state", headers);
  REQUIRE(res);
  REQUIRE(res->status == 200);
  CHECK(res->get_header_value("Content-Type") == "application/json");
  return json::parse(res->body);
}

}  // namespace

TEST_CASE("expert_tiers: VRAM beats pinned beats LRU, in no RAM list is disk, '?' while a live worker has not reported") {
  const std::vector<WorkerStatus> workers = {
      worker("a", WorkerState::kUp, {{3, {{0}, {1, 2}}}}, 5),
      worker("b", WorkerState::kUp, {{3, {{2}, {4, 9}}}}, 7),  // 9: past the layer's 6 experts, ignored
      worker("c", WorkerState::kDown, {}, -1),                  // down: not waited for
  };
  CHECK(expert_tiers(3, 6, workers) == "PLPDLD");
  CHECK(expert_tiers(5, 3, workers) == "DDD");  // a layer no one has in RAM
  std::vector<WorkerStatus> unknown = workers;
  unknown.push_back(worker("d", WorkerState::kUp, {}, -1));  // up, no health reply yet
  CHECK(expert_tiers(3, 6, unknown) == "PLP?L?");
  // VRAM beats the RAM lists, whichever worker reported them.
  std::vector<WorkerStatus> gpu = workers;
  gpu.push_back(worker("e", WorkerState::kUp, {{3, {{}, {}, {0, 1, 3}}}}, 2));
  CHECK(expert_tiers(3, 6, gpu) == "VVPVLD");
}

TEST_CASE("dashboard_state: version, workers with their hit rates, totals, load, heat rows of one width") {
  DashboardInputs in;
  in.model = "m";
  in.uptime_s = 12.5;
  WorkerStatus a = worker("a", WorkerState::kUp, {{0, {{1}, {}}}}, 3);
  a.address = "127.0.0.1:9";
  a.requests = 40;
  a.rtt_p50_ms = 1.5;
  a.failovers = 2;
  a.experts_by_tier = {{"ram", 3}, {"disk", 5}};
  in.workers = {a};
  in.load.running = 2;
  in.load.kv_blocks_total = 10;
  in.load.kv_blocks_used = 4;
  in.routing = {{0, {5, 0, 1}}, {2, {0, 7}}};  // a row shorter than the widest is padded
  in.metrics.completion_tokens = 30;
  in.metrics.prompt_tokens = 11;
  in.metrics.ttft_count = 2;
  in.metrics.ttft_sum_s = 0.5;
  in.metrics.token_latency_count = 28;
  in.metrics.token_latency_sum_s = 1.4;
  in.metrics.experts["a"] = {3, 1, 4096};

  const json s = dashboard_state(in);
  CHECK(s["version"] == kDashboardStateVersion);
  CHECK(s["model"] == "m");
  CHECK(s["uptime_s"] == 12.5);
  REQUIRE(s["workers"].size() == 1);
  const json& w = s["workers"][0];
  CHECK(w["name"] == "a");
  CHECK(w["state"] == "up");
  CHECK(w["requests"] == 40);
  CHECK(w["failovers"] == 2);
  CHECK(w["experts_by_tier"] == json{{"disk", 5}, {"ram", 3}});
  CHECK(w["hit_rate"].get<double>() == doctest::Approx(0.75));
  CHECK(w["expert_bytes_read"] == 4096);
  CHECK(w["residency_age_ms"] == 3.0);
  CHECK(s["totals"]["completion_tokens"] == 30);
  CHECK(s["totals"]["ttft_mean_ms"].get<double>() == doctest::Approx(250));
  CHECK(s["totals"]["decode_tokens_per_s"].get<double>() == doctest::Approx(20));
  CHECK(s["totals"]["hit_rate"].get<double>() == doctest::Approx(0.75));
  CHECK(s["load"]["running"] == 2);
  CHECK(s["load"]["kv_blocks_used"] == 4);
  CHECK(s["heat"]["num_experts"] == 3);
  CHECK(s["heat"]["max_count"] == 7);
  REQUIRE(s["heat"]["layers"].size() == 2);
  CHECK(s["heat"]["layers"][0] == json{{"layer", 0}, {"counts", {5, 0, 1}}, {"tiers", "DPD"}});
  CHECK(s["heat"]["layers"][1] == json{{"layer", 2}, {"counts", {0, 7, 0}}, {"tiers", "DDD"}});
  // Nothing counted yet: zeros, not NaNs.
  const json empty = dashboard_state(DashboardInputs{});
  CHECK(empty["totals"]["decode_tokens_per_s"] == 0.0);
  CHECK(empty["totals"]["hit_rate"] == 0.0);
  CHECK(empty["heat"]["layers"].empty());
}

TEST_CASE("the dashboard's files are compiled in: the page, its script and its style") {
  const EmbeddedFile* page = find_dashboard_file("index.html");
  REQUIRE(page != nullptr);
  CHECK(page->bytes.find("/dashboard/dashboard.js") != std::string_view::npos);
  REQUIRE(find_dashboard_file("dashboard.js") != nullptr);
  CHECK(find_dashboard_file("dashboard.js")->bytes.find("/dashboard/state") != std::string_view::npos);
  REQUIRE(find_dashboard_file("dashboard.css") != nullptr);
  CHECK(find_dashboard_file("nope.js") == nullptr);
  CHECK(std::string(dashboard_content_type("index.html")) == "text/html; charset=utf-8");
  CHECK(std::string(dashboard_content_type("dashboard.js")) == "text/javascript; charset=utf-8");
}

TEST_CASE("/dashboard/state over a real engine: every MoE layer, counts that grow by a completion's routings") {
  Metrics metrics;
  auto engine = tiny_engine(metrics);
  HttpApi api(*engine, "127.0.0.1", 0, &metrics);
  api.start();
  httplib::Client client("127.0.0.1", api.port());

  const json before = get_state(client);
  CHECK(before["version"] == 1);
  CHECK(before["model"] == "qwen3-moe-tiny");
  REQUIRE(before["workers"].size() == 1);
  CHECK(before["workers"][0]["name"] == "local");
  CHECK(before["workers"][0]["state"] == "in-process");
  CHECK(before["workers"][0]["residency_age_ms"] == 0.0);
  const json& heat = before["heat"];
  REQUIRE(!heat["layers"].empty());  // every MoE layer, before any request
  const size_t experts = heat["num_experts"].get<size_t>();
  CHECK(experts > 0);
  for (const json& layer : heat["layers"]) {
    CHECK(layer["counts"].size() == experts);
    // The in-process store holds every expert in RAM (no budget): pinned or LRU, never disk.
    const std::string tiers = layer["tiers"];
    CHECK(tiers.size() == experts);
    CHECK(tiers.find_first_not_of("PL") == std::string::npos);
  }
  CHECK(heat_total(before) == 0);
  CHECK(before["totals"]["completion_tokens"] == 0);
  CHECK(before["load"]["tokens_sampled"] == 0);

  // A completion of 4 tokens from a 3-token prompt: 3 + 3 positions go through every
  // MoE layer (the last sampled token is not fed back), each picking top-k experts.
  const json body = {{"prompt", {1, 2, 3}}, {"max_tokens", 4}, {"temperature", 0}};
  auto res = client.Post("/v1/completions", body.dump(), "application/json");
  REQUIRE(res);
  REQUIRE(res->status == 200);
  const int64_t replied = json::parse(res->body)["usage"]["completion_tokens"].get<int64_t>();
  // The engine counts a step's sampled tokens after it hands them on (EngineLoad: "as each
  // step ends"), so the reply can overtake the last count: read until it is there (bounded;
  // a lost count fails below).
  json after = get_state(client);
  for (int tries = 0; tries < 500 && after["load"]["tokens_sampled"].get<int64_t>() < replied; ++tries) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    after = get_state(client);
  }
  const uint64_t layers = after["heat"]["layers"].size();
  const int64_t completion = after["totals"]["completion_tokens"].get<int64_t>();
  CHECK(completion == replied);
  CHECK(completion > 0);
  // Every sampled token counts, an end-of-sequence one that the completion does not hold too.
  const int64_t sampled = after["load"]["tokens_sampled"].get<int64_t>();
  CHECK(sampled >= completion);
  CHECK(sampled <= completion + 1);
  // Every layer's counts sum to positions x top-k, the same on every layer.
  std::vector<uint64_t> per_layer;
  for (const json& layer : after["heat"]["layers"]) {
    uint64_t n = 0;
    for (const json& c : layer["counts"]) n += c.get<uint64_t>();
    per_layer.push_back(n);
  }
  CHECK(per_layer.front() > 0);
  CHECK(std::all_of(per_layer.begin(), per_layer.end(), [&](uint64_t n) { return n == per_layer.front(); }));
  CHECK(heat_total(after) == per_layer.front() * layers);
  CHECK(after["heat"]["max_count"].get<uint64_t>() > 0);
  CHECK(after["totals"]["generations"] == 1);
  CHECK(after["workers"][0]["requests"].get<uint64_t>() > 0);
  CHECK(after["uptime_s"].get<double>() >= before["uptime_s"].get<double>());

  // A second request adds to the counts (they are the server's life, never reset).
  REQUIRE(client.Post("/v1/completions", body.dump(), "application/json"));
  CHECK(heat_total(get_state(client)) == 2 * heat_total(after));
  api.stop();
}

TEST_CASE("API key: /dashboard/state needs it; the page and its files are served without it; methods") {
  Metrics metrics;
  auto engine = tiny_engine(metrics);
  HttpApi api(*engine, "127.0.0.1", 0, &metrics);
  api.set_api_key("sk-dash");
  api.start();
  httplib::Client client("127.0.0.1", api.port());

  auto denied = client.Get("/dashboard/state");
  REQUIRE(denied);
  CHECK(denied->status == 401);
  CHECK(json::parse(denied->body)["error"]["code"] == "invalid_api_key");
  auto wrong = client.Get("/dashboard/state", {{"Authorization", "Bearer sk-other"}});
  REQUIRE(wrong);
  CHECK(wrong->status == 401);
  CHECK(get_state(client, {{"Authorization", "Bearer sk-dash"}})["version"] == 1);

  // The page holds no data: it loads without the key and asks for it.
  auto page = client.Get("/");
  REQUIRE(page);
  CHECK(page->status == 200);
  CHECK(page->get_header_value("Content-Type") == "text/html; charset=utf-8");
  CHECK(page->body == std::string(find_dashboard_file("index.html")->bytes));
  auto script = client.Get("/dashboard/dashboard.js");
  REQUIRE(script);
  CHECK(script->status == 200);
  CHECK(script->get_header_value("Content-Type") == "text/javascript; charset=utf-8");
  auto head = client.Head("/dashboard/dashboard.css");
  REQUIRE(head);
  CHECK(head->status == 200);
  // A name that is no file, or a regex's idea of one, is not public.
  auto other = client.Get("/dashboard/dashboardXjs");
  REQUIRE(other);
  CHECK(other->status == 401);
  auto other_keyed = client.Get("/dashboard/dashboardXjs", {{"Authorization", "Bearer sk-dash"}});
  REQUIRE(other_keyed);
  CHECK(other_keyed->status == 404);
  // Read-only: POST / is 405 naming the methods allowed.
  auto post = client.Post("/", "{}", "application/json");
  REQUIRE(post);
  CHECK(post->status == 405);
  CHECK(post->get_header_value("Allow") == "GET, HEAD");
  api.stop();
}
