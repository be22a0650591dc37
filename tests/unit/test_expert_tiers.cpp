// The tier invariant at the executor: whatever tier serves an expert (all resident, one
// LRU slot per layer, prefetched, read from the checkpoint or from an expert container,
// pread or O_DIRECT), every output row has the same bits — and the same bits as the f32
// path of issue 2 (load_expert to f32, then linear_serial). Every fixture family,
// including fp8 experts (kept block-scaled in RAM, widened to f32 in a container).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "common/checkpoint.h"
#include "common/error.h"
#include "common/fixed_point.h"
#include "common/fingerprint.h"
#include "common/kernels.h"
#include "common/matmul.h"
#include "common/model_config.h"
#include "coordinator/models/checkpoint_families.h"
#include "tests/support/expect_error.h"
#include "tests/support/host_expert_device.h"
#include "tests/support/safetensors_writer.h"
#include "tests/support/temp_dir.h"
#include "worker/experts/expert_container.h"
#include "worker/experts/expert_convert.h"
#include "worker/experts/expert_executor.h"
#include "worker/experts/expert_manifest.h"

using namespace charm;
namespace fs = std::filesystem;

namespace {

const fs::path kModels = fs::path(CHARM_SOURCE_DIR) / "tests/fixtures/models";

struct Case {
  std::unique_ptr<Checkpoint> checkpoint;
  ModelConfig config;
  std::vector<ExpertKey> all;
  std::vector<float> hidden;
  std::vector<ExpertAssignment> assignments;
  uint32_t rows = 5;
  int64_t H, I;
  ExpertTensorNames names;
  ExpertIdentities identities;  // every expert's, hashed from the checkpoint

  explicit Case(const std::string& name) {
    checkpoint = Checkpoint::open(kModels / name);
    config = ModelConfig::parse(checkpoint->config_json(), name, checkpoint_families());
    H = config.hidden_size;
    I = config.moe_intermediate_size;
    names = config.expert_tensors;
    for (int64_t l : config.moe_layer_ids()) {
      for (int64_t e = 0; e < config.num_experts; ++e) all.emplace_back(l, e);
    }
    identities = hash_expert_identities(*checkpoint, names, all, H, I);
    hidden.resize(rows * H);
    for (size_t i = 0; i < hidden.size(); ++i) hidden[i] = std::cos(0.731f * static_cast<float>(i)) * 2.0f;
    // Every expert at least once, several rows per expert, in a scrambled order.
    const auto E = static_cast<uint32_t>(config.num_experts);
    for (uint32_t r = 0; r < rows; ++r) {
      for (uint32_t k = 0; k < E; k += 2) assignments.push_back({r, (k * 7 + r) % E, 0.25f + 0.125f * float(k)});
    }
  }

  /// The fixed-point sums ([rows, H]) of every MoE layer, concatenated.
  std::vector<int64_t> run(const ExpertStore& store, bool prefetch_first = false) const {
    ExpertExecutor executor(store);
    std::vector<int64_t> out;
    for (int64_t layer : config.moe_layer_ids()) {
      if (prefetch_first) store.prefetch(static_cast<uint32_t>(layer), {1, 3, 5});
      std::vector<int64_t> y(size_t{rows} * H, 0);
      const LayerStats s = executor.run_into(static_cast<uint32_t>(layer), hidden.data(), rows, assignments, y.data());
      CHECK(s.hits + s.misses == s.experts_computed);
      out.insert(out.end(), y.begin(), y.end());
    }
    return out;
  }

  /// Issue 2's computation: f32 weights, linear_serial, SwiGLU; each output weighted into
  /// its row's fixed-point sum in assignment order.
  std::vector<int64_t> reference() const {
    std::vector<int64_t> out;
    uint64_t saturated = 0;
    for (int64_t layer : config.moe_layer_ids()) {
      std::vector<int64_t> sums(size_t{rows} * H, 0);
      for (const auto& a : assignments) {
        const ExpertWeights w = checkpoint->load_expert(names, static_cast<int>(layer),
                                                        static_cast<int>(a.expert), H, I);
        std::vector<float> g(I), u(I), y(H);
        linear_serial(hidden.data() + a.row * H, 1, w.gate.data(), H, I, g.data());
        linear_serial(hidden.data() + a.row * H, 1, w.up.data(), H, I, u.data());
        for (int64_t i = 0; i < I; ++i) g[i] = silu(g[i]) * u[i];
        linear_serial(g.data(), 1, w.down.data(), I, H, y.data());
        add_weighted_term(y.data(), a.weight, static_cast<size_t>(H), sums.data() + a.row * H, saturated);
      }
      out.insert(out.end(), sums.begin(), sums.end());
    }
    CHECK(saturated == 0);
    return out;
  }

