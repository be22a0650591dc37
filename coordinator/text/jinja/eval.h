// Renders a parsed Jinja template (jinja_ast.h) against a set of variables, with jinja2's
// scoping: {% set %} writes the innermost scope; each for-loop iteration gets a fresh scope
// (so a set inside a loop is gone after it, which is why templates use namespace()); loop.*
// variables; break/continue (the loopcontrols extension).
#pragma once

#include <ctime>
#include <functional>
#include <string>
#include <unordered_map>

#include "coordinator/text/jinja/ast.h"
#include "coordinator/text/jinja/value.h"

namespace charm::jinja {

/// Template variables by name (messages, add_generation_prompt, bos_token, ...).
using Variables = std::unordered_map<std::string, Value>;

/// The local wall-clock time, broken down (what strftime_now() formats).
using LocalTime = std::function<std::tm()>;

/// What a template's globals read from outside the template: only the clock today.
/// `local_time` empty means the system clock in the process's time zone, as transformers'
/// `datetime.now()`; tests inject a fixed value so that no output depends on the date.
struct Environment {
  LocalTime local_time;
};

/// Renders `body` with `vars` as the template's context and `env` behind its globals.
/// Reentrant (no shared state).
/// Throws Error(kInvalidInput) "chat template line N: ..." on evaluation errors (undefined
/// values used, wrong types, unknown filters/tests/methods) and "chat template: <message>"
/// from raise_exception.
std::string render_body(const Body& body, const Variables& vars, const Environment& env = {});

}  // namespace charm::jinja
