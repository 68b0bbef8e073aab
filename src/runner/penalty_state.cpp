#include "runner/penalty_state.h"

#include <algorithm>

namespace deepinfer {

bool PenaltyState::needed(const SamplingParams& p) {
  return p.min_tokens > 0 || !p.logit_bias.empty() || p.repetition_penalty != 1.0f || p.frequency_penalty != 0.0f ||
         p.presence_penalty != 0.0f;
}

PenaltyState::PenaltyState(const SamplingParams& p, std::span<const int32_t> prompt_ids,
                           std::span<const int32_t> eos_ids, std::span<const int32_t> output_ids)
    : repetition_(p.repetition_penalty),
      frequency_(p.frequency_penalty),
      presence_(p.presence_penalty),
      min_tokens_(p.min_tokens) {
  count_outputs_ = repetition_ != 1.0f || frequency_ != 0.0f || presence_ != 0.0f;
  // Prompt membership matters to the repetition penalty only.
  if (repetition_ != 1.0f) {
    for (int32_t t : prompt_ids) entry(t).flags |= kPenaltyInPrompt;
  }
  for (const auto& [t, b] : p.logit_bias) {
    PenaltyEntry& e = entry(t);
    e.flags |= kPenaltyHasBias;
    e.bias = b;
  }
  if (min_tokens_ > 0) {
    if (!p.ignore_eos) {
      for (int32_t t : eos_ids) entry(t).flags |= kPenaltyMinTokensMask;
    }
    for (int32_t t : p.stop_token_ids) entry(t).flags |= kPenaltyMinTokensMask;
  }
  for (int32_t t : output_ids) add_output(t);
}

PenaltyEntry& PenaltyState::entry(int32_t token) {
  auto it = std::lower_bound(entries_.begin(), entries_.end(), token,
                             [](const PenaltyEntry& e, int32_t t) { return e.token < t; });
  if (it == entries_.end() || it->token != token) it = entries_.insert(it, PenaltyEntry{.token = token});
  return *it;
}

void PenaltyState::add_output(int32_t token) {
  ++num_outputs_;
  if (count_outputs_) ++entry(token).output_count;
  if (num_outputs_ == min_tokens_) {
    // Every later sample is past min_tokens: the mask entries are done.
    for (PenaltyEntry& e : entries_) e.flags &= ~kPenaltyMinTokensMask;
    std::erase_if(entries_, [](const PenaltyEntry& e) { return e.flags == 0 && e.output_count == 0; });
  }
}

PenaltyRowParams PenaltyState::row_params(int64_t position, int32_t begin, int32_t pending) const {
  PenaltyRowParams r;
  r.repetition = repetition_;
  r.frequency = frequency_;
  r.presence = presence_;
  r.entries_begin = begin;
  r.entries_end = begin + static_cast<int32_t>(entries_.size());
  r.pending = pending;
  r.mask_min_tokens = position < min_tokens_ ? 1 : 0;
  return r;
}

}  // namespace deepinfer
