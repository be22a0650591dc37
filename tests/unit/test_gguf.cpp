// Tests for common/gguf (GgufFile, GgufValue), common/gguf_split (GgufModelFiles,
// gguf_split_paths) and the type table of common/ggml_type.cpp: a round trip of every
// metadata value type, tensor access, every malformed-file case GgufFile::open
// documents, the split checks, and the files gguf-py's own writer made
// (tests/fixtures/gguf, scripts/gen_gguf_reader_cases.py).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/dtype.h"
#include "common/error.h"
#include "common/ggml_type.h"
#include "common/gguf.h"
#include "common/gguf_split.h"
#include "tests/support/expect_error.h"
#include "tests/support/gguf_writer.h"
#include "tests/support/temp_dir.h"

using namespace charm;
using charm::test::expect_error;
using charm::test::TempDir;
using charm::testing::f32_bytes;
using charm::testing::GgufBuilder;
namespace g = charm::testing::gguf;

namespace {

constexpr uint32_t kF32 = 0, kF16 = 1, kQ8_0 = 8, kBF16 = 30;

std::filesystem::path fixture_dir() { return std::filesystem::path(CHARM_SOURCE_DIR) / "tests/fixtures/gguf"; }

nlohmann::json expected_json() {
  std::ifstream in(fixture_dir() / "expected.json");
  REQUIRE(in.good());
  return nlohmann::json::parse(in);
}

/// A small valid file: two tensors and a little metadata, to corrupt.
GgufBuilder small_model() {
  GgufBuilder b;
  b.kv("general.architecture", g::str("test"));
  b.kv("test.tokens", g::array(8, {g::str("a"), g::str("bc")}));
  b.kv("test.count", g::u32(7));
  b.tensor("a.weight", kF32, {4, 2}, f32_bytes({1, 2, 3, 4, 5, 6, 7, 8}));
  b.tensor("b.weight", kF16, {2}, std::string("\x00\x3c\x00\xc0", 4));  // 1.0, -2.0
  return b;
}

/// Writes `b` and requires open() to fail with kInvalidInput naming the file and `parts`.
void expect_bad(const TempDir& dir, const GgufBuilder& b, const std::vector<std::string>& parts) {
  const auto path = dir / "bad.gguf";
  b.write(path);
  std::vector<std::string> all = parts;
  all.push_back(path.string());
  expect_error([&] { GgufFile::open(path); }, ErrorCategory::kInvalidInput, all);
}

void expect_bad_bytes(const TempDir& dir, const std::string& bytes, const std::vector<std::string>& parts) {
  const auto path = dir / "bad.gguf";
  GgufBuilder::write_to(path, bytes);
  std::vector<std::string> all = parts;
  all.push_back(path.string());
  expect_error([&] { GgufFile::open(path); }, ErrorCategory::kInvalidInput, all);
}

/// A builder holding one tensor, for the tensor-info cases.
GgufBuilder one_tensor(uint32_t type_id, std::vector<uint64_t> ne, std::string data,
                       std::optional<uint64_t> offset = std::nullopt) {
  GgufBuilder b;
  b.tensor("t.weight", type_id, std::move(ne), std::move(data), offset);
  return b;
}

/// Compares a value with its expected.json description {"type", "value"[, "element_type"]}.
void check_value(const GgufValue& v, const nlohmann::json& want) {
  INFO("metadata '" << v.name() << "'");
  const std::string type = want["type"];
  REQUIRE(gguf_value_type_name(v.type()) == type);
  const auto& value = want["value"];
  if (type == "u8" || type == "u16" || type == "u32" || type == "u64") {
    CHECK(v.as_u64() == value.get<uint64_t>());
  } else if (type == "i8" || type == "i16" || type == "i32" || type == "i64") {
    CHECK(v.as_i64() == value.get<int64_t>());
  } else if (type == "f32") {
    CHECK(v.as_f32() == static_cast<float>(value.get<double>()));
  } else if (type == "f64") {
    CHECK(v.as_f64() == value.get<double>());
  } else if (type == "bool") {
    CHECK(v.as_bool() == value.get<bool>());
  } else if (type == "string") {
    CHECK(v.as_string() == value.get<std::string>());
  } else {
    REQUIRE(type == "array");
    CHECK(gguf_value_type_name(v.element_type()) == want["element_type"].get<std::string>());
    REQUIRE(v.size() == value.size());
    for (size_t i = 0; i < value.size(); ++i) {
      if (want["element_type"] == "array") {
        check_value(v.at(i), value[i]);
      } else {
        check_value(v.at(i), {{"type", want["element_type"]}, {"value", value[i]}});
      }
    }
  }
}

}  // namespace

// ---- value round trip -----------------------------------------------------------

