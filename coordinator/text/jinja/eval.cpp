// Jinja evaluator: walks the statement tree and writes the output. See jinja_eval.h.
#include "coordinator/text/jinja/eval.h"

#include "common/error.h"
#include "coordinator/text/jinja/builtins.h"

namespace charm::jinja {
namespace {

[[noreturn]] void fail_at(int line, const std::string& what) {
  fail_invalid("chat template line " + std::to_string(line) + ": " + what);
}

enum class Flow { kNormal, kBreak, kContinue };

class Evaluator {
 public:
  Evaluator(const Variables& vars, const Environment& env) : env_(env) { scopes_.push_back(vars); }

  Flow run(const Body& body, std::string& out) {
    for (const StmtPtr& s : body) {
      Flow f = exec(*s, out);
      if (f != Flow::kNormal) return f;
    }
    return Flow::kNormal;
  }

 private:
  // Runs one statement; errors raised without a line (from value helpers) get this one.
  Flow exec(const Stmt& s, std::string& out) {
    try {
      return exec_unwrapped(s, out);
    } catch (const Error& e) {
      if (e.message().rfind("chat template", 0) == 0) throw;
      fail_at(s.line, e.message());
    }
  }

  Flow exec_unwrapped(const Stmt& s, std::string& out) {
    switch (s.kind) {
      case Stmt::Kind::kText: out += s.text; return Flow::kNormal;
      case Stmt::Kind::kOutput: out += to_str(eval(*s.expr)); return Flow::kNormal;
      case Stmt::Kind::kIf:
        for (const auto& [cond, body] : s.branches)
          if (truthy(eval(*cond))) return run(body, out);
        return run(s.else_body, out);
      case Stmt::Kind::kFor: return exec_for(s, out);
      case Stmt::Kind::kSet: exec_set(s); return Flow::kNormal;
      case Stmt::Kind::kSetBlock: {
        std::string captured;
        run(s.body, captured);
        scopes_.back()[s.targets[0]] = Value::string(captured);
        return Flow::kNormal;
      }
      case Stmt::Kind::kBreak: return Flow::kBreak;
      case Stmt::Kind::kContinue: return Flow::kContinue;
      case Stmt::Kind::kGeneration: return run(s.body, out);
      case Stmt::Kind::kMacro: {
        Value m;
        m.kind = Kind::kMacro;
        m.macro = &s;
        scopes_.back()[s.targets[0]] = m;
        return Flow::kNormal;
      }
    }
    return Flow::kNormal;
  }

  // Binds `targets` to `value`, unpacking it when there are several names.
  void bind(Variables& scope, const std::vector<std::string>& targets, const Value& value, int line) {
    if (targets.size() == 1) {
      scope[targets[0]] = value;
      return;
    }
    ValueList items = iterate(value);
    if (items.size() != targets.size())
      fail_at(line, "cannot unpack " + std::to_string(items.size()) + " values into " +
                        std::to_string(targets.size()) + " names");
    for (size_t k = 0; k < targets.size(); ++k) scope[targets[k]] = items[k];
  }

  void exec_set(const Stmt& s) {
    Value v = eval(*s.expr);
    if (s.attr.empty()) {
      bind(scopes_.back(), s.targets, v, s.line);
      return;
    }
    Value ns = lookup(s.targets[0]);
    if (ns.kind != Kind::kNamespace)
      fail_at(s.line, "cannot assign attribute '" + s.attr + "' on '" + s.targets[0] + "', which is not a namespace()");
    if (s.attr[0] == '_') fail_at(s.line, "namespace attribute '" + s.attr + "' is unsafe (underscore prefix)");
    ns.set(Value::string(s.attr), v);
  }

  Flow exec_for(const Stmt& s, std::string& out) {
    ValueList items = iterate(eval(*s.expr));
    if (s.filter) {
      // The loop's if-filter runs before loop.index/length are known, with only the targets bound.
      ValueList kept;
      for (const Value& item : items) {
        scopes_.emplace_back();
        bind(scopes_.back(), s.targets, item, s.line);
        bool keep = truthy(eval(*s.filter));
        scopes_.pop_back();
        if (keep) kept.push_back(item);
      }
      items = std::move(kept);
    }
    if (items.empty()) return run(s.else_body, out);
    const int64_t n = static_cast<int64_t>(items.size());
    for (int64_t k = 0; k < n; ++k) {
      scopes_.emplace_back();
      bind(scopes_.back(), s.targets, items[static_cast<size_t>(k)], s.line);
      scopes_.back()["loop"] = loop_value(items, k);
      Flow f = run(s.body, out);
      scopes_.pop_back();
      if (f == Flow::kBreak) break;
    }
    return Flow::kNormal;
  }

