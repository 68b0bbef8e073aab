// Test support for greedy continuations against reference data: run a
// prompt greedily through an Engine, and measure how far it agrees with the
// reference's tokens and where the reference's own top-1/top-2 margin becomes
// a near-tie (beyond which bitwise-different arithmetic may diverge).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "engine/engine.h"

namespace deepinfer::testing {

struct GreedyComparison {
  std::vector<int32_t> tokens;  // what the engine generated
  size_t same = 0;              // leading tokens equal to the reference
  size_t decided = 0;           // reference steps before its first near-tie
};

// Greedy decoding of exactly max_tokens tokens (EOS ignored).
inline SamplingParams greedy_params(int32_t max_tokens) {
  SamplingParams p;
  p.temperature = 0;
  p.ignore_eos = true;
  p.max_tokens = max_tokens;
  return p;
}

inline GreedyComparison compare_greedy(Engine& engine, const std::vector<int32_t>& prompt,
                                       const std::vector<int32_t>& expected, const std::vector<double>& margins,
                                       double near_tie) {
  engine.add_request(prompt, greedy_params(static_cast<int32_t>(expected.size())));
  GreedyComparison r;
  while (engine.has_unfinished()) {
    for (auto& o : engine.step()) {
      for (auto& t : o.new_tokens) r.tokens.push_back(t.token);
    }
  }
  while (r.decided < margins.size() && margins[r.decided] >= near_tie) ++r.decided;
  while (r.same < r.tokens.size() && r.same < expected.size() && r.tokens[r.same] == expected[r.same]) ++r.same;
  return r;
}

}  // namespace deepinfer::testing
