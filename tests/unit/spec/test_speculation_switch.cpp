// SpeculationSwitch against a simulated engine whose output rate depends on
// the mode and the batch: where speculation loses (a saturated server), the
// switch must give up at most a few percent to re-checking it; where it wins
// (batch 1), it must speculate nearly all the time; a change of load must be
// followed without relearning from scratch; and noisy rates must not make it
// flap away from a clear winner.
#include <gtest/gtest.h>

#include <cmath>

#include "core/error.h"
#include "spec/speculation_switch.h"

namespace deepinfer::spec {
namespace {

struct World {
  double plain_rate = 1000.0;        // output tokens/s without speculation
  double speculative_rate = 930.0;   // ... with
  double jitter = 0.0;               // relative, alternating sign per step
};

struct Outcome {
  double tokens = 0.0;       // produced
  double seconds = 0.0;
  int speculative_steps = 0;
  int steps = 0;
};

// Steps of 10 ms; each produces the world's rate for the switch's mode.
Outcome simulate(SpeculationSwitch& sw, const World& w, int steps, int32_t running, double& clock, double& tokens) {
  Outcome r;
  for (int i = 0; i < steps; ++i) {
    const double rate = sw.speculating() ? w.speculative_rate : w.plain_rate;
    const double noise = 1.0 + (i % 2 == 0 ? w.jitter : -w.jitter);
    const double produced = rate * 0.01 * noise;
    r.speculative_steps += sw.speculating() ? 1 : 0;
    clock += 0.01;
    tokens += produced;
    r.tokens += produced;
    r.seconds += 0.01;
    ++r.steps;
    sw.record_step(static_cast<int64_t>(std::floor(tokens)), 0, clock, running);
  }
  return r;
}

TEST(SpeculationSwitch, SaturatedServerLosesAtMostAFewPercent) {
  for (double spec_rate : {930.0, 720.0, 430.0}) {
    SpeculationSwitch sw;
    double clock = 0.0, tokens = 0.0;
    const World w{1000.0, spec_rate, 0.02};
    const Outcome r = simulate(sw, w, 24 * 300, 256, clock, tokens);
    const double achieved = r.tokens / r.seconds;
    EXPECT_GT(achieved, 0.97 * w.plain_rate) << "speculation at " << spec_rate / 1000.0 << "x";
    EXPECT_LT(r.speculative_steps, r.steps / 20) << spec_rate;
    EXPECT_EQ(sw.explore_interval(256), 128) << "each re-check lost: the interval grew to its bound";
  }
}

TEST(SpeculationSwitch, SpeculatesWhereItPaysAndFollowsTheLoad) {
  SpeculationSwitch sw;
  double clock = 0.0, tokens = 0.0;
  // Batch 1: speculation 1.5x.
  Outcome r = simulate(sw, World{100.0, 150.0, 0.02}, 24 * 100, 1, clock, tokens);
  EXPECT_GT(r.speculative_steps, r.steps * 9 / 10);
  // The server fills up: speculation now loses there.
  r = simulate(sw, World{1000.0, 800.0, 0.02}, 24 * 200, 200, clock, tokens);
  EXPECT_LT(r.speculative_steps, r.steps / 10);
  EXPECT_GT(r.tokens / r.seconds, 0.97 * 1000.0);
  // Back to one request: the batch-1 bucket still knows speculation wins.
  r = simulate(sw, World{100.0, 150.0, 0.02}, 24 * 20, 1, clock, tokens);
  EXPECT_GT(r.speculative_steps, r.steps * 8 / 10);
  EXPECT_GT(sw.speculative_rate(1), sw.plain_rate(1));
  EXPECT_LT(sw.speculative_rate(200), sw.plain_rate(200));
}

// Batch 1, a request whose first stretch gives the proposer nothing to
// draft (speculation a hair slower than plain decoding: the probes give up
// pipelining), then copies spans of its input (speculation 2x). Within the
// margin speculation stays on, so the copied stretch is not spent plain.
TEST(SpeculationSwitch, AStretchWithoutDraftsDoesNotTurnSpeculationOff) {
  SpeculationSwitch sw;
  double clock = 0.0, tokens = 0.0;
  Outcome r = simulate(sw, World{1000.0, 985.0, 0.0}, 24 * 40, 1, clock, tokens);
  EXPECT_GT(r.speculative_steps, r.steps * 9 / 10) << "only the first plain window and re-checks are plain";
  r = simulate(sw, World{1000.0, 2000.0, 0.0}, 24 * 40, 1, clock, tokens);
  EXPECT_GT(r.speculative_steps, r.steps * 9 / 10);
  // Beyond the margin plain decoding wins as before.
  SpeculationSwitch other;
  r = simulate(other, World{1000.0, 950.0, 0.0}, 24 * 100, 1, clock, tokens);
  EXPECT_LT(r.speculative_steps, r.steps / 10);
  EXPECT_THROW(SpeculationSwitch(SwitchConfig{24, 8, 128, 0.5, -0.1}), Error);
}

TEST(SpeculationSwitch, ConditionsThatChangeAreNoticedByReChecks) {
  SpeculationSwitch sw;
  double clock = 0.0, tokens = 0.0;
  simulate(sw, World{1000.0, 900.0, 0.0}, 24 * 100, 64, clock, tokens);
  EXPECT_LT(sw.speculative_rate(64), sw.plain_rate(64));
  // The workload becomes input-grounded at the same batch size: speculation
  // now wins, and a re-check finds it within the grown interval.
  const Outcome r = simulate(sw, World{1000.0, 1500.0, 0.0}, 24 * 400, 64, clock, tokens);
  EXPECT_GT(sw.speculative_rate(64), sw.plain_rate(64));
  EXPECT_GT(r.speculative_steps, r.steps / 2);
}

TEST(SpeculationSwitch, WindowsWithoutOutputsOrMostlyPromptsTeachNothing) {
  SpeculationSwitch sw;
  double clock = 0.0;
  for (int i = 0; i < 24 * 10; ++i) {
    clock += 0.01;
    sw.record_step(0, 100 * i, clock, 8);  // prefill only: no tokens yet
  }
  // A burst of prompts with a few outputs: more than kPrefillRatio prompt
  // tokens per output.
  for (int i = 0; i < 24 * 10; ++i) {
    clock += 0.01;
    sw.record_step(i, 50000 + 100 * i, clock, 8);
  }
  EXPECT_EQ(sw.speculative_rate(8), 0.0);
  EXPECT_EQ(sw.plain_rate(8), 0.0);
  EXPECT_TRUE(sw.speculating());
  // Decoding with a few prompt tokens alongside counts.
  for (int i = 0; i < 24 * 3; ++i) {
    clock += 0.01;
    sw.record_step(1000 + 8 * i, 80000 + i, clock, 8);
  }
  EXPECT_GT(sw.speculative_rate(8), 0.0);
  EXPECT_GT(sw.plain_rate(8), 0.0);
  EXPECT_THROW(SpeculationSwitch(SwitchConfig{0, 8, 128, 0.5}), Error);
  // A window with a graph capture counts without the capture's time: 24
  // steps of 10 ms and 10 tokens each, one of which also captured for 50 ms.
  SpeculationSwitch fresh;
  for (int i = 0; i <= 24; ++i) {
    clock += 0.01 + (i == 5 ? 0.05 : 0.0);
    fresh.record_step(10 * i, 0, clock, 8, /*one_time_s=*/i == 5 ? 0.05 : 0.0);
  }
  EXPECT_NEAR(fresh.speculative_rate(8), 1000.0, 1.0);
  EXPECT_FALSE(fresh.speculating());  // plain has no rate yet: measured next
}

// Batch 1 with a speculation that doubles the rate but captures a graph in
// every window it speculates (verify lengths and context buckets keep making
// new shapes; 0.5 s of capture against the window's 0.24 s of steps): the
// capture must not count, or speculation would look 3x slower than it is and
// plain decoding would win for whole exploration intervals.
TEST(SpeculationSwitch, CaptureTimeIsNotChargedToTheModeThatCaptured) {
  SpeculationSwitch sw;
  double clock = 0.0, tokens = 0.0;
  int steps = 0, speculative = 0;
  for (int window = 0; window < 60; ++window) {
    for (int i = 0; i < SwitchConfig{}.window_steps; ++i, ++steps) {
      const bool spec = sw.speculating();
      speculative += spec ? 1 : 0;
      double capture = 0.0;
      if (spec && i == 3) {
        capture = 0.5;
        clock += capture;
      }
      clock += 0.01;
      tokens += (spec ? 2000.0 : 1000.0) * 0.01;
      sw.record_step(static_cast<int64_t>(tokens), 0, clock, 1, capture);
    }
  }
  EXPECT_NEAR(sw.speculative_rate(1), 2000.0, 100.0);
  EXPECT_NEAR(sw.plain_rate(1), 1000.0, 50.0);
  EXPECT_GT(speculative, steps * 8 / 10) << speculative << " of " << steps << " steps speculated";
}

// 16 requests where speculation doubles the rate, then the batch drains as
// requests finish at different steps: 12, 6, 3, 1 running, three windows
// each. Each smaller bucket takes the 16-request bucket's verdict instead of
// spending a window on plain decoding; a later re-check measures it.
TEST(SpeculationSwitch, ADrainingBatchKeepsTheLargerBatchesVerdict) {
  SpeculationSwitch sw;
  double clock = 0.0, tokens = 0.0;
  const World doubled{1000.0, 2000.0, 0.0};
  simulate(sw, doubled, 24 * 12, 16, clock, tokens);
  EXPECT_GT(sw.plain_rate(16), 0.0);
  EXPECT_FALSE(sw.plain_rate_estimated(16));
  for (const int32_t running : {12, 6, 3, 1}) {
    const Outcome r = simulate(sw, doubled, 24 * 3, running, clock, tokens);
    EXPECT_EQ(r.speculative_steps, r.steps) << running << " running: no plain window";
    EXPECT_TRUE(sw.plain_rate_estimated(running)) << running;
    EXPECT_NEAR(sw.plain_rate(running) / sw.speculative_rate(running), 0.5, 0.05) << running;
  }
  // Staying at 3 requests: the re-check measures plain decoding, whose rate
  // (here 1,500 tokens/s, not the estimated 1,000) replaces the estimate.
  simulate(sw, World{1500.0, 2000.0, 0.0}, 24 * 12, 3, clock, tokens);
  EXPECT_FALSE(sw.plain_rate_estimated(3));
  EXPECT_NEAR(sw.plain_rate(3), 1500.0, 20.0);
}

// Where speculation doubles the rate, a short run spends on plain decoding
// only its first measurement and one re-check, each a plain window of a third
// of a speculating window's steps.
TEST(SpeculationSwitch, PlainWindowsAreShort) {
  SpeculationSwitch sw;
  double clock = 0.0, tokens = 0.0;
  const SwitchConfig config;
  ASSERT_LT(config.plain_window_steps, config.window_steps);
  const Outcome r = simulate(sw, World{1000.0, 2000.0, 0.0}, config.window_steps * 10, 16, clock, tokens);
  EXPECT_EQ(r.steps - r.speculative_steps, 2 * config.plain_window_steps);
  EXPECT_NEAR(sw.plain_rate(16), 1000.0, 20.0);
  EXPECT_THROW(SpeculationSwitch(SwitchConfig{24, 8, 128, 0.5, 0.03, 0}), Error);
}

// Where the larger batch found plain decoding winning, a smaller batch
// measures both modes itself (speculation may well pay there).
TEST(SpeculationSwitch, APlainVerdictIsNotPassedDown) {
  SpeculationSwitch sw;
  double clock = 0.0, tokens = 0.0;
  simulate(sw, World{1000.0, 800.0, 0.0}, 24 * 12, 200, clock, tokens);
  EXPECT_LT(sw.speculative_rate(200), sw.plain_rate(200));
  const Outcome r = simulate(sw, World{500.0, 900.0, 0.0}, 24 * 3, 40, clock, tokens);
  // Speculation first, then one plain window measured, then speculation (the
  // first step still closes the 200-request bucket's last, plain, window).
  const int plain_window = SwitchConfig{}.plain_window_steps;
  EXPECT_GE(r.steps - r.speculative_steps, plain_window);
  EXPECT_LE(r.steps - r.speculative_steps, plain_window + 1);
  EXPECT_FALSE(sw.plain_rate_estimated(40));
  EXPECT_GT(sw.speculative_rate(40), sw.plain_rate(40));
}

}  // namespace
}  // namespace deepinfer::spec
