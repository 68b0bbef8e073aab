// Logits processors: in-place edits of one row of logits before sampling.
// The built-in ones (min_tokens mask, logit_bias, penalties) are free
// functions the Sampler applies in vLLM's order; request-specific ones (grammar
// masks, ...) implement LogitsProcessor and ride along in SamplingRow.
// Every processor works on its own row only, so results do not depend on the
// batch a request is in.
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <vector>

namespace deepinfer {

struct SamplingParams;
struct SamplingRow;

class LogitsProcessor {
 public:
  virtual ~LogitsProcessor() = default;
  // Edits `logits` (vocab-sized) for `row`; -inf forbids a token.
  virtual void apply(const SamplingRow& row, std::span<float> logits) = 0;
};

// Sets the logits of `ids` to -inf (min_tokens not reached: EOS and stop tokens).
void mask_tokens(std::span<float> logits, std::span<const int32_t> ids);

void apply_logit_bias(std::span<float> logits, const std::map<int32_t, float>& bias);

// vLLM's penalties: repetition over prompt + output tokens (positive logits
// divided, negative ones multiplied by the penalty), then frequency (times the
// token's count in the output) and presence (once if it occurs in the output)
// subtracted. `counts` is caller-owned scratch of vocab size, all zero on entry
// and on return. The arithmetic is cpu::penalise_logit's, which every
// backend's apply_penalties reproduces bit for bit.
void apply_penalties(std::span<float> logits, const SamplingParams& params, std::span<const int32_t> prompt_ids,
                     std::span<const int32_t> output_ids, std::vector<int32_t>& counts);

}  // namespace deepinfer
