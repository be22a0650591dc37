// NFC following the UAX #15 reference algorithm: decompose fully, sort combining marks
// by class, then compose each mark with the last starter unless blocked.
#include "coordinator/text/unicode_nfc.h"

#include <algorithm>
#include <cstdint>
#include <iterator>

#include "common/utf8.h"

namespace charm {
namespace {

struct CccRange {
  char32_t first, last;
  uint8_t ccc;
};
struct Decomposition {
  char32_t cp, first, second;  // second == 0: singleton
};
struct Composition {
  char32_t first, second, composite;
};
struct CpRange {
  char32_t first, last;
};

#include "coordinator/text/unicode_nfc_data.inc"

// Hangul syllable arithmetic (Unicode chapter 3.12).
constexpr char32_t kSBase = 0xAC00, kLBase = 0x1100, kVBase = 0x1161, kTBase = 0x11A7;
constexpr char32_t kLCount = 19, kVCount = 21, kTCount = 28;
constexpr char32_t kNCount = kVCount * kTCount, kSCount = kLCount * kNCount;

template <typename Range>
const Range* find_range(const Range* begin, const Range* end, char32_t cp) {
  auto it =
      std::upper_bound(begin, end, cp, [](char32_t c, const Range& r) { return c < r.first; });
  if (it == begin) return nullptr;
  --it;
  return cp <= it->last ? it : nullptr;
}

uint8_t combining_class(char32_t cp) {
  if (cp < 0x300) return 0;
  const CccRange* r = find_range(std::begin(kCombiningClass), std::end(kCombiningClass), cp);
  return r ? r->ccc : 0;
}

void decompose(char32_t cp, std::u32string& out) {
  if (cp >= kSBase && cp < kSBase + kSCount) {
    const char32_t s = cp - kSBase;
    out += kLBase + s / kNCount;
    out += kVBase + (s % kNCount) / kTCount;
    if (s % kTCount != 0) out += kTBase + s % kTCount;
    return;
  }
  auto it = std::lower_bound(std::begin(kDecomposition), std::end(kDecomposition), cp,
                             [](const Decomposition& d, char32_t c) { return d.cp < c; });
  if (it == std::end(kDecomposition) || it->cp != cp) {
    out += cp;
    return;
  }
  decompose(it->first, out);
  if (it->second != 0) decompose(it->second, out);
}

/// The primary composite of (a, b), or 0.
char32_t compose(char32_t a, char32_t b) {
  if (a >= kLBase && a < kLBase + kLCount && b >= kVBase && b < kVBase + kVCount)
    return kSBase + ((a - kLBase) * kVCount + (b - kVBase)) * kTCount;
  if (a >= kSBase && a < kSBase + kSCount && (a - kSBase) % kTCount == 0 && b > kTBase &&
      b < kTBase + kTCount)
    return a + (b - kTBase);
  auto it = std::lower_bound(std::begin(kComposition), std::end(kComposition), std::make_pair(a, b),
                             [](const Composition& c, const std::pair<char32_t, char32_t>& k) {
                               return std::make_pair(c.first, c.second) < k;
                             });
  if (it == std::end(kComposition) || it->first != a || it->second != b) return 0;
  return it->composite;
}

/// Canonical ordering: a stable sort of each run of non-starters by combining class.
void reorder_marks(std::u32string& s) {
  size_t i = 0;
  while (i < s.size()) {
    if (combining_class(s[i]) == 0) {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < s.size() && combining_class(s[j]) != 0) ++j;
    std::stable_sort(
        s.begin() + static_cast<std::ptrdiff_t>(i), s.begin() + static_cast<std::ptrdiff_t>(j),
        [](char32_t a, char32_t b) { return combining_class(a) < combining_class(b); });
    i = j;
  }
}

/// Canonical composition (UAX #15 reference code).
std::u32string compose_all(const std::u32string& s) {
  std::u32string out;
  if (s.empty()) return out;
  size_t starter = 0;
  out += s[0];
  int last_class = combining_class(s[0]) == 0 ? 0 : 256;
  for (size_t i = 1; i < s.size(); ++i) {
    const char32_t ch = s[i];
    const int cls = combining_class(ch);
    const char32_t composite = compose(out[starter], ch);
    if (composite != 0 && (last_class < cls || last_class == 0)) {
      out[starter] = composite;
      continue;
    }
    if (cls == 0) starter = out.size();
    last_class = cls;
    out += ch;
  }
  return out;
}

}  // namespace

bool is_nfc_quick(std::string_view text) {
  // Code points below U+0300 are encoded with lead bytes below 0xCC and never change.
  if (std::all_of(text.begin(), text.end(),
                  [](char c) { return static_cast<unsigned char>(c) < 0xCC; }))
    return true;
  for (char32_t cp : decode_utf8_unchecked(text))
    if (cp >= 0x300 && find_range(std::begin(kMaybeNotNfc), std::end(kMaybeNotNfc), cp))
      return false;
  return true;
}

std::string to_nfc(std::string_view text) {
  std::u32string decomposed;
  for (char32_t cp : decode_utf8_unchecked(text)) decompose(cp, decomposed);
  reorder_marks(decomposed);
  std::string out;
  for (char32_t cp : compose_all(decomposed)) append_utf8(out, cp);
  return out;
}

}  // namespace charm
