// Jinja parser: segments -> statement tree. Follows jinja2/parser.py's grammar; see jinja_ast.h.
#include <set>

#include "common/error.h"
#include "coordinator/text/jinja/ast.h"

namespace charm::jinja {
namespace {

[[noreturn]] void fail_at(int line, const std::string& what) {
  fail_invalid("chat template line " + std::to_string(line) + ": " + what);
}

std::string describe(const Token& t) {
  switch (t.type) {
    case Token::Type::kEnd: return "end of tag";
    case Token::Type::kString: return "string literal";
    case Token::Type::kName: return "'" + t.text + "'";
    default: return "'" + t.text + "'";
  }
}

// Reads the expression tokens of one tag.
class Cursor {
 public:
  explicit Cursor(const std::vector<Token>& tokens) : t_(tokens) {}
  const Token& peek(size_t ahead = 0) const { return t_[std::min(i_ + ahead, t_.size() - 1)]; }
  const Token& next() { return t_[i_ < t_.size() - 1 ? i_++ : i_]; }
  bool at_end() const { return peek().type == Token::Type::kEnd; }
  bool is_op(const char* op, size_t ahead = 0) const {
    return peek(ahead).type == Token::Type::kOp && peek(ahead).text == op;
  }
  bool is_name(const char* name, size_t ahead = 0) const {
    return peek(ahead).type == Token::Type::kName && peek(ahead).text == name;
  }
  bool accept_op(const char* op) { return is_op(op) ? (next(), true) : false; }
  bool accept_name(const char* name) { return is_name(name) ? (next(), true) : false; }
  void expect_op(const char* op) {
    if (!accept_op(op)) fail_at(peek().line, "expected '" + std::string(op) + "', got " + describe(peek()));
  }
  std::string expect_name() {
    if (peek().type != Token::Type::kName) fail_at(peek().line, "expected a name, got " + describe(peek()));
    return next().text;
  }
  void expect_end(const std::string& tag) {
    if (!at_end()) fail_at(peek().line, "unexpected " + describe(peek()) + " in '" + tag + "' tag");
  }

 private:
  const std::vector<Token>& t_;
  size_t i_ = 0;
};

// Deepest nesting of expressions or of block tags a template may use.
constexpr int kMaxNesting = 200;

ExprPtr make(Expr::Kind kind, int line) {
  auto e = std::make_unique<Expr>();
  e->kind = kind;
  e->line = line;
  return e;
}

// Expression grammar, one function per precedence level (jinja2/parser.py).
class ExprParser {
 public:
  explicit ExprParser(Cursor& c) : c_(c) {}

  ExprPtr expression(bool with_condexpr = true) {
    // Bounds recursion so a hostile template cannot overflow the stack.
    struct Depth {
      int& d;
      explicit Depth(int& depth, int line) : d(depth) {
        if (++d > kMaxNesting) fail_at(line, "expression nested too deeply");
      }
      ~Depth() { --d; }
    } guard(depth_, c_.peek().line);
    ExprPtr e = or_expr();
    if (!with_condexpr) return e;
    while (c_.is_name("if")) {
      int line = c_.next().line;
      auto cond = make(Expr::Kind::kCond, line);
      ExprPtr test = or_expr();
      ExprPtr otherwise = c_.accept_name("else") ? expression() : nullptr;
      cond->args.push_back(std::move(e));
      cond->args.push_back(std::move(test));
      cond->args.push_back(std::move(otherwise));
      e = std::move(cond);
    }
    return e;
  }

  // A tuple without parentheses ("a, b" in set/for) or a single expression.
  ExprPtr tuple_or_expression(bool with_condexpr = true) {
    int line = c_.peek().line;
    ExprPtr first = expression(with_condexpr);
    if (!c_.is_op(",")) return first;
    auto t = make(Expr::Kind::kTuple, line);
    t->args.push_back(std::move(first));
    while (c_.accept_op(",")) {
      if (c_.at_end()) break;
      t->args.push_back(expression(with_condexpr));
    }
    return t;
  }

 private:
  ExprPtr binary(Expr::Kind kind, ExprPtr a, ExprPtr b, int line, const std::string& op = {}) {
    auto e = make(kind, line);
    e->name = op;
    e->args.push_back(std::move(a));
    e->args.push_back(std::move(b));
    return e;
  }

