// Test support: assert that a call throws charm::Error of a given category whose message
// names everything it should (file, tensor, key, problem).
#pragma once

#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "common/error.h"

namespace charm::test {

/// Runs `fn`, requires it to throw charm::Error of `category` whose message contains
/// every string in `parts`.
template <typename Fn>
void expect_error(Fn&& fn, ErrorCategory category, const std::vector<std::string>& parts) {
  try {
    fn();
    FAIL("expected a charm::Error containing '" << parts.front() << "'");
  } catch (const Error& e) {
    CHECK_MESSAGE(e.category() == category, std::string(e.what()));
    for (const auto& p : parts) CHECK_MESSAGE(e.message().find(p) != std::string::npos, std::string(e.what()) << " lacks " << p);
  }
}

}  // namespace charm::test
