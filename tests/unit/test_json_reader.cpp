// Tests for common/json_reader.cpp and for every JSON entry point that goes through it:
// each refuses a document nested too deep or too large with an error naming the file (or
// field) and the limit, instead of crashing in a recursive walk later.
#include <doctest/doctest.h>

#include <filesystem>
#include <string>

#include <nlohmann/json.hpp>

#include "app/status_report.h"
#include "common/checkpoint.h"
#include "common/json_reader.h"
#include "common/safetensors.h"
#include "coordinator/text/chat_template.h"
#include "coordinator/text/jinja/value.h"
#include "coordinator/text/tokenizer.h"
#include "tests/support/expect_error.h"
#include "tests/support/safetensors_writer.h"
#include "tests/support/temp_dir.h"
#include "worker/experts/expert_container.h"
#include "worker/experts/usage_log.h"

namespace fs = std::filesystem;
using charm::ErrorCategory;
using charm::JsonLimits;
using charm::test::expect_error;
using charm::test::TempDir;
using charm::testing::write_bytes;

namespace {

// `depth` nested arrays around `inner`: nested(2, "1") == "[[1]]".
std::string nested(int depth, const std::string& inner = "") {
  return std::string(static_cast<size_t>(depth), '[') + inner + std::string(static_cast<size_t>(depth), ']');
}

// Deep enough that the recursive walks (dump, copies, the template's value conversion)
// overflowed an 8 MiB stack before the limits: 2 MB of brackets.
constexpr int kHostileDepth = 1'000'000;

const fs::path kFixtures = fs::path(CHARM_SOURCE_DIR) / "tests" / "fixtures";

// A copy of a fixture checkpoint directory whose `file` is replaced by `text`.
void copy_fixture_with(const TempDir& dir, const std::string& fixture, const std::string& file,
                       const std::string& text) {
  fs::copy(kFixtures / "models" / fixture, dir.path(), fs::copy_options::recursive);
  write_bytes(dir / file, text);
}

}  // namespace

TEST_CASE("parse_json keeps documents within the depth and size limits") {
  const JsonLimits limits{1000, 3};
  CHECK(charm::parse_json(nested(3, "1"), "doc", limits).dump() == "[[[1]]]");
  CHECK(charm::parse_json("{\"a\": {\"b\": [1]}}", "doc", limits)["a"]["b"][0] == 1);
  CHECK(charm::parse_ordered_json("{\"z\": 1, \"a\": 2}", "doc", limits).begin().key() == "z");
  // One level more, in an array or an object, is refused naming the source and the limit.
  expect_error([&] { charm::parse_json(nested(4, "1"), "doc.json", limits); }, ErrorCategory::kInvalidInput,
               {"doc.json", "limit of 3 levels"});
  expect_error([&] { charm::parse_json("{\"a\": {\"b\": {\"c\": {}}}}", "doc.json", limits); },
               ErrorCategory::kInvalidInput, {"doc.json", "limit of 3"});
  CHECK_THROWS_AS(charm::parse_json(nested(4), "doc", limits), charm::JsonLimitError);
  // Size: counted in bytes of text, before parsing.
  expect_error([&] { charm::parse_json(std::string(1001, ' ') + "1", "big.json", limits); },
               ErrorCategory::kInvalidInput, {"big.json", "1002 bytes", "limit of 1000 bytes"});
  // Numbers a double cannot hold are a limit too; syntax errors are plain Errors.
  CHECK_THROWS_AS(charm::parse_json("[1e400]", "doc", limits), charm::JsonLimitError);
  expect_error(
      [&] {
        try {
          charm::parse_json("[1,", "doc.json", limits);
        } catch (const charm::JsonLimitError&) {
          FAIL("a syntax error is not a limit");  // any other Error goes on to expect_error
        }
      },
      ErrorCategory::kInvalidInput, {"doc.json: not valid JSON"});
}

TEST_CASE("a hostile depth is refused at once, whatever the limits") {
  const std::string text = nested(kHostileDepth);
  expect_error([&] { charm::parse_json(text, "deep.json", charm::kHttpJsonLimits); }, ErrorCategory::kInvalidInput,
               {"deep.json", "limit of 64 levels"});
  expect_error([&] { charm::parse_ordered_json(text, "deep.json", charm::kConfigJsonLimits); },
               ErrorCategory::kInvalidInput, {"deep.json", "limit of 64 levels"});
}

// --- every entry point ---------------------------------------------------------------

TEST_CASE("config.json, generation_config.json and the index nested too deep are refused by name") {
  for (const std::string file : {"config.json", "generation_config.json", "model.safetensors.index.json"}) {
    CAPTURE(file);
    TempDir dir("json-ckpt");
    copy_fixture_with(dir, "qwen3-moe-tiny", file, "{\"x\": " + nested(kHostileDepth) + "}");
    expect_error([&] { charm::Checkpoint::open(dir.path()); }, ErrorCategory::kInvalidInput,
                 {file, "limit of"});
  }
}

