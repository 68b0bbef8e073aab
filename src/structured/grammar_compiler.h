// GrammarCompiler: turns a request's StructuredOutputs (JSON schema, regex,
// grammar, choice list) into a compiled grammar over the model's vocabulary,
// on XGrammar's C++ core. Compiled grammars are cached by the constraint's
// key (a bounded LRU), so a schema is compiled once however many requests use
// it. Thread-safe: the server compiles in its request handlers (to answer an
// invalid schema with a 400 before the request is queued) while the engine
// thread looks the same grammars up.
//
// A compilation that runs past the time budget is reported as an error (the
// request gets a 400) and finishes in the background, its result discarded,
// so a hostile schema costs a thread for a while but never hangs a request.
#pragma once

#include <chrono>
#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "deepinfer/structured_outputs.h"

namespace deepinfer {
class Tokenizer;
}

namespace deepinfer::structured {

// A compiled grammar (opaque outside src/structured).
struct CompiledGrammar;

struct CompilerOptions {
  // Generous: XGrammar precomputes token masks at compile time, and a large
  // schema takes seconds on a busy 2-core machine.
  std::chrono::milliseconds timeout{30000};
  size_t cache_entries = 256;
  // Compilations running at once (those abandoned at the timeout included);
  // beyond it a constraint is refused.
  int max_running = 16;
  int threads = 2;  // XGrammar's threads for the token-mask cache of one compilation
};

class GrammarCompiler {
 public:
  // vocab_size: the model's logits width (may exceed the tokenizer's vocabulary;
  // the extra ids are never allowed).
  GrammarCompiler(const Tokenizer& tokenizer, int32_t vocab_size, CompilerOptions options = {});
  ~GrammarCompiler();
  GrammarCompiler(const GrammarCompiler&) = delete;
  GrammarCompiler& operator=(const GrammarCompiler&) = delete;

  // The compiled grammar of `so` (cached). Throws ParamError naming so.param
  // for an invalid constraint or one whose compilation exceeds the budget.
  std::shared_ptr<const CompiledGrammar> compile(const StructuredOutputs& so);

  int32_t vocab_size() const { return vocab_size_; }
  // int32 words of one row's token bitmask.
  int32_t mask_words() const { return (vocab_size_ + 31) / 32; }

  struct Stats {
    int64_t compiled = 0, cache_hits = 0, failed = 0, timed_out = 0;
  };
  Stats stats() const;

 private:
  struct Impl;
  std::shared_ptr<Impl> impl_;  // shared with compilations still running after a timeout
  int32_t vocab_size_;
  CompilerOptions options_;

  mutable std::mutex mutex_;
  std::list<std::string> lru_;  // most recent first
  struct Entry {
    std::shared_ptr<const CompiledGrammar> grammar;
    std::list<std::string>::iterator lru;
  };
  std::unordered_map<std::string, Entry> cache_;
  Stats stats_;
};

}  // namespace deepinfer::structured
