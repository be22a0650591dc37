// coordinator/dispatch/routing_observer.h: prefetch recall counted by hand, the prefetch switch,
// the routing trace's lines, and LocalDispatcher delivering hints behind the layer in
// flight. Also: hint_next_moe_layer predicts what the next router would pick.
#include <doctest/doctest.h>

#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "coordinator/dispatch/local_dispatch.h"
#include "coordinator/dispatch/routing_observer.h"
#include "coordinator/models/blocks.h"
#include "tests/support/expect_error.h"
#include "tests/support/safetensors_writer.h"
#include "tests/support/temp_dir.h"

using namespace charm;
using namespace charm::testing;
using charm::test::TempDir;

namespace {

// Writes zeros as sums and records what reached it, in call order.
class FakeDispatcher final : public ExpertDispatcher {
 public:
  std::vector<std::string> calls;
  void begin_layer(uint32_t layer, const float*, uint32_t num_rows, uint32_t hidden_size,
                   const std::vector<ExpertAssignment>&, int64_t* sums) override {
    calls.push_back("begin " + std::to_string(layer));
    std::fill(sums, sums + size_t{num_rows} * hidden_size, 0);
  }
  void finish_layer() override { calls.push_back("finish"); }
  void drop_unfinished() override { calls.push_back("drop"); }
  void hint_layer(uint32_t layer, const std::vector<uint32_t>& experts) override {
    calls.push_back("hint " + std::to_string(layer) + " x" + std::to_string(experts.size()));
  }
  std::vector<WorkerStatus> status() const override { return {}; }
};

void run(ExpertDispatcher& d, uint32_t layer, const std::vector<ExpertAssignment>& assignments, uint32_t rows) {
  std::vector<float> hidden(rows * 2, 1.0f);
  std::vector<int64_t> out(rows * 2);
  d.run_layer(layer, hidden.data(), rows, 2, assignments, out.data());
}

}  // namespace

TEST_CASE("count_common intersects ascending lists") {
  CHECK(count_common({}, {1, 2}) == 0);
  CHECK(count_common({1, 3, 5, 7}, {2, 3, 4, 7, 9}) == 2);
  CHECK(count_common({0, 1, 2}, {0, 1, 2}) == 3);
}

TEST_CASE("recall and precision per layer are counted against the batch-union") {
  auto fake = std::make_unique<FakeDispatcher>();
  FakeDispatcher* inner = fake.get();
  RoutingObserver observer(std::move(fake), RoutingObserverOptions{/*prefetch=*/false, ""});
  CHECK_FALSE(observer.wants_hints());

  run(observer, 0, {{0, 4}, {0, 5}}, 1);   // no hint yet: not counted
  observer.hint_layer(1, {1, 2, 3});       // predicted {1,2,3}
  // Actual union on layer 1: {2, 3, 6} (row 0: 2,3; row 1: 3,6).
  run(observer, 1, {{0, 2}, {0, 3}, {1, 3}, {1, 6}}, 2);
  observer.hint_layer(1, {6});
  run(observer, 1, {{0, 6}, {0, 7}}, 1);   // predicted {6}, actual {6, 7}
  run(observer, 1, {{0, 6}, {0, 7}}, 1);   // the hint was used up: not counted

  const auto& stats = observer.prefetch_stats();
  REQUIRE(stats.count(1) == 1);
  CHECK(stats.count(0) == 0);
  const PrefetchLayerStats& s = stats.at(1);
  CHECK(s.steps == 2);
  CHECK(s.actual == 5);
  CHECK(s.predicted == 4);
  CHECK(s.correct == 3);
  CHECK(s.recall() == doctest::Approx(0.6));
  CHECK(s.precision() == doctest::Approx(0.75));
  // Prefetch off: hints are counted but never reach the dispatcher.
  for (const auto& c : inner->calls) CHECK(c.rfind("hint", 0) != 0);
}

TEST_CASE("two hints for one layer (two micro-batches) are matched oldest first") {
  RoutingObserver observer(std::make_unique<FakeDispatcher>(), RoutingObserverOptions{false, ""});
  observer.hint_layer(2, {1});  // half A's prediction
  observer.hint_layer(2, {5});  // half B's
  run(observer, 2, {{0, 1}}, 1);  // A: predicted {1}
  run(observer, 2, {{0, 5}}, 1);  // B: predicted {5}
  const PrefetchLayerStats& s = observer.prefetch_stats().at(2);
  CHECK(s.steps == 2);
  CHECK(s.correct == 2);
  CHECK(s.recall() == doctest::Approx(1.0));
}

