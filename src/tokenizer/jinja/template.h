// A parsed Jinja template: parse once, render many times (render is const and
// thread-safe; each render has its own interpreter state and budget counters).
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tokenizer/jinja/ast.h"
#include "tokenizer/jinja/parser.h"
#include "tokenizer/jinja/render_context.h"

namespace deepinfer::jinja {

class Template {
 public:
  explicit Template(std::string_view source, const ParseOptions& options = {});

  // `globals` are the top-level variables. raise_exception, strftime_now, namespace,
  // range and dict are provided unless shadowed.
  std::string render(const std::vector<std::pair<std::string, Value>>& globals, const RenderBudget& budget,
                     const NowFn& now = {}) const;

 private:
  Body body_;
};

}  // namespace deepinfer::jinja
