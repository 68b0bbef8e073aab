// TokenMatcher: one request's position in its compiled grammar. It gives the
// token bitmask of the next row (bit t of word t / 32 set = token t allowed,
// the layout ops::apply_token_bitmask reads) and advances by every token the
// request keeps. Not thread-safe: one request, one matcher, one thread at a time.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "runner/logits_processors.h"
#include "structured/grammar_compiler.h"

namespace deepinfer::structured {

class TokenMatcher {
 public:
  // stop_ids: the tokens that end the output once the grammar is complete
  // (the tokenizer's EOS ids).
  TokenMatcher(std::shared_ptr<const CompiledGrammar> grammar, std::span<const int32_t> stop_ids);
  ~TokenMatcher();
  TokenMatcher(TokenMatcher&&) noexcept;

  // Fills words (GrammarCompiler::mask_words() of them) with the tokens allowed
  // next. Returns false when the grammar allows none (a dead end).
  bool fill_mask(std::span<int32_t> words);
  // Advances by `token`; false if the grammar does not allow it (the state is unchanged).
  bool accept(int32_t token);
  // The grammar has accepted a stop token: nothing more may follow.
  bool terminated() const;
  // Tokens accepted so far.
  int64_t num_accepted() const { return num_accepted_; }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  int64_t num_accepted_ = 0;
};

// The matcher as a host-side logits processor: forbidden tokens become -inf.
// For rows the host samples (e.g. logprobs together with penalties).
class GrammarLogitsProcessor final : public LogitsProcessor {
 public:
  explicit GrammarLogitsProcessor(TokenMatcher& matcher, int32_t mask_words) : matcher_(matcher), words_(mask_words) {}
  void apply(const SamplingRow& row, std::span<float> logits) override;

 private:
  TokenMatcher& matcher_;
  std::vector<int32_t> words_;
};

}  // namespace deepinfer::structured
