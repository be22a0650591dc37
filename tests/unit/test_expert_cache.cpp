// worker/experts/expert_cache.h, worker/experts/expert_store.h (plan_slots) and worker/experts/usage_log.h: LRU and LRFU
// order, pinned experts never evicted, prefetch, read failures, budgets, usage merging.
// The disk tier is a fake source whose reads are counted and can be held back.
#include <doctest/doctest.h>

#include <atomic>
#include <condition_variable>
#include <fstream>
#include <limits>
#include <mutex>
#include <set>
#include <thread>

#include "common/checkpoint.h"
#include "common/error.h"
#include "tests/support/expect_error.h"
#include "tests/support/safetensors_writer.h"
#include "tests/support/temp_dir.h"
#include "worker/experts/expert_cache.h"
#include "worker/experts/expert_manifest.h"
#include "worker/experts/expert_source.h"
#include "worker/experts/expert_store.h"
#include "worker/experts/usage_log.h"

using namespace charm;

namespace {

constexpr int64_t kHidden = 4;
constexpr int64_t kInter = 2;

/// Experts whose every weight equals (expert id + 1); reads counted per expert; reads
/// can be held until release(); an expert in `broken` fails to read.
class FakeSource final : public ExpertSource {
 public:
  FakeSource() {
    const MatrixShape gate{WeightFormat::kF32, kInter, kHidden, 0};
    const MatrixShape down{WeightFormat::kF32, kHidden, kInter, 0};
    layout_ = ExpertLayout::make(gate, gate, down);
  }
  const ExpertLayout* layout(const ExpertKey& key) const override { return key.second < 64 ? &layout_ : nullptr; }
  uint64_t read(const ExpertKey& key, uint8_t* dst) const override {
    {
      std::unique_lock<std::mutex> lock(mutex_);
      cv_.wait(lock, [&] { return !hold_; });
      ++reads_[key];
    }
    if (broken_.count(key)) fail_io("fake disk: layer " + std::to_string(key.first) + " expert " + std::to_string(key.second) + " unreadable");
    auto* f = reinterpret_cast<float*>(dst);
    for (uint64_t i = 0; i < layout_.bytes / 4; ++i) f[i] = static_cast<float>(key.second + 1);
    return layout_.bytes;
  }
  std::optional<ContentHash> identity(const ExpertKey& key) const override {
    if (!layout(key)) return std::nullopt;
    return ContentHash{key.first, key.second};
  }
  std::string describe() const override { return "fake"; }

  int reads(uint32_t layer, uint32_t expert) const {
    std::lock_guard<std::mutex> lock(mutex_);
    const auto it = reads_.find({layer, expert});
    return it == reads_.end() ? 0 : it->second;
  }
  void hold() {
    std::lock_guard<std::mutex> lock(mutex_);
    hold_ = true;
  }
  void release() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      hold_ = false;
    }
    cv_.notify_all();
  }
  std::set<ExpertKey> broken_;

 private:
  ExpertLayout layout_;
  mutable std::mutex mutex_;
  mutable std::condition_variable cv_;
  mutable std::map<ExpertKey, int> reads_;
  bool hold_ = false;
};

LayerPlan plan_of(std::vector<uint32_t> owned, std::vector<uint32_t> pinned, size_t lru) {
  return LayerPlan{std::move(owned), std::move(pinned), lru};
}

/// Runs a whole fetch; returns the experts in the order they came back, checking each
/// lease's weights belong to its expert.
std::vector<uint32_t> drain(ExpertCache& cache, uint32_t layer, const std::vector<uint32_t>& experts,
                            TierCounters* stats = nullptr) {
  auto fetch = cache.fetch(layer, experts);
  std::vector<uint32_t> order;
  std::vector<ExpertLease> batch;
  for (;;) {
    batch.clear();
    batch = fetch->next();
    if (batch.empty()) break;
    for (const ExpertLease& lease : batch) {
      order.push_back(lease.expert());
      const auto* w = reinterpret_cast<const float*>(lease.view().gate.data);
      CHECK(w[0] == static_cast<float>(lease.expert() + 1));
    }
  }
  if (stats) *stats = fetch->stats();
  return order;
}

std::set<uint32_t> resident(const ExpertCache& cache, uint32_t layer) {
  const auto v = cache.resident(layer);
  return {v.begin(), v.end()};
}

}  // namespace