TEST_CASE("every metadata value type round-trips, with integer accessors that accept any type that fits") {
  TempDir dir("gguf");
  GgufBuilder b;
  b.kv("u8", g::u8(255)).kv("i8", g::i8(-128)).kv("u16", g::u16(65535)).kv("i16", g::i16(-32768));
  b.kv("u32", g::u32(4294967295u)).kv("i32", g::i32(-2147483647 - 1)).kv("f32", g::f32(0.1f));
  b.kv("bool", g::boolean(true)).kv("no", g::boolean(false)).kv("str", g::str("h\xc3\xa9llo"));
  b.kv("empty", g::str("")).kv("u64", g::u64(UINT64_MAX)).kv("i64", g::i64(INT64_MIN)).kv("f64", g::f64(-1e300));
  b.kv("small", g::u16(7)).kv("neg", g::i8(-1));
  b.kv("a.u8", g::array(0, {g::u8(1), g::u8(200)}));
  b.kv("a.i16", g::array(3, {g::i16(-5), g::i16(5)}));
  b.kv("a.f32", g::array(6, {g::f32(0.5f), g::f32(-2.25f)}));
  b.kv("a.f64", g::array(12, {g::f64(1.0 / 3)}));
  b.kv("a.bool", g::array(7, {g::boolean(true), g::boolean(false)}));
  b.kv("a.str", g::array(8, {g::str("x"), g::str(""), g::str("yz")}));
  b.kv("a.u64", g::array(10, {g::u64(UINT64_MAX), g::u64(3)}));
  b.kv("a.empty", g::array(5, {}));
  b.kv("a.nested", g::array(9, {g::array(5, {g::i32(1), g::i32(-2)}), g::array(8, {g::str("s")}), g::array(4, {})}));
  const auto path = dir / "values.gguf";
  b.write(path);
  const auto f = GgufFile::open(path);

  CHECK(f->version() == 3);
  CHECK(f->metadata().size() == 25);
  CHECK(f->get("u8").as_u64() == 255);
  CHECK(f->get("u8").as_i32() == 255);
  CHECK(f->get("i8").as_i64() == -128);
  CHECK(f->get("u16").as_u32() == 65535);
  CHECK(f->get("i16").as_i32() == -32768);
  CHECK(f->get("u32").as_u64() == 4294967295u);
  CHECK(f->get("i32").as_i32() == INT32_MIN);
  CHECK(f->get("f32").as_f32() == 0.1f);
  CHECK(f->get("f32").as_f64() == static_cast<double>(0.1f));
  CHECK(f->get("bool").as_bool());
  CHECK_FALSE(f->get("no").as_bool());
  CHECK(f->get("str").as_string() == "h\xc3\xa9llo");
  CHECK(f->get("empty").as_string().empty());
  CHECK(f->get("u64").as_u64() == UINT64_MAX);
  CHECK(f->get("i64").as_i64() == INT64_MIN);
  CHECK(f->get("f64").as_f64() == -1e300);
  CHECK(f->get("small").as_i32() == 7);
  CHECK(f->get("small").type() == GgufValueType::kU16);
  CHECK(f->get("neg").as_i64() == -1);
  CHECK(f->find("absent") == nullptr);
  CHECK(f->get("u32").is_integer());
  CHECK_FALSE(f->get("f32").is_integer());
  CHECK(f->get("f64").is_float());

  CHECK(f->get("a.u8").element_type() == GgufValueType::kU8);
  CHECK(f->get("a.u8").as_i64_array() == std::vector<int64_t>{1, 200});
  CHECK(f->get("a.i16").as_i64_array() == std::vector<int64_t>{-5, 5});
  CHECK(f->get("a.f32").as_f32_array() == std::vector<float>{0.5f, -2.25f});
  CHECK(f->get("a.f64").as_f64_array() == std::vector<double>{1.0 / 3});
  CHECK(f->get("a.bool").at(0).as_bool());
  CHECK_FALSE(f->get("a.bool").at(1).as_bool());
  CHECK(f->get("a.str").as_string_array() == std::vector<std::string>{"x", "", "yz"});
  CHECK(f->get("a.str").at(2).as_string() == "yz");
  CHECK(f->get("a.str").at(2).name() == "a.str[2]");
  CHECK(f->get("a.u64").at(0).as_u64() == UINT64_MAX);
  CHECK(f->get("a.empty").size() == 0);
  CHECK(f->get("a.empty").as_i64_array().empty());

  const GgufValue& nested = f->get("a.nested");
  CHECK(nested.element_type() == GgufValueType::kArray);
  REQUIRE(nested.as_array_array().size() == 3);
  CHECK(nested.at(0).as_i64_array() == std::vector<int64_t>{1, -2});
  CHECK(nested.at(1).as_string_array() == std::vector<std::string>{"s"});
  CHECK(nested.at(2).size() == 0);
  CHECK(nested.at(1).name() == "a.nested[1]");
  CHECK(nested.at(1).at(0).name() == "a.nested[1][0]");
}

