// The value type of charm's Jinja interpreter: a Python-like dynamic value (None, bool, int,
// float, str, list, tuple, dict, namespace, undefined) with Python's semantics for str(),
// repr(), truthiness, ==, <, and arithmetic, because chat templates are Python code in effect
// (jinja2 compiles them to Python) and their output must match transformers byte for byte.
// Lists, dicts and namespaces are shared (reference semantics, as in Python), so
// `{% set ns.x = ... %}` changes the one namespace every scope sees.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/utf8.h"  // decode_utf8_surrogateescape: str is indexed by code point, as in Python

namespace charm::jinja {

/// The dynamic type of a Value; kTuple behaves as an immutable list.
enum class Kind { kUndefined, kNone, kBool, kInt, kFloat, kString, kList, kTuple, kDict, kNamespace, kMacro };

struct Stmt;  // a {% macro %} definition (jinja_ast.h)
struct Value;
using ValueList = std::vector<Value>;
/// Insertion-ordered key/value pairs (Python dicts keep insertion order).
using ValueDict = std::vector<std::pair<Value, Value>>;

/// A Python-like value. Copies of list/tuple/dict/namespace values share their contents.
struct Value {
  Kind kind = Kind::kUndefined;
  bool b = false;
  int64_t i = 0;
  double f = 0.0;
  std::string s;                      ///< string contents (UTF-8); for kUndefined, the reason
  std::shared_ptr<ValueList> list;    ///< kList, kTuple
  std::shared_ptr<ValueDict> dict;    ///< kDict, kNamespace
  const Stmt* macro = nullptr;        ///< kMacro: the definition, owned by the parsed template

  /// An undefined value; `why` is jinja's message for using it ("'x' is undefined").
  static Value undefined(std::string why);
  static Value none();
  static Value boolean(bool v);
  static Value integer(int64_t v);
  static Value floating(double v);
  static Value string(std::string v);
  static Value new_list(ValueList items = {});
  static Value new_tuple(ValueList items);
  static Value new_dict(ValueDict items = {});
  static Value new_namespace(ValueDict items = {});
  /// Converts JSON (objects keep their key order) to a Value; null -> None. Throws
  /// charm::Error(kInvalidInput) for JSON nested deeper than kMaxValueDepth.
  static Value from_json(const nlohmann::ordered_json& j);

  bool is_undefined() const { return kind == Kind::kUndefined; }
  bool is_none() const { return kind == Kind::kNone; }
  bool is_string() const { return kind == Kind::kString; }
  bool is_number() const { return kind == Kind::kInt || kind == Kind::kFloat || kind == Kind::kBool; }
  bool is_sequence() const { return kind == Kind::kList || kind == Kind::kTuple; }
  bool is_mapping() const { return kind == Kind::kDict || kind == Kind::kNamespace; }

  /// The entry for `key` in a dict or namespace, or nullptr.
  const Value* find(const Value& key) const;
  Value* find(const Value& key);
  /// Sets `key` in a dict or namespace, appending when absent.
  void set(const Value& key, Value v);
};

/// How deeply lists, tuples and dicts may nest in the walks over a Value (from_json, str,
/// repr, ==, <, tojson), so that no value, whether passed in or built by a template's loop,
/// can overflow the stack; deeper values throw charm::Error(kInvalidInput), as Python's
/// RecursionError makes jinja2 fail (at about 1000 frames).
constexpr int kMaxValueDepth = 256;

/// Python's type name ("str", "int", "list", "dict", "NoneType", ...), for error messages.
std::string type_name(const Value& v);
/// Python truthiness (undefined is false).
bool truthy(const Value& v);
/// str(v): what `{{ v }}` and `~` output (undefined -> "", None -> "None", 1.0 -> "1.0").
std::string to_str(const Value& v);
/// repr(v) as Python writes it ("'a'", "[1, 'b']", "{'k': None}").
std::string to_repr(const Value& v);
/// Python float repr: shortest round-trip digits, "1e+16", "1e-05", "inf", "nan".
std::string float_repr(double v);
/// Python ==.
bool equals(const Value& a, const Value& b);
/// Python a < b; throws charm::Error naming both types when they are not ordered.
bool less_than(const Value& a, const Value& b);
/// json.dumps(v, ensure_ascii=False, indent=indent, sort_keys=sort_keys) with Python's default
/// separators (", ", ": "; "," when indenting), as transformers' tojson filter does. indent < 0 means None;
/// ensure_ascii writes non-ASCII characters as \\uXXXX escapes (surrogate pairs above U+FFFF).
std::string to_json_text(const Value& v, int indent, bool sort_keys, bool ensure_ascii = false);
/// The items a for loop visits: list/tuple items, dict keys, string characters; undefined -> none.
/// Throws charm::Error when `v` is not iterable.
ValueList iterate(const Value& v);

/// Python's str.isspace() for one code point.
bool py_isspace(char32_t c);
/// Simple case mapping of one code point (ASCII, Latin-1, Latin Extended-A, Greek, Cyrillic,
/// Armenian, fullwidth Latin); other scripts map to themselves.
char32_t py_lower(char32_t c);
char32_t py_upper(char32_t c);
/// str.lower() / str.upper() on UTF-8 text with the mapping above (and upper("ß") == "SS").
std::string str_lower(const std::string& s);
std::string str_upper(const std::string& s);

}  // namespace charm::jinja