TEST_CASE("a safetensors header nested too deep is refused naming the file") {
  TempDir dir("json-st");
  charm::testing::write_raw_safetensors(dir / "x.safetensors", "{\"t\": " + nested(100) + "}", "");
  expect_error([&] { charm::SafetensorsFile::open(dir / "x.safetensors"); }, ErrorCategory::kInvalidInput,
               {"x.safetensors", "header", "limit of 8 levels"});
}

TEST_CASE("tokenizer.json and tokenizer_config.json nested too deep are refused by name") {
  TempDir dir("json-tok");
  write_bytes(dir / "tokenizer.json", "{\"model\": " + nested(kHostileDepth) + "}");
  expect_error([&] { charm::Tokenizer::load(dir / "tokenizer.json"); }, ErrorCategory::kInvalidInput,
               {"tokenizer.json", "limit of 64 levels"});
  write_bytes(dir / "tokenizer_config.json", "{\"chat_template\": \"x\", \"k\": " + nested(kHostileDepth) + "}");
  expect_error([&] { charm::ChatTemplate::load(dir / "tokenizer_config.json"); }, ErrorCategory::kInvalidInput,
               {"tokenizer_config.json", "limit of 64 levels"});
}

TEST_CASE("a usage file nested too deep is ignored with a warning naming it, as any unreadable one") {
  TempDir dir("json-usage");
  write_bytes(dir / "usage.json", "{\"layers\": " + nested(kHostileDepth) + "}");
  std::string warning;
  CHECK(charm::read_usage_file(dir / "usage.json", "", &warning).empty());
  CHECK(warning.find("usage.json") != std::string::npos);
  CHECK(warning.find("limit of 16 levels") != std::string::npos);
}

TEST_CASE("an expert container index nested too deep is refused naming it") {
  TempDir dir("json-container");
  write_bytes(dir / "index.json", "{\"format\": " + nested(kHostileDepth) + "}");
  expect_error([&] { charm::ExpertContainer::open(dir.path(), "0", 1, 1); }, ErrorCategory::kInvalidInput,
               {"index.json", "limit of 16 levels"});
}

TEST_CASE("a /cluster/status reply nested too deep is a protocol error, not a crash") {
  expect_error([&] { charm::parse_cluster_status("{\"workers\": " + nested(kHostileDepth) + "}"); },
               ErrorCategory::kProtocol, {"/cluster/status", "limit of 64 levels"});
}

TEST_CASE("the chat template's value walks are bounded, for passed-in and template-built values") {
  using charm::jinja::kMaxValueDepth;
  // Passed in: from_json refuses what is deeper than its bound (the HTTP limit is far below).
  const auto deep = nlohmann::ordered_json::parse(nested(kMaxValueDepth + 1));
  expect_error([&] { charm::jinja::Value::from_json(deep); }, ErrorCategory::kInvalidInput,
               {"nested deeper than 256"});
  CHECK_NOTHROW(charm::jinja::Value::from_json(nlohmann::ordered_json::parse(nested(kMaxValueDepth))));
  // Built by the template itself: a loop wrapping a list in a list 100000 times, then
  // printed, compared and serialised. jinja2 fails with RecursionError; charm with an error.
  const std::string build = "{%- set ns = namespace(x=[]) %}{%- for i in range(100000) %}{%- set ns.x = [ns.x] %}"
                            "{%- endfor %}";
  for (const std::string use : {"{{ ns.x }}", "{{ ns.x | tojson }}", "{{ ns.x == ns.x }}", "{{ ns.x < ns.x }}"}) {
    CAPTURE(use);
    auto tmpl = charm::ChatTemplate::parse(build + use, "", "");
    expect_error([&] { tmpl->render({}, false); }, ErrorCategory::kInvalidInput, {"nested deeper than 256"});
  }
}

TEST_CASE("a key repeated within one object is refused, naming it and where it is") {
  const JsonLimits limits{1 << 20, 64};
  // Equal keys in different objects are fine.
  CHECK_NOTHROW(charm::parse_json(R"({"a": 1, "b": {"a": 2}, "c": [{"a": 3}, {"a": 4}]})", "doc", limits));
  const auto top = expect_error<charm::JsonDuplicateKeyError>(
      [&] { charm::parse_json(R"({"a": 1, "b": 2, "a": 3})", "doc.json", limits); }, ErrorCategory::kInvalidInput);
  CHECK(top.duplicate().key == "a");
  CHECK(top.duplicate().path.empty());
  CHECK(top.message() == "doc.json: key 'a' appears twice at the top level");
  const auto nested = expect_error<charm::JsonDuplicateKeyError>(
      [&] { charm::parse_ordered_json(R"({"x": [1, {"y": {"k": 1, "k": 1}}]})", "doc.json", limits); },
      ErrorCategory::kInvalidInput);
  CHECK(nested.duplicate().path == std::vector<std::string>{"'x'", "[1]", "'y'"});
  CHECK(nested.message() == "doc.json: key 'k' appears twice in 'x'[1].'y'");
  // After a closed object its keys no longer count; the index of an array counts values
  // and containers alike.
  expect_error([&] { charm::parse_json(R"([{"a": 1}, 2, {"a": 1, "b": [], "b": 0}])", "doc", limits); },
               ErrorCategory::kInvalidInput, {"key 'b' appears twice in [2]"});
}
