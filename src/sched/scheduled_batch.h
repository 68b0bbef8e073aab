// Plain structs passed between the scheduling stages and the model runner.
#pragma once

#include <cstdint>
#include <vector>

namespace deepinfer {

class Request;

// One sequence's share of a step: tokens [start, start + num_tokens) of the
// request's token list are computed; `sample` when the chunk reaches the last
// known token, so the step yields the next token's logits.
struct ScheduledSeq {
  Request* request = nullptr;
  int32_t start = 0;
  int32_t num_tokens = 0;
  bool sample = false;
};

struct ScheduledBatch {
  std::vector<ScheduledSeq> seqs;
  int32_t num_tokens = 0;
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
