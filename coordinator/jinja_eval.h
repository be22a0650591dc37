// Renders a parsed Jinja template (jinja_ast.h) against a set of variables, with jinja2's
// scoping: {% set %} writes the innermost scope; each for-loop iteration gets a fresh scope
// (so a set inside a loop is gone after it, which is why templates use namespace()); loop.*
// variables; break/continue (the loopcontrols extension).
#pragma once

#include <string>
#include <unordered_map>

#include "coordinator/jinja_ast.h"
#include "coordinator/jinja_value.h"

namespace charm::jinja {

/// Template variables by name (messages, add_generation_prompt, bos_token, ...).
using Variables = std::unordered_map<std::string, Value>;

/// Renders `body` with `vars` as the template's context. Reentrant (no shared state).
/// Throws Error(kInvalidInput) "chat template line N: ..." on evaluation errors (undefined
/// values used, wrong types, unknown filters/tests/methods) and "chat template: <message>"
/// from raise_exception.
std::string render_body(const Body& body, const Variables& vars);

}  // namespace charm::jinja
