#include "structured/token_matcher.h"

#include <dlpack/dlpack.h>

#include <limits>

#include "core/error.h"
#include "structured/compiled_grammar.h"

namespace deepinfer::structured {

struct TokenMatcher::Impl {
  std::shared_ptr<const CompiledGrammar> grammar;
  xgrammar::GrammarMatcher matcher;
  Impl(std::shared_ptr<const CompiledGrammar> g, std::vector<int32_t> stops)
      : grammar(std::move(g)), matcher(grammar->grammar, std::move(stops)) {}
};

TokenMatcher::TokenMatcher(std::shared_ptr<const CompiledGrammar> grammar, std::span<const int32_t> stop_ids) {
  DI_CHECK(grammar != nullptr, "TokenMatcher needs a compiled grammar");
  impl_ = std::make_unique<Impl>(std::move(grammar), std::vector<int32_t>(stop_ids.begin(), stop_ids.end()));
}

TokenMatcher::~TokenMatcher() = default;
TokenMatcher::TokenMatcher(TokenMatcher&&) noexcept = default;

bool TokenMatcher::fill_mask(std::span<int32_t> words) {
  if (impl_->matcher.IsTerminated()) {
    // Nothing may follow a stop token; the request ends on it.
    std::fill(words.begin(), words.end(), 0);
    return false;
  }
  int64_t shape[1] = {static_cast<int64_t>(words.size())};
  DLTensor t{};
  t.data = words.data();
  t.device = DLDevice{kDLCPU, 0};
  t.ndim = 1;
  t.dtype = DLDataType{kDLInt, 32, 1};
  t.shape = shape;
  t.strides = nullptr;
  t.byte_offset = 0;
  impl_->matcher.FillNextTokenBitmask(&t, 0);
  for (int32_t w : words) {
    if (w != 0) return true;
  }
  return false;
}

bool TokenMatcher::accept(int32_t token) {
  if (impl_->matcher.IsTerminated() || !impl_->matcher.AcceptToken(token)) return false;
  ++num_accepted_;
  return true;
}

bool TokenMatcher::terminated() const { return impl_->matcher.IsTerminated(); }

void GrammarLogitsProcessor::apply(const SamplingRow& /*row*/, std::span<float> logits) {
  matcher_.fill_mask(words_);
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  const size_t n = logits.size();
  for (size_t t = 0; t < n; ++t) {
    const size_t w = t >> 5;
    if (w >= words_.size() || ((static_cast<uint32_t>(words_[w]) >> (t & 31)) & 1u) == 0) logits[t] = kNegInf;
  }
}

}  // namespace deepinfer::structured