  static Value loop_value(const ValueList& items, int64_t k) {
    const int64_t n = static_cast<int64_t>(items.size());
    ValueDict d = {
        {Value::string("index"), Value::integer(k + 1)},
        {Value::string("index0"), Value::integer(k)},
        {Value::string("revindex"), Value::integer(n - k)},
        {Value::string("revindex0"), Value::integer(n - k - 1)},
        {Value::string("first"), Value::boolean(k == 0)},
        {Value::string("last"), Value::boolean(k == n - 1)},
        {Value::string("length"), Value::integer(n)},
        {Value::string("depth"), Value::integer(1)},
        {Value::string("depth0"), Value::integer(0)},
        {Value::string("previtem"), k > 0 ? items[static_cast<size_t>(k - 1)] : Value::undefined("there is no previous item")},
        {Value::string("nextitem"), k + 1 < n ? items[static_cast<size_t>(k + 1)] : Value::undefined("there is no next item")},
    };
    return Value::new_dict(std::move(d));
  }

  Value lookup(const std::string& name) const {
    for (auto it = scopes_.rbegin(); it != scopes_.rend(); ++it) {
      auto found = it->find(name);
      if (found != it->end()) return found->second;
    }
    if (is_global_function(name)) return Value::string("<built-in function " + name + ">");
    return Value::undefined("'" + name + "' is undefined");
  }

  bool is_variable(const std::string& name) const {
    for (const auto& scope : scopes_)
      if (scope.count(name)) return true;
    return false;
  }

  void eval_args(const Expr& e, ValueList& args, KwArgs& kwargs) {
    for (size_t k = 1; k < e.args.size(); ++k) args.push_back(eval(*e.args[k]));
    for (const auto& [name, x] : e.kwargs) kwargs.emplace_back(name, eval(*x));
  }

  Value eval_call(const Expr& e) {
    ValueList args;
    KwArgs kwargs;
    const Expr& callee = *e.args[0];
    if (callee.kind == Expr::Kind::kName && !is_variable(callee.name)) {
      if (!is_global_function(callee.name)) fail_at(e.line, "'" + callee.name + "' is undefined (called as a function)");
      eval_args(e, args, kwargs);
      return call_global(callee.name, args, kwargs, e.line, env_);
    }
    if (callee.kind == Expr::Kind::kAttr) {
      Value obj = eval(*callee.args[0]);
      eval_args(e, args, kwargs);
      return call_method(obj, callee.name, args, kwargs, e.line);
    }
    Value v = eval(callee);
    require_defined(v, e.line);
    if (v.kind != Kind::kMacro) fail_at(e.line, "'" + type_name(v) + "' object is not callable");
    eval_args(e, args, kwargs);
    return call_macro(*v.macro, args, kwargs, e.line);
  }

  // Runs a macro body in a fresh scope over the template's top-level scope (jinja macros see
  // the template context and their parameters, not the caller's loop variables). Unfilled
  // parameters take their defaults (evaluated per call) or are undefined; extra arguments
  // land in `varargs` and `kwargs`, as in jinja.
  Value call_macro(const Stmt& m, const ValueList& args, const KwArgs& kwargs, int line) {
    if (macro_depth_ >= kMaxMacroDepth)
      fail_at(line, "macro '" + m.targets[0] + "' nested deeper than " + std::to_string(kMaxMacroDepth) + " calls");
    std::vector<Variables> saved;
    saved.swap(scopes_);
    scopes_.push_back(saved.front());
    scopes_.emplace_back();
    struct Restore {
      Evaluator& ev;
      std::vector<Variables>& saved;
      ~Restore() {
        ev.scopes_.swap(saved);
        --ev.macro_depth_;
      }
    } restore{*this, saved};
    ++macro_depth_;
    Variables& local = scopes_.back();
    ValueList varargs;
    for (size_t k = 0; k < args.size(); ++k) {
      if (k < m.params.size()) local[m.params[k].first] = args[k];
      else varargs.push_back(args[k]);
    }
    Value extra = Value::new_dict();
    for (const auto& [name, v] : kwargs) {
      bool is_param = false;
      for (const auto& p : m.params) is_param = is_param || p.first == name;
      if (is_param) local[name] = v;
      else extra.set(Value::string(name), v);
    }
    for (const auto& [name, dflt] : m.params) {
      if (local.count(name)) continue;
      local[name] = dflt ? eval(*dflt) : Value::undefined("parameter '" + name + "' was not provided");
    }
    local["varargs"] = Value::new_tuple(varargs);
    local["kwargs"] = extra;
    std::string out;
    run(m.body, out);
    return Value::string(out);
  }