TEST_CASE("LRU: the least recently used unleased expert is evicted first") {
  FakeSource source;
  ExpertCache cache(source, {{0, plan_of({0, 1, 2, 3}, {}, 2)}}, 2);
  CHECK(drain(cache, 0, {0}) == std::vector<uint32_t>{0});
  CHECK(drain(cache, 0, {1}) == std::vector<uint32_t>{1});
  TierCounters s;
  drain(cache, 0, {0}, &s);  // 0 is now more recent than 1
  CHECK(s.hits == 1);
  CHECK(s.misses == 0);
  drain(cache, 0, {2}, &s);  // evicts 1
  CHECK(s.misses == 1);
  CHECK(s.bytes_read == source.layout({0, 2})->bytes);
  CHECK(resident(cache, 0) == std::set<uint32_t>{0, 2});
  drain(cache, 0, {1});  // evicts 0 (used before 2)
  CHECK(resident(cache, 0) == std::set<uint32_t>{1, 2});
  CHECK(source.reads(0, 0) == 1);
  CHECK(source.reads(0, 1) == 2);
  const TierCounters layer = cache.stats().at(0);
  CHECK(layer.hits == 1);
  CHECK(layer.misses == 4);
}

TEST_CASE("LRFU keeps the frequently used expert that LRU evicts, as scripts/replay_routing.py counts") {
  // 2 slots, fetches 0 0 0 1 2 0 (the replay test's sequence): LRU evicts 0 for 2 and
  // misses the last 0; LRFU's count for 0 (~3) beats 1's (1), so 2 replaces 1.
  const std::vector<uint32_t> sequence{0, 0, 0, 1, 2, 0};
  for (const auto& [policy, expected] :
       {std::pair{EvictionPolicy::kLru, std::vector<uint64_t>{0, 1, 1, 0, 0, 0}},
        std::pair{EvictionPolicy::kLrfu, std::vector<uint64_t>{0, 1, 1, 0, 0, 1}}}) {
    FakeSource source;
    ExpertCache cache(source, {{0, plan_of({0, 1, 2, 3}, {}, 2)}}, 2, policy);
    std::vector<uint64_t> hits;
    for (uint32_t e : sequence) {
      TierCounters s;
      drain(cache, 0, {e}, &s);
      hits.push_back(s.hits);
    }
    CHECK(hits == expected);
  }
}

TEST_CASE("LRFU counts decay: an old burst of uses gives way to fewer recent ones") {
  // 3 slots: 0 used 10 times, then 2 * kLrfuHalfLifeCalls fetches of 1 and 2 alternating
  // (8 uses each). Plain counts (LFU) would keep 0 (10 > 8); decayed, 0's is ~1.6
  // against ~4 for 1 and 2, so the miss of 3 evicts 0.
  FakeSource source;
  ExpertCache cache(source, {{0, plan_of({0, 1, 2, 3}, {}, 3)}}, 2, EvictionPolicy::kLrfu);
  for (int i = 0; i < 10; ++i) drain(cache, 0, {0});
  for (int i = 0; i < 2 * static_cast<int>(kLrfuHalfLifeCalls); ++i) drain(cache, 0, {static_cast<uint32_t>(1 + i % 2)});
  CHECK(resident(cache, 0) == std::set<uint32_t>{0, 1, 2});
  drain(cache, 0, {3});
  CHECK(resident(cache, 0) == std::set<uint32_t>{1, 2, 3});
}

TEST_CASE("pinned experts are read once at start and never evicted") {
  FakeSource source;
  ExpertCache cache(source, {{0, plan_of({0, 1, 2, 3, 4}, {3}, 1)}, {1, plan_of({0, 1}, {0, 1}, 0)}}, 2);
  CHECK(source.reads(0, 3) == 1);
  CHECK(cache.stats().at(0) == TierCounters{});  // start-up reads are not request traffic
  for (int round = 0; round < 3; ++round) {
    for (uint32_t e : {0u, 1u, 2u, 4u}) drain(cache, 0, {e, 3});
    CHECK(resident(cache, 0).count(3) == 1);
  }
  CHECK(source.reads(0, 3) == 1);
  // One LRU slot and a request for four missing experts: served one after another.
  TierCounters s;
  const auto order = drain(cache, 0, {0, 1, 2, 4}, &s);
  CHECK(std::set<uint32_t>(order.begin(), order.end()) == std::set<uint32_t>{0, 1, 2, 4});
  CHECK(s.misses + s.hits == 4);
  CHECK(cache.slot_count() == 2 + 2);
  TierCounters all;
  drain(cache, 1, {0, 1}, &all);
  CHECK(all.hits == 2);
}

