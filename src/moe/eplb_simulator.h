// Replays a routing trace (tokens per expert per step, one MoE layer) through
// EPLB placement policies and measures moe_lb on the steps after each
// re-placement: a placement is computed from the past window and evaluated on
// the following interval, never on the load it was computed from.
//
// Trace file format (CSV): one line per step, each line the non-negative token
// count of every expert, comma separated, the same number on every line. Blank
// lines and lines starting with '#' are ignored.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "moe/expert_load_stats.h"

namespace deepinfer::moe {

struct RoutingTrace {
  int32_t num_experts = 0;
  std::vector<int64_t> counts;  // num_steps x num_experts, row major

  int64_t num_steps() const { return num_experts > 0 ? static_cast<int64_t>(counts.size()) / num_experts : 0; }
  std::span<const int64_t> step(int64_t s) const;
};

RoutingTrace read_routing_trace(const std::string& path);
void write_routing_trace(const RoutingTrace& trace, const std::string& path);

// A synthetic trace with the skew seen in MoE routing: Zipf-like expert
// popularity (hot experts scattered over the expert ids), slow drift of each
// expert's popularity, occasional bursts where one expert gets much hotter for a
// while, and per-step noise from batch composition on top of sampling noise.
struct SyntheticTraceOptions {
  int32_t num_experts = 256;
  int32_t top_k = 8;
  int32_t tokens_per_step = 4096;
  int64_t num_steps = 30000;
  double zipf_exponent = 0.5;    // popularity of the i-th hottest expert ~ 1 / i^s
  double drift_std = 0.1;        // stationary std-dev of the log-popularity drift
  double drift_steps = 50000;    // correlation time of the drift, in steps
  double step_noise = 0.1;       // std-dev of per-step log-rate noise per expert
  double burst_rate = 1e-4;      // bursts started per step
  double burst_factor = 2.0;     // popularity multiplier during a burst
  int32_t burst_steps = 1000;
  uint64_t seed = 1;

  void validate() const;
};

RoutingTrace synthetic_trace(const SyntheticTraceOptions& options);

struct SimulationOptions {
  int32_t num_ranks = 64;
  EplbSchedule schedule = EplbSchedule::decode();
  // Topology for hierarchical placement (0 = all ranks on one node).
  int32_t ranks_per_node = 0;
  int32_t num_groups = 1;
};

// moe_lb of one policy: `interval` over the load summed across each evaluated
// interval (what a placement can balance), `step` averaged over every evaluated
// step (what each step waits for, including per-step noise no placement fixes).
struct LbFigures {
  double interval = 0.0;
  double step = 0.0;
  double interval_worst = 0.0;  // worst evaluated interval
};

struct SimulationResult {
  int32_t num_ranks = 0;
  int32_t replacements = 0;
  int64_t evaluated_steps = 0;
  LbFigures contiguous;  // experts placed contiguously, no redundancy
  LbFigures policy;      // place_experts (this library)
  LbFigures deepseek;    // deepseek_eplb_placement on the same windows
  LbFigures offline;     // place_experts on the evaluated interval itself

  // Share of the achievable reduction (contiguous -> offline) the policy reaches.
  static double fraction_of_perfect(double before, double after, double perfect);
};

SimulationResult simulate_eplb(const RoutingTrace& trace, const SimulationOptions& options);

}  // namespace deepinfer::moe