TEST_CASE("a value read as the wrong type is an error naming the file, the key and both types") {
  TempDir dir("gguf");
  GgufBuilder b;
  b.kv("k.u32", g::u32(5)).kv("k.neg", g::i32(-1)).kv("k.big", g::u64(uint64_t{1} << 40)).kv("k.huge", g::u64(UINT64_MAX));
  b.kv("k.str", g::str("x")).kv("k.f32", g::f32(1.5f)).kv("k.bool", g::boolean(true));
  b.kv("k.arr", g::array(5, {g::i32(1), g::i32(-3)})).kv("k.nest", g::array(9, {g::array(8, {g::str("a")})}));
  const auto path = dir / "types.gguf";
  b.write(path);
  const auto f = GgufFile::open(path);
  const std::string file = path.string();
  using C = ErrorCategory;
  expect_error([&] { f->get("k.u32").as_string(); }, C::kInvalidInput, {file, "'k.u32'", "u32 5", "a string"});
  expect_error([&] { f->get("k.neg").as_u64(); }, C::kInvalidInput, {"'k.neg'", "i32 -1", "u64"});
  expect_error([&] { f->get("k.neg").as_u32(); }, C::kInvalidInput, {"'k.neg'", "u32"});
  expect_error([&] { f->get("k.big").as_u32(); }, C::kInvalidInput, {"'k.big'", "u64 1099511627776", "u32"});
  expect_error([&] { f->get("k.big").as_i32(); }, C::kInvalidInput, {"'k.big'", "i32"});
  expect_error([&] { f->get("k.huge").as_i64(); }, C::kInvalidInput, {"'k.huge'", "i64"});
  expect_error([&] { f->get("k.str").as_u32(); }, C::kInvalidInput, {"'k.str'", "string"});
  expect_error([&] { f->get("k.f32").as_i64(); }, C::kInvalidInput, {"'k.f32'", "f32"});
  expect_error([&] { f->get("k.u32").as_f32(); }, C::kInvalidInput, {"'k.u32'", "f32 or f64"});
  expect_error([&] { f->get("k.bool").as_u32(); }, C::kInvalidInput, {"'k.bool'", "bool"});
  expect_error([&] { f->get("k.u32").as_bool(); }, C::kInvalidInput, {"'k.u32'", "a bool"});
  expect_error([&] { f->get("k.u32").size(); }, C::kInvalidInput, {"'k.u32'", "an array"});
  expect_error([&] { f->get("k.arr").as_string_array(); }, C::kInvalidInput, {"'k.arr'", "array of 2 i32", "strings"});
  expect_error([&] { f->get("k.arr").as_f32_array(); }, C::kInvalidInput, {"'k.arr'", "f32"});
  expect_error([&] { f->get("k.arr").at(2); }, C::kInvalidInput, {"'k.arr'", "2 elements", "element 2"});
  expect_error([&] { f->get("k.arr").at(1).as_u32(); }, C::kInvalidInput, {"'k.arr[1]'", "i32 -3"});
  expect_error([&] { f->get("k.arr").as_array_array(); }, C::kInvalidInput, {"'k.arr'", "arrays"});
  expect_error([&] { f->get("k.nest").at(0).at(0).as_u32(); }, C::kInvalidInput, {"'k.nest[0][0]'", "string"});
  expect_error([&] { f->get("k.nest").as_i64_array(); }, C::kInvalidInput, {"'k.nest'", "integers"});
  expect_error([&] { f->get("absent"); }, C::kInvalidInput, {file, "'absent'", "missing"});
}

// ---- tensors ------------------------------------------------------------------

TEST_CASE("tensor infos: ne and its reversed shape, sizes, absolute offsets, mapped and pread bytes") {
  TempDir dir("gguf");
  GgufBuilder b = small_model();
  std::string q8(2 * 34, '\0');
  for (size_t i = 0; i < q8.size(); ++i) q8[i] = static_cast<char>(i * 7);
  b.tensor("q.weight", kQ8_0, {32, 1, 2}, q8);
  b.tensor("empty.weight", kBF16, {0, 3}, "");
  const auto path = dir / "model.gguf";
  b.write(path);
  const auto f = GgufFile::open(path);

  REQUIRE(f->tensors().size() == 4);
  CHECK(f->tensors()[0].name == "a.weight");  // file order
  CHECK(f->tensors()[3].name == "empty.weight");
  CHECK(f->alignment() == 32);
  CHECK(f->data_offset() == b.data_offset());
  CHECK(f->data_offset() % 32 == 0);

  const GgufTensorInfo& a = *f->find_tensor("a.weight");
  CHECK(a.type == GgmlType::kF32);
  CHECK(a.type_id == 0);
  CHECK(a.ne == std::vector<int64_t>{4, 2});
  CHECK(a.shape() == std::vector<int64_t>{2, 4});
  CHECK(a.numel() == 8);
  CHECK(a.rows() == 2);
  CHECK(a.row_elements() == 4);
  CHECK(a.row_bytes() == 16);
  CHECK(a.nbytes == 32);
  CHECK(a.offset == 0);
  CHECK(a.data_begin == f->data_offset());
  std::vector<float> values(8);
  f->read(a, 0, 32, values.data());
  CHECK(values == std::vector<float>{1, 2, 3, 4, 5, 6, 7, 8});
  float last = 0;
  f->read(a, 28, 4, &last);
  CHECK(last == 8);

  const GgufTensorInfo& bw = *f->find_tensor("b.weight");
  CHECK(bw.offset == 32);  // packed at the next multiple of the alignment
  float widened[2];
  convert_to_f32(DType::kF16, f->mapped(bw), widened, 2);
  CHECK(widened[0] == 1.0f);
  CHECK(widened[1] == -2.0f);

  const GgufTensorInfo& q = *f->find_tensor("q.weight");
  CHECK(q.type == GgmlType::kQ8_0);
  CHECK(q.shape() == std::vector<int64_t>{2, 1, 32});
  CHECK(q.rows() == 2);
  CHECK(q.row_bytes() == 34);
  CHECK(q.nbytes == 68);
  CHECK(std::string(reinterpret_cast<const char*>(f->mapped(q)), 68) == q8);

  const GgufTensorInfo& e = *f->find_tensor("empty.weight");
  CHECK(e.nbytes == 0);
  CHECK(e.numel() == 0);
  CHECK(f->find_tensor("absent") == nullptr);

  using C = ErrorCategory;
  expect_error([&] { f->read(a, 30, 4, values.data()); }, C::kInvalidInput, {path.string(), "'a.weight'", "outside"});
  expect_error([&] { f->read(a, 33, 0, values.data()); }, C::kInvalidInput, {"'a.weight'"});
  GgufTensorInfo forged = a;
  forged.data_begin = f->size();
  forged.nbytes = 1;
  expect_error([&] { f->mapped(forged); }, C::kInvalidInput, {"not inside this file"});
  expect_error([&] { f->read(forged, 0, 1, values.data()); }, C::kInvalidInput, {"not inside this file"});
}