TEST_CASE("residency: pinned and LRU-resident experts per layer, ascending; a read expert moves in") {
  FakeSource source;
  ExpertCache cache(source, {{0, plan_of({0, 1, 2, 3, 4}, {3}, 1)}, {1, plan_of({0, 1}, {1, 0}, 0)}}, 2);
  using R = std::map<uint32_t, LayerResidency>;
  CHECK(cache.residency() == R{{0, {{3}, {}, {}}}, {1, {{0, 1}, {}, {}}}});  // the LRU slot is empty at start
  drain(cache, 0, {4});
  CHECK(cache.residency() == R{{0, {{3}, {4}, {}}}, {1, {{0, 1}, {}, {}}}});
  drain(cache, 0, {2});  // evicts 4 from the one LRU slot
  CHECK(cache.residency().at(0) == LayerResidency{{3}, {2}, {}});
}

TEST_CASE("resident experts come back first, missing ones as their reads land") {
  FakeSource source;
  ExpertCache cache(source, {{0, plan_of({0, 1, 2}, {0}, 2)}}, 1);
  source.hold();
  auto fetch = cache.fetch(0, {2, 0});
  std::vector<ExpertLease> first = fetch->next();  // does not wait for the held read
  REQUIRE(first.size() == 1);
  CHECK(first[0].expert() == 0);
  first.clear();
  source.release();
  std::vector<ExpertLease> second = fetch->next();
  REQUIRE(second.size() == 1);
  CHECK(second[0].expert() == 2);
  second.clear();
  CHECK(fetch->next().empty());
  CHECK(fetch->stats().hits == 1);
  CHECK(fetch->stats().misses == 1);
}

TEST_CASE("prefetch starts reads without waiting; a later request counts them as prefetch hits") {
  FakeSource source;
  ExpertCache cache(source, {{0, plan_of({0, 1, 2, 3}, {}, 2)}}, 2);
  source.hold();
  CHECK(cache.prefetch(0, {1, 2, 3}) == 2);  // two free slots; returns with reads held
  CHECK(cache.prefetch(0, {1}) == 0);        // already on its way
  source.release();
  TierCounters s;
  const auto order = drain(cache, 0, {1, 2}, &s);
  CHECK(order.size() == 2);
  CHECK(s.hits == 2);
  CHECK(s.misses == 0);
  CHECK(s.prefetch_hits == 2);
  CHECK(source.reads(0, 1) == 1);
  const TierCounters layer = cache.stats().at(0);
  CHECK(layer.prefetch_issued == 2);
  CHECK(layer.prefetch_hits == 2);
  CHECK(layer.bytes_read == 2 * source.layout({0, 1})->bytes);
  drain(cache, 0, {1}, &s);  // a second use is a plain hit
  CHECK(s.prefetch_hits == 0);
  CHECK(cache.prefetch(7, {0}) == 0);  // unknown layer: ignored
}

TEST_CASE("a failed read is an error naming the expert; the slot is usable afterwards") {
  FakeSource source;
  source.broken_.insert({0, 1});
  ExpertCache cache(source, {{0, plan_of({0, 1, 2}, {}, 1)}}, 1);
  test::expect_error([&] { drain(cache, 0, {1}); }, ErrorCategory::kIo, {"layer 0 expert 1", "unreadable"});
  CHECK(drain(cache, 0, {2}) == std::vector<uint32_t>{2});
  source.broken_.clear();
  CHECK(drain(cache, 0, {1}) == std::vector<uint32_t>{1});
}

TEST_CASE("a pinned expert that cannot be read fails the start, naming it") {
  FakeSource source;
  source.broken_.insert({2, 4});
  test::expect_error([&] { ExpertCache cache(source, {{2, plan_of({3, 4}, {3, 4}, 0)}}, 2); }, ErrorCategory::kIo,
                     {"layer 2 expert 4"});
}

TEST_CASE("concurrent requests on a one-slot layer all complete with the right weights") {
  FakeSource source;
  ExpertCache cache(source, {{0, plan_of({0, 1, 2, 3, 4, 5}, {}, 1)}}, 2);
  std::vector<std::thread> threads;
  std::atomic<int> done{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 20; ++i) {
        const auto order = drain(cache, 0, {static_cast<uint32_t>(t), static_cast<uint32_t>((t + i) % 6)});
        if (!order.empty()) ++done;
      }
    });
  }
  for (auto& th : threads) th.join();
  CHECK(done == 80);
}

