// Tests for common/safetensors: dtype round-trips, mapped and pread access, and every
// malformed-header case SafetensorsFile::open documents.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>

#include "common/error.h"
#include "common/safetensors.h"
#include "tests/support/expect_error.h"
#include "tests/support/safetensors_writer.h"
#include "tests/support/temp_dir.h"

using namespace charm;
using charm::test::expect_error;
using charm::test::TempDir;
using charm::testing::TensorSpec;

namespace {

/// Writes a file with the given header text and a data buffer of `data_bytes` zero bytes,
/// then requires open() to fail with kInvalidInput naming the file and `parts`.
void expect_bad_header(const TempDir& dir, const std::string& header, size_t data_bytes,
                       const std::vector<std::string>& parts) {
  const auto path = dir / "bad.safetensors";
  charm::testing::write_raw_safetensors(path, header, std::string(data_bytes, '\0'));
  std::vector<std::string> all = parts;
  all.push_back(path.string());
  expect_error([&] { SafetensorsFile::open(path); }, ErrorCategory::kInvalidInput, all);
}

std::vector<float> read_back(const SafetensorsFile& f, const std::string& name) {
  const TensorInfo& info = f.tensors().at(name);
  std::vector<uint8_t> raw(info.nbytes);
  f.read(info, 0, raw.size(), raw.data());
  std::vector<float> out(info.numel());
  convert_to_f32(info.dtype, raw.data(), out.data(), out.size());
  return out;
}

}  // namespace

TEST_CASE("bf16, f16 and f32 tensors round-trip through write, read and convert_to_f32") {
  TempDir dir("st");
  const auto path = dir / "model.safetensors";
  // Values exactly representable in all three types, including negatives, zero and a
  // subnormal-in-f16 value (2^-20), and one that needs rounding in bf16 but not f32.
  const std::vector<float> exact = {0.0f, -1.5f, 3.25f, 1024.0f, 0.000000953674316f, -0.0078125f};
  charm::testing::write_safetensors(
      path,
      {TensorSpec{"a.f32", DType::kF32, {2, 3}, {1.0f, -2.0f, 0.1f, 1e-30f, 65504.0f, -7.0f}},
       TensorSpec{"b.bf16", DType::kBF16, {3, 2}, exact},
       TensorSpec{"c.f16", DType::kF16, {6}, exact},
       TensorSpec{"d.scalar", DType::kF32, {}, {42.0f}},
       TensorSpec{"e.empty", DType::kF16, {0, 4}, {}}},
      {{"format", "pt"}});
  const auto f = SafetensorsFile::open(path);

  REQUIRE(f->tensors().size() == 5);
  CHECK(f->metadata().at("format") == "pt");
  const TensorInfo& a = f->tensors().at("a.f32");
  CHECK(a.dtype == DType::kF32);
  CHECK(a.shape == std::vector<int64_t>{2, 3});
  CHECK(a.numel() == 6);
  CHECK(a.nbytes == 24);
  CHECK(a.file == path);

  CHECK(read_back(*f, "a.f32") == std::vector<float>{1.0f, -2.0f, 0.1f, 1e-30f, 65504.0f, -7.0f});
  CHECK(read_back(*f, "b.bf16") == exact);
  CHECK(read_back(*f, "c.f16") == exact);
  CHECK(read_back(*f, "d.scalar") == std::vector<float>{42.0f});
  CHECK(f->tensors().at("d.scalar").numel() == 1);
  CHECK(f->tensors().at("e.empty").nbytes == 0);
  CHECK(f->tensors().at("b.bf16").dtype == DType::kBF16);
  CHECK(f->tensors().at("c.f16").dtype == DType::kF16);

  // The mapping and pread see the same bytes.
  const TensorInfo& b = f->tensors().at("b.bf16");
  std::vector<float> via_map(b.numel());
  convert_to_f32(b.dtype, f->mapped(b), via_map.data(), via_map.size());
  CHECK(via_map == exact);
}

TEST_CASE("bf16 rounding to nearest even and f16 specials survive the round-trip") {
  TempDir dir("st");
  const auto path = dir / "r.safetensors";
  const float inf = std::numeric_limits<float>::infinity();
  charm::testing::write_safetensors(
      path, {TensorSpec{"bf", DType::kBF16, {3}, {1.00390625f /* 1+2^-8: ties to even -> 1 */, 1.01171875f, -inf}},
             TensorSpec{"h", DType::kF16, {3}, {inf, -65504.0f, 5.9604645e-08f /* smallest f16 subnormal */}}});
  const auto f = SafetensorsFile::open(path);
  const auto bf = read_back(*f, "bf");
  CHECK(bf[0] == 1.0f);
  CHECK(bf[1] == 1.015625f);  // 1 + 3*2^-8 rounds up to even 1 + 4*2^-8
  CHECK(bf[2] == -inf);
  const auto h = read_back(*f, "h");
  CHECK(h[0] == inf);
  CHECK(h[1] == -65504.0f);
  CHECK(h[2] == 5.9604645e-08f);
}