TEST_CASE("prefetch on forwards hints in call order; outputs are the inner dispatcher's") {
  auto fake = std::make_unique<FakeDispatcher>();
  FakeDispatcher* inner = fake.get();
  RoutingObserver observer(std::move(fake), RoutingObserverOptions{/*prefetch=*/true, ""});
  CHECK(observer.wants_hints());
  std::vector<float> hidden(2, 1.0f);
  std::vector<int64_t> out(2, 7);
  const std::vector<ExpertAssignment> a = {{0, 1}};
  observer.begin_layer(0, hidden.data(), 1, 2, a, out.data());
  observer.hint_layer(1, {1, 2});
  observer.finish_layer();
  CHECK(out == std::vector<int64_t>{0, 0});
  CHECK(inner->calls == std::vector<std::string>{"begin 0", "hint 1 x2", "finish"});
}

TEST_CASE("the routing trace has one line per layer call, steps, rows in rank order and predictions") {
  TempDir dir("charm-trace");
  const std::string path = (dir / "trace.jsonl").string();
  {
    RoutingObserver observer(std::make_unique<FakeDispatcher>(), RoutingObserverOptions{false, path});
    CHECK(observer.wants_hints());  // a trace records predictions
    run(observer, 0, {{0, 5}, {0, 2}, {1, 2}, {1, 9}}, 2);  // step 0 (prefill of 2 rows)
    observer.hint_layer(2, {2, 9});
    run(observer, 2, {{0, 9}, {0, 1}, {1, 2}, {1, 3}}, 2);
    run(observer, 0, {{0, 7}, {0, 1}}, 1);  // layer id not above the last: step 1
  }
  std::ifstream in(path);
  std::vector<nlohmann::json> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(nlohmann::json::parse(line));
  REQUIRE(lines.size() == 3);
  CHECK(lines[0] == nlohmann::json::parse(R"({"step":0,"layer":0,"rows":2,"experts":[[5,2],[2,9]]})"));
  CHECK(lines[1] ==
        nlohmann::json::parse(R"({"step":0,"layer":2,"rows":2,"experts":[[9,1],[2,3]],"predicted":[2,9]})"));
  CHECK(lines[2] == nlohmann::json::parse(R"({"step":1,"layer":0,"rows":1,"experts":[[7,1]]})"));
}

TEST_CASE("an unwritable routing trace path is an I/O error naming the file") {
  test::expect_error(
      [] { RoutingObserver observer(std::make_unique<FakeDispatcher>(), RoutingObserverOptions{false, "/nonexistent-dir/trace.jsonl"}); },
      ErrorCategory::kIo, {"/nonexistent-dir/trace.jsonl"});
}

TEST_CASE("hint_next_moe_layer sends what the next router picks on the normalised state") {
  auto fake = std::make_unique<FakeDispatcher>();
  FakeDispatcher* inner = fake.get();
  RoutingObserver observer(std::move(fake), RoutingObserverOptions{true, ""});
  // Router over hidden 2, 3 experts, top-1: expert 0 likes +x, expert 1 likes +y, 2 likes -x.
  SoftmaxTopkRouter moe;
  moe.router.weight = StoredMatrix::from_f32({1, 0, 0, 1, -1, 0}, 3, 2);
  moe.top_k = 1;
  RmsNorm norm;
  norm.weight = {1, 1};
  const std::vector<float> hidden = {5, 0.1f, -3, 0.2f, 0.1f, 4};  // rows pick 0, 2, 1
  hint_next_moe_layer(observer, 7, norm, moe, hidden.data(), 3);
  hint_next_moe_layer(observer, 7, norm, moe, hidden.data(), 1);
  CHECK(inner->calls == std::vector<std::string>{"hint 7 x3", "hint 7 x1"});
  CHECK(moe.predict(hidden.data(), 3) == std::vector<uint32_t>{0, 1, 2});
  CHECK(moe.predict(hidden.data() + 2, 1) == std::vector<uint32_t>{2});
  // A dispatcher that wants no hints is not even asked.
  FakeDispatcher plain;
  hint_next_moe_layer(plain, 7, norm, moe, hidden.data(), 3);
  CHECK(plain.calls.empty());
}