TEST_CASE("plan_slots: everything resident by default or when the budget holds it") {
  std::vector<ExpertKey> owned;
  for (uint32_t l : {0u, 2u}) {
    for (uint32_t e = 0; e < 4; ++e) owned.emplace_back(l, e);
  }
  for (auto budget : {std::optional<uint64_t>{}, std::optional<uint64_t>{8 * 4096}}) {
    const auto plan = plan_slots(owned, 4096, budget, {}, "w0");
    REQUIRE(plan.size() == 2);
    for (const auto& [layer, p] : plan) {
      CHECK(p.pinned == p.owned);
      CHECK(p.lru_slots == 0);
    }
  }
}

TEST_CASE("plan_slots: a tight budget shares slots by layer and pins the hottest, keeping an LRU") {
  std::vector<ExpertKey> owned;
  for (uint32_t e = 0; e < 16; ++e) owned.emplace_back(0, e);
  for (uint32_t e = 0; e < 16; ++e) owned.emplace_back(1, e);
  UsageCounts usage{{{0, 5}, 100}, {{0, 9}, 50}, {{0, 1}, 7}, {{0, 2}, 0}, {{1, 3}, 9}};
  const auto plan = plan_slots(owned, 4096, 8 * 4096 + 100, usage, "w0");
  CHECK(plan.at(0).pinned == std::vector<uint32_t>{5, 9, 1});  // 4 slots: 3 pinned + 1 LRU
  CHECK(plan.at(0).lru_slots == 1);
  CHECK(plan.at(1).pinned == std::vector<uint32_t>{3});
  CHECK(plan.at(1).lru_slots == 3);
  const auto none = plan_slots(owned, 4096, 2 * 4096, {}, "w0");  // one slot per layer
  CHECK(none.at(0).pinned.empty());
  CHECK(none.at(0).lru_slots == 1);
  CHECK(none.at(1).lru_slots == 1);
}

TEST_CASE("plan_slots: fewer slots than layers is an error naming the worker and the numbers") {
  std::vector<ExpertKey> owned = {{0, 0}, {1, 0}, {2, 0}};
  test::expect_error([&] { plan_slots(owned, 12288, 20000, {}, "w7"); }, ErrorCategory::kInvalidInput,
                     {"worker 'w7'", "20000 bytes", "1 expert slots of 12288 bytes", "3 MoE layers",
                      "at least", "36864 bytes"});
}

TEST_CASE("usage file: two restarts merge their counts; a corrupt file is warned about and ignored") {
  test::TempDir dir("charm-usage");
  const auto path = dir / "usage.json";
  {
    UsageLog log(path, "fp1");
    log.record({0, 3}, 2);
    log.record({2, 1});
  }  // flushed at exit
  {
    UsageLog log(path, "fp1");
    log.record({0, 3});
    log.flush();
    log.record({0, 4});
  }
  std::string warning;
  UsageCounts counts = read_usage_file(path, "fp1", &warning);
  CHECK(warning.empty());
  CHECK(counts == UsageCounts{{{0, 3}, 3}, {{0, 4}, 1}, {{2, 1}, 1}});

  read_usage_file(path, "other", &warning);
  CHECK(warning.find("fingerprint") != std::string::npos);

  // Truncated mid-write (say, a crash of some other tool): ignored with a warning.
  std::ifstream in(path);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  testing::write_bytes(path, text.substr(0, text.size() / 2));
  warning.clear();
  CHECK(read_usage_file(path, "fp1", &warning).empty());
  CHECK(warning.find(path.string()) != std::string::npos);
  CHECK(warning.find("ignored") != std::string::npos);
  testing::write_bytes(path, R"({"format":"charm-expert-usage","counts":[[0,1,-5]]})");
  warning.clear();
  CHECK(read_usage_file(path, "", &warning).empty());
  CHECK(!warning.empty());
  {
    UsageLog log(path, "fp1");  // the next flush replaces the bad file
    log.record({1, 1});
  }
  warning.clear();
  CHECK(read_usage_file(path, "fp1", &warning) == UsageCounts{{{1, 1}, 1}});
  CHECK(warning.empty());
  CHECK(read_usage_file(dir / "absent.json", "fp1", &warning).empty());
}