TEST_CASE("general.alignment moves the data section and the offsets; version 2 files read like version 3") {
  TempDir dir("gguf");
  GgufBuilder b = small_model();
  b.version = 2;
  b.set_alignment(256);
  const auto path = dir / "v2.gguf";
  b.write(path);
  const auto f = GgufFile::open(path);
  CHECK(f->version() == 2);
  CHECK(f->alignment() == 256);
  CHECK(f->data_offset() % 256 == 0);
  CHECK(f->find_tensor("b.weight")->offset == 256);
  float first = 0;
  f->read(*f->find_tensor("a.weight"), 0, 4, &first);
  CHECK(first == 1.0f);
}

TEST_CASE("a file with no tensors and no data section opens") {
  TempDir dir("gguf");
  GgufBuilder b;
  b.kv("general.architecture", g::str("x"));
  const auto path = dir / "meta.gguf";
  b.write(path);
  const auto f = GgufFile::open(path);
  CHECK(f->tensors().empty());
  CHECK(f->get("general.architecture").as_string() == "x");
}

// ---- malformed files ------------------------------------------------------------

TEST_CASE("every truncation of a valid file is refused, before the tensor data as inside it") {
  TempDir dir("gguf");
  GgufBuilder b = small_model();
  b.kv("test.nested", g::array(9, {g::array(6, {g::f32(1)}), g::array(8, {g::str("zz")})}));
  const std::string bytes = b.bytes();
  const auto path = dir / "full.gguf";
  GgufBuilder::write_to(path, bytes);
  const auto f = GgufFile::open(path);
  const GgufTensorInfo& last = f->tensors().back();
  const uint64_t end = last.data_begin + last.nbytes;  // the padding after it may go
  for (uint64_t n = 0; n < end; ++n) {
    CAPTURE(n);
    const auto cut = dir / "cut.gguf";
    GgufBuilder::write_to(cut, bytes.substr(0, n));
    expect_error([&] { GgufFile::open(cut); }, ErrorCategory::kInvalidInput, {cut.string()});
  }
  GgufBuilder::write_to(dir / "cut.gguf", bytes.substr(0, end));
  CHECK(GgufFile::open(dir / "cut.gguf")->tensors().size() == 2);
}

TEST_CASE("header errors: short file, magic, version, big-endian, counts the file cannot hold") {
  TempDir dir("gguf");
  expect_bad_bytes(dir, std::string("GGUF\x03\x00\x00\x00", 8), {"8 bytes", "24-byte GGUF header"});
  expect_bad_bytes(dir, "", {"0 bytes", "24-byte GGUF header"});
  GgufBuilder b = small_model();
  b.magic = "GGML";
  expect_bad(dir, b, {"not a GGUF file"});
  b = small_model();
  b.version = 1;
  expect_bad(dir, b, {"version 1", "not supported", "2 and 3"});
  b.version = 4;
  expect_bad(dir, b, {"version 4", "not supported"});
  b.version = 0x03000000;  // 3 written big-endian
  expect_bad(dir, b, {"big-endian", "byte-swapped 3"});
  b = small_model();
  b.kv_count = 60000;  // under the cap, but 60000 pairs take at least 840000 bytes
  expect_bad(dir, b, {"kv_count 60000", "larger than the file could hold"});
  b.kv_count = uint64_t{1} << 40;
  expect_bad(dir, b, {"kv_count 1099511627776", "over charm's limit of 65536"});
  b = small_model();
  b.tensor_count = 60000;
  expect_bad(dir, b, {"tensor_count 60000", "larger than the file could hold"});
  b.tensor_count = UINT64_MAX;
  expect_bad(dir, b, {"tensor_count 18446744073709551615", "over charm's limit of 1048576"});
  b = small_model();
  b.kv_count = 4;  // one more than written: the next "key" is the first tensor info
  const auto path = dir / "bad.gguf";
  b.write(path);
  expect_error([&] { GgufFile::open(path); }, ErrorCategory::kInvalidInput, {path.string()});
}

TEST_CASE("key errors: empty, given twice, over 64 KiB") {
  TempDir dir("gguf");
  GgufBuilder b = small_model();
  b.kv("", g::u8(1));
  expect_bad(dir, b, {"metadata key 3 is empty"});
  b = small_model();
  b.kv("test.count", g::u32(8));
  expect_bad(dir, b, {"'test.count'", "given twice"});
  b = small_model();
  b.kv(std::string(64 * 1024 + 1, 'k'), g::u8(1));
  expect_bad(dir, b, {"metadata key 3", "65537 bytes", "65536-byte limit"});
  b = small_model();
  b.kv(std::string(64 * 1024, 'k'), g::u8(1));  // at the limit: fine
  const auto path = dir / "long.gguf";
  b.write(path);
  CHECK(GgufFile::open(path)->metadata().size() == 4);
}

