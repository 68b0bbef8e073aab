// LogitsProcessor: a request-specific in-place edit of one row of logits
// before sampling (grammar masks, ...), riding along in SamplingRow. The
// built-in processing (min_tokens mask, logit_bias, penalties) is the backend
// op apply_penalties. Every processor works on its own row only, so results
// do not depend on the batch a request is in.
#pragma once

#include <span>

namespace deepinfer {

struct SamplingRow;

class LogitsProcessor {
 public:
  virtual ~LogitsProcessor() = default;
  // Edits `logits` (vocab-sized) for `row`; -inf forbids a token.
  virtual void apply(const SamplingRow& row, std::span<float> logits) = 0;
};

}  // namespace deepinfer
