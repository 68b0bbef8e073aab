// Test support: the built-in logits processing (min_tokens mask, logit_bias,
// vLLM's penalties) written per token over the full history, independently
// of the PenaltyState entry lists the backends' apply_penalties reads — the
// reference the op tests and sampler tests compare with, bit for bit (the
// per-logit arithmetic is cpu::penalise_logit's, shared by every backend).
#pragma once

#include <cstdint>
#include <limits>
#include <map>
#include <span>
#include <vector>

#include "backend/cpu/cpu_penalties.h"
#include "core/error.h"
#include "deepinfer/sampling_params.h"

namespace deepinfer::testing {

namespace detail {

inline void check_token(int32_t id, size_t vocab, const char* what) {
  DI_CHECK(id >= 0 && static_cast<size_t>(id) < vocab, "sampler: {} token id {} outside the vocabulary [0, {})",
           what, id, vocab);
}

}  // namespace detail

inline void mask_tokens(std::span<float> logits, std::span<const int32_t> ids) {
  for (int32_t id : ids) {
    detail::check_token(id, logits.size(), "masked");
    logits[static_cast<size_t>(id)] = -std::numeric_limits<float>::infinity();
  }
}

inline void apply_logit_bias(std::span<float> logits, const std::map<int32_t, float>& bias) {
  for (const auto& [id, b] : bias) {
    detail::check_token(id, logits.size(), "logit_bias");
    logits[static_cast<size_t>(id)] += b;
  }
}

inline void apply_penalties(std::span<float> logits, const SamplingParams& params, std::span<const int32_t> prompt_ids,
                     std::span<const int32_t> output_ids, std::vector<int32_t>& counts) {
  const size_t vocab = logits.size();
  if (counts.size() < vocab) counts.resize(vocab, 0);
  for (int32_t id : prompt_ids) detail::check_token(id, vocab, "prompt");
  for (int32_t id : output_ids) detail::check_token(id, vocab, "output");

  if (params.repetition_penalty != 1.0f) {
    // counts doubles as a "seen" mark so every token is penalised once.
    const float r = params.repetition_penalty;
    auto penalise = [&](std::span<const int32_t> ids) {
      for (int32_t id : ids) {
        int32_t& seen = counts[static_cast<size_t>(id)];
        if (seen != 0) continue;
        seen = 1;
        float& l = logits[static_cast<size_t>(id)];
        l = cpu::repetition_penalised(l, r);
      }
    };
    penalise(prompt_ids);
    penalise(output_ids);
    for (int32_t id : prompt_ids) counts[static_cast<size_t>(id)] = 0;
    for (int32_t id : output_ids) counts[static_cast<size_t>(id)] = 0;
  }

  if (params.frequency_penalty != 0.0f || params.presence_penalty != 0.0f) {
    for (int32_t id : output_ids) ++counts[static_cast<size_t>(id)];
    for (int32_t id : output_ids) {
      int32_t& c = counts[static_cast<size_t>(id)];
      if (c == 0) continue;
      float& l = logits[static_cast<size_t>(id)];
      l = cpu::frequency_penalised(l, params.frequency_penalty, params.presence_penalty, c);
      c = 0;
    }
  }
}

}  // namespace deepinfer::testing