TEST_CASE("value errors: unknown type, bad bool, strings over 64 MiB or past the end, arrays too deep or too long") {
  TempDir dir("gguf");
  GgufBuilder b = small_model();
  b.kv("k", g::raw(13, "\x01"));
  expect_bad(dir, b, {"'k'", "unknown value type 13"});
  b = small_model();
  b.kv("k", g::raw(7, "\x02"));
  expect_bad(dir, b, {"'k'", "bool", "neither 0 nor 1"});
  b = small_model();
  b.kv("k", g::array_raw(7, 3, std::string("\x01\x00\x05", 3)));
  expect_bad(dir, b, {"'k'", "element 2", "neither 0 nor 1"});
  b = small_model();
  b.kv("k", g::raw(8, g::le<uint64_t>(64 * 1024 * 1024 + 1)));  // no allocation: refused by its length
  expect_bad(dir, b, {"'k'", "67108865 bytes", "67108864-byte limit"});
  b = small_model();
  b.kv("k", g::raw(8, g::le<uint64_t>(5000) + "abc"));
  expect_bad(dir, b, {"truncated", "'k'", "5000 bytes"});
  b = small_model();
  b.kv("k", g::array_raw(99, 1, ""));
  expect_bad(dir, b, {"'k'", "unknown value type 99"});
  b = small_model();
  b.kv("k", g::array(9, {g::array(9, {g::array(0, {g::u8(1)})})}));
  expect_bad(dir, b, {"'k'", "nests arrays 3 deep", "at most 2"});
  b = small_model();
  b.kv("k", g::array(9, {g::array(9, {})}));  // an empty array of arrays at depth 2 declares depth 3
  expect_bad(dir, b, {"'k'", "nests arrays 3 deep"});
  // Inner arrays are capped per file (each costs an object): 65536 in all is fine, one more is not.
  std::string empties;
  for (int i = 0; i < 32768; ++i) empties += g::le<uint32_t>(0) + g::le<uint64_t>(0);
  b = small_model();
  b.kv("k1", g::array_raw(9, 32768, empties)).kv("k2", g::array_raw(9, 32768, empties));
  const auto many = dir / "many.gguf";
  b.write(many);
  CHECK(GgufFile::open(many)->get("k2").as_array_array().size() == 32768);
  b.kv("k3", g::array(9, {g::array(0, {})}));
  expect_bad(dir, b, {"'k3'", "inner arrays to 65537", "limit of 65536"});
  b = small_model();
  b.kv("k", g::array_raw(4, uint64_t{1} << 40, "abcd"));
  expect_bad(dir, b, {"truncated", "'k'", "1099511627776 u32 elements"});
  b = small_model();
  b.kv("k", g::array_raw(8, UINT64_MAX, ""));
  expect_bad(dir, b, {"truncated", "'k'", "string elements"});
  b = small_model();
  b.kv("k", g::array_raw(9, UINT64_MAX / 2, ""));
  expect_bad(dir, b, {"truncated", "'k'", "array elements"});
  b = small_model();
  b.kv("k", g::array_raw(8, 2, g::string_bytes("a") + g::le<uint64_t>(64 * 1024 * 1024 + 1)));
  expect_bad(dir, b, {"'k' element 1", "67108864-byte limit"});
}

TEST_CASE("general.alignment must be a u32 power of two") {
  TempDir dir("gguf");
  GgufBuilder b = small_model();
  b.kv("general.alignment", g::i32(32));
  expect_bad(dir, b, {"'general.alignment'", "i32", "not u32"});
  b = small_model();
  b.kv("general.alignment", g::u32(0));
  expect_bad(dir, b, {"'general.alignment' is 0", "power of two"});
  b = small_model();
  b.alignment = 48;
  b.kv("general.alignment", g::u32(48));
  expect_bad(dir, b, {"'general.alignment' is 48", "power of two"});
}

TEST_CASE("tensor info errors: names, dims, types, block multiples") {
  TempDir dir("gguf");
  const std::string four(16, '\0');
  GgufBuilder b = small_model();
  b.tensor("a.weight", kF32, {4}, four);
  expect_bad(dir, b, {"tensor 'a.weight'", "given twice"});
  expect_bad(dir, one_tensor(kF32, {4}, four).tensor("", kF32, {4}, four), {"tensor info 1 has an empty name"});
  GgufBuilder long_name;
  long_name.tensor(std::string(64 * 1024 + 1, 'n'), kF32, {4}, four);
  expect_bad(dir, long_name, {"tensor info 0 name", "65536-byte limit"});
  expect_bad(dir, one_tensor(kF32, {}, ""), {"'t.weight'", "has 0 dims", "1 to 4"});
  expect_bad(dir, one_tensor(kF32, {1, 1, 1, 1, 1}, four), {"'t.weight'", "has 5 dims"});
  expect_bad(dir, one_tensor(kF32, {4, uint64_t{1} << 63}, four), {"'t.weight'", "ne[1]", "negative"});
  expect_bad(dir, one_tensor(kF32, {uint64_t{1} << 32, uint64_t{1} << 32}, four), {"'t.weight'", "overflows int64"});
  // A zero dim does not hide an overflow in the others (rows() would wrap).
  expect_bad(dir, one_tensor(kF32, {0, uint64_t{1} << 32, uint64_t{1} << 32}, ""), {"'t.weight'", "overflows int64"});
  // The element count fits int64 but the bytes do not fit u64.
  expect_bad(dir, one_tensor(kF32, {uint64_t{1} << 61, 2}, four), {"'t.weight'", "overflows u64"});
  expect_bad(dir, one_tensor(99, {4}, four), {"'t.weight'", "type id 99", "no ggml type"});
  expect_bad(dir, one_tensor(16, {256}, std::string(66, '\0')), {"'t.weight'", "IQ2_XXS (16)", "does not read"});
  expect_bad(dir, one_tensor(28, {1}, std::string(8, '\0')), {"'t.weight'", "F64 (28)"});
  expect_bad(dir, one_tensor(kQ8_0, {33}, std::string(34, '\0')), {"'t.weight'", "ne[0] = 33", "Q8_0", "block of 32"});
  expect_bad(dir, one_tensor(12, {128}, std::string(144, '\0')), {"'t.weight'", "ne[0] = 128", "Q4_K", "256"});
}

