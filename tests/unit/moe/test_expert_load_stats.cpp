#include "moe/expert_load_stats.h"

#include <gtest/gtest.h>

#include "core/error.h"

namespace deepinfer::moe {
namespace {

TEST(ExpertLoadStats, ReferenceDefaults) {
  EXPECT_EQ(EplbSchedule::prefill().window_steps, 100);
  EXPECT_EQ(EplbSchedule::prefill().interval_steps, 1000);
  EXPECT_EQ(EplbSchedule::prefill().redundant_slots_per_rank, 4);
  EXPECT_EQ(EplbSchedule::decode().window_steps, 1000);
  EXPECT_EQ(EplbSchedule::decode().interval_steps, 10000);
  EXPECT_EQ(EplbSchedule::decode().redundant_slots_per_rank, 1);
}

TEST(ExpertLoadStats, SlidingWindowKeepsLastSteps) {
  ExpertLoadStats stats(2, {3, 100, 0});
  EXPECT_EQ(stats.window_load(), (std::vector<double>{0, 0}));
  EXPECT_THROW(stats.last_step(), Error);
  for (int64_t s = 1; s <= 5; ++s) {
    const std::vector<int64_t> counts{s, 10 * s};
    stats.record_step(counts);
    EXPECT_EQ(stats.last_step()[1], 10 * s);
  }
  EXPECT_EQ(stats.window_fill(), 3);
  EXPECT_EQ(stats.steps_recorded(), 5);
  EXPECT_EQ(stats.window_load(), (std::vector<double>{3 + 4 + 5, 30 + 40 + 50}));
  // Many more steps: the exact running sum still matches the last three.
  for (int64_t s = 6; s <= 1000; ++s) stats.record_step(std::vector<int64_t>{s, 0});
  EXPECT_EQ(stats.window_load(), (std::vector<double>{998 + 999 + 1000, 0}));
}

TEST(ExpertLoadStats, TriggerEveryIntervalSteps) {
  ExpertLoadStats stats(4, {2, 4, 1});
  std::vector<int64_t> due_at;
  for (int64_t s = 1; s <= 12; ++s) {
    if (stats.record_step(std::vector<int64_t>{1, 1, 1, 1})) due_at.push_back(s);
    EXPECT_EQ(stats.replacement_due(), s % 4 == 0);
  }
  EXPECT_EQ(due_at, (std::vector<int64_t>{4, 8, 12}));
}

TEST(ExpertLoadStats, RebalanceAndMoeLb) {
  ExpertLoadStats stats(4, {2, 10, 1});
  EXPECT_DOUBLE_EQ(stats.window_moe_lb(), 1.0);  // nothing recorded, no placement
  stats.record_step(std::vector<int64_t>{30, 10, 10, 10});
  stats.record_step(std::vector<int64_t>{30, 10, 10, 10});
  stats.set_placement(contiguous_placement(4, 2));
  EXPECT_DOUBLE_EQ(stats.window_moe_lb(), 80.0 / 60.0);
  EXPECT_DOUBLE_EQ(stats.last_step_moe_lb(), 40.0 / 30.0);
  const ExpertPlacement& p = stats.rebalance(EplbConfig{2, 0, 1, 1});
  EXPECT_EQ(p.slots_per_rank(), 3);     // 2 experts per rank + the schedule's 1 redundant slot
  EXPECT_EQ(p.replica_count(0), 2);     // the hot expert is on both ranks
  EXPECT_NEAR(stats.window_moe_lb(), 1.0, 1e-12);
  EXPECT_THROW(stats.set_placement(contiguous_placement(8, 2)), Error);
}

TEST(ExpertLoadStats, InvalidInputThrows) {
  EXPECT_THROW(ExpertLoadStats(0, EplbSchedule::decode()), Error);
  EXPECT_THROW(ExpertLoadStats(4, {0, 10, 1}), Error);
  EXPECT_THROW(ExpertLoadStats(4, {10, 0, 1}), Error);
  EXPECT_THROW(ExpertLoadStats(4, {10, 10, -1}), Error);
  ExpertLoadStats stats(4, EplbSchedule::prefill());
  EXPECT_THROW(stats.record_step(std::vector<int64_t>{1, 2, 3}), Error);
  EXPECT_THROW(stats.record_step(std::vector<int64_t>{1, 2, 3, -4}), Error);
  EXPECT_THROW(stats.record_step(std::vector<int64_t>{1, 2, 3, int64_t{1} << 62}), Error);
  EXPECT_EQ(stats.steps_recorded(), 0);
}

}  // namespace
}  // namespace deepinfer::moe
