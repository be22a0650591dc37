// jinja2's built-in filters and tests (jinja2/filters.py, jinja2/tests.py), with
// transformers' tojson override (json.dumps, ensure_ascii=False). See jinja_builtins.h.
#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>

#include "common/error.h"
#include "coordinator/text/jinja/builtins.h"

namespace charm::jinja {
namespace {

[[noreturn]] void fail_at(int line, const std::string& what) {
  fail_invalid("chat template line " + std::to_string(line) + ": " + what);
}

// A filter argument given by position or by keyword, else `dflt`.
Value arg(const ValueList& args, const KwArgs& kwargs, size_t pos, const std::string& name, Value dflt) {
  for (const auto& [k, v] : kwargs)
    if (k == name) return v;
  return pos < args.size() ? args[pos] : dflt;
}

std::u32string strip_u32(const std::u32string& s, bool left, bool right) {
  size_t b = 0, e = s.size();
  while (left && b < e && py_isspace(s[b])) ++b;
  while (right && e > b && py_isspace(s[e - 1])) --e;
  return s.substr(b, e - b);
}


int64_t length_of(const Value& v, int line) {
  switch (v.kind) {
    case Kind::kUndefined: return 0;
    case Kind::kString: return static_cast<int64_t>(decode_utf8_surrogateescape(v.s).size());
    case Kind::kList:
    case Kind::kTuple: return static_cast<int64_t>(v.list->size());
    case Kind::kDict:
    case Kind::kNamespace: return static_cast<int64_t>(v.dict->size());
    default: fail_at(line, "object of type '" + type_name(v) + "' has no len() (filter 'length')");
  }
}

// Reads a dotted attribute path ("a.b", "0") the way jinja's make_attrgetter does.
Value attr_path(const Value& v, const Value& attribute, int line) {
  if (!attribute.is_string()) return get_item(v, attribute, line);
  Value cur = v;
  size_t start = 0;
  const std::string& path = attribute.s;
  while (start <= path.size()) {
    size_t dot = path.find('.', start);
    std::string part = path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    bool numeric = !part.empty() && std::all_of(part.begin(), part.end(), ::isdigit);
    cur = numeric ? get_item(cur, Value::integer(std::atoll(part.c_str())), line) : get_item(cur, Value::string(part), line);
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  return cur;
}

// Sort key comparison for sort/dictsort/min/max: strings compare case-insensitively by default.
bool sort_less(const Value& a, const Value& b, bool case_sensitive) {
  if (!case_sensitive && a.is_string() && b.is_string()) return str_lower(a.s) < str_lower(b.s);
  return less_than(a, b);
}

Value select_like(const Value& value, const ValueList& args, bool by_attr, bool keep_when, int line) {
  ValueList out;
  size_t test_pos = by_attr ? 1 : 0;
  if (!truthy(value)) return Value::new_list();  // jinja guards with `if seq:`, so None selects nothing
  for (const Value& item : iterate(value)) {
    Value subject = by_attr ? attr_path(item, args.at(0), line) : item;
    bool ok;
    if (args.size() > test_pos) {
      if (!args[test_pos].is_string()) fail_at(line, "select/reject: the test name must be a string");
      ValueList test_args(args.begin() + static_cast<long>(test_pos) + 1, args.end());
      ok = apply_test(args[test_pos].s, subject, test_args, line);
    } else {
      ok = truthy(subject);
    }
    if (ok == keep_when) out.push_back(item);
  }
  return Value::new_list(out);
}

Value round_filter(const Value& v, const ValueList& args, const KwArgs& kwargs, int line) {
  int64_t precision = arg(args, kwargs, 0, "precision", Value::integer(0)).i;
  std::string method = arg(args, kwargs, 1, "method", Value::string("common")).s;
  double x = v.kind == Kind::kFloat ? v.f : static_cast<double>(v.kind == Kind::kBool ? v.b : v.i);
  if (!v.is_number()) fail_at(line, "filter 'round' needs a number, got " + type_name(v));
  double scale = std::pow(10.0, static_cast<double>(precision));
  if (method == "ceil") return Value::floating(std::ceil(x * scale) / scale);
  if (method == "floor") return Value::floating(std::floor(x * scale) / scale);
  if (method != "common") fail_at(line, "filter 'round': method must be common, ceil or floor");
  // Python's round(x, n): correctly rounded from the exact binary value, ties to even,
  // which is what printf's %.*f does.
  char buf[512];
  std::snprintf(buf, sizeof buf, "%.*f", static_cast<int>(std::max<int64_t>(precision, 0)), x);
  return Value::floating(std::strtod(buf, nullptr));
}

Value to_int(const Value& v, const Value& dflt) {
  if (v.kind == Kind::kInt) return v;
  if (v.kind == Kind::kBool) return Value::integer(v.b);
  if (v.kind == Kind::kFloat) return Value::integer(static_cast<int64_t>(v.f));
  if (v.is_string()) {
    std::string s = encode_utf8_surrogateescape(strip_u32(decode_utf8_surrogateescape(v.s), true, true));
    char* end = nullptr;
    long long i = std::strtoll(s.c_str(), &end, 10);
    if (!s.empty() && *end == '\0') return Value::integer(i);
    double f = std::strtod(s.c_str(), &end);
    if (!s.empty() && *end == '\0') return Value::integer(static_cast<int64_t>(f));
  }
  return dflt;
}

Value to_float(const Value& v, const Value& dflt) {
  if (v.is_number()) return Value::floating(v.kind == Kind::kFloat ? v.f : static_cast<double>(v.kind == Kind::kBool ? v.b : v.i));
  if (v.is_string()) {
    std::string s = encode_utf8_surrogateescape(strip_u32(decode_utf8_surrogateescape(v.s), true, true));
    char* end = nullptr;
    double f = std::strtod(s.c_str(), &end);
    if (!s.empty() && *end == '\0') return Value::floating(f);
  }
  return dflt;
}

std::string capitalize(const std::string& s) {
  std::u32string t = decode_utf8_surrogateescape(str_lower(s));
  if (!t.empty()) t[0] = py_upper(t[0]);
  return encode_utf8_surrogateescape(t);
}

// jinja's title filter: upper-case the first letter after whitespace, '-', '(', '{', '[' or '<'.
std::string title(const std::string& s) {
  std::u32string out;
  bool start = true;
  for (char32_t c : decode_utf8_surrogateescape(s)) {
    bool sep = py_isspace(c) || c == '-' || c == '(' || c == '{' || c == '[' || c == '<';
    out += start ? py_upper(c) : py_lower(c);
    start = sep;
  }
  return encode_utf8_surrogateescape(out);
}

std::string html_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

using Filter = std::function<Value(const Value&, const ValueList&, const KwArgs&, int)>;

Value sort_filter(const Value& v, const ValueList& args, const KwArgs& kw, int line) {
  bool reverse = truthy(arg(args, kw, 0, "reverse", Value::boolean(false)));
  bool case_sensitive = truthy(arg(args, kw, 1, "case_sensitive", Value::boolean(false)));
  Value attribute = arg(args, kw, 2, "attribute", Value::none());
  ValueList items = iterate(v);
  auto key = [&](const Value& x) { return attribute.is_none() ? x : attr_path(x, attribute, line); };
  try {
    std::stable_sort(items.begin(), items.end(), [&](const Value& a, const Value& b) {
      return reverse ? sort_less(key(b), key(a), case_sensitive) : sort_less(key(a), key(b), case_sensitive);
    });
  } catch (const Error& e) {
    fail_at(line, "filter 'sort': " + e.message());
  }
  return Value::new_list(items);
}

Value minmax_filter(const Value& v, const ValueList& args, const KwArgs& kw, int line, bool want_max) {
  ValueList items = iterate(v);
  if (items.empty()) return Value::undefined("No aggregated item, sequence was empty.");
  bool case_sensitive = truthy(arg(args, kw, 0, "case_sensitive", Value::boolean(false)));
  Value attribute = arg(args, kw, 1, "attribute", Value::none());
  auto key = [&](const Value& x) { return attribute.is_none() ? x : attr_path(x, attribute, line); };
  Value best = items[0];
  for (const Value& x : items) {
    bool better = want_max ? sort_less(key(best), key(x), case_sensitive) : sort_less(key(x), key(best), case_sensitive);
    if (better) best = x;
  }
  return best;
}

Value map_filter(const Value& v, const ValueList& args, const KwArgs& kw, int line) {
  ValueList out;
  Value attribute = arg({}, kw, 0, "attribute", Value::undefined(""));
  if (!truthy(v)) return Value::new_list();  // jinja guards with `if value:`
  for (const Value& item : iterate(v)) {
    if (!attribute.is_undefined()) {
      Value got = attr_path(item, attribute, line);
      if (got.is_undefined()) got = arg({}, kw, 0, "default", got);
      out.push_back(got);
    } else {
      if (args.empty() || !args[0].is_string()) fail_at(line, "filter 'map' needs a filter name or attribute=");
      out.push_back(apply_filter(args[0].s, item, ValueList(args.begin() + 1, args.end()), {}, line));
    }
  }
  return Value::new_list(out);
}

// jinja's indent filter: indents every line but the first (unless first=True), skipping
// blank lines unless blank=True.
Value indent_filter(const Value& v, const ValueList& args, const KwArgs& kw, int) {
  Value width = arg(args, kw, 0, "width", Value::integer(4));
  bool first = truthy(arg(args, kw, 1, "first", Value::boolean(false)));
  bool blank = truthy(arg(args, kw, 2, "blank", Value::boolean(false)));
  std::string pad = width.is_string() ? width.s : std::string(static_cast<size_t>(std::max<int64_t>(width.i, 0)), ' ');
  // jinja appends "\n" and splits lines, so a trailing newline yields a final empty line.
  std::string s = to_str(v) + "\n";
  std::vector<std::string> lines;
  for (size_t start = 0; start < s.size();) {
    size_t nl = s.find('\n', start);
    lines.push_back(s.substr(start, nl - start));
    start = nl + 1;
  }
  std::string out = lines.empty() ? "" : lines[0];
  for (size_t k = 1; k < lines.size(); ++k) out += "\n" + ((blank || !lines[k].empty()) ? pad : "") + lines[k];
  return Value::string(first ? pad + out : out);
}

const std::map<std::string, Filter>& filters() {
  static const std::map<std::string, Filter> table = {
      {"abs", [](const Value& v, const ValueList&, const KwArgs&, int line) {
         if (v.kind == Kind::kFloat) return Value::floating(std::fabs(v.f));
         if (!v.is_number()) fail_at(line, "filter 'abs' needs a number, got " + type_name(v));
         return Value::integer(std::llabs(v.kind == Kind::kBool ? v.b : v.i));
       }},
      {"attr", [](const Value& v, const ValueList& a, const KwArgs&, int line) {
         return get_attr(v, a.empty() ? "" : to_str(a[0]), line);
       }},
      {"capitalize", [](const Value& v, const ValueList&, const KwArgs&, int) { return Value::string(capitalize(to_str(v))); }},
      {"center", [](const Value& v, const ValueList& a, const KwArgs& kw, int) {
         std::u32string s = decode_utf8_surrogateescape(to_str(v));
         int64_t width = arg(a, kw, 0, "width", Value::integer(80)).i, n = static_cast<int64_t>(s.size());
         if (width <= n) return Value::string(to_str(v));
         // Python's str.center puts the extra space on the right when the margin is odd... unless len is odd.
         int64_t marg = width - n, left = marg / 2 + (marg & width & 1);
         return Value::string(std::string(static_cast<size_t>(left), ' ') + to_str(v) +
                              std::string(static_cast<size_t>(marg - left), ' '));
       }},
      {"default", [](const Value& v, const ValueList& a, const KwArgs& kw, int) {
         Value dflt = arg(a, kw, 0, "default_value", Value::string(""));
         bool boolean = truthy(arg(a, kw, 1, "boolean", Value::boolean(false)));
         if (v.is_undefined() || (boolean && !truthy(v))) return dflt;
         return v;
       }},
      {"dictsort", [](const Value& v, const ValueList& a, const KwArgs& kw, int line) {
         if (!v.is_mapping()) fail_at(line, "filter 'dictsort' needs a dict, got " + type_name(v));
         bool case_sensitive = truthy(arg(a, kw, 0, "case_sensitive", Value::boolean(false)));
         bool by_value = arg(a, kw, 1, "by", Value::string("key")).s == "value";
         bool reverse = truthy(arg(a, kw, 2, "reverse", Value::boolean(false)));
         ValueDict items = *v.dict;
         std::stable_sort(items.begin(), items.end(), [&](const auto& x, const auto& y) {
           const Value& kx = by_value ? x.second : x.first;
           const Value& ky = by_value ? y.second : y.first;
           return reverse ? sort_less(ky, kx, case_sensitive) : sort_less(kx, ky, case_sensitive);
         });
         ValueList out;
         for (auto& [k, val] : items) out.push_back(Value::new_tuple({k, val}));
         return Value::new_list(out);
       }},
      {"escape", [](const Value& v, const ValueList&, const KwArgs&, int) { return Value::string(html_escape(to_str(v))); }},
      {"first", [](const Value& v, const ValueList&, const KwArgs&, int) {
         ValueList items = iterate(v);
         return items.empty() ? Value::undefined("No first item, sequence was empty.") : items.front();
       }},
      {"float", [](const Value& v, const ValueList& a, const KwArgs& kw, int) {
         return to_float(v, arg(a, kw, 0, "default", Value::floating(0.0)));
       }},
      {"int", [](const Value& v, const ValueList& a, const KwArgs& kw, int) {
         return to_int(v, arg(a, kw, 0, "default", Value::integer(0)));
       }},
      {"indent", indent_filter},
      {"items", [](const Value& v, const ValueList&, const KwArgs&, int line) {
         if (v.is_undefined()) return Value::new_list();
         if (!v.is_mapping()) fail_at(line, "filter 'items' needs a dict, got " + type_name(v));
         ValueList out;
         for (const auto& [k, val] : *v.dict) out.push_back(Value::new_tuple({k, val}));
         return Value::new_list(out);
       }},
      {"join", [](const Value& v, const ValueList& a, const KwArgs& kw, int line) {
         std::string sep = to_str(arg(a, kw, 0, "d", Value::string("")));
         Value attribute = arg(a, kw, 1, "attribute", Value::none());
         std::string out;
         bool first = true;
         for (const Value& item : iterate(v)) {
           if (!first) out += sep;
           out += to_str(attribute.is_none() ? item : attr_path(item, attribute, line));
           first = false;
         }
         return Value::string(out);
       }},
      {"last", [](const Value& v, const ValueList&, const KwArgs&, int) {
         ValueList items = iterate(v);
         return items.empty() ? Value::undefined("No last item, sequence was empty.") : items.back();
       }},
      {"length", [](const Value& v, const ValueList&, const KwArgs&, int line) { return Value::integer(length_of(v, line)); }},
      {"list", [](const Value& v, const ValueList&, const KwArgs&, int) { return Value::new_list(iterate(v)); }},
      {"lower", [](const Value& v, const ValueList&, const KwArgs&, int) { return Value::string(str_lower(to_str(v))); }},
      {"map", map_filter},
      {"max", [](const Value& v, const ValueList& a, const KwArgs& kw, int line) { return minmax_filter(v, a, kw, line, true); }},
      {"min", [](const Value& v, const ValueList& a, const KwArgs& kw, int line) { return minmax_filter(v, a, kw, line, false); }},
      {"reject", [](const Value& v, const ValueList& a, const KwArgs&, int line) { return select_like(v, a, false, false, line); }},
      {"rejectattr", [](const Value& v, const ValueList& a, const KwArgs&, int line) { return select_like(v, a, true, false, line); }},
      {"replace", [](const Value& v, const ValueList& a, const KwArgs& kw, int line) {
         ValueList margs = {arg(a, kw, 0, "old", Value::string("")), arg(a, kw, 1, "new", Value::string(""))};
         Value count = arg(a, kw, 2, "count", Value::none());
         if (!count.is_none()) margs.push_back(count);
         return call_method(Value::string(to_str(v)), "replace", margs, {}, line);
       }},
      {"reverse", [](const Value& v, const ValueList&, const KwArgs&, int) {
         if (v.is_string()) {
           std::u32string s = decode_utf8_surrogateescape(v.s);
           std::reverse(s.begin(), s.end());
           return Value::string(encode_utf8_surrogateescape(s));
         }
         ValueList items = iterate(v);
         std::reverse(items.begin(), items.end());
         return Value::new_list(items);
       }},
      {"round", round_filter},
      {"safe", [](const Value& v, const ValueList&, const KwArgs&, int) { return v; }},
      {"select", [](const Value& v, const ValueList& a, const KwArgs&, int line) { return select_like(v, a, false, true, line); }},
      {"selectattr", [](const Value& v, const ValueList& a, const KwArgs&, int line) { return select_like(v, a, true, true, line); }},
      {"sort", sort_filter},
      {"string", [](const Value& v, const ValueList&, const KwArgs&, int) { return Value::string(to_str(v)); }},
      {"sum", [](const Value& v, const ValueList& a, const KwArgs& kw, int line) {
         Value attribute = arg(a, kw, 0, "attribute", Value::none());
         Value total = arg(a, kw, 1, "start", Value::integer(0));
         for (const Value& item : iterate(v))
           total = binary_op("+", total, attribute.is_none() ? item : attr_path(item, attribute, line), line);
         return total;
       }},
      {"title", [](const Value& v, const ValueList&, const KwArgs&, int) { return Value::string(title(to_str(v))); }},
      {"tojson", [](const Value& v, const ValueList& a, const KwArgs& kw, int line) {
         // transformers' tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False).
         bool ensure_ascii = truthy(arg(a, kw, 0, "ensure_ascii", Value::boolean(false)));
         if (!arg(a, kw, 2, "separators", Value::none()).is_none())
           fail_at(line, "filter 'tojson': custom separators are not supported");
         Value indent = arg(a, kw, 1, "indent", Value::none());
         bool sort_keys = truthy(arg(a, kw, 3, "sort_keys", Value::boolean(false)));
         try {
           return Value::string(to_json_text(v, indent.kind == Kind::kInt ? static_cast<int>(indent.i) : -1, sort_keys, ensure_ascii));
         } catch (const Error& e) {
           fail_at(line, "filter 'tojson': " + e.message());
         }
       }},
      {"trim", [](const Value& v, const ValueList& a, const KwArgs& kw, int line) {
         Value chars = arg(a, kw, 0, "chars", Value::none());
         return call_method(Value::string(to_str(v)), "strip", chars.is_none() ? ValueList{} : ValueList{chars}, {}, line);
       }},
      {"unique", [](const Value& v, const ValueList& a, const KwArgs& kw, int line) {
         bool case_sensitive = truthy(arg(a, kw, 0, "case_sensitive", Value::boolean(false)));
         ValueList out, keys;
         for (const Value& item : iterate(v)) {
           Value key = (!case_sensitive && item.is_string()) ? Value::string(str_lower(item.s)) : item;
           bool seen = false;
           for (const Value& k : keys) seen = seen || equals(k, key);
           if (!seen) {
             keys.push_back(key);
             out.push_back(item);
           }
         }
         return Value::new_list(out);
       }},
      {"upper", [](const Value& v, const ValueList&, const KwArgs&, int) { return Value::string(str_upper(to_str(v))); }},
      {"wordcount", [](const Value& v, const ValueList&, const KwArgs&, int line) {
         return Value::integer(length_of(call_method(Value::string(to_str(v)), "split", {}, {}, line), line));
       }},
  };
  return table;
}

const std::map<std::string, std::string>& filter_aliases() {
  static const std::map<std::string, std::string> aliases = {{"count", "length"}, {"d", "default"}, {"e", "escape"}};
  return aliases;
}

bool integer_like(const Value& v) { return v.kind == Kind::kInt; }

}  // namespace

Value apply_filter(const std::string& name, const Value& value, const ValueList& args, const KwArgs& kwargs, int line) {
  auto alias = filter_aliases().find(name);
  const std::string& real = alias == filter_aliases().end() ? name : alias->second;
  auto it = filters().find(real);
  if (it == filters().end()) fail_at(line, "unknown filter '" + name + "'");
  // Filters other than default/length/list/... see undefined values as jinja's Undefined does:
  // empty string, empty iteration.
  try {
    return it->second(value, args, kwargs, line);
  } catch (const Error& e) {
    if (e.message().rfind("chat template line", 0) == 0) throw;
    fail_at(line, "filter '" + name + "': " + e.message());
  }
}

bool apply_test(const std::string& name, const Value& v, const ValueList& args, int line) {
  auto need_arg = [&]() -> const Value& {
    if (args.empty()) fail_at(line, "test '" + name + "' needs an argument");
    return args[0];
  };
  if (name == "defined") return !v.is_undefined();
  if (name == "undefined") return v.is_undefined();
  if (name == "none") return v.is_none();
  if (name == "string") return v.is_string();
  if (name == "number") return v.is_number();
  if (name == "integer") return integer_like(v);
  if (name == "float") return v.kind == Kind::kFloat;
  if (name == "boolean") return v.kind == Kind::kBool;
  if (name == "true") return v.kind == Kind::kBool && v.b;
  if (name == "false") return v.kind == Kind::kBool && !v.b;
  if (name == "mapping") return v.kind == Kind::kDict;
  if (name == "sequence") return v.is_sequence() || v.is_string() || v.kind == Kind::kDict;
  if (name == "iterable") return v.is_sequence() || v.is_string() || v.is_mapping() || v.is_undefined();
  if (name == "callable") return false;
  if (name == "odd" || name == "even") {
    if (v.kind != Kind::kInt) fail_at(line, "test '" + name + "' needs an integer, got " + type_name(v));
    return ((v.i % 2) != 0) == (name == "odd");
  }
  if (name == "divisibleby") {
    const Value& d = need_arg();
    if (v.kind != Kind::kInt || d.kind != Kind::kInt || d.i == 0) fail_at(line, "test 'divisibleby' needs non-zero integers");
    return v.i % d.i == 0;
  }
  if (name == "lower") return v.is_string() && str_lower(v.s) == v.s;
  if (name == "upper") return v.is_string() && str_upper(v.s) == v.s;
  if (name == "sameas") {
    const Value& o = need_arg();
    if (v.kind != o.kind) return false;
    if (v.is_sequence()) return v.list == o.list;
    if (v.is_mapping()) return v.dict == o.dict;
    return equals(v, o);
  }
  if (name == "in") return compare_op("in", v, need_arg(), line);
  static const std::map<std::string, std::string> cmp = {
      {"eq", "=="}, {"equalto", "=="}, {"==", "=="}, {"ne", "!="}, {"!=", "!="}, {"lt", "<"}, {"lessthan", "<"},
      {"<", "<"}, {"le", "<="}, {"<=", "<="}, {"gt", ">"}, {"greaterthan", ">"}, {">", ">"}, {"ge", ">="}, {">=", ">="}};
  auto c = cmp.find(name);
  if (c != cmp.end()) return compare_op(c->second, v, need_arg(), line);
  if (name == "filter") return need_arg().is_string() && (filters().count(args[0].s) || filter_aliases().count(args[0].s));
  if (name == "test") return false;
  fail_at(line, "unknown test '" + name + "'");
}

}  // namespace charm::jinja
