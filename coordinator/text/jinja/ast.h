// Syntax tree of a parsed Jinja template, and the parser that builds it from the lexer's
// segments. The grammar and operator precedence follow jinja2/parser.py (3.1):
// cond-expr < or < and < not < comparisons/in/not in < + - < ~ < * / // % < ** < unary -
// < postfix (. [] ()) and then filters/tests (| and is).
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "coordinator/text/jinja/lexer.h"
#include "coordinator/text/jinja/value.h"

namespace charm::jinja {

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

/// An expression node. Children live in `args`; the meaning of each slot is per kind:
///  kLiteral: value. kName: name. kAttr: args[0].name. kItem: args[0][args[1]].
///  kSlice: args[0][args[1]:args[2]:args[3]] (null slots omitted). kCall: args[0](args[1..], kwargs).
///  kFilter: args[0] | name(args[1..], kwargs). kTest: args[0] is [not] name(args[1..]).
///  kNeg/kPos/kNot: op args[0]. kBinary: args[0] name args[1] (name is the operator).
///  kAnd/kOr: args[0], args[1]. kCompare: args[0] ops[0] args[1] ops[1] args[2] ...
///  kCond: args[0] if args[1] else args[2] (args[2] may be null). kList/kTuple: items.
///  kDict: args[2k] -> args[2k+1].
struct Expr {
  enum class Kind {
    kLiteral, kName, kAttr, kItem, kSlice, kCall, kFilter, kTest, kNeg, kPos, kNot,
    kBinary, kAnd, kOr, kCompare, kCond, kList, kTuple, kDict
  };
  Kind kind = Kind::kLiteral;
  int line = 1;
  Value value;
  std::string name;
  bool negated = false;
  std::vector<ExprPtr> args;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
  std::vector<std::string> ops;
};

struct Stmt;
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

/// A statement node.
///  kText: text. kOutput: {{ expr }}. kIf: branches (cond, body) then else_body.
///  kFor: for targets in expr [if filter]: body [else: else_body].
///  kSet: targets = expr, or targets[0].attr = expr when attr is non-empty.
///  kSetBlock: targets[0] = rendered body. kBreak / kContinue.
///  kGeneration: transformers' {% generation %} marker, renders its body unchanged.
///  kMacro: {% macro targets[0](params) %}body{% endmacro %}; a param's default may be null.
struct Stmt {
  enum class Kind { kText, kOutput, kIf, kFor, kSet, kSetBlock, kBreak, kContinue, kGeneration, kMacro };
  Kind kind = Kind::kText;
  int line = 1;
  std::string text;
  ExprPtr expr;
  ExprPtr filter;
  std::vector<std::string> targets;
  std::string attr;
  std::vector<std::pair<ExprPtr, Body>> branches;
  Body body;
  Body else_body;
  std::vector<std::pair<std::string, ExprPtr>> params;
};

/// Parses a whole template. Throws Error(kInvalidInput) "chat template line N: ..." naming the
/// unexpected token, unknown or unclosed tag, or misplaced break/continue, and
/// Error(kUnsupported) naming tags charm does not implement (call, include, extends, ...).
Body parse_template(const std::string& source);

}  // namespace charm::jinja
