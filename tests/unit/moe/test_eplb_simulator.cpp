#include "moe/eplb_simulator.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <numeric>

#include "core/error.h"

namespace deepinfer::moe {
namespace {

std::string temp_file(const std::string& name, const std::string& text) {
  const std::string path = (std::filesystem::temp_directory_path() / ("deepinfer_eplb_" + name)).string();
  std::ofstream(path) << text;
  return path;
}

TEST(EplbSimulator, TraceCsvRoundTrip) {
  SyntheticTraceOptions o;
  o.num_experts = 16;
  o.top_k = 2;
  o.tokens_per_step = 100;
  o.num_steps = 50;
  const RoutingTrace trace = synthetic_trace(o);
  const std::string path = temp_file("roundtrip.csv", "");
  write_routing_trace(trace, path);
  const RoutingTrace back = read_routing_trace(path);
  std::filesystem::remove(path);
  EXPECT_EQ(back.num_experts, 16);
  EXPECT_EQ(back.num_steps(), 50);
  EXPECT_EQ(back.counts, trace.counts);
}

TEST(EplbSimulator, ReadsCommentsAndRejectsMalformedTraces) {
  const std::string ok = temp_file("ok.csv", "# two experts\n1, 2\n\n3,4\r\n");
  const RoutingTrace t = read_routing_trace(ok);
  EXPECT_EQ(t.counts, (std::vector<int64_t>{1, 2, 3, 4}));
  std::filesystem::remove(ok);
  for (const auto& [name, text] : std::vector<std::pair<std::string, std::string>>{
           {"ragged", "1,2\n3\n"}, {"negative", "1,-2\n"}, {"text", "1,x\n"}, {"empty_field", "1,,2\n"},
           {"trailing", "1,2x\n"}, {"huge", "1,99999999999999999999\n"}, {"nothing", "# only a comment\n"}}) {
    const std::string path = temp_file(name + ".csv", text);
    EXPECT_THROW(read_routing_trace(path), Error) << name;
    std::filesystem::remove(path);
  }
  EXPECT_THROW(read_routing_trace("/nonexistent/trace.csv"), Error);
}

TEST(EplbSimulator, SyntheticTraceIsDeterministicTopKAndSkewed) {
  SyntheticTraceOptions o;
  o.num_steps = 200;
  const RoutingTrace a = synthetic_trace(o);
  const RoutingTrace b = synthetic_trace(o);
  EXPECT_EQ(a.counts, b.counts);
  o.seed = 2;
  EXPECT_NE(synthetic_trace(o).counts, a.counts);
  // Each token picks top_k experts: about tokens * k assignments per step.
  const double total = std::accumulate(a.counts.begin(), a.counts.end(), 0.0);
  EXPECT_NEAR(total / 200, 4096.0 * 8, 4096.0 * 8 * 0.02);
  std::vector<double> per_expert(256, 0.0);
  for (int64_t s = 0; s < 200; ++s) {
    for (int32_t e = 0; e < 256; ++e) {
      EXPECT_LE(a.step(s)[e], 4096);
      per_expert[e] += static_cast<double>(a.step(s)[e]);
    }
  }
  const double hottest = *std::max_element(per_expert.begin(), per_expert.end());
  EXPECT_GT(hottest / (total / 256), 4.0);
  o.top_k = 0;
  EXPECT_THROW(synthetic_trace(o), Error);
}

// Issue 8's target: skewed trace, EP 64, 1 redundant slot per GPU (the decode
// schedule: window 1,000 steps, re-placement every 10,000), moe_lb on the
// steps after each re-placement.
TEST(EplbSimulator, Ep64OneRedundantSlotReachesTarget) {
  SyntheticTraceOptions o;
  o.num_steps = 30000;
  const RoutingTrace trace = synthetic_trace(o);
  SimulationOptions s;
  s.num_ranks = 64;
  s.schedule = EplbSchedule::decode();
  const SimulationResult r = simulate_eplb(trace, s);
  std::printf("EP64 +1 slot/GPU, %d re-placements, %lld steps evaluated: moe_lb before %.3f, after %.3f, "
              "DeepSeek EPLB %.3f, offline %.3f (per step: %.3f / %.3f / %.3f / %.3f)\n",
              r.replacements, static_cast<long long>(r.evaluated_steps), r.contiguous.interval, r.policy.interval,
              r.deepseek.interval, r.offline.interval, r.contiguous.step, r.policy.step, r.deepseek.step,
              r.offline.step);
  EXPECT_EQ(r.replacements, 2);
  EXPECT_EQ(r.evaluated_steps, 20000);
  EXPECT_GT(r.contiguous.interval, 2.0);
  EXPECT_LE(r.policy.interval, 1.05);
  EXPECT_LE(r.policy.interval_worst, 1.06);
  EXPECT_LE(r.deepseek.interval, 1.06);
  EXPECT_LE(r.offline.interval, r.policy.interval);
  EXPECT_GT(SimulationResult::fraction_of_perfect(r.contiguous.interval, r.policy.interval, r.offline.interval), 0.95);
  // Per-step figures include sampling noise that no placement removes.
  EXPECT_GE(r.policy.step, r.policy.interval);
  EXPECT_LT(r.policy.step, r.contiguous.step);
}

TEST(EplbSimulator, RejectsTooShortTraceAndBadTopology) {
  SyntheticTraceOptions o;
  o.num_experts = 32;
  o.top_k = 4;
  o.num_steps = 100;
  const RoutingTrace trace = synthetic_trace(o);
  SimulationOptions s;
  s.num_ranks = 8;
  s.schedule = {10, 200, 1};
  EXPECT_THROW(simulate_eplb(trace, s), Error);
  s.schedule = {10, 20, 1};
  EXPECT_EQ(simulate_eplb(trace, s).replacements, 4);
  s.ranks_per_node = 3;
  EXPECT_THROW(simulate_eplb(trace, s), Error);
  s.ranks_per_node = 0;
  s.num_ranks = 5;
  EXPECT_THROW(simulate_eplb(trace, s), Error);
}

}  // namespace
}  // namespace deepinfer::moe
