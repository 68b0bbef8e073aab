// `deepinfer eplb-sim`: replays a routing trace (CSV file or synthetic) through
// the EPLB placement policies for a list of EP sizes and prints moe_lb before
// balancing, after (this library), with DeepSeek's EPLB, and the offline bound.
#include <cstdio>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "command.h"
#include "core/error.h"
#include "moe/eplb_simulator.h"

namespace deepinfer::cli {
namespace {

using moe::SimulationResult;

int run_eplb_sim(int argc, char** argv) {
  CLI::App app{"Simulate expert-parallel load balancing (EPLB) on a routing trace."};
  app.name("deepinfer eplb-sim");
  std::string trace_path;
  std::string write_trace_path;
  std::string mode = "decode";
  std::vector<int32_t> eps{4, 8, 16, 32, 64, 128, 256};
  int32_t window = 0, interval = 0, redundant = -1;
  int32_t ranks_per_node = 0, groups = 1;
  moe::SyntheticTraceOptions syn;
  app.add_option("--trace", trace_path, "CSV trace: one line per step, tokens per expert (default: synthetic)");
  app.add_option("--write-trace", write_trace_path, "write the trace used (e.g. the synthetic one) as CSV");
  app.add_option("--mode", mode, "schedule defaults: decode (window 1000, every 10000, 1 redundant) or prefill "
                                 "(100, 1000, 4)")
      ->check(CLI::IsMember({"decode", "prefill"}));
  app.add_option("--ep", eps, "EP sizes (ranks) to simulate")->delimiter(',');
  app.add_option("--window", window, "load window in steps (overrides --mode)");
  app.add_option("--interval", interval, "re-placement interval in steps (overrides --mode)");
  app.add_option("--redundant", redundant, "redundant slots per rank (overrides --mode)");
  app.add_option("--ranks-per-node", ranks_per_node, "ranks per node for hierarchical placement (0 = one node)");
  app.add_option("--groups", groups, "expert groups (hierarchical when groups divide across nodes)");
  app.add_option("--experts", syn.num_experts, "synthetic: experts");
  app.add_option("--top-k", syn.top_k, "synthetic: experts per token");
  app.add_option("--tokens", syn.tokens_per_step, "synthetic: tokens per step");
  app.add_option("--steps", syn.num_steps, "synthetic: steps");
  app.add_option("--zipf", syn.zipf_exponent, "synthetic: popularity skew exponent");
  app.add_option("--drift", syn.drift_std, "synthetic: std-dev of log-popularity drift");
  app.add_option("--drift-steps", syn.drift_steps, "synthetic: drift correlation time in steps");
  app.add_option("--step-noise", syn.step_noise, "synthetic: per-step log-rate noise");
  app.add_option("--burst-rate", syn.burst_rate, "synthetic: bursts started per step");
  app.add_option("--burst-factor", syn.burst_factor, "synthetic: popularity multiplier in a burst");
  app.add_option("--burst-steps", syn.burst_steps, "synthetic: burst length in steps");
  app.add_option("--seed", syn.seed, "synthetic: random seed");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }

  moe::EplbSchedule schedule = mode == "prefill" ? moe::EplbSchedule::prefill() : moe::EplbSchedule::decode();
  if (window > 0) schedule.window_steps = window;
  if (interval > 0) schedule.interval_steps = interval;
  if (redundant >= 0) schedule.redundant_slots_per_rank = redundant;
  schedule.validate();

  const moe::RoutingTrace trace = trace_path.empty() ? moe::synthetic_trace(syn) : moe::read_routing_trace(trace_path);
  if (!write_trace_path.empty()) moe::write_routing_trace(trace, write_trace_path);
  std::printf("trace: %s, %d experts, %lld steps; window %d, re-placement every %d steps, %d redundant slot(s)/rank\n",
              trace_path.empty() ? "synthetic" : trace_path.c_str(), trace.num_experts,
              static_cast<long long>(trace.num_steps()), schedule.window_steps, schedule.interval_steps,
              schedule.redundant_slots_per_rank);
  std::printf("moe_lb = max rank load / mean, on the steps after each re-placement; 'interval' = load summed over "
              "each interval, 'step' = mean over steps\n");
  std::printf("| EP | re-placements | before | after | DeepSeek EPLB | offline | fraction of perfect | "
              "step: before | after | DeepSeek | offline | fraction |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (int32_t ep : eps) {
    if (ep < 1 || trace.num_experts % ep != 0) {
      std::printf("| %d | skipped: %d experts do not divide across %d ranks |||||||||||\n", ep, trace.num_experts, ep);
      continue;
    }
    moe::SimulationOptions options;
    options.num_ranks = ep;
    options.schedule = schedule;
    options.ranks_per_node = ranks_per_node > 0 && ep % ranks_per_node == 0 ? ranks_per_node : 0;
    options.num_groups = groups;
    const SimulationResult r = moe::simulate_eplb(trace, options);
    std::printf("| %d | %d | %.3f | %.3f | %.3f | %.3f | %.2f | %.3f | %.3f | %.3f | %.3f | %.2f |\n", ep,
                r.replacements, r.contiguous.interval, r.policy.interval, r.deepseek.interval, r.offline.interval,
                SimulationResult::fraction_of_perfect(r.contiguous.interval, r.policy.interval, r.offline.interval),
                r.contiguous.step, r.policy.step, r.deepseek.step, r.offline.step,
                SimulationResult::fraction_of_perfect(r.contiguous.step, r.policy.step, r.offline.step));
  }
  return 0;
}

}  // namespace

DEEPINFER_COMMAND("eplb-sim", "simulate expert-parallel load balancing on a routing trace", run_eplb_sim);

}  // namespace deepinfer::cli