TEST_CASE("read takes any sub-range with pread and rejects ranges outside the tensor") {
  TempDir dir("st");
  const auto path = dir / "p.safetensors";
  charm::testing::write_safetensors(path, {TensorSpec{"x", DType::kF32, {4, 4}, charm::testing::ramp(16)},
                                           TensorSpec{"y", DType::kF32, {2}, {9.0f, 8.0f}}});
  const auto f = SafetensorsFile::open(path);
  const TensorInfo& x = f->tensors().at("x");
  float row[4];
  f->read(x, 2 * 4 * sizeof(float), sizeof row, row);  // third row
  CHECK(row[0] == 1.0f);
  CHECK(row[3] == 1.375f);
  std::vector<uint8_t> none;
  f->read(x, x.nbytes, 0, none.data());  // empty read at the end is fine

  expect_error([&] { f->read(x, 60, 8, row); }, ErrorCategory::kInvalidInput, {"'x'", path.string(), "outside"});
  expect_error([&] { f->read(x, UINT64_MAX, 2, row); }, ErrorCategory::kInvalidInput, {"'x'"});

  // A TensorInfo lying about its offset (e.g. from another file) is rejected, not read.
  TensorInfo forged = x;
  forged.data_begin = 1u << 30;
  expect_error([&] { f->read(forged, 0, 4, row); }, ErrorCategory::kInvalidInput, {"not inside"});
  expect_error([&] { f->mapped(forged); }, ErrorCategory::kInvalidInput, {"not inside"});
}

TEST_CASE("open reports a missing file as an io error naming it") {
  TempDir dir("st");
  expect_error([&] { SafetensorsFile::open(dir / "absent.safetensors"); }, ErrorCategory::kIo, {"absent.safetensors"});
  expect_error([&] { SafetensorsFile::open(dir.path()); }, ErrorCategory::kIo, {dir.path().string()});
}

TEST_CASE("open rejects a file shorter than 8 bytes") {
  TempDir dir("st");
  const auto path = dir / "short.safetensors";
  charm::testing::write_bytes(path, "abc");
  expect_error([&] { SafetensorsFile::open(path); }, ErrorCategory::kInvalidInput, {path.string(), "shorter than"});
  charm::testing::write_bytes(path, "");
  expect_error([&] { SafetensorsFile::open(path); }, ErrorCategory::kInvalidInput, {path.string(), "0 bytes"});
}

TEST_CASE("open rejects a header length past the end of the file or over 100 MB") {
  TempDir dir("st");
  const auto path = dir / "len.safetensors";
  charm::testing::write_bytes(path, charm::testing::length_prefix(100) + "{}");
  expect_error([&] { SafetensorsFile::open(path); }, ErrorCategory::kInvalidInput, {path.string(), "past the end"});
  charm::testing::write_bytes(path, charm::testing::length_prefix(100'000'001) + "{}");
  expect_error([&] { SafetensorsFile::open(path); }, ErrorCategory::kInvalidInput, {path.string(), "100 MB"});
  charm::testing::write_bytes(path, charm::testing::length_prefix(UINT64_MAX) + "{}");
  expect_error([&] { SafetensorsFile::open(path); }, ErrorCategory::kInvalidInput, {path.string()});
}

TEST_CASE("open rejects header JSON that does not parse or is not an object") {
  TempDir dir("st");
  expect_bad_header(dir, "{\"a\": ", 0, {"not valid JSON"});
  expect_bad_header(dir, "[1, 2]", 0, {"not an object"});
  expect_bad_header(dir, "\"text\"", 0, {"not an object"});
  expect_bad_header(dir, "{\"__metadata__\": [1]}", 0, {"__metadata__"});
  expect_bad_header(dir, "{\"__metadata__\": {\"k\": 1}}", 0, {"__metadata__", "'k'"});
}

