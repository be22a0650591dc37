// Jinja template lexer; see jinja_lexer.h. Mirrors jinja2/lexer.py's tokeniter.
#include "coordinator/text/jinja/lexer.h"

#include <cctype>
#include <cstdlib>

#include "common/error.h"
#include "coordinator/text/jinja/value.h"

namespace charm::jinja {
namespace {

[[noreturn]] void fail_at(int line, const std::string& what) {
  fail_invalid("chat template line " + std::to_string(line) + ": " + what);
}

bool is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

std::string rstrip_ws(const std::string& s) {
  size_t end = s.size();
  while (end > 0 && is_ws(s[end - 1])) --end;
  return s.substr(0, end);
}

// jinja2 normalises \r\n and \r to \n and drops one trailing newline (keep_trailing_newline off).
std::string normalise_newlines(const std::string& source) {
  std::string out;
  out.reserve(source.size());
  for (size_t k = 0; k < source.size(); ++k) {
    if (source[k] == '\r') {
      out += '\n';
      if (k + 1 < source.size() && source[k + 1] == '\n') ++k;
    } else {
      out += source[k];
    }
  }
  if (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

// Decodes a string literal body the way jinja2 does (Python's unicode-escape codec).
std::string decode_escapes(const std::string& body, int line) {
  std::string out;
  for (size_t k = 0; k < body.size(); ++k) {
    if (body[k] != '\\' || k + 1 >= body.size()) {
      out += body[k];
      continue;
    }
    char c = body[++k];
    auto hex = [&](size_t n) {
      if (k + n >= body.size()) fail_at(line, "truncated \\x/\\u escape in string");
      std::string digits = body.substr(k + 1, n);
      for (char d : digits)
        if (!std::isxdigit(static_cast<unsigned char>(d))) fail_at(line, "bad \\x/\\u escape in string");
      k += n;
      return static_cast<char32_t>(std::strtoul(digits.c_str(), nullptr, 16));
    };
    switch (c) {
      case '\n': break;  // line continuation
      case '\\': out += '\\'; break;
      case '\'': out += '\''; break;
      case '"': out += '"'; break;
      case 'a': out += '\a'; break;
      case 'b': out += '\b'; break;
      case 'f': out += '\f'; break;
      case 'n': out += '\n'; break;
      case 'r': out += '\r'; break;
      case 't': out += '\t'; break;
      case 'v': out += '\v'; break;
      case 'x': append_utf8_surrogateescape(out, hex(2)); break;
      case 'u': append_utf8_surrogateescape(out, hex(4)); break;
      case 'U': append_utf8_surrogateescape(out, hex(8)); break;
      default:
        if (c >= '0' && c <= '7') {
          char32_t cp = 0;
          size_t n = 0;
          for (; n < 3 && k < body.size() && body[k] >= '0' && body[k] <= '7'; ++n, ++k) cp = cp * 8 + (body[k] - '0');
          --k;
          append_utf8_surrogateescape(out, cp);
        } else {
          out += '\\';
          out += c;
        }
    }
  }
  return out;
}

class Lexer {
 public:
  explicit Lexer(std::string source) : src_(normalise_newlines(source)) {}

  std::vector<Segment> run() {
    bool line_starting = true;
    while (pos_ < src_.size()) {
      size_t open = find_open(pos_);
      std::string text = src_.substr(pos_, open == std::string::npos ? std::string::npos : open - pos_);
      if (open == std::string::npos) {
        emit_text(text, line_);
        break;
      }
      char kind = src_[open + 1];  // '{', '%' or '#'
      char sign = open + 2 < src_.size() ? src_[open + 2] : '\0';
      int text_line = line_;
      line_ += count_lines(text);
      if (sign == '-') {
        text = rstrip_ws(text);
      } else if (sign != '+' && kind != '{') {
        text = lstrip_block(text, line_starting);
      }
      emit_text(text, text_line);
      pos_ = open + 2 + ((sign == '-' || sign == '+') ? 1 : 0);
      if (kind == '#') line_starting = lex_comment();
      else if (kind == '%' && is_raw_begin()) line_starting = lex_raw();
      else line_starting = lex_tag(kind == '{' ? Segment::Kind::kVar : Segment::Kind::kBlock);
    }
    return std::move(out_);
  }

 private:
  static int count_lines(const std::string& s) {
    int n = 0;
    for (char c : s) n += c == '\n';
    return n;
  }

  size_t find_open(size_t from) const {
    for (size_t k = from; k + 1 < src_.size(); ++k)
      if (src_[k] == '{' && (src_[k + 1] == '{' || src_[k + 1] == '%' || src_[k + 1] == '#')) return k;
    return std::string::npos;
  }

  // lstrip_blocks: drop spaces/tabs between the line start and a block or comment tag.
  static std::string lstrip_block(const std::string& text, bool line_starting) {
    size_t nl = text.rfind('\n');
    size_t l_pos = nl == std::string::npos ? 0 : nl + 1;
    if (l_pos == 0 && !line_starting) return text;
    if (l_pos == text.size()) return text;
    for (size_t k = l_pos; k < text.size(); ++k)
      if (!is_ws(text[k])) return text;
    return text.substr(0, l_pos);
  }

  void emit_text(const std::string& text, int line) {
    if (text.empty()) return;
    Segment seg;
    seg.kind = Segment::Kind::kText;
    seg.line = line;
    seg.text = text;
    out_.push_back(std::move(seg));
  }

  // Consumes what follows a block/comment end: "-" strips all whitespace, "+" nothing,
  // otherwise trim_blocks removes one newline. Returns whether a newline ended the match.
  bool consume_block_suffix(char sign) {
    bool ended_nl = false;
    if (sign == '-') {
      while (pos_ < src_.size() && is_ws(src_[pos_])) {
        ended_nl = src_[pos_] == '\n';
        line_ += src_[pos_] == '\n';
        ++pos_;
      }
    } else if (sign != '+' && pos_ < src_.size() && src_[pos_] == '\n') {
      ++pos_;
      ++line_;
      ended_nl = true;
    }
    return ended_nl;
  }

  bool lex_comment() {
    int start_line = line_;
    size_t end = src_.find("#}", pos_);
    if (end == std::string::npos) fail_at(start_line, "unterminated comment '{#'");
    char sign = end > pos_ ? src_[end - 1] : '\0';
    line_ += count_lines(src_.substr(pos_, end - pos_));
    pos_ = end + 2;
    return consume_block_suffix(sign == '-' || sign == '+' ? sign : '\0');
  }

  // {% raw %}: jinja's raw_begin pattern, "{%" [-+]? \s* "raw" \s* "-"? "%}".
  bool is_raw_begin() {
    size_t k = pos_;
    while (k < src_.size() && is_ws(src_[k])) ++k;
    if (src_.compare(k, 3, "raw") != 0) return false;
    k += 3;
    if (k < src_.size() && (std::isalnum(static_cast<unsigned char>(src_[k])) || src_[k] == '_')) return false;
    while (k < src_.size() && is_ws(src_[k])) ++k;
    return src_.compare(k, 2, "%}") == 0 || src_.compare(k, 3, "-%}") == 0;
  }

  bool lex_raw() {
    int start_line = line_;
    size_t k = src_.find("%}", pos_);
    bool strip_after = src_[k - 1] == '-';
    line_ += count_lines(src_.substr(pos_, k - pos_));
    pos_ = k + 2;
    if (strip_after) consume_block_suffix('-');
    // Find "{%" [-+]? \s* "endraw" \s* [-+]? "%}".
    for (size_t search = pos_;;) {
      size_t open = src_.find("{%", search);
      if (open == std::string::npos) fail_at(start_line, "missing '{% endraw %}' for '{% raw %}'");
      size_t q = open + 2;
      char sign = (q < src_.size() && (src_[q] == '-' || src_[q] == '+')) ? src_[q++] : '\0';
      while (q < src_.size() && is_ws(src_[q])) ++q;
      if (src_.compare(q, 6, "endraw") != 0) {
        search = open + 2;
        continue;
      }
      q += 6;
      while (q < src_.size() && is_ws(src_[q])) ++q;
      char end_sign = (q < src_.size() && (src_[q] == '-' || src_[q] == '+')) ? src_[q++] : '\0';
      if (src_.compare(q, 2, "%}") != 0) {
        search = open + 2;
        continue;
      }
      std::string body = src_.substr(pos_, open - pos_);
      int body_line = line_;
      line_ += count_lines(body);
      if (sign == '-') body = rstrip_ws(body);
      else if (sign != '+') body = lstrip_block(body, false);
      emit_text(body, body_line);
      pos_ = q + 2;
      return consume_block_suffix(end_sign);
    }
  }

  // Tokenises one {{ }} or {% %} tag; the end marker only counts outside brackets.
  bool lex_tag(Segment::Kind kind) {
    Segment seg;
    seg.kind = kind;
    seg.line = line_;
    std::vector<char> brackets;
    const std::string close = kind == Segment::Kind::kVar ? "}}" : "%}";
    const char* tag_name = kind == Segment::Kind::kVar ? "'{{'" : "'{%'";
    for (;;) {
      while (pos_ < src_.size() && is_ws(src_[pos_])) line_ += src_[pos_++] == '\n';
      if (pos_ >= src_.size())
        fail_at(seg.line, "unterminated tag " + std::string(tag_name) + " (no closing '" + close + "')");
      if (brackets.empty()) {
        char sign = src_[pos_];
        bool signed_close = (sign == '-' || (sign == '+' && kind == Segment::Kind::kBlock)) &&
                            src_.compare(pos_ + 1, 2, close) == 0;
        if (signed_close || src_.compare(pos_, 2, close) == 0) {
          pos_ += signed_close ? 3 : 2;
          Token end;
          end.line = line_;
          seg.tokens.push_back(end);
          out_.push_back(std::move(seg));
          if (kind == Segment::Kind::kVar) return signed_close ? consume_block_suffix('-') : false;
          return consume_block_suffix(signed_close ? sign : '\0');
        }
      }
      seg.tokens.push_back(next_token(brackets));
    }
  }

  Token next_token(std::vector<char>& brackets) {
    Token t;
    t.line = line_;
    char c = src_[pos_];
    if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      size_t start = pos_;
      while (pos_ < src_.size() && (std::isalnum(static_cast<unsigned char>(src_[pos_])) || src_[pos_] == '_')) ++pos_;
      t.type = Token::Type::kName;
      t.text = src_.substr(start, pos_ - start);
      return t;
    }
    if (std::isdigit(static_cast<unsigned char>(c))) return number(t);
    if (c == '\'' || c == '"') return string_literal(t, c);
    static const char* two[] = {"//", "**", "==", "!=", ">=", "<="};
    for (const char* op : two) {
      if (src_.compare(pos_, 2, op) == 0) {
        t.type = Token::Type::kOp;
        t.text = op;
        pos_ += 2;
        return t;
      }
    }
    if (std::string("+-*/%~<>=.,:|()[]{}").find(c) == std::string::npos)
      fail_at(line_, std::string("unexpected character '") + c + "' in tag");
    if (c == '(' || c == '[' || c == '{') brackets.push_back(c == '(' ? ')' : c == '[' ? ']' : '}');
    if (c == ')' || c == ']' || c == '}') {
      if (brackets.empty()) fail_at(line_, std::string("unexpected '") + c + "'");
      if (brackets.back() != c)
        fail_at(line_, std::string("unexpected '") + c + "', expected '" + brackets.back() + "'");
      brackets.pop_back();
    }
    t.type = Token::Type::kOp;
    t.text = std::string(1, c);
    ++pos_;
    return t;
  }

  Token number(Token t) {
    size_t start = pos_;
    auto digits = [&] {
      while (pos_ < src_.size() && (std::isdigit(static_cast<unsigned char>(src_[pos_])) || src_[pos_] == '_')) ++pos_;
    };
    digits();
    bool is_float = false;
    if (pos_ + 1 < src_.size() && src_[pos_] == '.' && std::isdigit(static_cast<unsigned char>(src_[pos_ + 1]))) {
      ++pos_;
      digits();
      is_float = true;
    }
    if (pos_ < src_.size() && (src_[pos_] == 'e' || src_[pos_] == 'E')) {
      size_t save = pos_++;
      if (pos_ < src_.size() && (src_[pos_] == '+' || src_[pos_] == '-')) ++pos_;
      if (pos_ < src_.size() && std::isdigit(static_cast<unsigned char>(src_[pos_]))) {
        digits();
        is_float = true;
      } else {
        pos_ = save;
      }
    }
    std::string text;
    for (size_t k = start; k < pos_; ++k)
      if (src_[k] != '_') text += src_[k];
    t.text = text;
    if (is_float) {
      t.type = Token::Type::kFloat;
      t.float_value = std::strtod(text.c_str(), nullptr);
    } else {
      t.type = Token::Type::kInt;
      t.int_value = std::strtoll(text.c_str(), nullptr, 10);
    }
    return t;
  }

  Token string_literal(Token t, char quote) {
    size_t k = pos_ + 1;
    while (k < src_.size() && src_[k] != quote) k += src_[k] == '\\' ? 2 : 1;
    if (k >= src_.size()) fail_at(line_, "unterminated string literal");
    std::string body = src_.substr(pos_ + 1, k - pos_ - 1);
    line_ += count_lines(body);
    t.type = Token::Type::kString;
    t.text = decode_escapes(body, t.line);
    pos_ = k + 1;
    return t;
  }

  std::string src_;
  size_t pos_ = 0;
  int line_ = 1;
  std::vector<Segment> out_;
};

}  // namespace

std::vector<Segment> lex_template(const std::string& source) { return Lexer(source).run(); }

}  // namespace charm::jinja
