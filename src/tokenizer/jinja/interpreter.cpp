#include "tokenizer/jinja/interpreter.h"

#include <cmath>
#include <limits>

#include "tokenizer/jinja/builtins.h"

namespace deepinfer::jinja {

namespace {

// Counts evaluation nesting for the duration of one eval/exec call.
struct DepthScope {
  int& depth;
  DepthScope(int& d, int limit) : depth(d) {
    if (++depth > limit) {
      --depth;
      fail("budget exceeded: evaluation nested deeper than {} levels", limit);
    }
  }
  ~DepthScope() { --depth; }
};

[[noreturn]] void unsupported(const char* op, const Value& a, const Value& b) {
  fail("unsupported operand type(s) for {}: '{}' and '{}'", op, a.type_name(), b.type_name());
}

bool is_numeric(const Value& v) { return v.is_number() || v.is_bool(); }
int64_t int_of(const Value& v) { return v.is_bool() ? static_cast<int64_t>(v.as_bool()) : v.as_int(); }

Value repeat(RenderContext& ctx, const Value& seq, int64_t n) {
  if (n < 0) n = 0;
  if (seq.is_string()) {
    const std::string& s = seq.str();
    if (!s.empty() && static_cast<uint64_t>(n) > ctx.budget().max_string_bytes / s.size() + 1) {
      ctx.check_size(ctx.budget().max_string_bytes + 1);
    }
    ctx.check_size(s.size() * static_cast<size_t>(n));
    std::string out;
    out.reserve(s.size() * static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) out += s;
    return Value(std::move(out));
  }
  const auto& items = seq.arr()->items;
  if (!items.empty() && static_cast<uint64_t>(n) > ctx.budget().max_string_bytes / items.size() + 1) {
    ctx.check_size(ctx.budget().max_string_bytes + 1);
  }
  ctx.check_size(items.size() * static_cast<size_t>(n));
  std::vector<Value> out;
  for (int64_t i = 0; i < n; ++i) out.insert(out.end(), items.begin(), items.end());
  return Value::array(std::move(out), seq.arr()->is_tuple);
}

Value percent_format(RenderContext& ctx, const std::string& fmt, const Value& args) {
  std::vector<Value> values = args.is_array() && args.arr()->is_tuple ? args.arr()->items : std::vector<Value>{args};
  std::string out;
  size_t next = 0;
  for (size_t i = 0; i < fmt.size(); ++i) {
    if (fmt[i] != '%') {
      out.push_back(fmt[i]);
      continue;
    }
    DI_CHECK(i + 1 < fmt.size(), "incomplete format");
    char c = fmt[++i];
    if (c == '%') {
      out.push_back('%');
      continue;
    }
    DI_CHECK(next < values.size(), "not enough arguments for format string");
    const Value& v = values[next++];
    if (c == 's') out += v.to_string();
    else if (c == 'r') out += v.repr();
    else if (c == 'd' || c == 'i') {
      DI_CHECK(is_numeric(v), "%d format: a real number is required, not {}", v.type_name());
      if (v.is_float()) {
        // Python prints the float's integer part exactly; casting a huge float to int64 is undefined.
        DI_CHECK(std::isfinite(v.as_float()), "cannot convert float {} to integer", v.to_string());
        out += fmt::format("{:.0f}", std::trunc(v.as_float()));
      } else {
        out += std::to_string(int_of(v));
      }
    } else {
      fail("unsupported format character '{}'", c);
    }
    ctx.check_size(out.size());
  }
  DI_CHECK(next == values.size(), "not all arguments converted during string formatting");
  return Value(std::move(out));
}

}  // namespace

Value binary_arith(RenderContext& ctx, BinaryOp op, const Value& a, const Value& b) {
  if (a.is_undefined()) fail_undefined(a);
  if (b.is_undefined()) fail_undefined(b);
  switch (op) {
    case BinaryOp::Add:
      if (a.is_string() && b.is_string()) {
        ctx.check_size(a.str().size() + b.str().size());
        return Value(a.str() + b.str());
      }
      if (a.is_array() && b.is_array()) {
        ctx.check_size(a.arr()->items.size() + b.arr()->items.size());
        std::vector<Value> items = a.arr()->items;
        items.insert(items.end(), b.arr()->items.begin(), b.arr()->items.end());
        return Value::array(std::move(items), a.arr()->is_tuple);
      }
      if (!is_numeric(a) || !is_numeric(b)) unsupported("+", a, b);
      if (a.is_float() || b.is_float()) return Value(a.to_double() + b.to_double());
      {
        int64_t r;
        DI_CHECK(!__builtin_add_overflow(int_of(a), int_of(b), &r), "integer overflow");
        return Value(r);
      }
    case BinaryOp::Sub:
      if (!is_numeric(a) || !is_numeric(b)) unsupported("-", a, b);
      if (a.is_float() || b.is_float()) return Value(a.to_double() - b.to_double());
      {
        int64_t r;
        DI_CHECK(!__builtin_sub_overflow(int_of(a), int_of(b), &r), "integer overflow");
        return Value(r);
      }
    case BinaryOp::Mul:
      if ((a.is_string() || a.is_array()) && (b.is_int() || b.is_bool())) return repeat(ctx, a, int_of(b));
      if ((b.is_string() || b.is_array()) && (a.is_int() || a.is_bool())) return repeat(ctx, b, int_of(a));
      if (!is_numeric(a) || !is_numeric(b)) unsupported("*", a, b);
      if (a.is_float() || b.is_float()) return Value(a.to_double() * b.to_double());
      {
        int64_t r;
        DI_CHECK(!__builtin_mul_overflow(int_of(a), int_of(b), &r), "integer overflow");
        return Value(r);
      }
    case BinaryOp::Div:
      if (!is_numeric(a) || !is_numeric(b)) unsupported("/", a, b);
      DI_CHECK(b.to_double() != 0.0, "division by zero");
      return Value(a.to_double() / b.to_double());
    case BinaryOp::FloorDiv:
    case BinaryOp::Mod: {
      if (op == BinaryOp::Mod && a.is_string()) return percent_format(ctx, a.str(), b);
      if (!is_numeric(a) || !is_numeric(b)) unsupported(op == BinaryOp::Mod ? "%" : "//", a, b);
      if (a.is_float() || b.is_float()) {
        double x = a.to_double(), y = b.to_double();
        DI_CHECK(y != 0.0, "float division by zero");
        double m = std::fmod(x, y);
        if (m != 0 && ((m < 0) != (y < 0))) m += y;
        if (op == BinaryOp::Mod) return Value(m);
        return Value(std::floor(x / y));
      }
      int64_t x = int_of(a), y = int_of(b);
      DI_CHECK(y != 0, "integer division or modulo by zero");
      if (x == std::numeric_limits<int64_t>::min() && y == -1) fail("integer overflow");
      int64_t q = x / y, m = x % y;
      if (m != 0 && ((m < 0) != (y < 0))) {
        m += y;
        --q;
      }
      return Value(op == BinaryOp::Mod ? m : q);
    }
    case BinaryOp::Pow: {
      if (!is_numeric(a) || !is_numeric(b)) unsupported("** or pow()", a, b);
      if (a.is_float() || b.is_float() || int_of(b) < 0) return Value(std::pow(a.to_double(), b.to_double()));
      int64_t base = int_of(a), exp = int_of(b), r = 1;
      for (int64_t i = 0; i < exp; ++i) {
        DI_CHECK(!__builtin_mul_overflow(r, base, &r), "integer overflow");
        if (r == 0 || r == 1) break;
        if (r == -1) {
          r = ((exp - i - 1) % 2 == 0) ? -1 : 1;
          break;
        }
      }
      return Value(r);
    }
    default: fail("internal: not an arithmetic operator");
  }
}

Interpreter::Interpreter(RenderContext& ctx) : ctx_(ctx) { current_ = new_frame(nullptr); }

Interpreter::Frame* Interpreter::new_frame(Frame* parent) {
  frames_.emplace_back();
  frames_.back().parent = parent;
  return &frames_.back();
}

void Interpreter::set_global(const std::string& name, Value value) { frames_.front().vars[name] = std::move(value); }

std::string Interpreter::run(const Body& body) {
  std::string out;
  out_ = &out;
  try {
    exec_body(body);
  } catch (const TemplateRaisedError&) {
    throw;
  } catch (const Error& e) {
    fail("chat template: line {}: {}", line_, e.what());
  }
  return out;
}

Value Interpreter::lookup(const std::string& name) const {
  for (const Frame* f = current_; f; f = f->parent) {
    auto it = f->vars.find(name);
    if (it != f->vars.end()) return it->second;
  }
  return Value::undefined("'" + name + "' is undefined");
}

void Interpreter::assign(const Target& target, const Value& value) {
  if (!target.attribute.empty()) {
    Value ns = lookup(target.names[0]);
    DI_CHECK(ns.is_namespace(), "cannot assign attribute on non-namespace object");
    ns.obj()->set(target.attribute, value);
    ctx_.note_mutation(ns);
    return;
  }
  if (!target.is_tuple) {
    current_->vars[target.names[0]] = value;
    return;
  }
  std::vector<Value> items = iterate(value);
  DI_CHECK(items.size() == target.names.size(), "{} values to unpack (expected {}, got {})",
           items.size() > target.names.size() ? "too many" : "not enough", target.names.size(), items.size());
  for (size_t i = 0; i < items.size(); ++i) current_->vars[target.names[i]] = items[i];
}

void Interpreter::write(const std::string& text) {
  DI_CHECK(out_->size() + text.size() <= ctx_.budget().max_output_bytes,
           "budget exceeded: output larger than {} bytes", ctx_.budget().max_output_bytes);
  ctx_.check_size(text.size());
  *out_ += text;
}

std::string Interpreter::capture(const Body& body) {
  std::string buffer;
  std::string* saved = out_;
  out_ = &buffer;
  try {
    exec_body(body);
  } catch (...) {
    out_ = saved;
    throw;
  }
  out_ = saved;
  return buffer;
}

Interpreter::Flow Interpreter::exec_body(const Body& body) {
  for (const auto& s : body) {
    Flow f = exec(*s);
    if (f != Flow::Normal) return f;
  }
  return Flow::Normal;
}

Interpreter::Flow Interpreter::exec(const Stmt& s) {
  ctx_.step();
  DepthScope depth(depth_, ctx_.budget().max_eval_depth);
  line_ = s.line;
  switch (s.kind) {
    case StmtKind::Text: write(static_cast<const TextStmt&>(s).text); return Flow::Normal;
    case StmtKind::Emit: {
      Value v = eval(*static_cast<const EmitStmt&>(s).expr);
      line_ = s.line;
      write(v.to_string());
      return Flow::Normal;
    }
    case StmtKind::If: {
      const auto& st = static_cast<const IfStmt&>(s);
      for (const auto& [cond, body] : st.branches) {
        if (eval(*cond).truthy()) return exec_body(body);
      }
      return exec_body(st.else_body);
    }
    case StmtKind::For: return exec_for(static_cast<const ForStmt&>(s));
    case StmtKind::Set: {
      const auto& st = static_cast<const SetStmt&>(s);
      assign(st.target, eval(*st.value));
      return Flow::Normal;
    }
    case StmtKind::SetBlock: {
      const auto& st = static_cast<const SetBlockStmt&>(s);
      Value v(capture(st.body));
      for (const auto& f : st.filters) v = eval_filter(*f, &v);
      assign(st.target, v);
      return Flow::Normal;
    }
    case StmtKind::Macro: exec_macro(static_cast<const MacroStmt&>(s)); return Flow::Normal;
    case StmtKind::FilterBlock: {
      const auto& st = static_cast<const FilterBlockStmt&>(s);
      Value v(capture(st.body));
      for (const auto& f : st.filters) v = eval_filter(*f, &v);
      write(v.to_string());
      return Flow::Normal;
    }
    case StmtKind::Scope: return exec_body(static_cast<const ScopeStmt&>(s).body);
    case StmtKind::Break: return Flow::Break;
    case StmtKind::Continue: return Flow::Continue;
  }
  return Flow::Normal;
}

Interpreter::Flow Interpreter::exec_for(const ForStmt& s) {
  Value iterable = eval(*s.iterable);
  std::vector<Value> items = iterate(iterable);
  Frame* saved = current_;
  current_ = new_frame(saved);
  struct Restore {
    Frame*& cur;
    Frame* saved;
    ~Restore() { cur = saved; }
  } restore{current_, saved};
  if (s.filter) {
    std::vector<Value> kept;
    for (auto& item : items) {
      ctx_.count_iteration();
      assign(s.target, item);
      if (eval(*s.filter).truthy()) kept.push_back(std::move(item));
    }
    items = std::move(kept);
  }
  const size_t n = items.size();
  for (size_t i = 0; i < n; ++i) {
    ctx_.count_iteration();
    Value loop = Value::object();
    auto& l = *loop.obj();
    l.set("index0", Value(i));
    l.set("index", Value(i + 1));
    l.set("revindex", Value(n - i));
    l.set("revindex0", Value(n - i - 1));
    l.set("first", Value(i == 0));
    l.set("last", Value(i + 1 == n));
    l.set("length", Value(n));
    l.set("depth", Value(1));
    l.set("depth0", Value(0));
    l.set("previtem", i > 0 ? items[i - 1] : Value::undefined("there is no previous item"));
    l.set("nextitem", i + 1 < n ? items[i + 1] : Value::undefined("there is no next item"));
    l.set("cycle", Value::function("loop.cycle", [i](RenderContext&, CallArgs& args) -> Value {
      DI_CHECK(!args.positional.empty(), "no items for cycling given");
      return args.positional[i % args.positional.size()];
    }));
    current_->vars["loop"] = loop;
    assign(s.target, items[i]);
    if (exec_body(s.body) == Flow::Break) break;
  }
  if (n == 0) {
    current_ = saved;
    return exec_body(s.else_body);
  }
  return Flow::Normal;
}

void Interpreter::exec_macro(const MacroStmt& s) {
  Frame* closure = current_;
  const MacroStmt* macro = &s;
  current_->vars[s.name] = Value::function(s.name, [this, macro, closure](RenderContext&, CallArgs& args) {
    return call_macro(*macro, closure, args);
  });
}

Value Interpreter::call_macro(const MacroStmt& m, Frame* closure, CallArgs& args) {
  DI_CHECK(call_depth_ < ctx_.budget().max_call_depth, "budget exceeded: macro calls nested deeper than {}",
           ctx_.budget().max_call_depth);
  DI_CHECK(args.positional.size() <= m.params.size(), "macro '{}' takes not more than {} argument(s)", m.name,
           m.params.size());
  Frame* saved = current_;
  current_ = new_frame(closure);
  ++call_depth_;
  struct Restore {
    Interpreter& in;
    Frame* saved;
    ~Restore() {
      in.current_ = saved;
      --in.call_depth_;
    }
  } restore{*this, saved};
  std::vector<bool> bound(m.params.size(), false);
  for (size_t i = 0; i < args.positional.size(); ++i) {
    current_->vars[m.params[i].name] = args.positional[i];
    bound[i] = true;
  }
  for (auto& [name, value] : args.keyword) {
    size_t i = 0;
    while (i < m.params.size() && m.params[i].name != name) ++i;
    DI_CHECK(i < m.params.size(), "macro '{}' has no argument named '{}'", m.name, name);
    DI_CHECK(!bound[i], "macro '{}' got multiple values for argument '{}'", m.name, name);
    current_->vars[name] = value;
    bound[i] = true;
  }
  for (size_t i = 0; i < m.params.size(); ++i) {
    if (bound[i]) continue;
    current_->vars[m.params[i].name] =
        m.params[i].default_value ? eval(*m.params[i].default_value)
                                  : Value::undefined("parameter '" + m.params[i].name + "' was not provided");
  }
  return Value(capture(m.body));
}

Value Interpreter::eval(const Expr& e) {
  ctx_.step();
  DepthScope depth(depth_, ctx_.budget().max_eval_depth);
  line_ = e.line;
  return eval_inner(e);
}

CallArgs Interpreter::eval_args(const std::vector<ExprPtr>& args, const std::vector<KeywordArg>& kwargs) {
  CallArgs out;
  for (const auto& a : args) out.positional.push_back(eval(*a));
  for (const auto& k : kwargs) out.keyword.emplace_back(k.name, eval(*k.value));
  return out;
}

Value Interpreter::eval_filter(const FilterExpr& e, const Value* block_input) {
  Value input = block_input ? *block_input : eval(*e.input);
  CallArgs args = eval_args(e.args, e.kwargs);
  line_ = e.line;
  return apply_filter(ctx_, e.name, input, args);
}

Value Interpreter::eval_inner(const Expr& e) {
  switch (e.kind) {
    case ExprKind::Literal: return static_cast<const LiteralExpr&>(e).value;
    case ExprKind::Name: return lookup(static_cast<const NameExpr&>(e).name);
    case ExprKind::List: {
      const auto& x = static_cast<const ListExpr&>(e);
      std::vector<Value> items;
      for (const auto& item : x.items) items.push_back(eval(*item));
      return Value::array(std::move(items), x.is_tuple);
    }
    case ExprKind::Dict: {
      Value d = Value::object();
      for (const auto& [k, v] : static_cast<const DictExpr&>(e).entries) {
        Value key = eval(*k);
        DI_CHECK(key.is_string(), "dict keys must be strings in chat templates, got {}", key.type_name());
        d.obj()->set(key.str(), eval(*v));
      }
      return d;
    }
    case ExprKind::GetAttr: {
      const auto& x = static_cast<const GetAttrExpr&>(e);
      return get_attr(ctx_, eval(*x.object), x.name);
    }
    case ExprKind::GetItem: {
      const auto& x = static_cast<const GetItemExpr&>(e);
      Value obj = eval(*x.object);
      return get_item(ctx_, obj, eval(*x.index));
    }
    case ExprKind::Slice: {
      const auto& x = static_cast<const SliceExpr&>(e);
      Value obj = eval(*x.object);
      Value start = x.start ? eval(*x.start) : Value();
      Value stop = x.stop ? eval(*x.stop) : Value();
      Value step = x.step ? eval(*x.step) : Value();
      return get_slice(ctx_, obj, start, stop, step);
    }
    case ExprKind::Call: {
      const auto& x = static_cast<const CallExpr&>(e);
      Value callee = eval(*x.callee);
      CallArgs args = eval_args(x.args, x.kwargs);
      line_ = e.line;
      return call_value(ctx_, callee, args);
    }
    case ExprKind::Filter: return eval_filter(static_cast<const FilterExpr&>(e), nullptr);
    case ExprKind::Test: {
      const auto& x = static_cast<const TestExpr&>(e);
      Value input = eval(*x.input);
      std::vector<Value> args;
      for (const auto& a : x.args) args.push_back(eval(*a));
      line_ = e.line;
      return Value(apply_test(ctx_, x.name, input, args) != x.negated);
    }
    case ExprKind::Unary: {
      const auto& x = static_cast<const UnaryExpr&>(e);
      Value v = eval(*x.operand);
      if (x.op == UnaryOp::Not) return Value(!v.truthy());
      if (v.is_undefined()) fail_undefined(v);
      DI_CHECK(v.is_number() || v.is_bool(), "bad operand type for unary {}: '{}'", x.op == UnaryOp::Neg ? "-" : "+",
               v.type_name());
      if (x.op == UnaryOp::Pos) return v.is_bool() ? Value(static_cast<int64_t>(v.as_bool())) : v;
      if (v.is_float()) return Value(-v.as_float());
      int64_t i = v.is_bool() ? v.as_bool() : v.as_int();
      DI_CHECK(i != std::numeric_limits<int64_t>::min(), "integer overflow");
      return Value(-i);
    }
    case ExprKind::Binary: return eval_binary(static_cast<const BinaryExpr&>(e));
    case ExprKind::Compare: return eval_compare(static_cast<const CompareExpr&>(e));
    case ExprKind::Cond: {
      const auto& x = static_cast<const CondExpr&>(e);
      if (eval(*x.cond).truthy()) return eval(*x.then_expr);
      if (x.else_expr) return eval(*x.else_expr);
      return Value::undefined("the inline if-expression evaluated to false and no else section was defined");
    }
  }
  return Value();
}

Value Interpreter::eval_binary(const BinaryExpr& e) {
  if (e.op == BinaryOp::And) {
    Value l = eval(*e.left);
    return l.truthy() ? eval(*e.right) : l;
  }
  if (e.op == BinaryOp::Or) {
    Value l = eval(*e.left);
    return l.truthy() ? l : eval(*e.right);
  }
  Value l = eval(*e.left);
  Value r = eval(*e.right);
  line_ = e.line;
  if (e.op == BinaryOp::Concat) {
    std::string ls = l.to_string(), rs = r.to_string();
    ctx_.check_size(ls.size() + rs.size());
    return Value(ls + rs);
  }
  return binary_arith(ctx_, e.op, l, r);
}

Value Interpreter::eval_compare(const CompareExpr& e) {
  Value left = eval(*e.first);
  for (const auto& [op, expr] : e.rest) {
    Value right = eval(*expr);
    line_ = e.line;
    bool ok = false;
    auto ordered = [&](const Value& a, const Value& b) {
      if (a.is_undefined()) fail_undefined(a);
      if (b.is_undefined()) fail_undefined(b);
      return value_less(a, b);
    };
    switch (op) {
      case CompareOp::Eq: ok = values_equal(left, right); break;
      case CompareOp::Ne: ok = !values_equal(left, right); break;
      case CompareOp::Lt: ok = ordered(left, right); break;
      case CompareOp::Gt: ok = ordered(right, left); break;
      case CompareOp::Le: ok = !ordered(right, left); break;
      case CompareOp::Ge: ok = !ordered(left, right); break;
      case CompareOp::In: ok = contains(right, left); break;
      case CompareOp::NotIn: ok = !contains(right, left); break;
    }
    if (!ok) return Value(false);
    left = std::move(right);
  }
  return Value(true);
}

}  // namespace deepinfer::jinja
