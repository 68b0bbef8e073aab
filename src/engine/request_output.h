// What a step returns to the caller for one request.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "runner/sampler.h"
#include "sched/request.h"

namespace deepinfer {

struct TokenOutput {
  int32_t token = -1;
  float logprob = 0.0f;
  int32_t rank = 0;
  std::vector<TokenLogprob> top;
};

// What one step produced for one request.
struct RequestOutput {
  uint64_t request_id = 0;
  std::vector<TokenOutput> new_tokens;
  std::string new_text;
  bool finished = false;
  FinishReason finish_reason = FinishReason::None;
  std::string stop_reason;  // the matched stop string, if any
  // Set when the engine gave up on this request alone (finished, reason Abort):
  // e.g. the model's logits held no finite value to sample from.
  std::string error;
};

}  // namespace deepinfer
