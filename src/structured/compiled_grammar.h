// The compiled grammar behind GrammarCompiler's opaque handle (internal to
// src/structured: only these files include XGrammar).
#pragma once

#include <xgrammar/xgrammar.h>

namespace deepinfer::structured {

struct CompiledGrammar {
  xgrammar::CompiledGrammar grammar;
};

}  // namespace deepinfer::structured
