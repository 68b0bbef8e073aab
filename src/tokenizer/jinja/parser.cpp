#include "tokenizer/jinja/parser.h"

#include <charconv>
#include <cstdlib>
#include <set>

#include "core/error.h"

namespace deepinfer::jinja {

namespace {

class Parser {
 public:
  Parser(std::vector<Token> tokens, int max_nesting) : toks_(std::move(tokens)), max_nesting_(max_nesting) {}

  Body parse_all() {
    Body body = parse_body({});
    if (cur().kind != TokenKind::Eof) error("unexpected '" + block_name_at(pos_) + "' tag");
    return body;
  }

 private:
  struct DepthGuard {
    Parser& p;
    explicit DepthGuard(Parser& parser) : p(parser) {
      if (++p.depth_ > p.max_nesting_) p.error("template nested too deeply");
    }
    ~DepthGuard() { --p.depth_; }
  };

  // Operator chains (a + b + c ..., x.y.z ..., x|f|g ...) build left-deep trees; their
  // size per statement is capped so evaluating or destroying a tree cannot exhaust the stack.
  void count_node() {
    if (++chain_nodes_ > kMaxChainNodes) error("expression too long");
  }

  const Token& cur() const { return toks_[pos_]; }
  const Token& peek(size_t n = 1) const { return toks_[std::min(pos_ + n, toks_.size() - 1)]; }
  void next() {
    if (pos_ + 1 < toks_.size()) ++pos_;
  }
  [[noreturn]] void error(const std::string& msg) const { fail("chat template: line {}: {}", cur().line, msg); }

  bool is_op(const char* op) const { return cur().kind == TokenKind::Op && cur().text == op; }
  bool is_name(const char* name) const { return cur().kind == TokenKind::Name && cur().text == name; }
  bool accept_op(const char* op) {
    if (!is_op(op)) return false;
    next();
    return true;
  }
  bool accept_name(const char* name) {
    if (!is_name(name)) return false;
    next();
    return true;
  }
  void expect_op(const char* op) {
    if (!accept_op(op)) error(std::string("expected '") + op + "', got " + describe(cur()));
  }
  std::string expect_name() {
    if (cur().kind != TokenKind::Name) error("expected a name, got " + describe(cur()));
    std::string n = cur().text;
    next();
    return n;
  }
  void expect_block_end() {
    if (cur().kind != TokenKind::BlockEnd) error("expected end of statement block, got " + describe(cur()));
    next();
  }
  static std::string describe(const Token& t) {
    switch (t.kind) {
      case TokenKind::Eof: return "end of template";
      case TokenKind::BlockEnd: return "'%}'";
      case TokenKind::VarEnd: return "'}}'";
      case TokenKind::String: return "a string";
      default: return "'" + t.text + "'";
    }
  }
  std::string block_name_at(size_t p) const {
    if (toks_[p].kind == TokenKind::BlockBegin && p + 1 < toks_.size()) return toks_[p + 1].text;
    return toks_[p].text;
  }

  // Parses statements until a block tag whose keyword is in `terminators` (left unconsumed).
  Body parse_body(const std::set<std::string>& terminators) {
    DepthGuard guard(*this);
    Body body;
    while (true) {
      const Token& t = cur();
      if (t.kind == TokenKind::Eof) {
        if (!terminators.empty()) {
          std::string expected;
          for (const auto& t : terminators) expected += (expected.empty() ? "'" : ", '") + t + "'";
          error("unexpected end of template, expected " + expected);
        }
        return body;
      }
      if (t.kind == TokenKind::Text) {
        body.push_back(std::make_unique<TextStmt>(t.line, t.text));
        next();
      } else if (t.kind == TokenKind::VarBegin) {
        chain_nodes_ = 0;
        int line = t.line;
        next();
        ExprPtr e = parse_tuple_or_expr();
        if (cur().kind != TokenKind::VarEnd) error("expected '}}', got " + describe(cur()));
        next();
        body.push_back(std::make_unique<EmitStmt>(line, std::move(e)));
      } else if (t.kind == TokenKind::BlockBegin) {
        const Token& kw = peek();
        if (kw.kind != TokenKind::Name) {
          next();
          error("expected a statement keyword, got " + describe(kw));
        }
        if (terminators.count(kw.text)) return body;
        chain_nodes_ = 0;
        next();
        body.push_back(parse_statement());
      } else {
        error("unexpected " + describe(t));
      }
    }
  }

