// UTF-8 encode, decode and validate: the one copy of these primitives for the tokenizer,
// the NFC normalizer and the chat-template interpreter. Three policies for invalid input
// exist side by side because their callers need different things, and each function's
// name says which it follows:
//   *_lossy            - each maximal invalid subpart becomes U+FFFD (Unicode §3.9 "U+FFFD
//                        Substitution of Maximal Subparts", as Rust String::from_utf8_lossy
//                        and Python bytes.decode("utf-8", "replace")); what the tokenizer
//                        must match.
//   *_unchecked        - assumes well-formed input and does no checking (cheap); garbage
//                        in, garbage out, but never reads out of bounds.
//   *_surrogateescape  - undecodable bytes become U+DC80..U+DCFF and encode back to the same
//                        byte (after Python's "surrogateescape" handler), so templates pass
//                        arbitrary bytes through unchanged.
// Well-formed UTF-8 means Unicode table 3-7: no overlong forms, no surrogates
// (U+D800..U+DFFF), nothing above U+10FFFF. All functions are pure and thread-safe.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace charm {

/// The Unicode replacement character U+FFFD that lossy decoding writes for invalid bytes.
inline constexpr char32_t kReplacementChar = 0xFFFD;

/// Length (1..4 bytes) of the well-formed UTF-8 sequence starting at byte `i` of `s`, or 0
/// when the bytes there are not one (bad lead byte, bad or missing continuation byte,
/// overlong form, surrogate, above U+10FFFF). `*valid_prefix` receives the length of the
/// longest prefix that could still begin a well-formed sequence ("maximal subpart",
/// Unicode table 3-7), always at least 1, so lossy decoding knows how far to skip.
/// REQUIRES: i < s.size().
size_t utf8_sequence_length(std::string_view s, size_t i, size_t* valid_prefix);

/// True when all of `s` is well-formed UTF-8 (the empty string is).
bool is_valid_utf8(std::string_view s);

/// `s` with each maximal invalid subpart replaced by U+FFFD (EF BF BD), as Rust's
/// String::from_utf8_lossy and Python's bytes.decode("utf-8", "replace") do; well-formed
/// input comes back unchanged.
std::string utf8_lossy(std::string_view s);

/// Where the trailing incomplete-but-so-far-valid UTF-8 sequence of `s` starts (e.g. the
/// E2 82 of a cut-off "€"), or s.size() when the tail is complete or already invalid:
/// the bytes a streaming decoder must hold back until more arrive.
size_t utf8_incomplete_tail_start(std::string_view s);

/// Code points of `s`, each maximal invalid subpart decoded as one U+FFFD (same policy as
/// utf8_lossy, so decode_utf8_lossy(s) is the code points of utf8_lossy(s)).
std::u32string decode_utf8_lossy(std::string_view s);

/// Code points of `s`, which the caller guarantees is well-formed UTF-8. Nothing is
/// checked: the lead byte alone sets the width (< 0x80: 1, < 0xE0: 2, < 0xF0: 3, else 4),
/// continuation bytes contribute their low 6 bits whatever they are, and a sequence cut
/// off by the end of `s` becomes one U+FFFD that ends the output.
std::u32string decode_utf8_unchecked(std::string_view s);

/// Appends the UTF-8 encoding of `cp` to `out` without checking it: surrogates are
/// encoded as 3-byte sequences and values above U+10FFFF give ill-formed bytes.
void append_utf8(std::string& out, char32_t cp);

/// Code points of `s` where a byte that is not a lead byte (80..BF, F8..FF), or a lead byte
/// whose sequence is cut off by the end of `s`, becomes U+DC00 + byte (U+DC80..U+DCFF), one
/// per byte, and decoding resumes at the next byte. Continuation bytes after a valid lead
/// byte are not checked (their low 6 bits are taken), so overlong forms and encoded
/// surrogates decode to their (non-canonical) values.
std::u32string decode_utf8_surrogateescape(std::string_view s);

/// Appends `cp` to `out`: U+DC80..U+DCFF as the single byte cp - 0xDC00 (undoing
/// decode_utf8_surrogateescape), anything else as append_utf8 does.
void append_utf8_surrogateescape(std::string& out, char32_t cp);

/// UTF-8 of `s` with append_utf8_surrogateescape applied to each code point, so the bytes
/// decode_utf8_surrogateescape escaped come back as they were (well-formed UTF-8 other
/// than encoded U+DC80..U+DCFF round-trips too; overlong forms and bad continuation bytes
/// do not).
std::string encode_utf8_surrogateescape(std::u32string_view s);

}  // namespace charm
