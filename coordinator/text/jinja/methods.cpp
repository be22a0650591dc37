// Python methods callable from chat templates (str, dict, list; the non-mutating ones that
// jinja2's ImmutableSandboxedEnvironment allows) and transformers' global functions.
// See jinja_builtins.h.
#include <cctype>
#include <chrono>
#include <ctime>
#include <set>

#include "common/error.h"
#include "coordinator/text/jinja/builtins.h"

namespace charm::jinja {
namespace {

[[noreturn]] void fail_at(int line, const std::string& what) {
  fail_invalid("chat template line " + std::to_string(line) + ": " + what);
}

const Value& need_string(const ValueList& args, size_t k, const std::string& method, int line) {
  if (k >= args.size() || !args[k].is_string())
    fail_at(line, "str." + method + "() argument " + std::to_string(k + 1) + " must be a string");
  return args[k];
}

// str.strip/lstrip/rstrip with Python's default whitespace set or an explicit character set.
std::string strip(const std::string& s, const ValueList& args, bool left, bool right, const std::string& method, int line) {
  std::u32string text = decode_utf8_surrogateescape(s), chars;
  bool default_ws = args.empty() || args[0].is_none();
  if (!default_ws) chars = decode_utf8_surrogateescape(need_string(args, 0, method, line).s);
  auto strip_it = [&](char32_t c) { return default_ws ? py_isspace(c) : chars.find(c) != std::u32string::npos; };
  size_t b = 0, e = text.size();
  while (left && b < e && strip_it(text[b])) ++b;
  while (right && e > b && strip_it(text[e - 1])) --e;
  return encode_utf8_surrogateescape(text.substr(b, e - b));
}

// str.split / str.rsplit: on runs of whitespace when sep is None, else on sep exactly.
Value split(const std::string& s, const ValueList& args, const KwArgs& kwargs, bool from_right, int line) {
  Value sep = args.size() > 0 ? args[0] : Value::none();
  Value maxsplit = args.size() > 1 ? args[1] : Value::integer(-1);
  for (const auto& [k, v] : kwargs) {
    if (k == "sep") sep = v;
    else if (k == "maxsplit") maxsplit = v;
    else fail_at(line, "str.split() got an unexpected keyword argument '" + k + "'");
  }
  int64_t limit = maxsplit.kind == Kind::kInt ? maxsplit.i : -1;
  ValueList parts;
  if (sep.is_none()) {
    std::u32string text = decode_utf8_surrogateescape(s);
    std::vector<std::u32string> words;
    if (!from_right) {
      size_t k = 0;
      while (k < text.size()) {
        while (k < text.size() && py_isspace(text[k])) ++k;
        if (k >= text.size()) break;
        if (limit >= 0 && static_cast<int64_t>(words.size()) == limit) {
          words.push_back(text.substr(k));  // Python keeps the rest as is
          break;
        }
        size_t start = k;
        while (k < text.size() && !py_isspace(text[k])) ++k;
        words.push_back(text.substr(start, k - start));
      }
    } else {
      size_t k = text.size();
      while (k > 0) {
        while (k > 0 && py_isspace(text[k - 1])) --k;
        if (k == 0) break;
        if (limit >= 0 && static_cast<int64_t>(words.size()) == limit) {
          words.insert(words.begin(), text.substr(0, k));
          break;
        }
        size_t end = k;
        while (k > 0 && !py_isspace(text[k - 1])) --k;
        words.insert(words.begin(), text.substr(k, end - k));
      }
    }
    for (const auto& w : words) parts.push_back(Value::string(encode_utf8_surrogateescape(w)));
    return Value::new_list(parts);
  }
  if (!sep.is_string()) fail_at(line, "str.split() separator must be a string or None");
  if (sep.s.empty()) fail_at(line, "str.split(): empty separator");
  std::vector<std::string> pieces;
  if (!from_right) {
    size_t start = 0;
    for (;;) {
      size_t hit = (limit >= 0 && static_cast<int64_t>(pieces.size()) >= limit) ? std::string::npos : s.find(sep.s, start);
      if (hit == std::string::npos) {
        pieces.push_back(s.substr(start));
        break;
      }
      pieces.push_back(s.substr(start, hit - start));
      start = hit + sep.s.size();
    }
  } else {
    size_t end = s.size();
    for (;;) {
      bool can = !(limit >= 0 && static_cast<int64_t>(pieces.size()) >= limit) && end >= sep.s.size();
      size_t hit = can ? s.rfind(sep.s, end - sep.s.size()) : std::string::npos;
      if (hit == std::string::npos) {
        pieces.insert(pieces.begin(), s.substr(0, end));
        break;
      }
      pieces.insert(pieces.begin(), s.substr(hit + sep.s.size(), end - hit - sep.s.size()));
      end = hit;
    }
  }
  for (const auto& p : pieces) parts.push_back(Value::string(p));
  return Value::new_list(parts);
}

std::string replace(const std::string& s, const std::string& from, const std::string& to, int64_t count) {
  std::string out;
  if (from.empty()) {
    // Python inserts `to` between every character (and at both ends).
    std::u32string text = decode_utf8_surrogateescape(s);
    int64_t done = 0;
    for (char32_t c : text) {
      if (count < 0 || done < count) { out += to; ++done; }
      append_utf8_surrogateescape(out, c);
    }
    if (count < 0 || done < count) out += to;
    return out;
  }
  size_t start = 0;
  int64_t done = 0;
  for (;;) {
    size_t hit = (count >= 0 && done >= count) ? std::string::npos : s.find(from, start);
    if (hit == std::string::npos) break;
    out += s.substr(start, hit - start) + to;
    start = hit + from.size();
    ++done;
  }
  return out + s.substr(start);
}

// startswith/endswith accept a string or a tuple of strings.
bool affix(const std::string& s, const Value& what, bool prefix, const std::string& method, int line) {
  ValueList options = what.is_sequence() ? *what.list : ValueList{what};
  for (const Value& o : options) {
    if (!o.is_string()) fail_at(line, "str." + method + "() argument must be str or a tuple of str, not " + type_name(o));
    if (o.s.size() <= s.size() &&
        (prefix ? s.compare(0, o.s.size(), o.s) == 0 : s.compare(s.size() - o.s.size(), o.s.size(), o.s) == 0))
      return true;
  }
  return false;
}

int64_t codepoint_index(const std::string& s, size_t byte_pos) {
  if (byte_pos == std::string::npos) return -1;
  return static_cast<int64_t>(decode_utf8_surrogateescape(s.substr(0, byte_pos)).size());
}

template <typename Pred>
bool all_chars(const std::string& s, Pred pred) {
  std::u32string t = decode_utf8_surrogateescape(s);
  if (t.empty()) return false;
  for (char32_t c : t)
    if (!pred(c)) return false;
  return true;
}

// str.format with "{}", "{0}" and "{name}" fields and "{{" / "}}" escapes; format specs
// and conversions ("{:>5}", "{!r}") are not supported.
std::string format(const std::string& fmt, const ValueList& args, const KwArgs& kwargs, int line) {
  std::string out;
  size_t auto_index = 0;
  for (size_t k = 0; k < fmt.size(); ++k) {
    char c = fmt[k];
    if (c == '}') {
      if (k + 1 < fmt.size() && fmt[k + 1] == '}') ++k;
      else fail_at(line, "str.format(): single '}' in format string");
      out += '}';
      continue;
    }
    if (c != '{') {
      out += c;
      continue;
    }
    if (k + 1 < fmt.size() && fmt[k + 1] == '{') {
      out += '{';
      ++k;
      continue;
    }
    size_t end = fmt.find('}', k);
    if (end == std::string::npos) fail_at(line, "str.format(): unclosed '{' in format string");
    std::string field = fmt.substr(k + 1, end - k - 1);
    if (field.find_first_of(":!") != std::string::npos)
      fail_at(line, "str.format(): format specs and conversions ('" + field + "') are not supported");
    k = end;
    if (field.empty() || std::isdigit(static_cast<unsigned char>(field[0]))) {
      size_t index = field.empty() ? auto_index++ : static_cast<size_t>(std::stoul(field));
      if (index >= args.size()) fail_at(line, "str.format(): replacement index " + std::to_string(index) + " out of range");
      out += to_str(args[index]);
      continue;
    }
    bool found = false;
    for (const auto& [name, v] : kwargs) {
      if (name != field) continue;
      out += to_str(v);
      found = true;
      break;
    }
    if (!found) fail_at(line, "str.format(): no argument named '" + field + "'");
  }
  return out;
}

Value string_method(const Value& obj, const std::string& name, const ValueList& args, const KwArgs& kwargs, int line) {
  const std::string& s = obj.s;
  if (name == "startswith" || name == "endswith") {
    if (args.empty()) fail_at(line, "str." + name + "() takes at least 1 argument");
    return Value::boolean(affix(s, args[0], name == "startswith", name, line));
  }
  if (name == "strip") return Value::string(strip(s, args, true, true, name, line));
  if (name == "lstrip") return Value::string(strip(s, args, true, false, name, line));
  if (name == "rstrip") return Value::string(strip(s, args, false, true, name, line));
  if (name == "split") return split(s, args, kwargs, false, line);
  if (name == "rsplit") return split(s, args, kwargs, true, line);
  if (name == "replace") {
    int64_t count = args.size() > 2 && args[2].kind == Kind::kInt ? args[2].i : -1;
    return Value::string(replace(s, need_string(args, 0, name, line).s, need_string(args, 1, name, line).s, count));
  }
  if (name == "upper" || name == "lower") return apply_filter(name, obj, {}, {}, line);
  if (name == "capitalize") return apply_filter("capitalize", obj, {}, {}, line);
  if (name == "title") {
    // Python's str.title: a letter after a non-letter starts a word.
    std::u32string out;
    bool prev_cased = false;
    for (char32_t c : decode_utf8_surrogateescape(s)) {
      bool cased = py_lower(c) != py_upper(c) || c == 0xDF;
      out += cased ? (prev_cased ? py_lower(c) : py_upper(c)) : c;
      prev_cased = cased;
    }
    return Value::string(encode_utf8_surrogateescape(out));
  }
  if (name == "find") return Value::integer(codepoint_index(s, s.find(need_string(args, 0, name, line).s)));
  if (name == "rfind") return Value::integer(codepoint_index(s, s.rfind(need_string(args, 0, name, line).s)));
  if (name == "count") {
    const std::string& sub = need_string(args, 0, name, line).s;
    if (sub.empty()) return Value::integer(static_cast<int64_t>(decode_utf8_surrogateescape(s).size()) + 1);
    int64_t n = 0;
    for (size_t p = s.find(sub); p != std::string::npos; p = s.find(sub, p + sub.size())) ++n;
    return Value::integer(n);
  }
  if (name == "join") {
    if (args.empty()) fail_at(line, "str.join() takes exactly one argument");
    std::string out;
    bool first = true;
    for (const Value& item : iterate(args[0])) {
      if (!item.is_string()) fail_at(line, "str.join(): sequence item must be str, not " + type_name(item));
      if (!first) out += s;
      out += item.s;
      first = false;
    }
    return Value::string(out);
  }
  if (name == "splitlines") {
    ValueList lines;
    size_t start = 0;
    while (start < s.size()) {
      size_t nl = s.find('\n', start);
      if (nl == std::string::npos) nl = s.size();
      std::string line_text = s.substr(start, nl - start);
      if (!line_text.empty() && line_text.back() == '\r') line_text.pop_back();
      lines.push_back(Value::string(line_text));
      start = nl + 1;
    }
    return Value::new_list(lines);
  }
  if (name == "format") return Value::string(format(s, args, kwargs, line));
  if (name == "isdigit") return Value::boolean(all_chars(s, [](char32_t c) { return c >= '0' && c <= '9'; }));
  if (name == "isalpha")
    return Value::boolean(all_chars(s, [](char32_t c) { return c < 128 ? std::isalpha(static_cast<int>(c)) != 0 : true; }));
  if (name == "isspace") return Value::boolean(all_chars(s, py_isspace));
  fail_at(line, "unknown or unsupported string method '" + name + "'");
}

Value dict_method(const Value& obj, const std::string& name, const ValueList& args, int line) {
  if (name == "items" || name == "keys" || name == "values") {
    ValueList out;
    for (const auto& [k, v] : *obj.dict)
      out.push_back(name == "items" ? Value::new_tuple({k, v}) : name == "keys" ? k : v);
    return Value::new_list(out);
  }
  if (name == "get") {
    if (args.empty()) fail_at(line, "dict.get() takes at least 1 argument");
    const Value* v = obj.find(args[0]);
    return v ? *v : (args.size() > 1 ? args[1] : Value::none());
  }
  static const std::set<std::string> mutating = {"update", "pop", "popitem", "clear", "setdefault"};
  if (mutating.count(name)) fail_at(line, "dict." + name + "() is not allowed: chat templates cannot modify dicts");
  fail_at(line, "unknown or unsupported dict method '" + name + "'");
}

Value list_method(const Value& obj, const std::string& name, const ValueList& args, int line) {
  if (name == "index" || name == "count") {
    if (args.empty()) fail_at(line, "list." + name + "() takes exactly one argument");
    int64_t count = 0;
    for (size_t k = 0; k < obj.list->size(); ++k) {
      if (!equals((*obj.list)[k], args[0])) continue;
      if (name == "index") return Value::integer(static_cast<int64_t>(k));
      ++count;
    }
    if (name == "index") fail_at(line, to_repr(args[0]) + " is not in list");
    return Value::integer(count);
  }
  static const std::set<std::string> mutating = {"append", "extend", "insert", "pop", "remove", "clear", "sort", "reverse"};
  if (mutating.count(name)) fail_at(line, "list." + name + "() is not allowed: chat templates cannot modify lists");
  fail_at(line, "unknown or unsupported list method '" + name + "'");
}

Value range(const ValueList& args, int line) {
  for (const Value& a : args)
    if (a.kind != Kind::kInt) fail_at(line, "range() arguments must be integers, got " + type_name(a));
  if (args.empty() || args.size() > 3) fail_at(line, "range() takes 1 to 3 arguments");
  int64_t start = args.size() > 1 ? args[0].i : 0, stop = args.size() > 1 ? args[1].i : args[0].i;
  int64_t step = args.size() > 2 ? args[2].i : 1;
  if (step == 0) fail_at(line, "range() step must not be zero");
  ValueList out;
  for (int64_t k = start; step > 0 ? k < stop : k > stop; k += step) {
    // jinja's sandbox caps range() at MAX_RANGE items.
    if (out.size() >= 100000) fail_at(line, "range() too big (more than 100000 items)");
    out.push_back(Value::integer(k));
  }
  return Value::new_list(out);
}

ValueDict kwargs_dict(const ValueList& args, const KwArgs& kwargs, const std::string& fn, int line) {
  ValueDict items;
  if (!args.empty()) {
    if (args.size() > 1 || !args[0].is_mapping()) fail_at(line, fn + "() takes at most one dict argument");
    items = *args[0].dict;
  }
  Value tmp = Value::new_dict(items);
  for (const auto& [k, v] : kwargs) tmp.set(Value::string(k), v);
  return *tmp.dict;
}

}  // namespace

Value call_method(const Value& obj, const std::string& name, const ValueList& args, const KwArgs& kwargs, int line) {
  require_defined(obj, line);
  if (!name.empty() && name[0] == '_') fail_at(line, "access to attribute '" + name + "' is unsafe (sandboxed template)");
  if (obj.is_string()) return string_method(obj, name, args, kwargs, line);
  if (obj.kind == Kind::kDict) {
    // A dict entry shadowed by a method name is still the method (jinja's getattr comes first).
    static const std::set<std::string> methods = {"items", "keys", "values", "get", "update", "pop", "popitem",
                                                  "clear", "setdefault"};
    if (methods.count(name)) return dict_method(obj, name, args, line);
    if (obj.find(Value::string(name))) fail_at(line, "'" + name + "' is not callable");
  }
  if (obj.is_sequence()) return list_method(obj, name, args, line);
  fail_at(line, "'" + type_name(obj) + " object' has no method '" + name + "'");
}

bool is_global_function(const std::string& name) {
  static const std::set<std::string> names = {"raise_exception", "namespace", "range", "dict", "strftime_now"};
  return names.count(name) != 0;
}

Value call_global(const std::string& name, const ValueList& args, const KwArgs& kwargs, int line,
                  const Environment& env) {
  if (name == "raise_exception") {
    // transformers raises jinja2.TemplateError(message); the message is the template's own.
    fail_invalid("chat template: " + (args.empty() ? std::string() : to_str(args[0])));
  }
  if (name == "namespace") {
    ValueDict items = kwargs_dict(args, kwargs, name, line);
    for (const auto& kv : items)
      if (kv.first.is_string() && !kv.first.s.empty() && kv.first.s[0] == '_')
        fail_at(line, "namespace() cannot store underscore-prefixed attribute '" + kv.first.s + "'");
    return Value::new_namespace(std::move(items));
  }
  if (name == "dict") return Value::new_dict(kwargs_dict(args, kwargs, name, line));
  if (name == "range") return range(args, line);
  if (name == "strftime_now") {
    if (args.empty() || !args[0].is_string()) fail_at(line, "strftime_now() needs a format string");
    std::tm local{};
    if (env.local_time) {
      local = env.local_time();
    } else {
      const std::time_t now = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
      localtime_r(&now, &local);
    }
    char buf[256];
    size_t n = std::strftime(buf, sizeof buf, args[0].s.c_str(), &local);
    return Value::string(std::string(buf, n));
  }
  fail_at(line, "unknown function '" + name + "'");
}

}  // namespace charm::jinja