  StmtPtr parse_statement() {
    int line = cur().line;
    std::string kw = expect_name();
    if (kw == "if") return parse_if(line);
    if (kw == "for") return parse_for(line);
    if (kw == "set") return parse_set(line);
    if (kw == "macro") return parse_macro(line);
    if (kw == "filter") return parse_filter_block(line);
    if (kw == "generation") {
      expect_block_end();
      auto s = std::make_unique<ScopeStmt>(line);
      s->body = parse_body({"endgeneration"});
      end_block("endgeneration");
      return s;
    }
    if (kw == "break" || kw == "continue") {
      if (loop_depth_ == 0) error("'" + kw + "' outside of a loop");
      expect_block_end();
      return std::make_unique<LoopControlStmt>(line, kw == "break");
    }
    if (kw == "include" || kw == "import" || kw == "from" || kw == "extends" || kw == "block") {
      error("'" + kw + "' is not allowed: chat templates cannot load other templates");
    }
    if (kw == "call" || kw == "do" || kw == "with" || kw == "autoescape") {
      error("'" + kw + "' statements are not supported in chat templates");
    }
    error("unknown statement '" + kw + "'");
  }

  // Consumes "{% name %}" (the BlockBegin was not yet consumed).
  void end_block(const char* name) {
    if (cur().kind != TokenKind::BlockBegin) error(std::string("expected '") + name + "'");
    next();
    if (!accept_name(name)) error(std::string("expected '") + name + "', got " + describe(cur()));
    expect_block_end();
  }

  StmtPtr parse_if(int line) {
    auto s = std::make_unique<IfStmt>(line);
    ExprPtr cond = parse_tuple_or_expr();
    expect_block_end();
    while (true) {
      Body body = parse_body({"elif", "else", "endif"});
      s->branches.emplace_back(std::move(cond), std::move(body));
      next();  // BlockBegin
      std::string kw = expect_name();
      if (kw == "elif") {
        cond = parse_tuple_or_expr();
        expect_block_end();
        continue;
      }
      if (kw == "else") {
        expect_block_end();
        s->else_body = parse_body({"endif"});
        end_block("endif");
      } else {
        expect_block_end();
      }
      return s;
    }
  }

  Target parse_target(bool allow_attribute) {
    Target t;
    t.names.push_back(expect_name());
    if (allow_attribute && accept_op(".")) {
      t.attribute = expect_name();
      return t;
    }
    while (accept_op(",")) {
      t.is_tuple = true;
      if (cur().kind != TokenKind::Name) break;
      t.names.push_back(expect_name());
    }
    return t;
  }

  StmtPtr parse_for(int line) {
    auto s = std::make_unique<ForStmt>(line);
    bool paren = accept_op("(");
    s->target = parse_target(false);
    if (paren) expect_op(")");
    if (!accept_name("in")) error("expected 'in' in for loop, got " + describe(cur()));
    s->iterable = parse_tuple_or_expr(/*no_condexpr=*/true);
    if (accept_name("if")) s->filter = parse_expression();
    if (accept_name("recursive")) error("recursive for loops are not supported");
    expect_block_end();
    ++loop_depth_;
    s->body = parse_body({"else", "endfor"});
    --loop_depth_;
    next();
    std::string kw = expect_name();
    expect_block_end();
    if (kw == "else") {
      s->else_body = parse_body({"endfor"});
      end_block("endfor");
    }
    return s;
  }

  StmtPtr parse_set(int line) {
    Target target = parse_target(true);
    if (accept_op("=")) {
      auto s = std::make_unique<SetStmt>(line);
      s->target = std::move(target);
      s->value = parse_tuple_or_expr();
      expect_block_end();
      return s;
    }
    auto s = std::make_unique<SetBlockStmt>(line);
    s->target = std::move(target);
    while (accept_op("|")) s->filters.push_back(parse_filter_call(nullptr));
    expect_block_end();
    s->body = parse_body({"endset"});
    end_block("endset");
    return s;
  }

