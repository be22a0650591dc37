// Test support: the one way a test says "this call must fail, and its message must name
// X". Both helpers fail the test case when nothing is thrown (fatal, like REQUIRE), when
// something of another type is thrown (doctest reports the stray exception), and, per
// string, when the message does not contain it (CHECK, so every missing part is listed).
// They return what they caught, for checks beyond "contains" (an exact message, a field
// of a derived error, a string that must be absent).
#pragma once

#include <doctest/doctest.h>

#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "common/error.h"

namespace charm::test {

namespace detail {
inline std::string quoted_list(const std::vector<std::string>& parts) {
  if (parts.empty()) return "(any message)";
  std::string out;
  for (const auto& p : parts) out += (out.empty() ? "'" : ", '") + p + "'";
  return out;
}
}  // namespace detail

/// Runs `fn`; requires it to throw E (charm::Error or a type derived from it) of
/// `category` whose message() contains every string in `parts`. Returns a copy of the
/// error.
template <typename E = Error, typename Fn>
E expect_error(Fn&& fn, ErrorCategory category, const std::vector<std::string>& parts = {}) {
  static_assert(std::is_base_of_v<Error, E>, "expect_error is for charm::Error; use expect_throw");
  try {
    fn();
  } catch (const E& e) {
    CHECK_MESSAGE(e.category() == category, "category is '" << std::string(category_name(e.category())) << "', expected '"
                                                            << std::string(category_name(category)) << "': " << e.message());
    for (const auto& p : parts) {
      CHECK_MESSAGE(e.message().find(p) != std::string::npos, "'" << e.message() << "' does not name '" << p << "'");
    }
    return e;
  }
  FAIL("no error thrown; expected a '" << std::string(category_name(category)) << "' error naming " << detail::quoted_list(parts));
  throw std::logic_error("unreachable: FAIL throws");
}

/// For exceptions that are not charm::Error (the HTTP layer's ApiError) or where the
/// category is not the point: requires `fn` to throw E whose what() contains every string
/// in `parts`. Returns a copy of the exception.
template <typename E, typename Fn>
E expect_throw(Fn&& fn, const std::vector<std::string>& parts = {}) {
  try {
    fn();
  } catch (const E& e) {
    const std::string what = e.what();
    for (const auto& p : parts) CHECK_MESSAGE(what.find(p) != std::string::npos, "'" << what << "' does not name '" << p << "'");
    return e;
  }
  FAIL("nothing thrown; expected an exception naming " << detail::quoted_list(parts));
  throw std::logic_error("unreachable: FAIL throws");
}

}  // namespace charm::test
