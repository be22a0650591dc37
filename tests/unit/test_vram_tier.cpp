// The VRAM tier's placement, budget accounting, lookup order, online promotion and
// counters (issue 19), on the CPU: the device is test::HostExpertDevice, which takes the
// GPU's formats and counts its memory. That the GPU computes the CPU's bits is checked by
// tests/gpu/ (skipped without a device); that a VRAM expert's output has the bits of
// every other tier is in test_expert_tiers.cpp.
#include <doctest/doctest.h>

#include <cstring>
#include <set>

#include "common/checkpoint.h"
#include "common/model_config.h"
#include "coordinator/dispatch/worker_status.h"
#include "coordinator/models/checkpoint_families.h"
#include "tests/support/expect_error.h"
#include "tests/support/host_expert_device.h"
#include "tests/support/temp_dir.h"
#include "worker/experts/expert_executor.h"
#include "worker/experts/expert_manifest.h"
#include "worker/experts/vram_tier.h"

using namespace charm;
namespace fs = std::filesystem;

namespace {

const fs::path kModel = fs::path(CHARM_SOURCE_DIR) / "tests/fixtures/models/qwen3-moe-tiny";

/// qwen3-moe-tiny's experts (MoE layers 0, 2 and 3, 16 experts each, bf16 blobs of 12 KiB) in
/// stores with a VRAM tier.
struct Fixture {
  std::unique_ptr<Checkpoint> checkpoint = Checkpoint::open(kModel);
  ModelConfig config = ModelConfig::parse(checkpoint->config_json(), "qwen3-moe-tiny", checkpoint_families());
  std::vector<ExpertKey> all;
  ExpertIdentities identities;
  uint64_t blob = 0;  // one expert's bytes (= its slot: a multiple of 4 KiB)

  Fixture() {
    for (int64_t l : config.moe_layer_ids()) {
      for (uint32_t e = 0; e < config.num_experts; ++e) all.emplace_back(l, e);
    }
    identities = hash_expert_identities(*checkpoint, config.expert_tensors, all, config.hidden_size,
                                        config.moe_intermediate_size);
    blob = source()->layout(all[0])->bytes;
  }
  std::unique_ptr<ExpertSource> source() const {
    return std::make_unique<CheckpointSource>(*checkpoint, config.expert_tensors, all, config.hidden_size,
                                              config.moe_intermediate_size, identities);
  }
  std::unique_ptr<ExpertStore> store(std::shared_ptr<ExpertDevice> device, uint64_t vram_slots,
                                     std::optional<uint64_t> ram_slots = std::nullopt,
                                     const fs::path& usage = {}) const {
    StoreOptions o;
    o.pin = usage.empty() ? PinMode::kNone : PinMode::kFile;
    o.pin_file = usage;
    o.model_fingerprint = "fp";
    if (ram_slots) o.ram_bytes = *ram_slots * blob;
    o.vram_bytes = vram_slots * blob;
    o.vram_device = std::move(device);
    return std::make_unique<ExpertStore>(source(), all, config.hidden_size, config.moe_intermediate_size, o);
  }
};

std::vector<ExpertKey> keys(std::initializer_list<ExpertKey> k) { return k; }

}  // namespace

TEST_CASE("plan_vram: everything when it fits, else the hottest, then round-robin over the layers") {
  std::vector<ExpertKey> owned;
  for (uint32_t l : {1u, 3u}) {
    for (uint32_t e = 0; e < 4; ++e) owned.emplace_back(l, e);
  }
  CHECK(plan_vram(owned, 100, 800, {}, "w") == owned);
  CHECK(plan_vram({}, 0, 800, {}, "w").empty());  // a worker with no experts places none
  CHECK(plan_vram(owned, 100, 5000, {}, "w") == owned);
  // No counts: slots spread over the layers, lowest ids first.
  CHECK(plan_vram(owned, 100, 399, {}, "w") == keys({{1, 0}, {1, 1}, {3, 0}}));
  // Counts first (ties: the smaller key), the rest round-robin.
  const UsageCounts usage{{{3, 2}, 9}, {{1, 3}, 9}, {{3, 1}, 4}, {{1, 0}, 0}};
  CHECK(plan_vram(owned, 100, 200, usage, "w") == keys({{1, 3}, {3, 2}}));
  CHECK(plan_vram(owned, 100, 400, usage, "w") == keys({{1, 0}, {1, 3}, {3, 1}, {3, 2}}));
  test::expect_error([&] { plan_vram(owned, 4096, 4095, {}, "w1"); }, ErrorCategory::kInvalidInput,
                     {"worker 'w1'", "vram_gb", "4095 bytes", "holds no expert of 4096 bytes", "at least"});
}

