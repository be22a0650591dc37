// The built-in behaviour chat templates reach through names: jinja2's filters and tests,
// Python's str/dict/list methods as jinja2's ImmutableSandboxedEnvironment allows them,
// attribute/item lookup (jinja2's getattr/getitem rules), and transformers' globals
// (raise_exception, strftime_now, namespace, dict) plus jinja's range.
// Every failure throws charm::Error(kInvalidInput) "chat template line N: ..." naming the
// filter, test, method or operand types.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "coordinator/text/jinja/eval.h"
#include "coordinator/text/jinja/value.h"

namespace charm::jinja {

/// Keyword arguments of a call, in call order.
using KwArgs = std::vector<std::pair<std::string, Value>>;

/// obj.name: attribute, else item (dicts, namespaces, loop); missing -> Undefined carrying
/// jinja's message. Throws when obj itself is undefined.
Value get_attr(const Value& obj, const std::string& name, int line);
/// obj[key]: item (negative indices count from the end), else attribute; missing -> Undefined.
Value get_item(const Value& obj, const Value& key, int line);
/// obj[start:stop:step] on lists, tuples and strings (null Values = omitted), Python semantics.
Value get_slice(const Value& obj, const Value& start, const Value& stop, const Value& step, int line);

/// value | name(args, kwargs). Throws "unknown filter 'name'" for filters charm lacks.
Value apply_filter(const std::string& name, const Value& value, const ValueList& args, const KwArgs& kwargs, int line);
/// value is name(args). Throws "unknown test 'name'".
bool apply_test(const std::string& name, const Value& value, const ValueList& args, int line);
/// obj.name(args, kwargs) for str, dict and list methods.
Value call_method(const Value& obj, const std::string& name, const ValueList& args, const KwArgs& kwargs, int line);
/// True when `name` is a global function (raise_exception, namespace, range, dict, strftime_now).
bool is_global_function(const std::string& name);
/// Calls a global function; raise_exception throws Error(kInvalidInput) "chat template: <message>";
/// strftime_now formats env.local_time() (the system's local time when it is empty).
Value call_global(const std::string& name, const ValueList& args, const KwArgs& kwargs, int line,
                  const Environment& env);

/// Python binary operator (+ - * / // % ** ~) on two values.
Value binary_op(const std::string& op, const Value& a, const Value& b, int line);
/// Python comparison (== != < > <= >= in notin).
bool compare_op(const std::string& op, const Value& a, const Value& b, int line);
/// Throws the undefined value's own message ("'x' is undefined") when `v` is undefined.
void require_defined(const Value& v, int line);

}  // namespace charm::jinja
