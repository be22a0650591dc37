// Python semantics for charm's Jinja values; see jinja_value.h.
#include "coordinator/text/jinja/value.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

#include "common/error.h"
#include "coordinator/text/jinja/ast.h"

namespace charm::jinja {
namespace {

// The depth argument of every recursive walk: the walk at `depth` is about to look inside a
// container, so its children are at depth + 1.
int nested(int depth, const char* walk) {
  if (depth >= kMaxValueDepth) {
    fail_invalid(std::string("chat template: value nested deeper than ") + std::to_string(kMaxValueDepth) +
                 " levels in " + walk);
  }
  return depth + 1;
}

Value value_from_json(const nlohmann::ordered_json& j, int depth) {
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null: return Value::none();
    case nlohmann::ordered_json::value_t::boolean: return Value::boolean(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer: return Value::integer(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned:
      return Value::integer(static_cast<int64_t>(j.get<uint64_t>()));
    case nlohmann::ordered_json::value_t::number_float: return Value::floating(j.get<double>());
    case nlohmann::ordered_json::value_t::string: return Value::string(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      const int inner = nested(depth, "a JSON value passed to the template");
      ValueList items;
      for (const auto& e : j) items.push_back(value_from_json(e, inner));
      return Value::new_list(std::move(items));
    }
    case nlohmann::ordered_json::value_t::object: {
      const int inner = nested(depth, "a JSON value passed to the template");
      ValueDict items;
      for (const auto& [k, e] : j.items()) items.emplace_back(Value::string(k), value_from_json(e, inner));
      return Value::new_dict(std::move(items));
    }
    default: fail_invalid("chat template: cannot pass JSON value of type " + std::string(j.type_name()));
  }
}

}  // namespace

Value Value::undefined(std::string why) {
  Value v;
  v.s = std::move(why);
  return v;
}
Value Value::none() {
  Value v;
  v.kind = Kind::kNone;
  return v;
}
Value Value::boolean(bool x) {
  Value v;
  v.kind = Kind::kBool;
  v.b = x;
  return v;
}
Value Value::integer(int64_t x) {
  Value v;
  v.kind = Kind::kInt;
  v.i = x;
  return v;
}
Value Value::floating(double x) {
  Value v;
  v.kind = Kind::kFloat;
  v.f = x;
  return v;
}
Value Value::string(std::string x) {
  Value v;
  v.kind = Kind::kString;
  v.s = std::move(x);
  return v;
}
Value Value::new_list(ValueList items) {
  Value v;
  v.kind = Kind::kList;
  v.list = std::make_shared<ValueList>(std::move(items));
  return v;
}
Value Value::new_tuple(ValueList items) {
  Value v = new_list(std::move(items));
  v.kind = Kind::kTuple;
  return v;
}
Value Value::new_dict(ValueDict items) {
  Value v;
  v.kind = Kind::kDict;
  v.dict = std::make_shared<ValueDict>(std::move(items));
  return v;
}
Value Value::new_namespace(ValueDict items) {
  Value v = new_dict(std::move(items));
  v.kind = Kind::kNamespace;
  return v;
}

Value Value::from_json(const nlohmann::ordered_json& j) { return value_from_json(j, 0); }

const Value* Value::find(const Value& key) const {
  if (!dict) return nullptr;
  for (const auto& [k, v] : *dict)
    if (equals(k, key)) return &v;
  return nullptr;
}
Value* Value::find(const Value& key) {
  return const_cast<Value*>(static_cast<const Value*>(this)->find(key));
}
void Value::set(const Value& key, Value v) {
  if (Value* slot = find(key)) {
    *slot = std::move(v);
    return;
  }
  dict->emplace_back(key, std::move(v));
}

std::string type_name(const Value& v) {
  switch (v.kind) {
    case Kind::kUndefined: return "Undefined";
    case Kind::kNone: return "NoneType";
    case Kind::kBool: return "bool";
    case Kind::kInt: return "int";
    case Kind::kFloat: return "float";
    case Kind::kString: return "str";
    case Kind::kList: return "list";
    case Kind::kTuple: return "tuple";
    case Kind::kDict: return "dict";
    case Kind::kNamespace: return "Namespace";
    case Kind::kMacro: return "Macro";
  }
  return "?";
}

bool truthy(const Value& v) {
  switch (v.kind) {
    case Kind::kUndefined:
    case Kind::kNone: return false;
    case Kind::kBool: return v.b;
    case Kind::kInt: return v.i != 0;
    case Kind::kFloat: return v.f != 0.0;
    case Kind::kString: return !v.s.empty();
    case Kind::kList:
    case Kind::kTuple: return !v.list->empty();
    case Kind::kDict: return !v.dict->empty();
    case Kind::kNamespace:
    case Kind::kMacro: return true;
  }
  return false;
}

std::string float_repr(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  // Shortest round-trip digits in scientific form, then laid out as Python's repr does:
  // positional when -4 <= exponent < 16, else d.ddde+XX.
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof buf, v, std::chars_format::scientific);
  std::string sci(buf, res.ptr);
  bool neg = sci[0] == '-';
  if (neg) sci.erase(0, 1);
  size_t e_pos = sci.find('e');
  std::string mant = sci.substr(0, e_pos);
  int exp = std::stoi(sci.substr(e_pos + 1));
  std::string digits;
  for (char c : mant)
    if (c != '.') digits += c;
  std::string out;
  if (exp >= -4 && exp < 16) {
    if (exp < 0) {
      out = "0." + std::string(-exp - 1, '0') + digits;
    } else if (static_cast<int>(digits.size()) <= exp + 1) {
      out = digits + std::string(exp + 1 - digits.size(), '0') + ".0";
    } else {
      out = digits.substr(0, exp + 1) + "." + digits.substr(exp + 1);
    }
  } else {
    out = digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    char e[16];
    std::snprintf(e, sizeof e, "e%c%02d", exp < 0 ? '-' : '+', std::abs(exp));
    out += e;
  }
  return neg ? "-" + out : out;
}

namespace {

std::string repr_string(const std::string& s) {
  // Python prefers single quotes, switching to double quotes when only ' appears.
  bool has_single = s.find('\'') != std::string::npos;
  bool has_double = s.find('"') != std::string::npos;
  char q = (has_single && !has_double) ? '"' : '\'';
  std::string out(1, q);
  for (unsigned char c : s) {
    if (c == '\\') out += "\\\\";
    else if (c == static_cast<unsigned char>(q)) out += std::string("\\") + q;
    else if (c == '\n') out += "\\n";
    else if (c == '\r') out += "\\r";
    else if (c == '\t') out += "\\t";
    else if (c < 0x20 || c == 0x7f) {
      char b[8];
      std::snprintf(b, sizeof b, "\\x%02x", c);
      out += b;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + q;
}

std::string repr_at(const Value& v, int depth);

std::string join_repr(const ValueList& items, int depth) {
  const int inner = nested(depth, "repr()");
  std::string out;
  for (size_t k = 0; k < items.size(); ++k) {
    if (k) out += ", ";
    out += repr_at(items[k], inner);
  }
  return out;
}

std::string dict_repr(const ValueDict& items, int depth) {
  const int inner = nested(depth, "repr()");
  std::string out = "{";
  for (size_t k = 0; k < items.size(); ++k) {
    if (k) out += ", ";
    out += repr_at(items[k].first, inner) + ": " + repr_at(items[k].second, inner);
  }
  return out + "}";
}

std::string repr_at(const Value& v, int depth) {
  switch (v.kind) {
    case Kind::kUndefined: return "Undefined";
    case Kind::kNone: return "None";
    case Kind::kBool: return v.b ? "True" : "False";
    case Kind::kInt: return std::to_string(v.i);
    case Kind::kFloat: return float_repr(v.f);
    case Kind::kString: return repr_string(v.s);
    case Kind::kList: return "[" + join_repr(*v.list, depth) + "]";
    case Kind::kTuple: return "(" + join_repr(*v.list, depth) + (v.list->size() == 1 ? ",)" : ")");
    case Kind::kDict: return dict_repr(*v.dict, depth);
    case Kind::kNamespace: return "<Namespace " + dict_repr(*v.dict, depth) + ">";
    case Kind::kMacro: return "<Macro '" + v.macro->targets[0] + "'>";
  }
  return "?";
}

double as_double(const Value& v) {
  if (v.kind == Kind::kFloat) return v.f;
  if (v.kind == Kind::kBool) return v.b ? 1.0 : 0.0;
  return static_cast<double>(v.i);
}

int compare_numbers(const Value& a, const Value& b) {
  if (a.kind != Kind::kFloat && b.kind != Kind::kFloat) {
    int64_t x = a.kind == Kind::kBool ? a.b : a.i, y = b.kind == Kind::kBool ? b.b : b.i;
    return x < y ? -1 : (x > y ? 1 : 0);
  }
  double x = as_double(a), y = as_double(b);
  return x < y ? -1 : (x > y ? 1 : 0);
}

// json.dumps string escaping; with ensure_ascii, non-ASCII code points become \uXXXX
// (UTF-16 units, so surrogate pairs above U+FFFF), else they are written as UTF-8.
void json_string(const std::string& s, std::string& out, bool ensure_ascii) {
  auto escape_unit = [&](unsigned u) {
    char b[16];
    std::snprintf(b, sizeof b, "\\u%04x", u);
    out += b;
  };
  out += '"';
  for (size_t k = 0; k < s.size(); ++k) {
    unsigned char c = static_cast<unsigned char>(s[k]);
    if (c >= 0x80) {
      if (!ensure_ascii) {
        out += static_cast<char>(c);
        continue;
      }
      size_t len = (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 1;
      char32_t cp = decode_utf8_surrogateescape(s.substr(k, len))[0];
      k += len - 1;
      if (cp >= 0x10000) {
        escape_unit(0xD800 + ((cp - 0x10000) >> 10));
        escape_unit(0xDC00 + ((cp - 0x10000) & 0x3FF));
      } else {
        escape_unit(static_cast<unsigned>(cp));
      }
      continue;
    }
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (c < 0x20) escape_unit(c);
        else out += static_cast<char>(c);
    }
  }
  out += '"';
}

void json_dump(const Value& v, int indent, bool sort_keys, bool ascii, int depth, std::string& out) {
  std::string item_sep = indent >= 0 ? "," : ", ";
  auto newline = [&](int d) {
    if (indent >= 0) out += "\n" + std::string(static_cast<size_t>(indent * d), ' ');
  };
  switch (v.kind) {
    case Kind::kUndefined:
    case Kind::kNamespace:
    case Kind::kMacro:
      fail_invalid("object of type " + type_name(v) + " is not JSON serializable");
    case Kind::kNone: out += "null"; return;
    case Kind::kBool: out += v.b ? "true" : "false"; return;
    case Kind::kInt: out += std::to_string(v.i); return;
    case Kind::kFloat:
      out += std::isnan(v.f) ? "NaN" : std::isinf(v.f) ? (v.f > 0 ? "Infinity" : "-Infinity") : float_repr(v.f);
      return;
    case Kind::kString: json_string(v.s, out, ascii); return;
    case Kind::kList:
    case Kind::kTuple: {
      if (v.list->empty()) { out += "[]"; return; }
      out += "[";
      const int inner = nested(depth, "tojson");
      for (size_t k = 0; k < v.list->size(); ++k) {
        if (k) out += item_sep;
        newline(inner);
        json_dump((*v.list)[k], indent, sort_keys, ascii, inner, out);
      }
      newline(depth);
      out += "]";
      return;
    }
    case Kind::kDict: {
      if (v.dict->empty()) { out += "{}"; return; }
      ValueDict items = *v.dict;
      if (sort_keys)
        std::stable_sort(items.begin(), items.end(), [](const auto& a, const auto& b) { return less_than(a.first, b.first); });
      out += "{";
      const int inner = nested(depth, "tojson");
      for (size_t k = 0; k < items.size(); ++k) {
        if (k) out += item_sep;
        newline(inner);
        // json.dumps writes non-string keys as their JSON scalar text, quoted.
        json_string(items[k].first.is_string() ? items[k].first.s : to_str(items[k].first), out, ascii);
        out += ": ";
        json_dump(items[k].second, indent, sort_keys, ascii, inner, out);
      }
      newline(depth);
      out += "}";
      return;
    }
  }
}

bool equals_at(const Value& a, const Value& b, int depth) {
  if (a.is_number() && b.is_number()) return compare_numbers(a, b) == 0;
  if (a.kind != b.kind) return false;  // also Python's [1] != (1,)
  switch (a.kind) {
    case Kind::kUndefined:
    case Kind::kNone: return true;
    case Kind::kString: return a.s == b.s;
    case Kind::kList:
    case Kind::kTuple: {
      if (a.list->size() != b.list->size()) return false;
      const int inner = nested(depth, "==");
      for (size_t k = 0; k < a.list->size(); ++k)
        if (!equals_at((*a.list)[k], (*b.list)[k], inner)) return false;
      return true;
    }
    case Kind::kDict: {
      if (a.dict->size() != b.dict->size()) return false;
      const int inner = nested(depth, "==");
      for (const auto& [k, v] : *a.dict) {
        const Value* other = b.find(k);
        if (!other || !equals_at(v, *other, inner)) return false;
      }
      return true;
    }
    case Kind::kNamespace: return a.dict == b.dict;
    case Kind::kMacro: return a.macro == b.macro;
    default: return false;
  }
}

bool less_than_at(const Value& a, const Value& b, int depth) {
  if (a.is_number() && b.is_number()) return compare_numbers(a, b) < 0;
  if (a.is_string() && b.is_string()) return a.s < b.s;  // UTF-8 byte order == code point order
  if (a.kind == b.kind && a.is_sequence()) {
    const int inner = nested(depth, "<");
    size_t n = std::min(a.list->size(), b.list->size());
    for (size_t k = 0; k < n; ++k) {
      if (!equals_at((*a.list)[k], (*b.list)[k], inner)) return less_than_at((*a.list)[k], (*b.list)[k], inner);
    }
    return a.list->size() < b.list->size();
  }
  fail_invalid("'<' not supported between instances of '" + type_name(a) + "' and '" +
               type_name(b) + "'");
}

}  // namespace

std::string to_str(const Value& v) {
  switch (v.kind) {
    case Kind::kUndefined: return "";
    case Kind::kString: return v.s;
    default: return repr_at(v, 0);
  }
}

std::string to_repr(const Value& v) { return repr_at(v, 0); }

bool equals(const Value& a, const Value& b) { return equals_at(a, b, 0); }

bool less_than(const Value& a, const Value& b) { return less_than_at(a, b, 0); }

std::string to_json_text(const Value& v, int indent, bool sort_keys, bool ensure_ascii) {
  std::string out;
  json_dump(v, indent, sort_keys, ensure_ascii, 0, out);
  return out;
}

ValueList iterate(const Value& v) {
  switch (v.kind) {
    case Kind::kUndefined: return {};
    case Kind::kList:
    case Kind::kTuple: return *v.list;
    case Kind::kDict:
    case Kind::kNamespace: {
      ValueList keys;
      for (const auto& kv : *v.dict) keys.push_back(kv.first);
      return keys;
    }
    case Kind::kString: {
      ValueList chars;
      for (char32_t c : decode_utf8_surrogateescape(v.s)) chars.push_back(Value::string(encode_utf8_surrogateescape(std::u32string(1, c))));
      return chars;
    }
    default: fail_invalid("'" + type_name(v) + "' object is not iterable");
  }
}

bool py_isspace(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

namespace {

// Ranges where upper and lower case alternate (even code point upper, odd lower).
bool in_alternating_even(char32_t c) {
  return (c >= 0x100 && c <= 0x137) || (c >= 0x14A && c <= 0x177) || (c >= 0x460 && c <= 0x481) ||
         (c >= 0x48A && c <= 0x4BF) || (c >= 0x4D0 && c <= 0x52F) || (c >= 0x1E00 && c <= 0x1E95) ||
         (c >= 0x1EA0 && c <= 0x1EFF);
}
// Same, but odd code point upper, even lower.
bool in_alternating_odd(char32_t c) { return (c >= 0x139 && c <= 0x148) || (c >= 0x179 && c <= 0x17E); }

}  // namespace

char32_t py_lower(char32_t c) {
  if (c >= 'A' && c <= 'Z') return c + 32;
  if (c < 0x80) return c;
  if ((c >= 0xC0 && c <= 0xDE && c != 0xD7) || (c >= 0x391 && c <= 0x3AB && c != 0x3A2) || (c >= 0x410 && c <= 0x42F) ||
      (c >= 0xFF21 && c <= 0xFF3A))
    return c + 32;
  if (c >= 0x400 && c <= 0x40F) return c + 80;
  if (c >= 0x531 && c <= 0x556) return c + 48;
  if (c == 0x178) return 0xFF;
  if (c == 0x386) return 0x3AC;
  if (c >= 0x388 && c <= 0x38A) return c + 37;
  if (c == 0x38C) return 0x3CC;
  if (c == 0x38E || c == 0x38F) return c + 63;
  if (in_alternating_even(c)) return (c % 2 == 0) ? c + 1 : c;
  if (in_alternating_odd(c)) return (c % 2 == 1) ? c + 1 : c;
  return c;
}

char32_t py_upper(char32_t c) {
  if (c >= 'a' && c <= 'z') return c - 32;
  if (c < 0x80) return c;
  if (c == 0xB5) return 0x39C;
  if (c == 0xFF) return 0x178;
  if (c == 0x3C2) return 0x3A3;
  if ((c >= 0xE0 && c <= 0xFE && c != 0xF7) || (c >= 0x3B1 && c <= 0x3CB) || (c >= 0x430 && c <= 0x44F) ||
      (c >= 0xFF41 && c <= 0xFF5A))
    return c - 32;
  if (c >= 0x450 && c <= 0x45F) return c - 80;
  if (c >= 0x561 && c <= 0x586) return c - 48;
  if (c == 0x3AC) return 0x386;
  if (c >= 0x3AD && c <= 0x3AF) return c - 37;
  if (c == 0x3CC) return 0x38C;
  if (c == 0x3CD || c == 0x3CE) return c - 63;
  if (in_alternating_even(c)) return (c % 2 == 1) ? c - 1 : c;
  if (in_alternating_odd(c)) return (c % 2 == 0) ? c - 1 : c;
  return c;
}

std::string str_lower(const std::string& s) {
  std::u32string t = decode_utf8_surrogateescape(s);
  for (char32_t& c : t) c = py_lower(c);
  return encode_utf8_surrogateescape(t);
}

std::string str_upper(const std::string& s) {
  std::u32string out;
  for (char32_t c : decode_utf8_surrogateescape(s)) {
    if (c == 0xDF) out += U"SS";
    else out += py_upper(c);
  }
  return encode_utf8_surrogateescape(out);
}

}  // namespace charm::jinja