TEST_CASE("open rejects entries missing dtype, shape or data_offsets, or with wrong JSON types") {
  TempDir dir("st");
  expect_bad_header(dir, R"({"w": {"shape": [1], "data_offsets": [0, 4]}})", 4, {"'w'", "missing 'dtype'"});
  expect_bad_header(dir, R"({"w": {"dtype": "F32", "data_offsets": [0, 4]}})", 4, {"'w'", "missing 'shape'"});
  expect_bad_header(dir, R"({"w": {"dtype": "F32", "shape": [1]}})", 4, {"'w'", "missing 'data_offsets'"});
  expect_bad_header(dir, R"({"w": 7})", 4, {"'w'", "not a JSON object"});
  expect_bad_header(dir, R"({"w": {"dtype": 1, "shape": [1], "data_offsets": [0, 4]}})", 4, {"'w'", "'dtype'"});
  expect_bad_header(dir, R"({"w": {"dtype": "F32", "shape": 1, "data_offsets": [0, 4]}})", 4, {"'w'", "'shape'"});
  expect_bad_header(dir, R"({"w": {"dtype": "F32", "shape": [1.5], "data_offsets": [0, 4]}})", 4,
                    {"'w'", "non-integer"});
  expect_bad_header(dir, R"({"w": {"dtype": "F32", "shape": ["1"], "data_offsets": [0, 4]}})", 4,
                    {"'w'", "non-integer"});
  expect_bad_header(dir, R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0]}})", 4, {"'w'", "data_offsets"});
  expect_bad_header(dir, R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": "0-4"}})", 4,
                    {"'w'", "data_offsets"});
  expect_bad_header(dir, R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, "4"]}})", 4,
                    {"'w'", "data_offsets"});
  expect_bad_header(dir, R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [-4, 4]}})", 4,
                    {"'w'", "data_offsets"});
}

TEST_CASE("open rejects unknown dtypes and negative or overflowing dims") {
  TempDir dir("st");
  expect_bad_header(dir, R"({"w": {"dtype": "F64", "shape": [1], "data_offsets": [0, 8]}})", 8,
                    {"'w'", "unknown dtype 'F64'"});
  expect_bad_header(dir, R"({"w": {"dtype": "F32", "shape": [2, -1], "data_offsets": [0, 0]}})", 0,
                    {"'w'", "negative dimension"});
  expect_bad_header(dir, R"({"w": {"dtype": "F32", "shape": [4294967296, 4294967296], "data_offsets": [0, 0]}})", 0,
                    {"'w'", "overflows"});
}

TEST_CASE("open rejects bad data_offsets: end before begin, past the buffer, wrong byte count") {
  TempDir dir("st");
  expect_bad_header(dir, R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [8, 4]}})", 8,
                    {"'w'", "end before begin"});
  expect_bad_header(dir, R"({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}})", 4,
                    {"'w'", "past the end of the data buffer"});
  expect_bad_header(dir, R"({"w": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}})", 8,
                    {"'w'", "needs 3 x 4"});
  expect_bad_header(dir, R"({"w": {"dtype": "BF16", "shape": [2, 2], "data_offsets": [0, 16]}})", 16,
                    {"'w'", "needs 4 x 2"});
}

TEST_CASE("open rejects tensors whose byte ranges overlap, naming both") {
  TempDir dir("st");
  expect_bad_header(dir,
                    R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                        "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}})",
                    12, {"'a'", "'b'", "overlapping"});
  // Adjacent ranges and empty tensors sitting inside another's range are fine.
  const auto path = dir / "ok.safetensors";
  charm::testing::write_raw_safetensors(path,
                                        R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
                                            "z": {"dtype": "F32", "shape": [0], "data_offsets": [2, 2]},
                                            "b": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}})",
                                        std::string(8, '\0'));
  CHECK(SafetensorsFile::open(path)->tensors().size() == 3);
}

TEST_CASE("open rejects a tensor name, __metadata__ or an entry's key given twice (JSON keeps the last silently)") {
  TempDir dir("st");
  const std::string w = R"("w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]})";
  expect_bad_header(dir, "{" + w + ", " + w + "}", 4, {"tensor 'w' appears twice in the header"});
  expect_bad_header(dir, R"({"__metadata__": {}, "__metadata__": {"a": "b"}})", 0, {"'__metadata__' appears twice"});
  expect_bad_header(dir, R"({"w": {"dtype": "F16", "dtype": "F32", "shape": [1], "data_offsets": [0, 4]}})", 4,
                    {"header: key 'dtype' appears twice in 'w'"});
  expect_bad_header(dir, R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}, "__metadata__": {"k": "1", "k": "2"}})",
                    4, {"key 'k' appears twice in '__metadata__'"});
  // Distinct names in different objects are fine.
  charm::testing::write_raw_safetensors(dir / "ok.safetensors",
                                        R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}, "__metadata__": {"w": "x"}})",
                                        std::string(4, '\0'));
  CHECK(SafetensorsFile::open(dir / "ok.safetensors")->tensors().size() == 1);
}
