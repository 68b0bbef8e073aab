// PenaltyState: one sequence's history in the form Backend::apply_penalties
// reads — a sorted entry per token that its logit_bias, min_tokens mask or
// penalties touch, with the token's output count and prompt membership —
// kept up to date as tokens arrive. Prompt membership is computed once; a
// new output token costs a binary search (and an insertion the first time),
// so staging a step copies O(entries) and never rescans the history.
//
// The counts cover the output the host knows. A token sampled by a step
// whose results have not reached the host yet is the row's "pending" token:
// the op adds it on the device (ModelRunner points it at the step's input id).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "backend/backend.h"
#include "deepinfer/sampling_params.h"

namespace deepinfer {

class PenaltyState {
 public:
  // Whether sampling with `p` needs logits processing (min_tokens mask,
  // logit_bias, penalties) that this state can express.
  static bool needed(const SamplingParams& p);

  // eos_ids: the tokenizer's end-of-sequence ids (masked with the stop token
  // ids until min_tokens outputs exist, unless ignore_eos). output_ids: the
  // outputs already generated.
  PenaltyState(const SamplingParams& p, std::span<const int32_t> prompt_ids, std::span<const int32_t> eos_ids,
               std::span<const int32_t> output_ids = {});

  // A token appended to the output (in order, once each).
  void add_output(int32_t token);

  std::span<const PenaltyEntry> entries() const { return entries_; }
  // The op's parameters for sampling output token `position` (counting tokens
  // in flight), with this state's entries at [begin, begin + entries().size())
  // of the step's list and the pending token at index `pending` (-1: none).
  PenaltyRowParams row_params(int64_t position, int32_t begin, int32_t pending) const;

 private:
  PenaltyEntry& entry(int32_t token);  // found or inserted in order

  std::vector<PenaltyEntry> entries_;  // strictly increasing token ids
  float repetition_ = 1.0f, frequency_ = 0.0f, presence_ = 0.0f;
  int32_t min_tokens_ = 0;
  int64_t num_outputs_ = 0;
  bool count_outputs_ = false;  // a penalty reads the output counts
};

}  // namespace deepinfer