  ExprPtr or_expr() {
    ExprPtr e = and_expr();
    while (c_.is_name("or")) {
      int line = c_.next().line;
      e = binary(Expr::Kind::kOr, std::move(e), and_expr(), line);
    }
    return e;
  }
  ExprPtr and_expr() {
    ExprPtr e = not_expr();
    while (c_.is_name("and")) {
      int line = c_.next().line;
      e = binary(Expr::Kind::kAnd, std::move(e), not_expr(), line);
    }
    return e;
  }
  ExprPtr not_expr() {
    if (c_.is_name("not")) {
      auto e = make(Expr::Kind::kNot, c_.next().line);
      e->args.push_back(not_expr());
      return e;
    }
    return compare();
  }
  ExprPtr compare() {
    int line = c_.peek().line;
    ExprPtr first = math1();
    std::vector<std::string> ops;
    std::vector<ExprPtr> rest;
    static const std::set<std::string> cmp = {"==", "!=", "<", ">", "<=", ">="};
    for (;;) {
      if (c_.peek().type == Token::Type::kOp && cmp.count(c_.peek().text)) {
        ops.push_back(c_.next().text);
      } else if (c_.is_name("in")) {
        c_.next();
        ops.push_back("in");
      } else if (c_.is_name("not") && c_.is_name("in", 1)) {
        c_.next();
        c_.next();
        ops.push_back("notin");
      } else {
        break;
      }
      rest.push_back(math1());
    }
    if (ops.empty()) return first;
    auto e = make(Expr::Kind::kCompare, line);
    e->args.push_back(std::move(first));
    for (auto& r : rest) e->args.push_back(std::move(r));
    e->ops = std::move(ops);
    return e;
  }
  ExprPtr math1() {
    ExprPtr e = concat();
    while (c_.is_op("+") || c_.is_op("-")) {
      const Token& t = c_.next();
      e = binary(Expr::Kind::kBinary, std::move(e), concat(), t.line, t.text);
    }
    return e;
  }
  ExprPtr concat() {
    ExprPtr e = math2();
    while (c_.is_op("~")) {
      int line = c_.next().line;
      e = binary(Expr::Kind::kBinary, std::move(e), math2(), line, "~");
    }
    return e;
  }
  ExprPtr math2() {
    ExprPtr e = power();
    while (c_.is_op("*") || c_.is_op("/") || c_.is_op("//") || c_.is_op("%")) {
      const Token& t = c_.next();
      e = binary(Expr::Kind::kBinary, std::move(e), power(), t.line, t.text);
    }
    return e;
  }
  ExprPtr power() {
    ExprPtr e = unary(true);
    while (c_.is_op("**")) {
      int line = c_.next().line;
      e = binary(Expr::Kind::kBinary, std::move(e), unary(true), line, "**");
    }
    return e;
  }
  ExprPtr unary(bool with_filter) {
    ExprPtr e;
    if (c_.is_op("-") || c_.is_op("+")) {
      const Token& t = c_.next();
      if (++unary_run_ > kMaxNesting) fail_at(t.line, "expression nested too deeply");
      e = make(t.text == "-" ? Expr::Kind::kNeg : Expr::Kind::kPos, t.line);
      e->args.push_back(unary(false));
      --unary_run_;
    } else {
      e = primary();
    }
    e = postfix(std::move(e));
    return with_filter ? filters_and_tests(std::move(e)) : std::move(e);
  }

  ExprPtr primary() {
    const Token& t = c_.peek();
    auto lit = [&](Value v) {
      auto e = make(Expr::Kind::kLiteral, t.line);
      e->value = std::move(v);
      c_.next();
      return e;
    };
    switch (t.type) {
      case Token::Type::kString: {
        // Adjacent string literals concatenate, as in Python.
        std::string s;
        int line = t.line;
        while (c_.peek().type == Token::Type::kString) s += c_.next().text;
        auto e = make(Expr::Kind::kLiteral, line);
        e->value = Value::string(s);
        return e;
      }
      case Token::Type::kInt: return lit(Value::integer(t.int_value));
      case Token::Type::kFloat: return lit(Value::floating(t.float_value));
      case Token::Type::kName: {
        if (t.text == "true" || t.text == "True") return lit(Value::boolean(true));
        if (t.text == "false" || t.text == "False") return lit(Value::boolean(false));
        if (t.text == "none" || t.text == "None") return lit(Value::none());
        auto e = make(Expr::Kind::kName, t.line);
        e->name = c_.next().text;
        return e;
      }
      case Token::Type::kOp:
        if (t.text == "(") return paren();
        if (t.text == "[") return list_literal();
        if (t.text == "{") return dict_literal();
        break;
      default: break;
    }
    fail_at(t.line, "unexpected " + describe(t) + " in expression");
  }

