// The arithmetic of logit_bias and vLLM's penalties on one logit, used by
// CpuBackend::apply_penalties (which the host Sampler runs too) and by the
// tests' per-token reference (tests/support/reference_penalties.h); the CUDA
// kernel (cuda_penalties.cu) performs the same separately rounded f32 steps,
// so all give bit-identical logits.
#pragma once

#include <cstdint>
#include <limits>

#include "backend/backend.h"

namespace deepinfer::cpu {

// a * b rounded to f32 on its own. GCC fuses a product into the add that
// consumes it by default (-ffp-contract=fast with -march=native's FMA), which
// would change the last bit; the volatile round trip keeps the rounding.
inline float product_rn(float a, float b) {
  volatile float p = a * b;
  return p;
}

// Repetition penalty on a logit of a token seen in the prompt or output.
inline float repetition_penalised(float logit, float penalty) {
  return logit > 0.0f ? logit / penalty : product_rn(logit, penalty);
}

// Frequency and presence penalties on a logit of a token seen `count` > 0
// times in the output.
inline float frequency_penalised(float logit, float frequency, float presence, int32_t count) {
  return logit - (product_rn(frequency, static_cast<float>(count)) + presence);
}

// Backend::apply_penalties on one logit: `masked`, `flags` and `bias` from
// the token's entry (false / 0 without one), count including the pending token.
inline float penalise_logit(float logit, const PenaltyRowParams& p, uint32_t flags, float bias, bool masked,
                            int32_t count) {
  if (masked) logit = -std::numeric_limits<float>::infinity();
  if (flags & kPenaltyHasBias) logit += bias;
  if (p.repetition != 1.0f && ((flags & kPenaltyInPrompt) || count > 0)) {
    logit = repetition_penalised(logit, p.repetition);
  }
  if ((p.frequency != 0.0f || p.presence != 0.0f) && count > 0) {
    logit = frequency_penalised(logit, p.frequency, p.presence, count);
  }
  return logit;
}

}  // namespace deepinfer::cpu
