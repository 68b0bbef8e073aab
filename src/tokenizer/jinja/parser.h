// Recursive-descent parser for the Jinja subset used by chat templates.
#pragma once

#include <string_view>

#include "tokenizer/jinja/ast.h"
#include "tokenizer/jinja/lexer.h"

namespace deepinfer::jinja {

struct ParseOptions {
  LexerOptions lexer;
  size_t max_source_bytes = 1 << 20;
  // Bounds parser recursion (nested expressions and blocks) so hostile input
  // cannot overflow the stack.
  int max_nesting = 128;
};

// Throws deepinfer::Error ("chat template: line N: ...") on syntax errors and on
// features the sandbox refuses (include, import, extends, ...).
Body parse_template(std::string_view source, const ParseOptions& options);

}  // namespace deepinfer::jinja