  ExprPtr paren() {
    int line = c_.next().line;
    if (c_.accept_op(")")) return make(Expr::Kind::kTuple, line);
    ExprPtr first = expression();
    if (c_.accept_op(")")) return first;
    auto t = make(Expr::Kind::kTuple, line);
    t->args.push_back(std::move(first));
    while (c_.accept_op(",")) {
      if (c_.is_op(")")) break;
      t->args.push_back(expression());
    }
    c_.expect_op(")");
    return t;
  }
  ExprPtr list_literal() {
    auto e = make(Expr::Kind::kList, c_.next().line);
    while (!c_.is_op("]")) {
      if (!e->args.empty()) c_.expect_op(",");
      if (c_.is_op("]")) break;
      e->args.push_back(expression());
    }
    c_.expect_op("]");
    return e;
  }
  ExprPtr dict_literal() {
    auto e = make(Expr::Kind::kDict, c_.next().line);
    while (!c_.is_op("}")) {
      if (!e->args.empty()) c_.expect_op(",");
      if (c_.is_op("}")) break;
      e->args.push_back(expression());
      c_.expect_op(":");
      e->args.push_back(expression());
    }
    c_.expect_op("}");
    return e;
  }

  ExprPtr postfix(ExprPtr e) {
    for (;;) {
      if (c_.is_op(".")) {
        int line = c_.next().line;
        const Token& t = c_.peek();
        if (t.type == Token::Type::kInt) {
          // a.0 means a[0] in jinja.
          auto item = make(Expr::Kind::kItem, line);
          item->args.push_back(std::move(e));
          auto idx = make(Expr::Kind::kLiteral, line);
          idx->value = Value::integer(c_.next().int_value);
          item->args.push_back(std::move(idx));
          e = std::move(item);
          continue;
        }
        auto attr = make(Expr::Kind::kAttr, line);
        attr->name = c_.expect_name();
        attr->args.push_back(std::move(e));
        e = std::move(attr);
      } else if (c_.is_op("[")) {
        e = subscript(std::move(e));
      } else if (c_.is_op("(")) {
        e = call(std::move(e));
      } else {
        return e;
      }
    }
  }

  ExprPtr subscript(ExprPtr obj) {
    int line = c_.next().line;
    ExprPtr parts[3];
    int colons = 0;
    for (;;) {
      if (c_.is_op("]")) break;
      if (c_.accept_op(":")) {
        if (++colons > 2) fail_at(line, "too many ':' in subscript");
        continue;
      }
      if (parts[colons]) fail_at(c_.peek().line, "expected ']' or ':', got " + describe(c_.peek()));
      parts[colons] = expression();
    }
    c_.expect_op("]");
    if (colons == 0) {
      if (!parts[0]) fail_at(line, "empty subscript '[]'");
      auto e = make(Expr::Kind::kItem, line);
      e->args.push_back(std::move(obj));
      e->args.push_back(std::move(parts[0]));
      return e;
    }
    auto e = make(Expr::Kind::kSlice, line);
    e->args.push_back(std::move(obj));
    for (auto& p : parts) e->args.push_back(std::move(p));
    return e;
  }

  // Parses "(args, name=value)" into e->args (after slot 0) and e->kwargs.
  void call_args(Expr& e) {
    c_.expect_op("(");
    while (!c_.is_op(")")) {
      if (!e.args.empty() && (e.args.size() > 1 || !e.kwargs.empty())) c_.expect_op(",");
      if (c_.is_op(")")) break;
      if (c_.peek().type == Token::Type::kName && c_.is_op("=", 1)) {
        std::string key = c_.next().text;
        c_.next();
        e.kwargs.emplace_back(key, expression());
      } else {
        if (!e.kwargs.empty()) fail_at(c_.peek().line, "positional argument after keyword argument");
        e.args.push_back(expression());
      }
    }
    c_.expect_op(")");
  }

  ExprPtr call(ExprPtr callee) {
    auto e = make(Expr::Kind::kCall, callee->line);
    e->args.push_back(std::move(callee));
    call_args(*e);
    return e;
  }

  ExprPtr filters_and_tests(ExprPtr e) {
    for (;;) {
      if (c_.is_op("|")) {
        int line = c_.next().line;
        auto f = make(Expr::Kind::kFilter, line);
        f->name = c_.expect_name();
        while (c_.accept_op(".")) f->name += "." + c_.expect_name();
        f->args.push_back(std::move(e));
        if (c_.is_op("(")) call_args(*f);
        e = std::move(f);
      } else if (c_.is_name("is")) {
        e = test(std::move(e));
      } else if (c_.is_op("(")) {
        e = call(std::move(e));
      } else {
        return e;
      }
    }
  }

