// ExpertLoadMonitor: the live side of EPLB in a running engine. It receives
// every completed step's routed-token counts of all MoE layers, keeps one
// ExpertLoadStats per layer, re-places every layer's experts when the schedule
// says so (on one GPU a simulation of `num_ranks` ranks: the placement is
// computed and measured, no weights move), reports moe_lb for export, and can
// record the counts as routing traces that `deepinfer eplb-sim` replays.
#pragma once

#include <cstdint>
#include <fstream>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "moe/expert_load_stats.h"

namespace deepinfer::moe {

struct ExpertLoadMonitorOptions {
  int32_t num_ranks = 0;  // simulated EP size; 0 = no placement or moe_lb (trace only)
  EplbSchedule schedule = EplbSchedule::decode();
  // Non-empty: one trace file per MoE layer, trace_file(trace_path, layer).
  std::string trace_path;
  // The ranks are real (expert parallelism): the engine moves the weights to
  // each new placement. Otherwise the placement is a simulation.
  bool ranks_are_real = false;
};

class ExpertLoadMonitor {
 public:
  // moe_layers: the model layer index of each MoE layer, in forward order
  // (the rows of a step's counts). Opens (truncates) the trace files.
  ExpertLoadMonitor(std::vector<int32_t> moe_layers, int32_t num_experts, ExpertLoadMonitorOptions options);
  ~ExpertLoadMonitor();
  ExpertLoadMonitor(const ExpertLoadMonitor&) = delete;
  ExpertLoadMonitor& operator=(const ExpertLoadMonitor&) = delete;

  // One completed step: counts i32[moe_layers x num_experts], row-major.
  // Appends a line to each trace file; when a re-placement is due, re-places
  // every layer from its window and logs moe_lb before and after.
  void record_step(std::span<const int32_t> counts);

  bool balancing() const { return options_.num_ranks > 0; }
  int64_t steps() const { return steps_; }
  int32_t replacements() const { return replacements_; }
  int32_t num_experts() const { return num_experts_; }
  const std::vector<int32_t>& moe_layers() const { return moe_layers_; }
  const ExpertLoadStats& layer_stats(size_t k) const { return stats_.at(k); }

  // Mean over MoE layers of moe_lb over the window: with the current
  // placement (the contiguous one until the first re-placement), and with
  // the contiguous baseline. 1.0 before any step or when not balancing. Right
  // after a re-placement the current figure is in-sample (the placement was
  // computed from this window); it turns out-of-sample as the window slides.
  double moe_lb() const;
  double moe_lb_contiguous() const;

  // The trace file of model layer `layer`: path without a trailing ".csv",
  // then ".layer<layer>.csv".
  static std::string trace_file(const std::string& path, int32_t layer);

 private:
  double mean_window_lb(bool contiguous) const;

  std::vector<int32_t> moe_layers_;
  int32_t num_experts_;
  ExpertLoadMonitorOptions options_;
  std::vector<ExpertLoadStats> stats_;
  ExpertPlacement contiguous_;
  std::vector<std::unique_ptr<std::ofstream>> traces_;
  std::vector<int64_t> row_;  // one layer's counts widened for ExpertLoadStats
  int64_t steps_ = 0;
  int32_t replacements_ = 0;
};

}  // namespace deepinfer::moe