TEST_CASE("the VRAM tier places the hottest experts, keeps them out of the RAM pins and accounts its bytes") {
  const Fixture f;
  test::TempDir dir("charm-vram");
  const fs::path usage = dir / "usage.json";
  {
    UsageLog log(usage, "fp");
    log.record({0, 5}, 50);
    log.record({2, 7}, 40);
    log.record({0, 2}, 30);
    log.record({3, 9}, 20);
  }
  auto device = std::make_shared<test::HostExpertDevice>();
  // 2 VRAM slots; 6 RAM slots (2 per layer: 1 pinned, 1 LRU).
  auto store = f.store(device, 2, 6, usage);
  REQUIRE(store->vram() != nullptr);
  CHECK(store->vram()->capacity() == 2);
  CHECK(store->vram()->resident() == std::map<uint32_t, std::vector<uint32_t>>{{0, {5}}, {2, {7}}});
  CHECK(store->vram()->bytes() == 2 * f.blob);
  CHECK(device->used() == 2 * f.blob);
  // RAM pins the hottest of the rest: layer 0 expert 2, layer 3 expert 9 (not 0/5, 2/7).
  const auto residency = store->residency();
  CHECK(residency.at(0).pinned == std::vector<uint32_t>{2});
  CHECK(residency.at(0).vram == std::vector<uint32_t>{5});
  CHECK(residency.at(2).pinned.empty());
  CHECK(residency.at(2).vram == std::vector<uint32_t>{7});
  CHECK(residency.at(3).pinned == std::vector<uint32_t>{9});
  {  // Lookup order: VRAM first; the rest through RAM / disk.
    LayerFetch fetch = store->fetch(0, {2, 5, 11});
    REQUIRE(fetch.vram.size() == 1);
    CHECK(fetch.vram[0].expert == 5);
    std::set<uint32_t> from_ram;
    for (;;) {
      std::vector<ExpertLease> batch = fetch.ram->next();
      if (batch.empty()) break;
      for (const ExpertLease& lease : batch) from_ram.insert(lease.expert());
    }
    CHECK(from_ram == std::set<uint32_t>{2, 11});
  }
  // A prefetch reads nothing the VRAM serves: of 5 (VRAM) and 12, only 12 (into layer 0's LRU slot).
  CHECK(store->prefetch(0, {5, 12}) == 1);
  // The status column: 2 in VRAM; of the other 46, 6 RAM slots, the rest on disk.
  CHECK(split_by_tier(store->size(), store->cache().slot_count(), vram_experts_of(residency)) ==
        std::map<std::string, uint64_t>{{"vram", 2}, {"ram", 6}, {"disk", 40}});
  store.reset();
  CHECK(device->used() == 0);  // every device copy freed with the store
}

TEST_CASE("the VRAM budget: refused when the device has less free memory, or holds less than one expert") {
  const Fixture f;
  test::expect_error([&] { f.store(std::make_shared<test::HostExpertDevice>(3 * f.blob - 1), 3); },
                     ErrorCategory::kUnavailable,
                     {"worker 'local'", "places 3 experts (" + std::to_string(3 * f.blob) + " bytes)", "host device",
                      std::to_string(3 * f.blob - 1) + " bytes free", "lower vram_gb"});
  // Room for the experts but not for a promotion's copy and the headroom: refused too,
  // with the most that fits.
  const uint64_t tight = 3 * f.blob + VramTier::kHeadroomBytes;
  test::expect_error([&] { f.store(std::make_shared<test::HostExpertDevice>(tight), 3); },
                     ErrorCategory::kUnavailable,
                     {std::to_string(tight) + " bytes free", "keeps " + std::to_string(f.blob + VramTier::kHeadroomBytes),
                      "one expert's slot for promotions", "256 MiB"});
  CHECK_NOTHROW(f.store(std::make_shared<test::HostExpertDevice>(tight + f.blob), 3));
  // A ram_gb too small for the layers is refused before any expert goes to the device.
  auto untouched = std::make_shared<test::HostExpertDevice>();
  test::expect_error([&] { f.store(untouched, 3, /*ram_slots=*/1); }, ErrorCategory::kInvalidInput,
                     {"ram_gb", "each needs at least one slot"});
  CHECK(untouched->attempts() == 0);
  StoreOptions o;
  o.vram_bytes = f.blob - 1;
  o.vram_device = std::make_shared<test::HostExpertDevice>();
  test::expect_error([&] { ExpertStore(f.source(), f.all, f.config.hidden_size, f.config.moe_intermediate_size, o); },
                     ErrorCategory::kInvalidInput, {"vram_gb", "holds no expert of " + std::to_string(f.blob)});
  // Every expert fits: all in VRAM, and the capacity is what the budget holds.
  auto device = std::make_shared<test::HostExpertDevice>();
  auto all = f.store(device, 100);
  CHECK(all->vram()->size() == f.all.size());
  CHECK(all->vram()->capacity() == f.all.size());  // no more slots than experts to place
  CHECK(device->used() == f.all.size() * f.blob);
}