TEST_CASE("tensor data errors: misaligned offset, data past the end, overlapping tensors") {
  TempDir dir("gguf");
  const std::string four(16, '\0');
  expect_bad(dir, one_tensor(kF32, {4}, four, 4), {"'t.weight'", "offset 4", "multiple of the alignment 32"});
  const GgufBuilder past = one_tensor(kF32, {4}, four, 1024);
  expect_bad_bytes(dir, past.bytes().substr(0, past.data_offset() + 1024 + 15),
                   {"'t.weight'", "16 bytes at data offset 1024", "past the end of the file"});
  expect_bad(dir, one_tensor(kF32, {4}, four, uint64_t{1} << 62), {"'t.weight'", "past the end of the file"});
  expect_bad(dir, one_tensor(kF32, {4}, four, UINT64_MAX - 31), {"'t.weight'", "past the end of the file"});
  // The data (padded to 32 bytes) is shorter than the 64 bytes the tensor needs.
  expect_bad(dir, one_tensor(kF32, {16}, four), {"'t.weight'", "64 bytes", "past the end"});

  GgufBuilder overlap;
  overlap.tensor("x.weight", kF32, {16}, std::string(64, '\0'), 0);
  overlap.tensor("y.weight", kF32, {4}, four, 32);
  expect_bad(dir, overlap, {"'x.weight'", "'y.weight'", "overlapping"});
  // Two empty tensors at one offset share no byte; an empty one inside another is fine too.
  GgufBuilder empties;
  empties.tensor("x.weight", kF32, {16}, std::string(64, '\0'), 0);
  empties.tensor("y.weight", kF32, {0}, "", 32);
  empties.tensor("z.weight", kF32, {0}, "", 32);
  const auto path = dir / "empties.gguf";
  empties.write(path);
  CHECK(GgufFile::open(path)->tensors().size() == 3);
}

TEST_CASE("files that cannot be opened are io errors") {
  TempDir dir("gguf");
  expect_error([&] { GgufFile::open(dir / "absent.gguf"); }, ErrorCategory::kIo, {"absent.gguf", "cannot open"});
  expect_error([&] { GgufFile::open(dir.path()); }, ErrorCategory::kIo, {"not a regular file"});
}

// ---- the ggml type table ------------------------------------------------------

TEST_CASE("the ggml type table matches gguf-py's GGML_QUANT_SIZES and names every id in it") {
  const nlohmann::json types = expected_json()["ggml_types"];
  REQUIRE(types.size() >= 34);
  const std::vector<GgmlType> named = {GgmlType::kF32,  GgmlType::kF16,  GgmlType::kQ4_0, GgmlType::kQ4_1,
                                       GgmlType::kQ5_0, GgmlType::kQ5_1, GgmlType::kQ8_0, GgmlType::kQ2_K,
                                       GgmlType::kQ3_K, GgmlType::kQ4_K, GgmlType::kQ5_K, GgmlType::kQ6_K,
                                       GgmlType::kBF16, GgmlType::kMXFP4};
  size_t read = 0;
  for (const auto& t : types) {
    const uint32_t id = t["id"];
    CAPTURE(id);
    CHECK(ggml_type_name_of_id(id) == t["name"].get<std::string>());
    const auto traits = ggml_type_traits(id);
    const bool is_named = std::find(named.begin(), named.end(), static_cast<GgmlType>(id)) != named.end();
    CHECK(traits.has_value() == is_named);
    if (!traits) continue;
    ++read;
    CHECK(traits->name == t["name"].get<std::string>());
    CHECK(traits->block_elements == t["block_elements"].get<int64_t>());
    CHECK(traits->block_bytes == t["block_bytes"].get<int64_t>());
    CHECK(static_cast<uint32_t>(traits->type) == id);
    CHECK(ggml_traits(traits->type).block_bytes == traits->block_bytes);
  }
  CHECK(read == named.size());
  CHECK(ggml_type_name_of_id(4) == "type 4");  // Q4_2: removed from ggml
  CHECK(ggml_type_name_of_id(1000) == "type 1000");
  CHECK_FALSE(ggml_type_traits(16).has_value());  // IQ2_XXS: named, not read
  CHECK(ggml_row_bytes(GgmlType::kQ8_0, 64) == 68);
  CHECK(ggml_row_bytes(GgmlType::kQ4_K, 512) == 288);
  CHECK(ggml_row_bytes(GgmlType::kF16, 3) == 6);
  CHECK(ggml_row_bytes(GgmlType::kF32, 0) == 0);
  CHECK_FALSE(ggml_row_bytes(GgmlType::kQ8_0, 33).has_value());
  CHECK_FALSE(ggml_row_bytes(GgmlType::kF32, -4).has_value());
  CHECK_FALSE(ggml_row_bytes(GgmlType::kF32, INT64_MAX).has_value());  // 4 * INT64_MAX overflows u64
}

