// Syntax tree of a parsed template. Nodes are immutable after parsing, so one
// tree is shared by concurrent renders.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "tokenizer/jinja/value.h"

namespace deepinfer::jinja {

struct Expr;
struct Stmt;
using ExprPtr = std::unique_ptr<Expr>;
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

enum class ExprKind : uint8_t {
  Literal, Name, List, Dict, GetAttr, GetItem, Slice, Call, Filter, Test, Unary, Binary, Compare, Cond,
};

enum class UnaryOp : uint8_t { Neg, Pos, Not };
enum class BinaryOp : uint8_t { Add, Sub, Mul, Div, FloorDiv, Mod, Pow, Concat, And, Or };
enum class CompareOp : uint8_t { Eq, Ne, Lt, Le, Gt, Ge, In, NotIn };

struct KeywordArg {
  std::string name;
  ExprPtr value;
};

struct Expr {
  ExprKind kind;
  int line;
  Expr(ExprKind k, int l) : kind(k), line(l) {}
  virtual ~Expr() = default;
};

struct LiteralExpr : Expr {
  Value value;
  LiteralExpr(int l, Value v) : Expr(ExprKind::Literal, l), value(std::move(v)) {}
};

struct NameExpr : Expr {
  std::string name;
  NameExpr(int l, std::string n) : Expr(ExprKind::Name, l), name(std::move(n)) {}
};

struct ListExpr : Expr {
  std::vector<ExprPtr> items;
  bool is_tuple;
  ListExpr(int l, bool tuple) : Expr(ExprKind::List, l), is_tuple(tuple) {}
};

struct DictExpr : Expr {
  std::vector<std::pair<ExprPtr, ExprPtr>> entries;
  explicit DictExpr(int l) : Expr(ExprKind::Dict, l) {}
};

struct GetAttrExpr : Expr {
  ExprPtr object;
  std::string name;
  GetAttrExpr(int l, ExprPtr o, std::string n) : Expr(ExprKind::GetAttr, l), object(std::move(o)), name(std::move(n)) {}
};

struct GetItemExpr : Expr {
  ExprPtr object;
  ExprPtr index;
  GetItemExpr(int l, ExprPtr o, ExprPtr i) : Expr(ExprKind::GetItem, l), object(std::move(o)), index(std::move(i)) {}
};

struct SliceExpr : Expr {
  ExprPtr object, start, stop, step;  // bounds may be null
  explicit SliceExpr(int l) : Expr(ExprKind::Slice, l) {}
};

struct CallExpr : Expr {
  ExprPtr callee;
  std::vector<ExprPtr> args;
  std::vector<KeywordArg> kwargs;
  explicit CallExpr(int l) : Expr(ExprKind::Call, l) {}
};

struct FilterExpr : Expr {
  ExprPtr input;  // null inside {% filter %} blocks, where the body is the input
  std::string name;
  std::vector<ExprPtr> args;
  std::vector<KeywordArg> kwargs;
  explicit FilterExpr(int l) : Expr(ExprKind::Filter, l) {}
};

struct TestExpr : Expr {
  ExprPtr input;
  std::string name;
  std::vector<ExprPtr> args;
  bool negated = false;
  explicit TestExpr(int l) : Expr(ExprKind::Test, l) {}
};

struct UnaryExpr : Expr {
  UnaryOp op;
  ExprPtr operand;
  UnaryExpr(int l, UnaryOp o, ExprPtr e) : Expr(ExprKind::Unary, l), op(o), operand(std::move(e)) {}
};

struct BinaryExpr : Expr {
  BinaryOp op;
  ExprPtr left, right;
  BinaryExpr(int l, BinaryOp o, ExprPtr a, ExprPtr b)
      : Expr(ExprKind::Binary, l), op(o), left(std::move(a)), right(std::move(b)) {}
};

// Python-style chained comparison: a < b <= c.
struct CompareExpr : Expr {
  ExprPtr first;
  std::vector<std::pair<CompareOp, ExprPtr>> rest;
  explicit CompareExpr(int l) : Expr(ExprKind::Compare, l) {}
};

struct CondExpr : Expr {
  ExprPtr cond, then_expr, else_expr;  // else_expr may be null (yields undefined)
  explicit CondExpr(int l) : Expr(ExprKind::Cond, l) {}
};

enum class StmtKind : uint8_t { Text, Emit, If, For, Set, SetBlock, Macro, FilterBlock, Scope, Break, Continue };

struct Stmt {
  StmtKind kind;
  int line;
  Stmt(StmtKind k, int l) : kind(k), line(l) {}
  virtual ~Stmt() = default;
};

struct TextStmt : Stmt {
  std::string text;
  TextStmt(int l, std::string t) : Stmt(StmtKind::Text, l), text(std::move(t)) {}
};

struct EmitStmt : Stmt {
  ExprPtr expr;
  EmitStmt(int l, ExprPtr e) : Stmt(StmtKind::Emit, l), expr(std::move(e)) {}
};

struct IfStmt : Stmt {
  std::vector<std::pair<ExprPtr, Body>> branches;
  Body else_body;
  explicit IfStmt(int l) : Stmt(StmtKind::If, l) {}
};

// An assignment target: a name, `ns.attr`, or a tuple of names.
struct Target {
  std::vector<std::string> names;  // several names: tuple unpacking
  std::string attribute;           // non-empty: names[0].attribute
  bool is_tuple = false;
};

struct ForStmt : Stmt {
  Target target;
  ExprPtr iterable;
  ExprPtr filter;  // `for x in xs if cond`; may be null
  Body body;
  Body else_body;
  explicit ForStmt(int l) : Stmt(StmtKind::For, l) {}
};

struct SetStmt : Stmt {
  Target target;
  ExprPtr value;
  explicit SetStmt(int l) : Stmt(StmtKind::Set, l) {}
};

struct SetBlockStmt : Stmt {
  Target target;
  std::vector<std::unique_ptr<FilterExpr>> filters;
  Body body;
  explicit SetBlockStmt(int l) : Stmt(StmtKind::SetBlock, l) {}
};

struct MacroParam {
  std::string name;
  ExprPtr default_value;  // may be null
};

struct MacroStmt : Stmt {
  std::string name;
  std::vector<MacroParam> params;
  Body body;
  explicit MacroStmt(int l) : Stmt(StmtKind::Macro, l) {}
};

struct FilterBlockStmt : Stmt {
  std::vector<std::unique_ptr<FilterExpr>> filters;
  Body body;
  explicit FilterBlockStmt(int l) : Stmt(StmtKind::FilterBlock, l) {}
};

// A block that only groups statements ({% generation %} of transformers).
struct ScopeStmt : Stmt {
  Body body;
  explicit ScopeStmt(int l) : Stmt(StmtKind::Scope, l) {}
};

struct LoopControlStmt : Stmt {
  explicit LoopControlStmt(int l, bool is_break) : Stmt(is_break ? StmtKind::Break : StmtKind::Continue, l) {}
};

}  // namespace deepinfer::jinja