  StmtPtr parse_macro(int line) {
    auto s = std::make_unique<MacroStmt>(line);
    s->name = expect_name();
    expect_op("(");
    while (!is_op(")")) {
      MacroParam p;
      p.name = expect_name();
      if (accept_op("=")) p.default_value = parse_expression();
      s->params.push_back(std::move(p));
      if (!accept_op(",")) break;
    }
    expect_op(")");
    expect_block_end();
    int saved_loops = loop_depth_;
    loop_depth_ = 0;
    s->body = parse_body({"endmacro"});
    loop_depth_ = saved_loops;
    end_block("endmacro");
    return s;
  }

  StmtPtr parse_filter_block(int line) {
    auto s = std::make_unique<FilterBlockStmt>(line);
    do {
      s->filters.push_back(parse_filter_call(nullptr));
    } while (accept_op("|"));
    expect_block_end();
    s->body = parse_body({"endfilter"});
    end_block("endfilter");
    return s;
  }

  // Expressions, lowest precedence first (mirrors Jinja's grammar).
  ExprPtr parse_tuple_or_expr(bool no_condexpr = false) {
    int line = cur().line;
    ExprPtr first = no_condexpr ? parse_or() : parse_expression();
    if (!is_op(",")) return first;
    auto t = std::make_unique<ListExpr>(line, true);
    t->items.push_back(std::move(first));
    while (accept_op(",")) {
      if (cur().kind == TokenKind::BlockEnd || cur().kind == TokenKind::VarEnd || is_name("if")) break;
      t->items.push_back(no_condexpr ? parse_or() : parse_expression());
    }
    return t;
  }

  ExprPtr parse_expression() {
    DepthGuard guard(*this);
    int line = cur().line;
    ExprPtr e = parse_or();
    while (accept_name("if")) {
      count_node();
      auto c = std::make_unique<CondExpr>(line);
      c->then_expr = std::move(e);
      c->cond = parse_or();
      if (accept_name("else")) c->else_expr = parse_expression();
      e = std::move(c);
    }
    return e;
  }

  ExprPtr parse_or() {
    ExprPtr e = parse_and();
    while (is_name("or")) {
      int line = cur().line;
      next();
      count_node();
      e = std::make_unique<BinaryExpr>(line, BinaryOp::Or, std::move(e), parse_and());
    }
    return e;
  }

  ExprPtr parse_and() {
    ExprPtr e = parse_not();
    while (is_name("and")) {
      int line = cur().line;
      next();
      count_node();
      e = std::make_unique<BinaryExpr>(line, BinaryOp::And, std::move(e), parse_not());
    }
    return e;
  }

  ExprPtr parse_not() {
    if (is_name("not")) {
      DepthGuard guard(*this);
      int line = cur().line;
      next();
      return std::make_unique<UnaryExpr>(line, UnaryOp::Not, parse_not());
    }
    return parse_compare();
  }

  ExprPtr parse_compare() {
    int line = cur().line;
    ExprPtr first = parse_math1();
    std::unique_ptr<CompareExpr> cmp;
    while (true) {
      CompareOp op;
      if (is_op("==")) op = CompareOp::Eq;
      else if (is_op("!=")) op = CompareOp::Ne;
      else if (is_op("<")) op = CompareOp::Lt;
      else if (is_op("<=")) op = CompareOp::Le;
      else if (is_op(">")) op = CompareOp::Gt;
      else if (is_op(">=")) op = CompareOp::Ge;
      else if (is_name("in")) op = CompareOp::In;
      else if (is_name("not") && peek().kind == TokenKind::Name && peek().text == "in") {
        next();
        op = CompareOp::NotIn;
      } else {
        break;
      }
      next();
      if (!cmp) {
        cmp = std::make_unique<CompareExpr>(line);
        cmp->first = std::move(first);
      }
      count_node();
      cmp->rest.emplace_back(op, parse_math1());
    }
    if (cmp) return cmp;
    return first;
  }

  ExprPtr parse_math1() {
    ExprPtr e = parse_concat();
    while (is_op("+") || is_op("-")) {
      int line = cur().line;
      BinaryOp op = is_op("+") ? BinaryOp::Add : BinaryOp::Sub;
      next();
      count_node();
      e = std::make_unique<BinaryExpr>(line, op, std::move(e), parse_concat());
    }
    return e;
  }

  ExprPtr parse_concat() {
    ExprPtr e = parse_math2();
    while (is_op("~")) {
      int line = cur().line;
      next();
      count_node();
      e = std::make_unique<BinaryExpr>(line, BinaryOp::Concat, std::move(e), parse_math2());
    }
    return e;
  }

