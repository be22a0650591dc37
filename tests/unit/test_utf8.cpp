// common/utf8 tests: well-formed 1-4 byte sequences, overlong forms, surrogates, truncated
// sequences, and lossy replacement counts checked against Python 3.11's
// bytes.decode("utf-8", "replace") (expected values computed with python3, noted per case).
#include <doctest/doctest.h>

#include <string>

#include "common/utf8.h"

using namespace std::string_literals;

namespace {

size_t count_replacements(const std::u32string& s) {
  size_t n = 0;
  for (char32_t c : s) n += c == charm::kReplacementChar;
  return n;
}

size_t sequence_length(const std::string& s, size_t i = 0) {
  size_t prefix = 0;
  return charm::utf8_sequence_length(s, i, &prefix);
}

size_t valid_prefix(const std::string& s, size_t i = 0) {
  size_t prefix = 0;
  charm::utf8_sequence_length(s, i, &prefix);
  return prefix;
}

}  // namespace

TEST_CASE("well-formed 1-4 byte sequences encode, validate and decode") {
  const std::u32string cps = U"A\u00E9\u20AC\U0001F600\U0010FFFF";  // A é € 😀 max
  const std::string utf8 = "A\xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80\xF4\x8F\xBF\xBF";
  std::string encoded;
  for (char32_t cp : cps) charm::append_utf8(encoded, cp);
  CHECK(encoded == utf8);
  CHECK(charm::is_valid_utf8(utf8));
  CHECK(charm::is_valid_utf8(""));
  CHECK(sequence_length(utf8, 0) == 1);
  CHECK(sequence_length(utf8, 1) == 2);
  CHECK(sequence_length(utf8, 3) == 3);
  CHECK(sequence_length(utf8, 6) == 4);
  CHECK(charm::utf8_lossy(utf8) == utf8);
  CHECK(charm::decode_utf8_lossy(utf8) == cps);
  CHECK(charm::decode_utf8_unchecked(utf8) == cps);
  CHECK(charm::decode_utf8_surrogateescape(utf8) == cps);
  CHECK(charm::encode_utf8_surrogateescape(cps) == utf8);
  // Boundaries of each width.
  CHECK(charm::decode_utf8_lossy("\x7F\xC2\x80\xDF\xBF\xE0\xA0\x80\xEF\xBF\xBF\xF0\x90\x80\x80") ==
        U"\u007F\u0080\u07FF\u0800\uFFFF\U00010000");
}

TEST_CASE("overlong forms are invalid; lossy replaces each byte as Python does") {
  // python3: b"\xc0\x80".decode("utf-8", "replace") -> 2 x U+FFFD
  CHECK_FALSE(charm::is_valid_utf8("\xC0\x80"s));
  CHECK(sequence_length("\xC0\x80"s) == 0);
  CHECK(charm::decode_utf8_lossy("\xC0\x80"s) == U"\uFFFD\uFFFD");
  // python3: b"\xe0\x80\xaf" -> 3 x U+FFFD (overlong '/')
  CHECK_FALSE(charm::is_valid_utf8("\xE0\x80\xAF"));
  CHECK(valid_prefix("\xE0\x80\xAF") == 1);
  CHECK(charm::utf8_lossy("\xE0\x80\xAF") == "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");
  // The unchecked and surrogateescape decoders do not look for overlong forms.
  CHECK(charm::decode_utf8_unchecked("\xC0\x80"s) == std::u32string(1, U'\0'));
  CHECK(charm::decode_utf8_surrogateescape("\xC0\x80"s) == std::u32string(1, U'\0'));
}

TEST_CASE("UTF-16 surrogates and code points above U+10FFFF are invalid") {
  // python3: b"\xed\xa0\x80" -> 3 x U+FFFD; b"\xf4\x90\x80\x80" -> 4 x U+FFFD
  CHECK_FALSE(charm::is_valid_utf8("\xED\xA0\x80"));
  CHECK(count_replacements(charm::decode_utf8_lossy("\xED\xA0\x80")) == 3);
  CHECK_FALSE(charm::is_valid_utf8("\xF4\x90\x80\x80"));
  CHECK(count_replacements(charm::decode_utf8_lossy("\xF4\x90\x80\x80")) == 4);
  CHECK(charm::is_valid_utf8("\xED\x9F\xBF"));  // U+D7FF, just below the surrogates
  // append_utf8 does not check: a surrogate becomes its 3-byte (ill-formed) encoding.
  std::string out;
  charm::append_utf8(out, 0xD800);
  CHECK(out == "\xED\xA0\x80");
  CHECK(charm::decode_utf8_unchecked(out) == std::u32string{0xD800});
}

