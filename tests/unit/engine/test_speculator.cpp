// Speculator's use of the speculation switch: the switch guards against host
// costs the per-step verify-length choice cannot see, so it is consulted only
// while speculating steps leave the device idle for a noticeable share of the
// time. A simulated engine: each step produces two tokens when plain and one
// when speculating (speculation loses), 1 ms of device time, and some idle.
// And the dynamic policy under steps padded to their longest sequence.
#include <gtest/gtest.h>

#include <map>
#include <memory>

#include "engine/speculator.h"
#include "sched/request.h"

namespace deepinfer {
namespace {

class NoDrafts final : public spec::Proposer {
 public:
  void start(uint64_t, std::span<const int32_t>) override {}
  void append(uint64_t, std::span<const int32_t>) override {}
  void propose(uint64_t, int32_t, spec::Draft&) override {}
  void finish(uint64_t) override {}
};

struct Simulated {
  int speculating_steps = 0;
  SpecDecodeStats stats;
};

Simulated simulate(double idle_ms, int steps) {
  spec::SpeculativeConfig config;
  config.method = spec::SpecMethod::Ngram;
  config.dynamic = true;
  config.switch_window_steps = 4;
  Speculator s(config, std::make_unique<NoDrafts>());
  Simulated run;
  int64_t tokens = 0;
  double now = 0.0;
  for (int i = 0; i < steps; ++i) {
    s.record_progress(tokens, 0, now, 1, 0.0);
    const bool speculating = s.should_propose();
    run.speculating_steps += speculating ? 1 : 0;
    s.record_step(1, 1.0, idle_ms, speculating);
    tokens += speculating ? 1 : 2;
    now += 1e-3 + idle_ms * 1e-3;
  }
  run.stats = s.stats();
  return run;
}

TEST(Speculator, AnIdleDeviceLetsTheSwitchTurnSpeculationOff) {
  const Simulated r = simulate(/*idle_ms=*/0.5, 2000);
  EXPECT_LT(r.speculating_steps, 2000 / 5);
  EXPECT_EQ(r.stats.unswitched_steps, 0);
  EXPECT_GT(r.stats.windows, 100);
}

TEST(Speculator, ABusyDeviceLeavesTheChoiceToTheVerifyLength) {
  // 1% idle: the switch is not consulted (whatever its window rates say);
  // each step's verify-length choice decides whether to verify drafts.
  const Simulated r = simulate(/*idle_ms=*/0.01, 2000);
  EXPECT_EQ(r.speculating_steps, 2000);
  EXPECT_GT(r.stats.unswitched_steps, 1990);
}

// Five drafts for every request, each with a fixed confidence per request.
class FixedDrafts final : public spec::Proposer {
 public:
  explicit FixedDrafts(std::map<uint64_t, float> confidence) : confidence_(std::move(confidence)) {}
  void start(uint64_t, std::span<const int32_t>) override {}
  void append(uint64_t, std::span<const int32_t>) override {}
  void propose(uint64_t id, int32_t max_tokens, spec::Draft& out) override {
    out.clear();
    for (int32_t i = 0; i < max_tokens; ++i) {
      out.tokens.push_back(7 + i);
      out.confidence.push_back(confidence_.at(id));
    }
  }
  void finish(uint64_t) override {}

 private:
  std::map<uint64_t, float> confidence_;
};

// The verified lengths of a confident and an unconfident request after one
// drafting round on a device where a step takes 10 ms and each query token
// adds 0.5 ms.
std::pair<int32_t, int32_t> verified_lengths(const Speculator::PaddingRule& pads, int32_t* seqs_asked) {
  spec::SpeculativeConfig config;
  config.method = spec::SpecMethod::Ngram;
  config.dynamic = true;
  config.num_speculative_tokens = 5;
  Speculator s(config, std::make_unique<FixedDrafts>(std::map<uint64_t, float>{{1, 0.98f}, {2, 0.05f}}));
  for (int32_t tokens = 1; tokens <= 24; ++tokens) s.record_step(tokens, 10.0 + 0.5 * tokens, -1.0, false);
  if (pads) {
    s.set_padding_rule([&](int32_t seqs, int32_t longest, int64_t tokens) {
      *seqs_asked = seqs;
      return pads(seqs, longest, tokens);
    });
  }
  SamplingParams p;
  p.max_tokens = 64;
  Request a(1, {1, 2, 3, 4}, p, 1), b(2, {5, 6, 7, 8}, p, 2);
  a.token_limit = b.token_limit = 100;
  std::vector<Request*> candidates = {&a, &b};
  s.propose(candidates, /*base_tokens=*/2);
  return {a.num_draft_tokens(), b.num_draft_tokens()};
}

TEST(Speculator, PaddedStepsVerifyUpToTheLongestChoice) {
  int32_t seqs = 0;
  const auto [alone_a, alone_b] = verified_lengths({}, &seqs);
  ASSERT_GT(alone_a, alone_b) << "the policy must trim the unconfident request's drafts for the test to mean anything";
  // Padded to the longest, the trimmed drafts cost nothing: they are verified.
  const auto [padded_a, padded_b] =
      verified_lengths([](int32_t, int32_t, int64_t) { return true; }, &seqs);
  EXPECT_EQ(padded_a, alone_a);
  EXPECT_EQ(padded_b, alone_a);
  EXPECT_EQ(seqs, 2);
  // A runner that would not pad such a step: the policy's choice stands.
  const auto [eager_a, eager_b] = verified_lengths([](int32_t, int32_t, int64_t) { return false; }, &seqs);
  EXPECT_EQ(eager_a, alone_a);
  EXPECT_EQ(eager_b, alone_b);
}

}  // namespace
}  // namespace deepinfer
