// Tests for common/load_progress.cpp: silent for quick loads, a bar or rate-limited log
// lines for slow ones, always ended; and the coordinator's dense-weight byte count
// (Checkpoint::non_expert_bytes), which is the bar's total. A fake clock, no terminal.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "common/checkpoint.h"
#include "common/load_progress.h"
#include "tests/support/safetensors_writer.h"
#include "tests/support/temp_dir.h"

using charm::LoadProgress;
using charm::LoadProgressOptions;

namespace {

// Records what a LoadProgress writes, on a clock the test moves.
struct Recorder {
  double now = 100.0;
  std::vector<std::string> bars, lines;

  LoadProgressOptions options(bool terminal) {
    LoadProgressOptions o;
    o.terminal = terminal;
    o.now_s = [this] { return now; };
    o.bar = [this](const std::string& s) { bars.push_back(s); };
    o.line = [this](const std::string& s) { lines.push_back(s); };
    return o;
  }
};

constexpr uint64_t kMiB = 1 << 20;

}  // namespace

TEST_CASE("a load that ends within the quiet time shows nothing, not even a final line") {
  Recorder r;
  {
    LoadProgress p("worker w0: pinned experts", 100 * kMiB, r.options(false));
    r.now += 1.0;
    p.add(60 * kMiB);
    r.now += 0.9;
    p.add(40 * kMiB);
    CHECK(p.done_bytes() == 100 * kMiB);
  }
  CHECK(r.lines.empty());
  CHECK(r.bars.empty());
}

TEST_CASE("log lines: the first after the quiet time, then at most one per log_every_s, and a summary") {
  Recorder r;
  LoadProgress p("coordinator: dense weights", 4096 * kMiB, r.options(false));
  r.now += 2.5;
  p.add(1024 * kMiB);
  REQUIRE(r.lines.size() == 1);
  // 1 GiB of 4 GiB in 2.5 s: 410 MiB/s, 3 GiB left at that rate is 7.5 s -> "8 s left".
  CHECK(r.lines[0] == "coordinator: dense weights: 1.0 of 4.0 GiB (25%), 410 MiB/s, 8 s left");
  r.now += 1.0;
  p.add(1024 * kMiB);  // within log_every_s of the last line: counted, not shown
  CHECK(r.lines.size() == 1);
  r.now += 4.5;
  p.add(1024 * kMiB);
  REQUIRE(r.lines.size() == 2);
  CHECK(r.lines[1].find("3.0 of 4.0 GiB (75%)") != std::string::npos);
  p.add(1024 * kMiB);
  p.finish();
  REQUIRE(r.lines.size() == 3);
  CHECK(r.lines[2] == "coordinator: dense weights: 4.0 GiB in 8.0 s (512 MiB/s)");
  p.add(1);  // after finish: counted (capped at the total), never shown
  CHECK(r.lines.size() == 3);
  CHECK(r.bars.empty());
}

TEST_CASE("on a terminal: a bar redrawn in place, ended with a newline, and the summary logged") {
  Recorder r;
  LoadProgress p("worker w1: pinned experts", 10 * kMiB, r.options(true));
  r.now += 3.0;
  p.add(5 * kMiB);
  REQUIRE(r.bars.size() == 1);
  CHECK(r.bars[0].rfind("\rworker w1: pinned experts [###############...............] 5.0 of 10.0 MiB (50%)", 0) == 0);
  r.now += 0.1;  // under bar_every_s
  p.add(1 * kMiB);
  CHECK(r.bars.size() == 1);
  r.now += 0.2;
  p.add(1 * kMiB);
  CHECK(r.bars.size() == 2);
  p.finish();
  REQUIRE(r.bars.size() == 3);
  CHECK(r.bars.back().back() == '\n');
  CHECK(r.bars.back().find("7.0 of 10.0 MiB (70%)") != std::string::npos);
  REQUIRE(r.lines.size() == 1);
  CHECK(r.lines[0].find("stopped before the end") != std::string::npos);  // 7 of 10 MiB loaded
  CHECK(r.lines[0].find("7.0 MiB in 3.3 s") != std::string::npos);
}

TEST_CASE("format_load_progress: small totals in their own unit, no rate before any byte") {
  CHECK(charm::format_load_progress("x", 0, 512, 0.0) == "x: 0.0 of 512.0 B (0%)");
  CHECK(charm::format_load_progress("x", 2048, 4096, 2.0) == "x: 2.0 of 4.0 KiB (50%), 1 KiB/s, 2 s left");
  CHECK(charm::format_load_progress("x", 9999, 4096, 1.0).find("4.0 of 4.0 KiB (100%)") != std::string::npos);
}

TEST_CASE("a zero total never shows anything") {
  Recorder r;
  LoadProgress p("empty", 0, r.options(false));
  r.now += 10;
  p.add(5);
  p.finish();
  CHECK(r.lines.empty());
  CHECK(p.done_bytes() == 0);
}

TEST_CASE("non_expert_bytes counts every tensor but the routed experts' (per-expert and fused names)") {
  charm::test::TempDir dir("progress");
  charm::testing::write_safetensors(
      dir / "model.safetensors",
      {{"model.embed_tokens.weight", charm::DType::kF32, {4, 2}, std::vector<float>(8, 0.5f)},
       {"model.layers.0.mlp.experts.0.gate_proj.weight", charm::DType::kF32, {2, 2}, std::vector<float>(4, 0.5f)},
       {"model.layers.12.mlp.experts.gate_up_proj", charm::DType::kF32, {1, 4, 2}, std::vector<float>(8, 0.5f)},
       {"model.layers.1.mlp.experts_bias", charm::DType::kF32, {2}, std::vector<float>(2, 0.5f)},  // not "<prefix>."
       {"model.layers.x.mlp.experts.0.up_proj.weight", charm::DType::kF32, {2}, std::vector<float>(2, 0.5f)},  // no layer number
       {"model.layers.1.mlp.gate.weight", charm::DType::kF32, {2, 2}, std::vector<float>(4, 0.5f)}});
  charm::testing::write_bytes(dir / "config.json", "{}");
  auto ckpt = charm::Checkpoint::open(dir.path());
  // embed 32 + experts_bias 8 + the unnumbered 8 + gate 16 bytes; the two expert tensors left out.
  CHECK(ckpt->non_expert_bytes(charm::ExpertTensorNames{}) == 32 + 8 + 8 + 16);
}