  ExprPtr test(ExprPtr operand) {
    int line = c_.next().line;
    auto t = make(Expr::Kind::kTest, line);
    t->negated = c_.accept_name("not");
    t->name = c_.expect_name();
    while (c_.accept_op(".")) t->name += "." + c_.expect_name();
    t->args.push_back(std::move(operand));
    const Token& nx = c_.peek();
    static const std::set<std::string> stop = {"else", "or", "and", "if", "in", "not", "is"};
    if (c_.is_op("(")) {
      call_args(*t);
    } else if ((nx.type == Token::Type::kName && !stop.count(nx.text)) || nx.type == Token::Type::kString ||
               nx.type == Token::Type::kInt || nx.type == Token::Type::kFloat || c_.is_op("[") || c_.is_op("{")) {
      // "x is divisibleby 3": one argument without parentheses.
      ExprPtr arg = postfix(primary());
      t->args.push_back(std::move(arg));
    }
    return t;
  }

  Cursor& c_;
  int depth_ = 0;
  int unary_run_ = 0;
};

// Statement grammar over the segment list.
class Parser {
 public:
  explicit Parser(std::vector<Segment> segs) : segs_(std::move(segs)) {}

  Body parse() {
    std::string end_tag;
    Body body = parse_body({}, end_tag);
    return body;
  }

 private:
  // Parses statements until one of `ends` (consumed; its name returned in end_tag) or the end
  // of the template (only allowed when `ends` is empty).
  Body parse_body(const std::set<std::string>& ends, std::string& end_tag, int open_line = 0,
                  const std::string& open_tag = {}) {
    if (++block_depth_ > kMaxNesting) fail_at(open_line, "tags nested too deeply");
    struct Leave {
      int& d;
      ~Leave() { --d; }
    } leave{block_depth_};
    Body body;
    while (i_ < segs_.size()) {
      const Segment& seg = segs_[i_];
      if (seg.kind == Segment::Kind::kText) {
        auto s = std::make_unique<Stmt>();
        s->kind = Stmt::Kind::kText;
        s->line = seg.line;
        s->text = seg.text;
        body.push_back(std::move(s));
        ++i_;
        continue;
      }
      Cursor c(seg.tokens);
      if (seg.kind == Segment::Kind::kVar) {
        auto s = std::make_unique<Stmt>();
        s->kind = Stmt::Kind::kOutput;
        s->line = seg.line;
        if (c.at_end()) fail_at(seg.line, "empty expression in '{{ }}'");
        s->expr = ExprParser(c).expression();
        c.expect_end("{{ }}");
        body.push_back(std::move(s));
        ++i_;
        continue;
      }
      if (c.peek().type != Token::Type::kName) fail_at(seg.line, "expected a tag name after '{%'");
      std::string name = c.peek().text;
      if (ends.count(name)) {
        end_tag = name;
        return body;
      }
      ++i_;
      c.next();
      body.push_back(statement(name, c, seg.line));
    }
    if (!ends.empty()) {
      std::string want;
      for (const auto& e : ends) want += (want.empty() ? "'" : " or '") + e + "'";
      fail_at(open_line, "unclosed '" + open_tag + "' tag: expected " + want + " before the end of the template");
    }
    return body;
  }

  // Consumes the current segment, which must be the end tag `name` with nothing after it.
  void finish_end_tag(const std::string& name) {
    Cursor c(segs_[i_].tokens);
    c.next();
    c.expect_end(name);
    ++i_;
  }

  StmtPtr statement(const std::string& name, Cursor& c, int line) {
    auto s = std::make_unique<Stmt>();
    s->line = line;
    if (name == "if") return if_stmt(std::move(s), c);
    if (name == "for") return for_stmt(std::move(s), c);
    if (name == "set") return set_stmt(std::move(s), c);
    if (name == "break" || name == "continue") {
      if (loop_depth_ == 0) fail_at(line, "'" + name + "' outside of a for loop");
      c.expect_end(name);
      s->kind = name == "break" ? Stmt::Kind::kBreak : Stmt::Kind::kContinue;
      return s;
    }
    if (name == "generation") {
      c.expect_end(name);
      s->kind = Stmt::Kind::kGeneration;
      std::string end;
      s->body = parse_body({"endgeneration"}, end, line, name);
      finish_end_tag(end);
      return s;
    }
    if (name == "macro") return macro_stmt(std::move(s), c);
    static const std::set<std::string> unsupported = {"call", "filter", "include", "import", "from",
                                                      "extends", "block", "with", "autoescape", "do", "trans"};
    if (unsupported.count(name))
      fail_unsupported("chat template line " + std::to_string(line) + ": the '{% " + name +
                       " %}' tag is not supported by charm's template engine");
    fail_at(line, "unknown tag '" + name + "'");
  }