  /// A store over `source` with `ram` bytes of RAM slots (nullopt: all resident) and, when
  /// `vram_experts` > 0, a VRAM tier of that many experts on the host stand-in device.
  std::unique_ptr<ExpertStore> store(std::unique_ptr<ExpertSource> source, std::optional<uint64_t> ram,
                                     int io_threads = 4, size_t vram_experts = 0) const {
    StoreOptions o;
    o.ram_bytes = ram;
    o.io_threads = io_threads;
    o.pin = PinMode::kNone;
    o.activation = config.expert_activation;
    if (vram_experts) {
      o.vram_bytes = vram_experts * align_up(source->layout(all[0])->bytes, kRecordAlignment);
      o.vram_device = std::make_shared<test::HostExpertDevice>();
    }
    return std::make_unique<ExpertStore>(std::move(source), all, H, I, o);
  }
  std::unique_ptr<ExpertSource> from_checkpoint() const {
    return std::make_unique<CheckpointSource>(*checkpoint, names, all, H, I, identities);
  }
};

template <typename T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

}  // namespace

TEST_CASE("expert outputs are bit-identical for every tier, budget and source") {
  for (const char* name : {"qwen3-moe-tiny", "olmoe-tiny", "qwen2-moe-tiny", "mixtral-tiny", "deepseek-v3-tiny", "deepseek-v3-tiny-fp8",
                           "glm4-moe-tiny", "kimi-k2-tiny", "minimax-m2-tiny", "glm-moe-dsa-tiny",
                           "qwen3-next-tiny", "qwen3.5-moe-tiny", "deepseek-v32-tiny"}) {
    INFO(name);
    const Case c(name);
    const std::vector<int64_t> want = c.reference();
    // `slots` slots per MoE layer for experts as `source` stores them.
    auto budget = [&](const ExpertSource& source, uint64_t slots) {
      return align_up(source.layout(c.all[0])->bytes, kRecordAlignment) * c.config.moe_layer_ids().size() * slots;
    };

    auto full = c.store(c.from_checkpoint(), std::nullopt);
    CHECK(same_bits(c.run(*full), want));
    CHECK(full->total_stats().misses == 0);

    auto tiny = c.store(c.from_checkpoint(), budget(*c.from_checkpoint(), 1), 1);
    CHECK(same_bits(c.run(*tiny), want));
    CHECK(tiny->cache().slot_count() == c.config.moe_layer_ids().size());
    const TierCounters t = tiny->total_stats();
    CHECK(t.misses >= c.all.size());
    CHECK(t.bytes_read > 0);
    CHECK(t.disk_ns > 0);

    test::TempDir dir("charm-tiers");
    ConvertOptions o;
    o.out = dir.path();
    o.progress = false;
    convert_experts(*c.checkpoint, c.config, c.all, o);
    const std::string fp = model_fingerprint(*c.checkpoint);
    auto container = [&](IoMode io = IoMode::kPread) { return ExpertContainer::open(dir.path(), fp, c.H, c.I, io); };
    const uint64_t one_per_layer = budget(*container(), 1);
    CHECK(same_bits(c.run(*c.store(container(), std::nullopt)), want));
    CHECK(same_bits(c.run(*c.store(container(), one_per_layer)), want));
    auto two = c.store(container(), 2 * one_per_layer);
    CHECK(same_bits(c.run(*two, /*prefetch_first=*/true), want));
    CHECK(two->total_stats().prefetch_issued > 0);

    std::unique_ptr<ExpertContainer> direct;
    try {
      direct = container(IoMode::kODirect);
    } catch (const Error& e) {
      MESSAGE("O_DIRECT not checked: this file system refuses it (" << e.message() << ")");
    }
    if (direct) CHECK(same_bits(c.run(*c.store(std::move(direct), one_per_layer)), want));

    // The VRAM tier (issue 19, the executor's split between device and CPU): half the
    // experts there, the rest through one RAM slot per layer. The device is the host
    // stand-in, so this checks the tier's plumbing; tests/gpu/ checks the GPU's bits.
    const WeightFormat format = c.from_checkpoint()->layout(c.all[0])->gate.shape.format;
    if (ExpertDevice::computes(format)) {
      auto vram = c.store(c.from_checkpoint(), budget(*c.from_checkpoint(), 1), 1, c.all.size() / 2);
      CHECK(same_bits(c.run(*vram), want));
      CHECK(vram->total_stats().vram_hits > 0);
      CHECK(vram->total_stats().vram_hits < vram->total_stats().hits + vram->total_stats().misses);
    } else {
      test::expect_error([&] { c.store(c.from_checkpoint(), std::nullopt, 1, 2); }, ErrorCategory::kUnsupported,
                         {weight_format_name(format)});
    }
  }
}

