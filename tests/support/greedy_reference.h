// Test support for greedy continuations against reference data: run a
// prompt greedily through an Engine, and measure how far it agrees with the
// reference's tokens and where the reference's own top-1/top-2 margin becomes
// a near-tie (beyond which bitwise-different arithmetic may diverge).
#pragma once

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>
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

// Every prompt of a reference's "prompts" (tokens, greedy_tokens,
// greedy_margins) on one engine: the greedy tokens must agree at least up to
// the reference's first near-tie; prints how far each agrees. Then checks the
// engine's pool integrity.
inline void expect_greedy_matches(Engine& engine, const nlohmann::json& prompts, double near_tie,
                                  const std::string& label) {
  for (const auto& p : prompts) {
    const auto expected = p["greedy_tokens"].get<std::vector<int32_t>>();
    const auto margins = p["greedy_margins"].get<std::vector<double>>();
    const auto [got, same, decided] =
        compare_greedy(engine, p["tokens"].get<std::vector<int32_t>>(), expected, margins, near_tie);
    std::printf("[%s] %s: %zu of %zu greedy tokens identical (smallest reference margin %.4f, first near-tie at "
                "step %zu)\n",
                label.c_str(), p["name"].get<std::string>().c_str(), same, expected.size(),
                *std::min_element(margins.begin(), margins.end()), decided);
    ASSERT_EQ(got.size(), expected.size());
    EXPECT_GE(same, decided) << label << "/" << p["name"] << ": differs at step " << same
                             << " where the reference's margin is " << margins[std::min(same, margins.size() - 1)];
  }
  engine.check_integrity();
}

}  // namespace deepinfer::testing