  StmtPtr if_stmt(StmtPtr s, Cursor& c) {
    s->kind = Stmt::Kind::kIf;
    ExprPtr cond = ExprParser(c).expression();
    c.expect_end("if");
    for (;;) {
      std::string end;
      Body body = parse_body({"elif", "else", "endif"}, end, s->line, "if");
      s->branches.emplace_back(std::move(cond), std::move(body));
      if (end == "elif") {
        Cursor ec(segs_[i_].tokens);
        ec.next();
        cond = ExprParser(ec).expression();
        ec.expect_end("elif");
        ++i_;
        continue;
      }
      if (end == "else") {
        finish_end_tag("else");
        s->else_body = parse_body({"endif"}, end, s->line, "if");
      }
      finish_end_tag("endif");
      return s;
    }
  }

  StmtPtr for_stmt(StmtPtr s, Cursor& c) {
    s->kind = Stmt::Kind::kFor;
    do {
      s->targets.push_back(c.expect_name());
    } while (c.accept_op(","));
    if (!c.accept_name("in")) fail_at(c.peek().line, "expected 'in' in 'for' tag, got " + describe(c.peek()));
    ExprParser ep(c);
    s->expr = ep.tuple_or_expression(false);
    if (c.accept_name("if")) s->filter = ExprParser(c).expression(false);
    if (c.accept_name("recursive")) fail_unsupported("chat template line " + std::to_string(s->line) +
                                                     ": recursive for loops are not supported");
    c.expect_end("for");
    ++loop_depth_;
    std::string end;
    s->body = parse_body({"else", "endfor"}, end, s->line, "for");
    --loop_depth_;
    if (end == "else") {
      finish_end_tag("else");
      s->else_body = parse_body({"endfor"}, end, s->line, "for");
    }
    finish_end_tag("endfor");
    return s;
  }

  StmtPtr macro_stmt(StmtPtr s, Cursor& c) {
    s->kind = Stmt::Kind::kMacro;
    s->targets.push_back(c.expect_name());
    c.expect_op("(");
    while (!c.is_op(")")) {
      if (!s->params.empty()) c.expect_op(",");
      if (c.is_op(")")) break;
      std::string param = c.expect_name();
      ExprPtr dflt = c.accept_op("=") ? ExprParser(c).expression() : nullptr;
      s->params.emplace_back(param, std::move(dflt));
    }
    c.expect_op(")");
    c.expect_end("macro");
    // break/continue inside a macro body do not reach an enclosing loop.
    int saved_depth = loop_depth_;
    loop_depth_ = 0;
    std::string end;
    s->body = parse_body({"endmacro"}, end, s->line, "macro");
    loop_depth_ = saved_depth;
    finish_end_tag("endmacro");
    return s;
  }

  StmtPtr set_stmt(StmtPtr s, Cursor& c) {
    std::string first = c.expect_name();
    if (c.accept_op(".")) {
      s->attr = c.expect_name();
    }
    s->targets.push_back(first);
    while (s->attr.empty() && c.accept_op(",")) s->targets.push_back(c.expect_name());
    if (c.at_end() && s->attr.empty() && s->targets.size() == 1) {
      s->kind = Stmt::Kind::kSetBlock;
      std::string end;
      s->body = parse_body({"endset"}, end, s->line, "set");
      finish_end_tag("endset");
      return s;
    }
    if (c.is_op("|")) fail_unsupported("chat template line " + std::to_string(s->line) +
                                       ": filtered block '{% set x | filter %}' is not supported");
    c.expect_op("=");
    s->kind = Stmt::Kind::kSet;
    s->expr = ExprParser(c).tuple_or_expression();
    c.expect_end("set");
    return s;
  }

  std::vector<Segment> segs_;
  size_t i_ = 0;
  int loop_depth_ = 0;
  int block_depth_ = 0;
};

}  // namespace

Body parse_template(const std::string& source) { return Parser(lex_template(source)).parse(); }

}  // namespace charm::jinja