// ---- interoperability with gguf-py ----------------------------------------------

TEST_CASE("the file gguf-py's GGUFWriter wrote reads as gguf-py reads it") {
  const nlohmann::json want = expected_json();
  const auto f = GgufFile::open(fixture_dir() / "reader_cases.gguf");
  CHECK(f->version() == want["version"].get<uint32_t>());
  CHECK(f->alignment() == want["alignment"].get<uint32_t>());
  CHECK(f->metadata().size() == want["metadata"].size());
  for (const auto& item : want["metadata"].items()) {
    const std::string key = item.key();  // a plain variable: clang's doctest lambdas cannot capture bindings
    const GgufValue* v = f->find(key);
    REQUIRE_MESSAGE(v != nullptr, key);
    check_value(*v, item.value());
  }
  REQUIRE(f->tensors().size() == want["tensors"].size());
  for (size_t i = 0; i < f->tensors().size(); ++i) {
    const GgufTensorInfo& t = f->tensors()[i];
    const auto& w = want["tensors"][i];
    INFO("tensor " << t.name);
    CHECK(t.name == w["name"].get<std::string>());
    CHECK(t.type_id == w["type_id"].get<uint32_t>());
    CHECK(ggml_traits(t.type).name == w["type_name"].get<std::string>());
    CHECK(t.ne == w["ne"].get<std::vector<int64_t>>());
    CHECK(t.data_begin == w["data_begin"].get<uint64_t>());
    CHECK(t.nbytes == w["nbytes"].get<uint64_t>());
    CHECK(t.data_begin % f->alignment() == 0);
    std::string bytes(t.nbytes, '\0');
    f->read(t, 0, t.nbytes, bytes.data());
    std::string hex;
    for (unsigned char c : bytes) {
      static const char* digits = "0123456789abcdef";
      hex += digits[c >> 4];
      hex += digits[c & 15];
    }
    CHECK(hex == w["hex"].get<std::string>());
    CHECK(std::memcmp(f->mapped(t), bytes.data(), bytes.size()) == 0);
    // The unquantised ones widen to the values gguf-py's dequantize gives.
    if (t.type == GgmlType::kF32 || t.type == GgmlType::kF16 || t.type == GgmlType::kBF16) {
      const DType dtype = t.type == GgmlType::kF32 ? DType::kF32 : t.type == GgmlType::kF16 ? DType::kF16 : DType::kBF16;
      std::vector<float> values(t.numel());
      convert_to_f32(dtype, bytes.data(), values.data(), values.size());
      const auto expected = w["f32"].get<std::vector<double>>();
      REQUIRE(values.size() == expected.size());
      for (size_t j = 0; j < values.size(); ++j) CHECK(values[j] == static_cast<float>(expected[j]));
    }
  }
  const GgufTensorInfo& q = *f->find_tensor("q8_0.matrix");
  CHECK(q.shape() == std::vector<int64_t>{2, 64});
  CHECK(q.row_bytes() == 68);
}

// ---- splits -------------------------------------------------------------------

TEST_CASE("gguf-py's split output opens as one model: first file's metadata, one tensor namespace") {
  const nlohmann::json want = expected_json()["split"];
  const auto first = fixture_dir() / want["files"][0].get<std::string>();
  const auto paths = gguf_split_paths(first);
  REQUIRE(paths.size() == want["files"].size());
  for (size_t i = 0; i < paths.size(); ++i) CHECK(paths[i] == fixture_dir() / want["files"][i].get<std::string>());

  const auto model = GgufModelFiles::open(first);
  REQUIRE(model->files().size() == 2);
  CHECK(model->get("test.u32").as_u32() == 7);
  CHECK(model->get("split.count").as_u32() == 2);
  size_t n = 0;
  for (size_t i = 0; i < want["tensors"].size(); ++i) {
    for (const auto& name : want["tensors"][i]) {
      const GgufTensorInfo& t = model->tensor(name.get<std::string>());
      CHECK(t.split == i);
      CHECK(&model->file_of(t) == model->files()[i].get());
      ++n;
    }
  }
  CHECK(model->tensors().size() == n);
  const GgufTensorInfo& cube = model->tensor("bf16.cube");
  uint16_t bits = 0;
  model->read(cube, 0, 2, &bits);
  CHECK(bits == f32_to_bf16(-3.0f));
  CHECK(std::memcmp(model->mapped(cube), &bits, 2) == 0);
  CHECK(model->find_tensor("absent") == nullptr);
  expect_error([&] { model->tensor("absent"); }, ErrorCategory::kInvalidInput, {"'absent'", "not in the model"});
  // Naming a later split is refused with the first's name.
  expect_error([&] { GgufModelFiles::open(fixture_dir() / want["files"][1].get<std::string>()); },
               ErrorCategory::kInvalidInput, {"split 2 of 2", "name the first", want["files"][0].get<std::string>()});
}