// gpt-oss's experts (ExpertTensorNames::gpt_oss_layout): the store transposes gate_up_proj
// [E, H, 2I] (gate even columns, up odd) and down_proj [E, I, H] into [out, in] blobs with
// f32 biases; every tier gives the bits of the f32 path written out from the whole tensors
// as GptOssExperts computes: gate_up = x @ W + b, the clamped SwiGLU, down = act @ W + b.
TEST_CASE("gpt-oss experts: every tier gives the bits of the f32 GptOssExperts path; convert refuses them") {
  const Case c("gpt-oss-tiny");
  const int64_t E = c.config.num_experts, H = c.H, I = c.I;
  const float limit = 2.5f, alpha = 1.702f;  // gpt-oss-tiny's swiglu_limit, GptOssConfig's swiglu_alpha
  CHECK(c.config.expert_activation.limit == limit);
  std::vector<int64_t> want;  // each layer's fixed-point sums, as Case::reference builds them
  uint64_t saturated = 0;
  for (int64_t layer : c.config.moe_layer_ids()) {
    std::vector<int64_t> sums(size_t{c.rows} * H, 0);
    const std::string p = "model.layers." + std::to_string(layer) + ".mlp.experts.";
    const std::vector<float> gate_up = c.checkpoint->load_f32(p + "gate_up_proj", {E, H, 2 * I});
    const std::vector<float> gate_up_bias = c.checkpoint->load_f32(p + "gate_up_proj_bias", {E, 2 * I});
    const std::vector<float> down = c.checkpoint->load_f32(p + "down_proj", {E, I, H});
    const std::vector<float> down_bias = c.checkpoint->load_f32(p + "down_proj_bias", {E, H});
    for (const auto& a : c.assignments) {
      const float* x = c.hidden.data() + a.row * H;
      std::vector<float> wg(I * H), wu(I * H), wd(H * I), act(I), y(H);
      for (int64_t h = 0; h < H; ++h) {
        for (int64_t i = 0; i < I; ++i) {
          wg[i * H + h] = gate_up[(a.expert * H + h) * 2 * I + 2 * i];
          wu[i * H + h] = gate_up[(a.expert * H + h) * 2 * I + 2 * i + 1];
          wd[h * I + i] = down[(a.expert * I + i) * H + h];
        }
      }
      std::vector<float> g(I), u(I);
      linear_serial(x, 1, wg.data(), H, I, g.data());
      linear_serial(x, 1, wu.data(), H, I, u.data());
      for (int64_t i = 0; i < I; ++i) {
        const float gi = std::min(g[i] + gate_up_bias[a.expert * 2 * I + 2 * i], limit);
        const float ui = std::clamp(u[i] + gate_up_bias[a.expert * 2 * I + 2 * i + 1], -limit, limit);
        act[i] = (ui + 1.0f) * (gi * (1.0f / (1.0f + std::exp(-(gi * alpha)))));
      }
      linear_serial(act.data(), 1, wd.data(), I, H, y.data());
      for (int64_t h = 0; h < H; ++h) y[h] = y[h] + down_bias[a.expert * H + h];
      add_weighted_term(y.data(), a.weight, static_cast<size_t>(H), sums.data() + a.row * H, saturated);
    }
    want.insert(want.end(), sums.begin(), sums.end());
  }
  CHECK(saturated == 0);
  auto store = [&](std::optional<uint64_t> ram) {
    StoreOptions o;
    o.ram_bytes = ram;
    o.pin = PinMode::kNone;
    o.activation = c.config.expert_activation;
    return std::make_unique<ExpertStore>(c.from_checkpoint(), c.all, H, I, o);
  };
  const uint64_t slot = align_up(c.from_checkpoint()->layout(c.all[0])->bytes, kRecordAlignment);
  CHECK(c.from_checkpoint()->layout(c.all[0])->has_biases());
  CHECK(same_bits(c.run(*store(std::nullopt)), want));
  CHECK(same_bits(c.run(*store(slot * c.config.moe_layer_ids().size())), want));  // one LRU slot per layer
  // Half in VRAM (the host stand-in): the device's projections with the biases, the
  // clamped SwiGLU on the host.
  auto vram = c.store(c.from_checkpoint(), std::nullopt, 1, c.all.size() / 2);
  CHECK(same_bits(c.run(*vram), want));
  CHECK(vram->total_stats().vram_hits > 0);
  // A plain SwiGLU store (the activation forgotten) or dropped biases would differ.
  StoreOptions plain;
  plain.pin = PinMode::kNone;
  CHECK_FALSE(same_bits(c.run(ExpertStore(c.from_checkpoint(), c.all, H, I, plain)), want));

  test::TempDir dir("charm-tiers-gpt-oss");
  ConvertOptions o;
  o.out = dir.path();
  o.progress = false;
  test::expect_error([&] { convert_experts(*c.checkpoint, c.config, c.all, o); }, ErrorCategory::kUnsupported,
                     {"gpt-oss experts", "cannot be converted into an expert container yet"});
}

