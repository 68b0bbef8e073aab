// Speculator's use of the speculation switch: the switch guards against host
// costs the per-step verify-length choice cannot see, so it is consulted only
// while speculating steps leave the device idle for a noticeable share of the
// time. A simulated engine: each step produces two tokens when plain and one
// when speculating (speculation loses), 1 ms of device time, and some idle.
#include <gtest/gtest.h>

#include <memory>

#include "engine/speculator.h"

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

}  // namespace
}  // namespace deepinfer