namespace {

/// Writes split `no` (0-based) of `count`, holding `tensor` and the split keys.
void write_split(const TempDir& dir, const std::string& prefix, uint32_t no, uint32_t count, const std::string& tensor,
                 int32_t tensors_total, std::optional<uint16_t> split_count_key = std::nullopt) {
  GgufBuilder b;
  if (no == 0) b.kv("general.architecture", g::str("test"));
  b.kv("split.no", g::u16(static_cast<uint16_t>(no)));
  b.kv("split.count", g::u16(split_count_key.value_or(static_cast<uint16_t>(count))));
  b.kv("split.tensors.count", g::i32(tensors_total));
  b.tensor(tensor, kF32, {4}, f32_bytes({1, 2, 3, float(no)}));
  char name[256];
  std::snprintf(name, sizeof name, "%s-%05u-of-%05u.gguf", prefix.c_str(), no + 1, count);
  b.write(dir / name);
}

}  // namespace

TEST_CASE("split names: single files, missing shards, later shards, bad indices") {
  TempDir dir("gguf");
  const auto single = dir / "model.gguf";
  small_model().write(single);
  CHECK(gguf_split_paths(single) == std::vector<std::filesystem::path>{single});
  CHECK(GgufModelFiles::open(single)->files().size() == 1);
  CHECK(GgufModelFiles::open(single)->tensor("b.weight").split == 0);

  write_split(dir, "m", 0, 3, "a", 3);
  write_split(dir, "m", 2, 3, "c", 3);
  expect_error([&] { gguf_split_paths(dir / "m-00001-of-00003.gguf"); }, ErrorCategory::kInvalidInput,
               {"m-00002-of-00003.gguf", "split 2 of 3", "missing"});
  expect_error([&] { gguf_split_paths(dir / "m-00003-of-00003.gguf"); }, ErrorCategory::kInvalidInput,
               {"split 3 of 3", "name the first", (dir / "m-00001-of-00003.gguf").string()});
  expect_error([&] { gguf_split_paths(dir / "m-00000-of-00003.gguf"); }, ErrorCategory::kInvalidInput,
               {"out of range"});
  expect_error([&] { gguf_split_paths(dir / "m-00004-of-00003.gguf"); }, ErrorCategory::kInvalidInput,
               {"out of range"});
  write_split(dir, "m", 1, 3, "b", 3);
  const auto model = GgufModelFiles::open(dir / "m-00001-of-00003.gguf");
  CHECK(model->files().size() == 3);
  CHECK(model->tensor("c").split == 2);
  float last = 0;
  model->read(model->tensor("c"), 12, 4, &last);
  CHECK(last == 2.0f);
}

TEST_CASE("split metadata errors: split.no, split.count, split.tensors.count, a tensor in two splits") {
  TempDir dir("gguf");
  using C = ErrorCategory;
  // split.no of the second file says it is the first.
  write_split(dir, "no", 0, 2, "a", 2);
  {
    GgufBuilder b;
    b.kv("split.no", g::u16(0)).kv("split.count", g::u16(2)).kv("split.tensors.count", g::i32(2));
    b.tensor("b", kF32, {1}, f32_bytes({1}));
    b.write(dir / "no-00002-of-00002.gguf");
  }
  expect_error([&] { GgufModelFiles::open(dir / "no-00001-of-00002.gguf"); }, C::kInvalidInput,
               {"no-00002-of-00002.gguf", "'split.no' is 0", "split 2 of 2"});

  write_split(dir, "cnt", 0, 2, "a", 2, uint16_t{3});
  write_split(dir, "cnt", 1, 2, "b", 2);
  expect_error([&] { GgufModelFiles::open(dir / "cnt-00001-of-00002.gguf"); }, C::kInvalidInput,
               {"cnt-00001-of-00002.gguf", "'split.count' is 3", "say 2 splits"});

  write_split(dir, "tc", 0, 2, "a", 5);
  write_split(dir, "tc", 1, 2, "b", 5);
  expect_error([&] { GgufModelFiles::open(dir / "tc-00001-of-00002.gguf"); }, C::kInvalidInput,
               {"'split.tensors.count' is 5", "hold 2 tensors"});

  write_split(dir, "dup", 0, 2, "same", 2);
  write_split(dir, "dup", 1, 2, "same", 2);
  expect_error([&] { GgufModelFiles::open(dir / "dup-00001-of-00002.gguf"); }, C::kInvalidInput,
               {"dup-00002-of-00002.gguf", "tensor 'same'", "also in", "dup-00001-of-00002.gguf"});

  // A shard renamed to a plain name: its split.count says the others exist.
  write_split(dir, "lone", 0, 3, "a", 3);
  std::filesystem::rename(dir / "lone-00001-of-00003.gguf", dir / "lone.gguf");
  expect_error([&] { GgufModelFiles::open(dir / "lone.gguf"); }, C::kInvalidInput,
               {"lone.gguf", "'split.count' is 3", "other splits"});
  // gguf-split --merge leaves split.count 0 in the merged file: fine.
  {
    GgufBuilder b = small_model();
    b.kv("split.count", g::u16(0));
    b.write(dir / "merged.gguf");
  }
  CHECK(GgufModelFiles::open(dir / "merged.gguf")->tensors().size() == 2);
  // split.* of a wrong type are named.
  {
    GgufBuilder b = small_model();
    b.kv("split.count", g::str("two"));
    b.write(dir / "typed.gguf");
  }
  expect_error([&] { GgufModelFiles::open(dir / "typed.gguf"); }, C::kInvalidInput, {"'split.count'", "string"});
}
