// common/json_duplicates.h: the first key repeated within one object, with its path;
// equal keys in different objects, invalid JSON and very deep nesting are not reported.
#include <doctest/doctest.h>

#include <string>

#include "common/json_duplicates.h"

using namespace charm;

TEST_CASE("find_duplicate_key reports the first repeated key and where it is") {
  CHECK_FALSE(find_duplicate_key(R"({"a": 1, "b": {"a": 2}, "c": [{"a": 3}, {"a": 4}]})").has_value());
  const auto top = find_duplicate_key(R"({"a": 1, "b": 2, "a": 3})");
  REQUIRE(top.has_value());
  CHECK(top->key == "a");
  CHECK(top->path.empty());
  CHECK(top->describe() == "key 'a' appears twice at the top level");
  const auto deep = find_duplicate_key(R"({"x": [1, {"y": {"k": 1, "k": 1}}]})");
  REQUIRE(deep.has_value());
  CHECK(deep->path == std::vector<std::string>{"'x'", "[1]", "'y'"});
  CHECK(deep->describe() == "key 'k' appears twice in 'x'[1].'y'");
  CHECK(find_duplicate_key(R"({"a": 1, "a": )").has_value());  // found before the syntax error
  CHECK_FALSE(find_duplicate_key(R"({"a": )").has_value());                     // invalid: the parser reports it
  CHECK_FALSE(find_duplicate_key("[1, 2, 3]").has_value());
}

TEST_CASE("nesting deeper than the limit is skipped, not tracked, and does not confuse the levels above") {
  const size_t depth = kMaxDuplicateKeyDepth + 50;
  std::string deep = "{\"a\": " + std::string(depth, '[') + "{\"k\": 1, \"k\": 2}" + std::string(depth, ']');
  CHECK_FALSE(find_duplicate_key(deep + "}").has_value());
  const auto after = find_duplicate_key(deep + ", \"a\": 0}");
  REQUIRE(after.has_value());
  CHECK(after->key == "a");
  CHECK(after->path.empty());
}