TEST_CASE("ExpertStore pins the hottest experts of the usage file at start (pin: auto)") {
  test::TempDir dir("charm-pin");
  const auto usage = dir / "usage.json";
  {
    UsageLog log(usage, "fp");
    log.record({0, 6}, 10);
    log.record({0, 2}, 5);
  }
  std::vector<ExpertKey> owned;
  for (uint32_t e = 0; e < 8; ++e) owned.emplace_back(0, e);
  auto make = [&](PinMode pin) {
    StoreOptions o;
    o.ram_bytes = 4 * 4096;
    o.pin = pin;
    o.usage_file = usage;
    o.model_fingerprint = "fp";
    return std::make_unique<ExpertStore>(std::make_unique<FakeSource>(), owned, kHidden, kInter, o);
  };
  {
    auto store = make(PinMode::kAuto);
    const auto r = store->cache().resident(0);
    CHECK(std::set<uint32_t>(r.begin(), r.end()) == std::set<uint32_t>{2, 6});
    CHECK(store->cache().slot_count() == 4);
    CHECK(store->prefetch(0, {0, 1, 99}) == 2);  // 99 is not owned: ignored
    auto fetch = store->fetch(0, {6});
  }  // records the fetch of expert 6
  CHECK(read_usage_file(usage, "fp", nullptr).at({0, 6}) == 11);
  auto none = make(PinMode::kNone);
  CHECK(none->cache().resident(0).empty());
}

TEST_CASE("a checkpoint expert holding NaN fails a pinned start and an LRU fill, naming file, tensor and element") {
  // Issue 12 item 7: every read of an expert into RAM checks its weights (pinned at
  // start, LRU fills on demand, prefetch), so a bad checkpoint cannot print garbage.
  test::TempDir dir("charm-nan-cache");
  testing::write_bytes(dir / "config.json", R"({"architectures": ["Qwen3MoeForCausalLM"]})");
  std::vector<testing::TensorSpec> tensors;
  for (int e = 0; e < 3; ++e) {
    const std::string p = "model.layers.0.mlp.experts." + std::to_string(e) + ".";
    std::vector<float> down(kHidden * kInter, 0.5f);
    if (e == 1) down[1 * kInter + 1] = std::numeric_limits<float>::infinity();  // [1, 1]
    tensors.push_back({p + "gate_proj.weight", DType::kBF16, {kInter, kHidden}, std::vector<float>(kInter * kHidden, 1.0f)});
    tensors.push_back({p + "up_proj.weight", DType::kBF16, {kInter, kHidden}, std::vector<float>(kInter * kHidden, 1.0f)});
    tensors.push_back({p + "down_proj.weight", DType::kBF16, {kHidden, kInter}, down});
  }
  testing::write_safetensors(dir / "model.safetensors", tensors);
  const auto checkpoint = Checkpoint::open(dir.path());
  // The good experts' identities as hashed; the bad one's read fails on its Inf before
  // its identity is compared, so any value serves.
  ExpertIdentities expected = hash_expert_identities(*checkpoint, ExpertTensorNames{}, {{0, 0}, {0, 2}}, kHidden, kInter);
  expected[{0, 1}] = ContentHash{1, 1};
  const CheckpointSource source(*checkpoint, ExpertTensorNames{}, {{0, 0}, {0, 1}, {0, 2}}, kHidden, kInter, expected);
  const std::vector<std::string> named = {(dir / "model.safetensors").string(),
                                          "'model.layers.0.mlp.experts.1.down_proj.weight'", "+Inf at [1, 1]"};
  test::expect_error([&] { ExpertCache cache(source, {{0, plan_of({0, 1, 2}, {1}, 1)}}, 1); }, ErrorCategory::kIo,
                     named);
  ExpertCache cache(source, {{0, plan_of({0, 1, 2}, {0}, 1)}}, 1);
  auto fetch_all = [&](uint32_t e) {
    auto fetch = cache.fetch(0, {e});
    size_t n = 0;
    for (auto batch = fetch->next(); !batch.empty(); batch = fetch->next()) n += batch.size();
    return n;
  };
  CHECK(fetch_all(2) == 1);  // a good expert through the LRU slot
  test::expect_error([&] { fetch_all(1); }, ErrorCategory::kIo, named);
  CHECK(fetch_all(0) == 1);  // the pinned one is still served
}