TEST_CASE("VRAM hits are counted per request and per layer, among the hits; the device computes only them") {
  const Fixture f;
  auto device = std::make_shared<test::HostExpertDevice>();
  auto store = f.store(device, 3);  // expert 0 of layers 0, 2 and 3 (round-robin)
  CHECK(store->vram()->resident() == std::map<uint32_t, std::vector<uint32_t>>{{0, {0}}, {2, {0}}, {3, {0}}});
  const ExpertExecutor executor(*store);
  const int64_t h = f.config.hidden_size;
  std::vector<float> x(2 * h, 0.5f);
  std::vector<int64_t> sums(2 * h, 0);
  const LayerStats s = executor.run_into(0, x.data(), 2, {{0, 0, 0.5f}, {1, 0, 0.25f}, {1, 3, 0.25f}}, sums.data());
  CHECK(s.experts_computed == 2);
  CHECK(s.hits == 2);  // both resident (the RAM holds every expert: no ram budget)
  CHECK(s.vram_hits == 1);
  CHECK(device->products() == 3);  // expert 0 alone: gate, up and down, each one product
  const auto stats = store->layer_stats();
  CHECK(stats.at(0).vram_hits == 1);
  CHECK(stats.at(0).hits == 2);
  CHECK(store->total_stats().vram_hits == 1);
}

TEST_CASE("online promotion: an expert whose routing count outgrows the coldest resident's replaces it") {
  // The promotion thread reads the expert from the source itself, so a request never
  // waits for an upload; wait_idle lets the test see it land.
  const Fixture f;
  auto device = std::make_shared<test::HostExpertDevice>();
  auto store = f.store(device, 1);  // one slot: layer 0 expert 0 (no usage file)
  REQUIRE(store->vram()->resident() == std::map<uint32_t, std::vector<uint32_t>>{{0, {0}}});
  const ExpertExecutor executor(*store);
  const int64_t h = f.config.hidden_size;
  std::vector<float> x(h, 0.5f);
  std::vector<int64_t> sums(h, 0);
  auto use = [&](uint32_t layer, uint32_t expert) { executor.run_into(layer, x.data(), 1, {{0, expert, 1.0f}}, sums.data()); };
  for (int i = 0; i < 4; ++i) use(0, 0);  // the resident's count: 4
  // Expert 3 of layer 2 needs a count above 2 * 4 + 16 = 24, offered on every 8th use: 32.
  for (int i = 0; i < 31; ++i) use(2, 3);
  store->vram()->wait_idle();
  CHECK(store->vram()->promotions() == 0);
  use(2, 3);  // queued; the tier's thread reads it from the checkpoint and uploads it
  store->vram()->wait_idle();
  CHECK(store->vram()->promotions() == 1);
  CHECK(store->vram()->resident() == std::map<uint32_t, std::vector<uint32_t>>{{2, {3}}});
  CHECK(device->used() == f.blob);  // the evicted copy is freed: still one expert's bytes
  // Now served from VRAM; the old one from RAM, with the same bits as before.
  std::vector<int64_t> before(h, 0), after(h, 0);
  executor.run_into(2, x.data(), 1, {{0, 3, 1.0f}}, after.data());
  CHECK(store->layer_stats().at(2).vram_hits == 1);
  auto plain = f.store(std::make_shared<test::HostExpertDevice>(), 1);
  ExpertExecutor(*plain).run_into(2, x.data(), 1, {{0, 3, 1.0f}}, before.data());
  CHECK(std::memcmp(before.data(), after.data(), h * sizeof(int64_t)) == 0);
}

TEST_CASE("a failed promotion leaves the expert in RAM and stops promotion, so a full device is asked once") {
  const Fixture f;
  auto device = std::make_shared<test::HostExpertDevice>();
  auto store = f.store(device, 1);
  const ExpertExecutor executor(*store);
  const int64_t h = f.config.hidden_size;
  std::vector<float> x(h, 0.5f);
  std::vector<int64_t> sums(h, 0), plain(h, 0);
  device->refuse_uploads();
  for (int i = 0; i < 64; ++i) {
    executor.run_into(2, x.data(), 1, {{0, 3, 1.0f}}, sums.data());
    store->vram()->wait_idle();
  }
  CHECK(device->attempts() == 2);  // the one at start, and the first promotion (at use 24 > 2 * 0 + 16)
  CHECK(store->vram()->promotions() == 0);
  CHECK(store->vram()->resident() == std::map<uint32_t, std::vector<uint32_t>>{{0, {0}}});
  auto cpu = f.store(std::make_shared<test::HostExpertDevice>(), 1);
  for (int i = 0; i < 64; ++i) ExpertExecutor(*cpu).run_into(2, x.data(), 1, {{0, 3, 1.0f}}, plain.data());
  CHECK(std::memcmp(sums.data(), plain.data(), h * sizeof(int64_t)) == 0);  // computed from RAM all along
}

TEST_CASE("a device that cannot take an expert's format is refused at start, naming it") {
  // The GPU kernels read F32, F16 and BF16; the host device refuses the others alike.
  const MatrixShape gate{WeightFormat::kInt8, 32, 64, 32};
  const MatrixShape down{WeightFormat::kInt8, 64, 32, 32};
  const ExpertLayout layout = ExpertLayout::make(gate, gate, down);
  AlignedBuffer blob(layout.bytes);
  test::HostExpertDevice device;
  test::expect_error([&] { device.upload(layout, blob.data()); }, ErrorCategory::kUnsupported, {"I8G"});
  CHECK_FALSE(ExpertDevice::computes(WeightFormat::kInt8));
  CHECK(ExpertDevice::computes(WeightFormat::kBF16));
}