  Value eval_compare(const Expr& e) {
    Value left = eval(*e.args[0]);
    for (size_t k = 0; k < e.ops.size(); ++k) {
      Value right = eval(*e.args[k + 1]);
      if (!compare_op(e.ops[k], left, right, e.line)) return Value::boolean(false);
      left = std::move(right);
    }
    return Value::boolean(true);
  }

  Value eval(const Expr& e) {
    switch (e.kind) {
      case Expr::Kind::kLiteral: return e.value;
      case Expr::Kind::kName: return lookup(e.name);
      case Expr::Kind::kAttr: return get_attr(eval(*e.args[0]), e.name, e.line);
      case Expr::Kind::kItem: return get_item(eval(*e.args[0]), eval(*e.args[1]), e.line);
      case Expr::Kind::kSlice: {
        auto part = [&](size_t k) { return e.args[k] ? eval(*e.args[k]) : Value::none(); };
        return get_slice(eval(*e.args[0]), part(1), part(2), part(3), e.line);
      }
      case Expr::Kind::kCall: return eval_call(e);
      case Expr::Kind::kFilter: {
        Value v = eval(*e.args[0]);
        ValueList args;
        KwArgs kwargs;
        eval_args(e, args, kwargs);
        return apply_filter(e.name, v, args, kwargs, e.line);
      }
      case Expr::Kind::kTest: {
        Value v = eval(*e.args[0]);
        ValueList args;
        KwArgs kwargs;
        eval_args(e, args, kwargs);
        return Value::boolean(apply_test(e.name, v, args, e.line) != e.negated);
      }
      case Expr::Kind::kNeg:
      case Expr::Kind::kPos: {
        Value v = eval(*e.args[0]);
        require_defined(v, e.line);
        if (!v.is_number()) fail_at(e.line, "bad operand type for unary " + std::string(e.kind == Expr::Kind::kNeg ? "-" : "+") + ": '" + type_name(v) + "'");
        if (e.kind == Expr::Kind::kPos) return v.kind == Kind::kBool ? Value::integer(v.b) : v;
        if (v.kind == Kind::kFloat) return Value::floating(-v.f);  // keeps -0.0 as Python does
        return binary_op("-", Value::integer(0), v, e.line);
      }
      case Expr::Kind::kNot: return Value::boolean(!truthy(eval(*e.args[0])));
      case Expr::Kind::kBinary: return binary_op(e.name, eval(*e.args[0]), eval(*e.args[1]), e.line);
      case Expr::Kind::kAnd: {
        Value a = eval(*e.args[0]);
        return truthy(a) ? eval(*e.args[1]) : a;
      }
      case Expr::Kind::kOr: {
        Value a = eval(*e.args[0]);
        return truthy(a) ? a : eval(*e.args[1]);
      }
      case Expr::Kind::kCompare: return eval_compare(e);
      case Expr::Kind::kCond:
        if (truthy(eval(*e.args[1]))) return eval(*e.args[0]);
        return e.args[2] ? eval(*e.args[2]) : Value::undefined("the inline if-expression evaluated to false and no else section was defined");
      case Expr::Kind::kList:
      case Expr::Kind::kTuple: {
        ValueList items;
        for (const ExprPtr& x : e.args) items.push_back(eval(*x));
        return e.kind == Expr::Kind::kList ? Value::new_list(std::move(items)) : Value::new_tuple(std::move(items));
      }
      case Expr::Kind::kDict: {
        Value d = Value::new_dict();
        for (size_t k = 0; k + 1 < e.args.size(); k += 2) d.set(eval(*e.args[k]), eval(*e.args[k + 1]));
        return d;
      }
    }
    fail_internal("chat template: unknown expression kind");
  }

  static constexpr int kMaxMacroDepth = 64;
  const Environment& env_;
  std::vector<Variables> scopes_;
  int macro_depth_ = 0;
};

}  // namespace

std::string render_body(const Body& body, const Variables& vars, const Environment& env) {
  Evaluator ev(vars, env);
  std::string out;
  ev.run(body, out);
  return out;
}

}  // namespace charm::jinja