TEST_CASE("truncated sequences") {
  // python3: b"\xe2\x82" -> 1 x U+FFFD; b"\xf0\x9f\x98" -> 1; b"\xc2" -> 1
  for (const std::string& s : {"\xE2\x82"s, "\xF0\x9F\x98"s, "\xC2"s}) {
    CAPTURE(s.size());
    CHECK_FALSE(charm::is_valid_utf8(s));
    CHECK(sequence_length(s) == 0);
    CHECK(valid_prefix(s) == s.size());
    CHECK(charm::decode_utf8_lossy(s) == U"\uFFFD");
    CHECK(charm::utf8_lossy(s) == "\xEF\xBF\xBD");
    CHECK(charm::decode_utf8_unchecked(s) == U"\uFFFD");  // cut off: one U+FFFD, then stop
    CHECK(charm::utf8_incomplete_tail_start("ab" + s) == 2);
  }
  // The unchecked decoder stops at a cut-off sequence; lossy continues.
  CHECK(charm::decode_utf8_unchecked("a\xF0\x9F") == U"a\uFFFD");
  // Complete or already-invalid tails need not be held back.
  CHECK(charm::utf8_incomplete_tail_start("ab\xE2\x82\xAC") == 5);
  CHECK(charm::utf8_incomplete_tail_start("ab\x80") == 3);
  CHECK(charm::utf8_incomplete_tail_start("ab\xE0\x80") == 4);  // E0 80 can never complete
  CHECK(charm::utf8_incomplete_tail_start("") == 0);
}

TEST_CASE("lossy replacement counts match Python bytes.decode('utf-8', 'replace')") {
  struct Case {
    std::string bytes;
    size_t replacements;      // python3: s.decode("utf-8", "replace").count("\ufffd")
    std::u32string decoded;   // python3: the decoded code points
  };
  const Case cases[] = {
      {"a\x80\x80" "b", 2, U"a\uFFFD\uFFFDb"},
      {"\xFE\xFF", 2, U"\uFFFD\uFFFD"},
      {"\xF0\x9F\x98\x80\xFF\xE2\x82\xAC" "z\xE2", 2, U"\U0001F600\uFFFD\u20ACz\uFFFD"},
      {"\xE1\x80\xE2\xF0\x91\x92\xF1\xBF" "A", 4, U"\uFFFD\uFFFD\uFFFD\uFFFDA"},
  };
  for (const Case& c : cases) {
    CAPTURE(c.replacements);
    const std::u32string decoded = charm::decode_utf8_lossy(c.bytes);
    CHECK(count_replacements(decoded) == c.replacements);
    CHECK(decoded == c.decoded);
    // utf8_lossy and decode_utf8_lossy follow the same policy.
    CHECK(charm::utf8_lossy(c.bytes) == charm::encode_utf8_surrogateescape(decoded));
    CHECK(charm::is_valid_utf8(charm::utf8_lossy(c.bytes)));
  }
}

TEST_CASE("surrogateescape keeps undecodable bytes and restores them") {
  const std::string bytes = "a\x80\xFF\xC3\xA9\xE2\x82"s;  // stray, invalid lead, é, cut-off
  const std::u32string decoded = charm::decode_utf8_surrogateescape(bytes);
  CHECK(decoded == std::u32string{U'a', 0xDC80, 0xDCFF, 0xE9, 0xDCE2, 0xDC82});
  CHECK(charm::encode_utf8_surrogateescape(decoded) == bytes);
  std::string one;
  charm::append_utf8_surrogateescape(one, 0xDC7F);  // outside the escape range: encoded
  CHECK(one == "\xED\xB1\xBF");
}