  ExprPtr parse_math2() {
    ExprPtr e = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      int line = cur().line;
      BinaryOp op = is_op("*") ? BinaryOp::Mul : is_op("/") ? BinaryOp::Div : is_op("//") ? BinaryOp::FloorDiv : BinaryOp::Mod;
      next();
      count_node();
      e = std::make_unique<BinaryExpr>(line, op, std::move(e), parse_pow());
    }
    return e;
  }

  ExprPtr parse_pow() {
    ExprPtr e = parse_unary(true);
    while (is_op("**")) {
      int line = cur().line;
      next();
      count_node();
      e = std::make_unique<BinaryExpr>(line, BinaryOp::Pow, std::move(e), parse_unary(true));
    }
    return e;
  }

  ExprPtr parse_unary(bool with_filter) {
    DepthGuard guard(*this);
    int line = cur().line;
    ExprPtr e;
    if (is_op("-") || is_op("+")) {
      UnaryOp op = is_op("-") ? UnaryOp::Neg : UnaryOp::Pos;
      next();
      e = std::make_unique<UnaryExpr>(line, op, parse_unary(false));
    } else {
      e = parse_primary();
    }
    e = parse_postfix(std::move(e));
    if (with_filter) e = parse_filter_expr(std::move(e));
    return e;
  }

  ExprPtr parse_primary() {
    const Token& t = cur();
    int line = t.line;
    switch (t.kind) {
      case TokenKind::Name: {
        std::string n = t.text;
        next();
        if (n == "true" || n == "True") return std::make_unique<LiteralExpr>(line, Value(true));
        if (n == "false" || n == "False") return std::make_unique<LiteralExpr>(line, Value(false));
        if (n == "none" || n == "None") return std::make_unique<LiteralExpr>(line, Value::none());
        return std::make_unique<NameExpr>(line, n);
      }
      case TokenKind::String: {
        std::string s = t.text;
        next();
        while (cur().kind == TokenKind::String) {
          s += cur().text;
          next();
        }
        return std::make_unique<LiteralExpr>(line, Value(std::move(s)));
      }
      case TokenKind::Int: {
        int64_t v = 0;
        auto r = std::from_chars(t.text.data(), t.text.data() + t.text.size(), v);
        if (r.ec != std::errc()) error("integer literal out of range: " + t.text);
        next();
        return std::make_unique<LiteralExpr>(line, Value(v));
      }
      case TokenKind::Float: {
        double v = std::strtod(t.text.c_str(), nullptr);
        next();
        return std::make_unique<LiteralExpr>(line, Value(v));
      }
      case TokenKind::Op:
        if (t.text == "(") {
          next();
          if (accept_op(")")) return std::make_unique<ListExpr>(line, true);
          ExprPtr first = parse_expression();
          if (accept_op(")")) return first;
          auto tuple = std::make_unique<ListExpr>(line, true);
          tuple->items.push_back(std::move(first));
          while (accept_op(",")) {
            if (is_op(")")) break;
            tuple->items.push_back(parse_expression());
          }
          expect_op(")");
          return tuple;
        }
        if (t.text == "[") {
          next();
          auto list = std::make_unique<ListExpr>(line, false);
          while (!is_op("]")) {
            list->items.push_back(parse_expression());
            if (!accept_op(",")) break;
          }
          expect_op("]");
          return list;
        }
        if (t.text == "{") {
          next();
          auto dict = std::make_unique<DictExpr>(line);
          while (!is_op("}")) {
            ExprPtr k = parse_expression();
            expect_op(":");
            dict->entries.emplace_back(std::move(k), parse_expression());
            if (!accept_op(",")) break;
          }
          expect_op("}");
          return dict;
        }
        break;
      default: break;
    }
    error("unexpected " + describe(t));
  }

  ExprPtr parse_postfix(ExprPtr e) {
    while (true) {
      int line = cur().line;
      if (is_op(".") || is_op("[") || is_op("(")) count_node();
      if (accept_op(".")) {
        if (cur().kind == TokenKind::Name) {
          e = std::make_unique<GetAttrExpr>(line, std::move(e), expect_name());
        } else if (cur().kind == TokenKind::Int) {
          auto idx = std::make_unique<LiteralExpr>(line, Value(static_cast<int64_t>(std::atoll(cur().text.c_str()))));
          next();
          e = std::make_unique<GetItemExpr>(line, std::move(e), std::move(idx));
        } else {
          error("expected an attribute name after '.'");
        }
      } else if (is_op("[")) {
        next();
        e = parse_subscript(std::move(e), line);
      } else if (is_op("(")) {
        e = parse_call(std::move(e));
      } else {
        return e;
      }
    }
  }