TEST_CASE("LocalDispatcher starts a hint with the next layer it runs, once that layer's reads are queued") {
  TempDir dir("charm-local-hint");
  std::vector<TensorSpec> tensors;
  for (int e = 0; e < 2; ++e) {
    const std::string p = "model.layers.0.mlp.experts." + std::to_string(e) + ".";
    tensors.push_back({p + "gate_proj.weight", DType::kF32, {2, 2}, {1, 0, 0, 1}});
    tensors.push_back({p + "up_proj.weight", DType::kF32, {2, 2}, {1, 0, 0, 1}});
    tensors.push_back({p + "down_proj.weight", DType::kF32, {2, 2}, {1, 0, 0, 1}});
  }
  write_safetensors(dir / "model.safetensors", tensors);
  write_bytes(dir / "config.json", R"({"architectures": ["Qwen3MoeForCausalLM"]})");
  auto checkpoint = Checkpoint::open(dir.path());
  ExpertStore store(*checkpoint, ExpertTensorNames{}, {{0, 0}, {0, 1}}, 2, 2);
  ExpertExecutor executor(store);
  std::vector<std::string> events;
  LocalDispatcher local(executor, [&](uint32_t layer, const std::vector<uint32_t>& experts) {
    // Started inside run_into, before the experts compute: the sums are still zero.
    events.push_back("prefetch " + std::to_string(layer) + " x" + std::to_string(experts.size()));
    if (layer == 9) throw Error(ErrorCategory::kIo, "disk gone");  // a failing prefetch is dropped
  });
  const std::vector<float> hidden = {1, 2};
  const std::vector<ExpertAssignment> a = {{0, 0}, {0, 1}};
  std::vector<int64_t> out(2, -1);
  local.hint_layer(3, {1});
  local.hint_layer(9, {0});  // a second hint before any begin: the first goes at once
  CHECK(events == std::vector<std::string>{"prefetch 3 x1"});
  local.begin_layer(0, hidden.data(), 1, 2, a, out.data());
  CHECK(events.size() == 1);  // kept with the layer, which has not run yet
  CHECK(out[0] == -1);
  local.finish_layer();
  CHECK(out[0] != -1);
  CHECK(events == std::vector<std::string>{"prefetch 3 x1", "prefetch 9 x1"});
  // A hint kept for a layer that is dropped goes with it.
  local.hint_layer(0, {0, 1});
  local.begin_layer(0, hidden.data(), 1, 2, a, out.data());
  local.drop_unfinished();
  local.hint_layer(0, {1});
  local.begin_layer(0, hidden.data(), 1, 2, a, out.data());
  local.finish_layer();
  CHECK(events == std::vector<std::string>{"prefetch 3 x1", "prefetch 9 x1", "prefetch 0 x1"});
}

TEST_CASE("routing counts: every assignment counted per (layer, expert), every MoE layer from the start") {
  auto fake = std::make_unique<FakeDispatcher>();
  RoutingObserver observer(std::move(fake), RoutingObserverOptions{false, ""}, {1, 3}, 4);
  using Counts = std::map<uint32_t, std::vector<uint64_t>>;
  CHECK(observer.routing_counts().snapshot() == Counts{{1, {0, 0, 0, 0}}, {3, {0, 0, 0, 0}}});
  run(observer, 1, {{0, 2}, {0, 3}, {1, 2}, {1, 0}}, 2);  // two rows; expert 2 chosen by both
  run(observer, 3, {{0, 1}}, 1);
  run(observer, 1, {{0, 2}}, 1);
  CHECK(observer.routing_counts().snapshot() == Counts{{1, {1, 0, 3, 1}}, {3, {0, 1, 0, 0}}});
  // Outside the shape given: counted all the same (the row grows; a layer appears).
  run(observer, 5, {{0, 6}}, 1);
  CHECK(observer.routing_counts().snapshot().at(5) == std::vector<uint64_t>{0, 0, 0, 0, 0, 0, 1});
}
