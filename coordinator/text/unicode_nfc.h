// Unicode Normalization Form C (UAX #15) for the tokenizer's NFC normalizer, on tables
// generated from Python's unicodedata by scripts/gen_unicode_nfc.py (unicode_nfc_data.inc).
#pragma once

#include <string>
#include <string_view>

namespace charm {

/// True when valid UTF-8 `text` contains no code point that NFC could change (fast path;
/// a false answer only means to_nfc must be run, not that the text changes).
bool is_nfc_quick(std::string_view text);

/// NFC of valid UTF-8 `text`: canonical decomposition, canonical ordering of combining
/// marks, canonical composition (Hangul algorithmically). REQUIRES: valid UTF-8 (the
/// tokenizer passes only text it has made valid); a sequence cut off at the end becomes U+FFFD.
std::string to_nfc(std::string_view text);

}  // namespace charm
