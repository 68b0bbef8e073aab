#include "moe/expert_load_monitor.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <functional>

#include "core/error.h"
#include "moe/eplb_simulator.h"
#include "../../support/error_message.h"

namespace deepinfer::moe {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

using deepinfer::testing::error_of;

// Two MoE layers (model layers 1 and 3) of 8 experts; layer 1 is skewed
// towards experts 0-1 (both on rank 0 when contiguous), layer 3 is uniform.
std::vector<int32_t> step_counts(int32_t s) {
  std::vector<int32_t> c(16);
  for (int e = 0; e < 8; ++e) {
    c[e] = e < 2 ? 40 + s : 4;
    c[8 + e] = 10;
  }
  return c;
}

TEST(ExpertLoadMonitor, RebalancesOnScheduleAndReportsMoeLb) {
  ExpertLoadMonitorOptions o;
  o.num_ranks = 4;
  o.schedule = {4, 5, 1};
  ExpertLoadMonitor m({1, 3}, 8, o);
  EXPECT_TRUE(m.balancing());
  EXPECT_EQ(m.moe_lb(), 1.0);
  for (int32_t s = 1; s <= 4; ++s) m.record_step(step_counts(s));
  EXPECT_EQ(m.replacements(), 0);
  // Before any re-placement the current placement is the contiguous one.
  EXPECT_DOUBLE_EQ(m.moe_lb(), m.moe_lb_contiguous());
  // Layer 1's window: experts 0-1 hold 2 * (4 * 40 + 10) = 340 of 340 + 6 * 16 = 436
  // tokens; rank 0 carries 340 against a mean of 109. Layer 3 is perfect.
  EXPECT_NEAR(m.moe_lb_contiguous(), (340.0 / 109.0 + 1.0) / 2.0, 1e-12);
  m.record_step(step_counts(5));
  EXPECT_EQ(m.replacements(), 1);
  EXPECT_LT(m.moe_lb(), m.moe_lb_contiguous() - 0.5);
  EXPECT_GE(m.moe_lb(), 1.0);
  EXPECT_TRUE(m.layer_stats(0).placement().has_value());
  EXPECT_EQ(m.layer_stats(0).placement()->slots_per_rank(), 3);  // 8 / 4 + 1 redundant
  for (int32_t s = 6; s <= 10; ++s) m.record_step(step_counts(s));
  EXPECT_EQ(m.replacements(), 2);
  EXPECT_EQ(m.steps(), 10);
}

TEST(ExpertLoadMonitor, WritesOneTracePerLayerThatTheSimulatorReads) {
  const fs::path dir = fs::temp_directory_path() / ("deepinfer_monitor_" + std::to_string(getpid()));
  fs::create_directories(dir);
  ExpertLoadMonitorOptions o;
  o.trace_path = (dir / "trace.csv").string();
  EXPECT_EQ(ExpertLoadMonitor::trace_file(o.trace_path, 3), (dir / "trace.layer3.csv").string());
  EXPECT_EQ(ExpertLoadMonitor::trace_file("run", 0), "run.layer0.csv");
  {
    ExpertLoadMonitor m({1, 3}, 8, o);  // trace only: no placement, moe_lb stays 1
    EXPECT_FALSE(m.balancing());
    for (int32_t s = 1; s <= 6; ++s) m.record_step(step_counts(s));
    EXPECT_EQ(m.moe_lb(), 1.0);
  }
  for (int layer : {1, 3}) {
    const RoutingTrace t = read_routing_trace(ExpertLoadMonitor::trace_file(o.trace_path, layer));
    ASSERT_EQ(t.num_experts, 8);
    ASSERT_EQ(t.num_steps(), 6);
    for (int32_t s = 1; s <= 6; ++s) {
      const std::vector<int32_t> c = step_counts(s);
      const size_t base = layer == 1 ? 0 : 8;
      for (size_t e = 0; e < 8; ++e) EXPECT_EQ(t.step(s - 1)[e], c[base + e]);
    }
    SimulationOptions so;
    so.num_ranks = 2;
    so.schedule = {2, 2, 0};
    EXPECT_EQ(simulate_eplb(t, so).replacements, 2);  // re-placements after steps 2 and 4 (6 has nothing after it)
  }
  fs::remove_all(dir);
}

TEST(ExpertLoadMonitor, RejectsBadSettingsAndCounts) {
  ExpertLoadMonitorOptions o;
  o.num_ranks = 3;
  EXPECT_THAT(error_of([&] { ExpertLoadMonitor({0}, 8, o); }), HasSubstr("--eplb-ep-size 3 must divide the model's 8"));
  o.num_ranks = 2;
  o.schedule.window_steps = 0;
  EXPECT_THAT(error_of([&] { ExpertLoadMonitor({0}, 8, o); }), HasSubstr("window of 0 steps"));
  o.schedule = EplbSchedule::decode();
  EXPECT_THAT(error_of([&] { ExpertLoadMonitor({}, 8, o); }), HasSubstr("at least one MoE layer"));
  ExpertLoadMonitor m({0, 1}, 8, o);
  EXPECT_THAT(error_of([&] { m.record_step(std::vector<int32_t>(8, 1)); }), HasSubstr("8 counts for 2 layers x 8"));
  std::vector<int32_t> negative(16, 1);
  negative[3] = -1;
  EXPECT_THAT(error_of([&] { m.record_step(negative); }), HasSubstr("negative count -1 (MoE layer 0, expert 3)"));
  EXPECT_EQ(m.steps(), 0);
  o.trace_path = "/nonexistent-dir/trace.csv";
  EXPECT_THAT(error_of([&] { ExpertLoadMonitor({0}, 8, o); }), HasSubstr("cannot write routing trace"));
}

}  // namespace
}  // namespace deepinfer::moe
