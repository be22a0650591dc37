// UTF-8 primitives (see utf8.h). Well-formedness follows Unicode 15 §3.9 table 3-7; the
// lossy policy follows its "maximal subpart" replacement practice (U+FFFD per subpart).
#include "common/utf8.h"

namespace charm {
namespace {

unsigned char byte_at(std::string_view s, size_t i) { return static_cast<unsigned char>(s[i]); }

/// The code point of the `width`-byte sequence at s[i]: the lead byte's payload bits, then
/// 6 bits from each following byte (not checked: callers decide what is well-formed).
char32_t decode_sequence(std::string_view s, size_t i, size_t width) {
  const char32_t lead = byte_at(s, i);
  char32_t cp = width == 1 ? lead : lead & (0x7Fu >> width);
  for (size_t k = 1; k < width; ++k) cp = (cp << 6) | (byte_at(s, i + k) & 0x3Fu);
  return cp;
}

}  // namespace

size_t utf8_sequence_length(std::string_view s, size_t i, size_t* valid_prefix) {
  const unsigned char lead = byte_at(s, i);
  *valid_prefix = 1;
  if (lead < 0x80) return 1;
  size_t width = 0;
  unsigned char lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  if (lead >= 0xC2 && lead <= 0xDF) {
    width = 2;  // C0, C1 would only start overlong forms
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    width = 3;
    if (lead == 0xE0) lo = 0xA0;  // no overlong forms
    if (lead == 0xED) hi = 0x9F;  // no UTF-16 surrogates
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    width = 4;
    if (lead == 0xF0) lo = 0x90;  // no overlong forms
    if (lead == 0xF4) hi = 0x8F;  // nothing above U+10FFFF
  } else {
    return 0;
  }
  for (size_t k = 1; k < width; ++k) {
    if (i + k >= s.size()) return 0;
    const unsigned char c = byte_at(s, i + k);
    const bool ok = k == 1 ? (c >= lo && c <= hi) : (c >= 0x80 && c <= 0xBF);
    if (!ok) return 0;
    *valid_prefix = k + 1;
  }
  return width;
}

bool is_valid_utf8(std::string_view s) {
  size_t i = 0, prefix = 0;
  while (i < s.size()) {
    const size_t n = utf8_sequence_length(s, i, &prefix);
    if (n == 0) return false;
    i += n;
  }
  return true;
}

std::string utf8_lossy(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    size_t prefix = 0;
    const size_t n = utf8_sequence_length(s, i, &prefix);
    if (n > 0) {
      out.append(s.substr(i, n));
      i += n;
    } else {
      append_utf8(out, kReplacementChar);
      i += prefix;
    }
  }
  return out;
}

size_t utf8_incomplete_tail_start(std::string_view s) {
  const size_t first = s.size() > 3 ? s.size() - 3 : 0;
  for (size_t i = s.size(); i-- > first;) {
    const unsigned char c = byte_at(s, i);
    if ((c & 0xC0) == 0x80) continue;  // continuation byte: keep looking for the lead
    size_t prefix = 0;
    const size_t n = utf8_sequence_length(s, i, &prefix);
    const bool incomplete = n == 0 && i + prefix == s.size() && c >= 0xC2 && c <= 0xF4;
    return incomplete ? i : s.size();
  }
  return s.size();
}

std::u32string decode_utf8_lossy(std::string_view s) {
  std::u32string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    size_t prefix = 0;
    const size_t n = utf8_sequence_length(s, i, &prefix);
    out += n > 0 ? decode_sequence(s, i, n) : kReplacementChar;
    i += n > 0 ? n : prefix;
  }
  return out;
}

std::u32string decode_utf8_unchecked(std::string_view s) {
  std::u32string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    const unsigned char lead = byte_at(s, i);
    const size_t n = lead < 0x80 ? 1 : lead < 0xE0 ? 2 : lead < 0xF0 ? 3 : 4;
    if (i + n > s.size()) {
      out += kReplacementChar;
      break;
    }
    out += decode_sequence(s, i, n);
    i += n;
  }
  return out;
}

void append_utf8(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

std::u32string decode_utf8_surrogateescape(std::string_view s) {
  std::u32string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    const unsigned char c = byte_at(s, i);
    const size_t n = c < 0x80           ? 1
                     : (c >> 5) == 0x6  ? 2
                     : (c >> 4) == 0xE  ? 3
                     : (c >> 3) == 0x1E ? 4
                                        : 0;
    if (n == 0 || i + n > s.size()) {
      out += static_cast<char32_t>(0xDC00 + c);  // escape this one byte; resume after it
      ++i;
      continue;
    }
    out += decode_sequence(s, i, n);
    i += n;
  }
  return out;
}

void append_utf8_surrogateescape(std::string& out, char32_t cp) {
  if (cp >= 0xDC80 && cp <= 0xDCFF) {
    out += static_cast<char>(cp - 0xDC00);
  } else {
    append_utf8(out, cp);
  }
}

std::string encode_utf8_surrogateescape(std::u32string_view s) {
  std::string out;
  for (char32_t cp : s) append_utf8_surrogateescape(out, cp);
  return out;
}

}  // namespace charm
