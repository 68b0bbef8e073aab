// What a speculative proposer hands the engine for one sequence: draft tokens
// that would follow its last token, each with the proposer's estimate that it
// is accepted given that every draft token before it was (the planner weighs
// these against the measured cost of verifying more tokens).
#pragma once

#include <cstdint>
#include <vector>

namespace deepinfer::spec {

struct Draft {
  std::vector<int32_t> tokens;
  std::vector<float> confidence;  // one per token, in (0, 1)

  void clear() {
    tokens.clear();
    confidence.clear();
  }
  int32_t size() const { return static_cast<int32_t>(tokens.size()); }
};

}  // namespace deepinfer::spec
