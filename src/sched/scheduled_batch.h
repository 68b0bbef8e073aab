// Plain structs passed between the scheduling stages.
#pragma once

#include <cstdint>
#include <vector>

namespace deepinfer {

class Request;

// One sequence's share of a step: tokens [start, start + num_tokens) of the
// request's token list (known or in flight) are computed, and the last
// num_sample_rows of them yield next-token logits to sample: 1 when the chunk
// reaches the end of the sequence, 0 for a prompt chunk that does not,
// several when the step verifies draft tokens.
struct ScheduledSeq {
  Request* request = nullptr;
  int32_t start = 0;
  int32_t num_tokens = 0;
  int32_t num_sample_rows = 0;
  // Of the tokens, the request's draft tokens this step verifies (the last
  // ones; each is also a sampling row, after the row of the token before).
  int32_t num_draft_tokens = 0;
};

struct ScheduledBatch {
  std::vector<ScheduledSeq> seqs;
  int32_t num_tokens = 0;
  int32_t num_prompt_tokens = 0;  // of num_tokens, those of prompt chunks (not decodes or drafts)
  std::vector<Request*> preempted;  // lost their KV this step; back in the waiting queue
  bool empty() const { return seqs.empty(); }
};

// Output of the capacity stage: who holds KV blocks for its next work.
struct CapacityDecision {
  std::vector<Request*> running;    // in priority order, including newly admitted
  std::vector<Request*> admitted;   // subset of running admitted this step
  std::vector<Request*> preempted;  // released their blocks this step
};

}  // namespace deepinfer
