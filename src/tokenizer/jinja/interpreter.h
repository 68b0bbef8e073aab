// Tree-walking evaluator for one render of a template.
#pragma once

#include <deque>
#include <string>
#include <unordered_map>

#include "tokenizer/jinja/ast.h"
#include "tokenizer/jinja/render_context.h"

namespace deepinfer::jinja {

class Interpreter {
 public:
  explicit Interpreter(RenderContext& ctx);

  void set_global(const std::string& name, Value value);
  std::string run(const Body& body);

 private:
  // Variables of one scope. Frames live as long as the render, so macros can keep
  // a plain pointer to the scope they were defined in.
  struct Frame {
    std::unordered_map<std::string, Value> vars;
    Frame* parent = nullptr;
  };
  enum class Flow { Normal, Break, Continue };

  Frame* new_frame(Frame* parent);
  Value lookup(const std::string& name) const;
  void assign(const Target& target, const Value& value);

  Flow exec_body(const Body& body);
  Flow exec(const Stmt& s);
  Flow exec_for(const ForStmt& s);
  void exec_macro(const MacroStmt& s);
  std::string capture(const Body& body);
  void write(const std::string& text);

  Value eval(const Expr& e);
  Value eval_inner(const Expr& e);
  Value eval_binary(const BinaryExpr& e);
  Value eval_compare(const CompareExpr& e);
  Value eval_filter(const FilterExpr& e, const Value* block_input);
  CallArgs eval_args(const std::vector<ExprPtr>& args, const std::vector<KeywordArg>& kwargs);
  Value call_macro(const MacroStmt& m, Frame* closure, CallArgs& args);

  RenderContext& ctx_;
  std::deque<Frame> frames_;
  Frame* current_ = nullptr;
  std::string* out_ = nullptr;
  int depth_ = 0;
  int call_depth_ = 0;
  int line_ = 0;
  friend class Template;
};

// Python arithmetic on template values (used by the interpreter and some filters).
Value binary_arith(RenderContext& ctx, BinaryOp op, const Value& a, const Value& b);

}  // namespace deepinfer::jinja
