// Lookup and operators for charm's Jinja interpreter: jinja2's getattr/getitem rules and
// Python's arithmetic and comparison semantics. See jinja_builtins.h.
#include <algorithm>
#include <cmath>

#include "common/error.h"
#include "coordinator/text/jinja/builtins.h"

namespace charm::jinja {
namespace {

[[noreturn]] void fail_at(int line, const std::string& what) {
  fail_invalid("chat template line " + std::to_string(line) + ": " + what);
}

// jinja2.utils.object_type_repr, used in its undefined messages.
std::string object_type_repr(const Value& v) {
  if (v.is_none()) return "None";
  return type_name(v) + " object";
}

Value missing_attr(const Value& obj, const std::string& name) {
  return Value::undefined("'" + object_type_repr(obj) + "' has no attribute '" + name + "'");
}

bool is_int_like(const Value& v) { return v.kind == Kind::kInt || v.kind == Kind::kBool; }
int64_t as_int(const Value& v) { return v.kind == Kind::kBool ? v.b : v.i; }
double as_double(const Value& v) { return v.kind == Kind::kFloat ? v.f : static_cast<double>(as_int(v)); }

// Python's slice.indices(): clamps start/stop for a sequence of length n.
void slice_indices(int64_t n, const Value& start, const Value& stop, const Value& step, int line, int64_t& b,
                   int64_t& e, int64_t& s) {
  auto opt = [&](const Value& v, const char* what) {
    if (v.is_undefined() || v.is_none()) return false;
    if (!is_int_like(v)) fail_at(line, std::string("slice ") + what + " must be an integer or None, got " + type_name(v));
    return true;
  };
  s = opt(step, "step") ? as_int(step) : 1;
  if (s == 0) fail_at(line, "slice step cannot be zero");
  auto clamp = [&](const Value& v, int64_t dflt) {
    if (!opt(v, "index")) return dflt;
    int64_t x = as_int(v);
    if (x < 0) x += n;
    if (s > 0) return std::clamp<int64_t>(x, 0, n);
    return std::clamp<int64_t>(x, -1, n - 1);
  };
  b = clamp(start, s > 0 ? 0 : n - 1);
  e = clamp(stop, s > 0 ? n : -1);
}

Value arithmetic(const std::string& op, const Value& a, const Value& b, int line) {
  bool ints = is_int_like(a) && is_int_like(b);
  if (op == "+") return ints ? Value::integer(as_int(a) + as_int(b)) : Value::floating(as_double(a) + as_double(b));
  if (op == "-") return ints ? Value::integer(as_int(a) - as_int(b)) : Value::floating(as_double(a) - as_double(b));
  if (op == "*") return ints ? Value::integer(as_int(a) * as_int(b)) : Value::floating(as_double(a) * as_double(b));
  if (op == "**") {
    if (ints && as_int(b) >= 0) {
      int64_t r = 1;
      for (int64_t k = 0; k < as_int(b); ++k) r *= as_int(a);
      return Value::integer(r);
    }
    return Value::floating(std::pow(as_double(a), as_double(b)));
  }
  bool zero = ints ? as_int(b) == 0 : as_double(b) == 0.0;
  if (zero) fail_at(line, "division by zero in '" + op + "'");
  if (op == "/") return Value::floating(as_double(a) / as_double(b));
  if (ints) {
    // Python floors integer division and gives the remainder the divisor's sign.
    int64_t x = as_int(a), y = as_int(b), q = x / y, r = x % y;
    if (r != 0 && ((r < 0) != (y < 0))) {
      --q;
      r += y;
    }
    return op == "//" ? Value::integer(q) : Value::integer(r);
  }
  double x = as_double(a), y = as_double(b);
  if (op == "//") return Value::floating(std::floor(x / y));
  double r = std::fmod(x, y);
  if (r != 0 && ((r < 0) != (y < 0))) r += y;
  return Value::floating(r);
}

Value repeat(const Value& seq, int64_t n) {
  if (seq.is_string()) {
    std::string out;
    for (int64_t k = 0; k < n; ++k) out += seq.s;
    return Value::string(out);
  }
  ValueList out;
  for (int64_t k = 0; k < n; ++k) out.insert(out.end(), seq.list->begin(), seq.list->end());
  return seq.kind == Kind::kTuple ? Value::new_tuple(out) : Value::new_list(out);
}

}  // namespace

void require_defined(const Value& v, int line) {
  if (v.is_undefined()) fail_at(line, v.s);
}

Value get_attr(const Value& obj, const std::string& name, int line) {
  require_defined(obj, line);
  // jinja's sandbox answers unsafe (dunder) attributes with an undefined value, not an error.
  if (name.rfind("__", 0) == 0)
    return Value::undefined("access to attribute '" + name + "' of '" + type_name(obj) + "' object is unsafe.");
  if (obj.is_mapping()) {
    if (const Value* v = obj.find(Value::string(name))) return *v;
  }
  return missing_attr(obj, name);
}

Value get_item(const Value& obj, const Value& key, int line) {
  require_defined(obj, line);
  // An undefined key finds nothing (jinja's Undefined is hashable), it is not an error.
  if (key.is_undefined()) return Value::undefined(object_type_repr(obj) + " has no element Undefined");
  if (obj.is_sequence() && is_int_like(key)) {
    int64_t n = static_cast<int64_t>(obj.list->size()), k = as_int(key);
    if (k < 0) k += n;
    if (k >= 0 && k < n) return (*obj.list)[static_cast<size_t>(k)];
    return Value::undefined(object_type_repr(obj) + " has no element " + to_repr(key));
  }
  if (obj.is_string() && is_int_like(key)) {
    std::u32string s = decode_utf8_surrogateescape(obj.s);
    int64_t n = static_cast<int64_t>(s.size()), k = as_int(key);
    if (k < 0) k += n;
    if (k >= 0 && k < n) return Value::string(encode_utf8_surrogateescape(s.substr(static_cast<size_t>(k), 1)));
    return Value::undefined(object_type_repr(obj) + " has no element " + to_repr(key));
  }
  if (obj.is_mapping()) {
    if (const Value* v = obj.find(key)) return *v;
  }
  if (key.is_string()) return get_attr(obj, key.s, line);
  return Value::undefined(object_type_repr(obj) + " has no element " + to_repr(key));
}

Value get_slice(const Value& obj, const Value& start, const Value& stop, const Value& step, int line) {
  require_defined(obj, line);
  int64_t b, e, s;
  if (obj.is_string()) {
    std::u32string text = decode_utf8_surrogateescape(obj.s), out;
    slice_indices(static_cast<int64_t>(text.size()), start, stop, step, line, b, e, s);
    for (int64_t k = b; s > 0 ? k < e : k > e; k += s) out += text[static_cast<size_t>(k)];
    return Value::string(encode_utf8_surrogateescape(out));
  }
  if (!obj.is_sequence()) fail_at(line, "cannot slice a value of type '" + type_name(obj) + "'");
  ValueList out;
  slice_indices(static_cast<int64_t>(obj.list->size()), start, stop, step, line, b, e, s);
  for (int64_t k = b; s > 0 ? k < e : k > e; k += s) out.push_back((*obj.list)[static_cast<size_t>(k)]);
  return obj.kind == Kind::kTuple ? Value::new_tuple(out) : Value::new_list(out);
}

Value binary_op(const std::string& op, const Value& a, const Value& b, int line) {
  if (op == "~") return Value::string(to_str(a) + to_str(b));
  require_defined(a, line);
  require_defined(b, line);
  if (a.is_number() && b.is_number()) return arithmetic(op, a, b, line);
  if (op == "+" && a.is_string() && b.is_string()) return Value::string(a.s + b.s);
  if (op == "+" && a.is_sequence() && a.kind == b.kind) {
    ValueList out = *a.list;
    out.insert(out.end(), b.list->begin(), b.list->end());
    return a.kind == Kind::kTuple ? Value::new_tuple(out) : Value::new_list(out);
  }
  if (op == "*" && (a.is_string() || a.is_sequence()) && is_int_like(b)) return repeat(a, as_int(b));
  if (op == "*" && (b.is_string() || b.is_sequence()) && is_int_like(a)) return repeat(b, as_int(a));
  if (op == "%" && a.is_string())
    fail_at(line, "printf-style string formatting ('%' on a string) is not supported");
  fail_at(line, "unsupported operand types for " + op + ": '" + type_name(a) + "' and '" + type_name(b) + "'");
}

bool compare_op(const std::string& op, const Value& a, const Value& b, int line) {
  if (op == "==") return equals(a, b);
  if (op == "!=") return !equals(a, b);
  if (op == "in" || op == "notin") {
    bool found = false;
    if (b.is_string()) {
      if (!a.is_string()) fail_at(line, "'in <string>' requires string as left operand, not " + type_name(a));
      found = b.s.find(a.s) != std::string::npos;
    } else if (b.is_mapping()) {
      found = b.find(a) != nullptr;
    } else if (b.is_sequence()) {
      for (const Value& item : *b.list) found = found || equals(item, a);
    } else if (!b.is_undefined()) {
      fail_at(line, "argument of type '" + type_name(b) + "' is not iterable");
    }
    return op == "in" ? found : !found;
  }
  require_defined(a, line);
  require_defined(b, line);
  try {
    if (op == "<") return less_than(a, b);
    if (op == ">") return less_than(b, a);
    if (op == "<=") return !less_than(b, a);
    if (op == ">=") return !less_than(a, b);
  } catch (const Error& e) {
    fail_at(line, e.message());
  }
  fail_internal("chat template: unknown comparison operator " + op);
}

}  // namespace charm::jinja
