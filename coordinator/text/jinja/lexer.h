// Splits Jinja template text into literal text and tags, applying the whitespace control
// that transformers configures (trim_blocks=True, lstrip_blocks=True, keep_trailing_newline
// off, '-' and '+' modifiers), and splits each tag into expression tokens. Follows
// jinja2/lexer.py (3.1): same rules for where a tag ends (not inside brackets or strings)
// and which whitespace around it is removed.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace charm::jinja {

/// One expression token inside a {{ }} or {% %} tag.
struct Token {
  enum class Type { kName, kString, kInt, kFloat, kOp, kEnd };
  Type type = Type::kEnd;
  std::string text;  ///< name, operator, or the decoded string literal
  int64_t int_value = 0;
  double float_value = 0.0;
  int line = 1;  ///< 1-based template line
};

/// A piece of the template: literal text, an output tag {{ }}, or a statement tag {% %}.
struct Segment {
  enum class Kind { kText, kVar, kBlock };
  Kind kind = Kind::kText;
  int line = 1;               ///< line where the piece starts
  std::string text;           ///< kText only
  std::vector<Token> tokens;  ///< kVar / kBlock: tokens, ending with a kEnd token
};

/// Tokenises `source`. Comments are dropped and {% raw %} bodies become text.
/// Throws Error(kInvalidInput) "chat template line N: ..." for an unterminated tag, comment,
/// string or raw block, an unexpected character, or unbalanced brackets.
std::vector<Segment> lex_template(const std::string& source);

}  // namespace charm::jinja