  ExprPtr parse_subscript(ExprPtr object, int line) {
    ExprPtr start, stop, step;
    bool is_slice = false;
    if (!is_op(":")) start = parse_expression();
    if (accept_op(":")) {
      is_slice = true;
      if (!is_op("]") && !is_op(":")) stop = parse_expression();
      if (accept_op(":") && !is_op("]")) step = parse_expression();
    }
    expect_op("]");
    if (!is_slice) return std::make_unique<GetItemExpr>(line, std::move(object), std::move(start));
    auto s = std::make_unique<SliceExpr>(line);
    s->object = std::move(object);
    s->start = std::move(start);
    s->stop = std::move(stop);
    s->step = std::move(step);
    return s;
  }

  void parse_args(std::vector<ExprPtr>& args, std::vector<KeywordArg>& kwargs) {
    expect_op("(");
    while (!is_op(")")) {
      if (cur().kind == TokenKind::Name && peek().kind == TokenKind::Op && peek().text == "=") {
        std::string name = expect_name();
        next();
        kwargs.push_back({name, parse_expression()});
      } else {
        if (!kwargs.empty()) error("positional argument follows keyword argument");
        args.push_back(parse_expression());
      }
      if (!accept_op(",")) break;
    }
    expect_op(")");
  }

  ExprPtr parse_call(ExprPtr callee) {
    auto c = std::make_unique<CallExpr>(cur().line);
    c->callee = std::move(callee);
    parse_args(c->args, c->kwargs);
    return c;
  }

  std::unique_ptr<FilterExpr> parse_filter_call(ExprPtr input) {
    auto f = std::make_unique<FilterExpr>(cur().line);
    f->input = std::move(input);
    f->name = expect_name();
    while (accept_op(".")) f->name += "." + expect_name();
    if (is_op("(")) parse_args(f->args, f->kwargs);
    return f;
  }

  ExprPtr parse_filter_expr(ExprPtr e) {
    while (true) {
      if (accept_op("|")) {
        count_node();
      e = parse_filter_call(std::move(e));
      } else if (is_name("is")) {
        count_node();
        int line = cur().line;
        next();
        auto t = std::make_unique<TestExpr>(line);
        t->negated = accept_name("not");
        t->name = expect_name();
        t->input = std::move(e);
        if (is_op("(")) {
          std::vector<KeywordArg> kwargs;
          parse_args(t->args, kwargs);
          if (!kwargs.empty()) error("tests take no keyword arguments");
        } else if (starts_test_argument()) {
          t->args.push_back(parse_unary(false));
        }
        e = std::move(t);
      } else if (is_op("(")) {
        count_node();
        e = parse_call(std::move(e));
      } else {
        return e;
      }
    }
  }

  // Jinja allows one bare argument after a test name: `x is divisibleby 3`.
  bool starts_test_argument() const {
    const Token& t = cur();
    if (t.kind == TokenKind::String || t.kind == TokenKind::Int || t.kind == TokenKind::Float) return true;
    if (t.kind == TokenKind::Name) {
      static const std::set<std::string> kStop = {"else", "or", "and", "if", "in", "is", "not"};
      return !kStop.count(t.text);
    }
    return t.kind == TokenKind::Op && (t.text == "[" || t.text == "{" || t.text == "-");
  }

  std::vector<Token> toks_;
  size_t pos_ = 0;
  int depth_ = 0;
  int max_nesting_;
  int loop_depth_ = 0;
  int chain_nodes_ = 0;
  static constexpr int kMaxChainNodes = 2000;
};

}  // namespace

Body parse_template(std::string_view source, const ParseOptions& options) {
  DI_CHECK(source.size() <= options.max_source_bytes, "chat template: source is {} bytes, above the limit of {}",
           source.size(), options.max_source_bytes);
  return Parser(tokenize(source, options.lexer), options.max_nesting).parse_all();
}

}  // namespace deepinfer::jinja