TEST_CASE("matmul_serial over bf16 and f16 rows equals linear_serial over their f32 values") {
  const int64_t rows = 7, cols = 37;  // a tail past the 8-wide blocks
  std::vector<float> w(rows * cols), x(cols);
  for (size_t i = 0; i < w.size(); ++i) w[i] = std::sin(0.3f * static_cast<float>(i)) * 3.0f;
  for (size_t i = 0; i < x.size(); ++i) x[i] = std::cos(0.7f * static_cast<float>(i));
  for (DType dtype : {DType::kBF16, DType::kF16, DType::kF32}) {
    const std::string bytes = testing::encode(dtype, w);
    std::vector<float> widened(w.size());
    convert_to_f32(dtype, bytes.data(), widened.data(), w.size());
    std::vector<float> want(rows), got(rows);
    linear_serial(x.data(), 1, widened.data(), cols, rows, want.data());
    alignas(64) uint8_t data[rows * cols * 4];
    std::memcpy(data, bytes.data(), bytes.size());
    MatrixView m{MatrixShape{weight_format_of(dtype), rows, cols, 0}, data, nullptr};
    matmul_serial(m, x.data(), 1, nullptr, got.data());
    CHECK(same_bits(got, want));
  }
}

TEST_CASE("int8 / int4 quantisation: per-weight error within half a step; odd widths and short last groups") {
  const int64_t rows = 3, cols = 45, group = 16;  // groups of 16, 16, 13; odd int4 row
  std::vector<float> w(rows * cols);
  for (size_t i = 0; i < w.size(); ++i) w[i] = std::sin(1.3f * static_cast<float>(i)) * (1 + i % 5);
  for (WeightFormat f : {WeightFormat::kInt8, WeightFormat::kInt4}) {
    MatrixShape s{f, rows, cols, group};
    CHECK(s.groups_per_row() == 3);
    std::vector<uint8_t> data(s.data_bytes());
    std::vector<float> scales(s.scale_bytes() / 4);
    quantize_matrix(w.data(), s, data.data(), scales.data());
    MatrixView m{s, data.data(), scales.data()};
    std::vector<float> row(cols);
    for (int64_t r = 0; r < rows; ++r) {
      matrix_row_to_f32(m, r, row.data());
      for (int64_t i = 0; i < cols; ++i) {
        const float step = scales[r * 3 + i / group];
        CHECK(std::fabs(row[i] - w[r * cols + i]) <= 0.5f * step * 1.0001f);
      }
    }
  }
  MatrixShape bad{WeightFormat::kBF16, 1, 1, 0};
  float one = 1;
  uint8_t out[4];
  CHECK_THROWS_AS(quantize_matrix(&one, bad, out, &one), Error);
}
