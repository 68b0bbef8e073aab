// Per-layer expert load statistics for EPLB: token counts per expert for each
// step, kept for the last `window_steps` steps, and a re-placement trigger every
// `interval_steps` steps. Also reports moe_lb of the current placement, for
// export as a metric.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "moe/eplb.h"

namespace deepinfer::moe {

struct EplbSchedule {
  int32_t window_steps = 1000;
  int32_t interval_steps = 10000;
  int32_t redundant_slots_per_rank = 1;

  // The reference's settings: prefill 100-step window, every 1,000 steps, 4
  // redundant slots per GPU; decode 1,000 / 10,000 with 1.
  static EplbSchedule prefill() { return {100, 1000, 4}; }
  static EplbSchedule decode() { return {1000, 10000, 1}; }
  void validate() const;
};

class ExpertLoadStats {
 public:
  ExpertLoadStats(int32_t num_experts, EplbSchedule schedule);

  // Adds one step's token count per expert (size num_experts, each >= 0).
  // Returns true when a re-placement is due after this step (every
  // interval_steps recorded steps).
  bool record_step(std::span<const int64_t> counts);

  int32_t num_experts() const { return num_experts_; }
  const EplbSchedule& schedule() const { return schedule_; }
  int64_t steps_recorded() const { return steps_; }
  // Steps currently in the window: min(steps_recorded, window_steps).
  int32_t window_fill() const { return fill_; }
  bool replacement_due() const { return steps_ > 0 && steps_ % schedule_.interval_steps == 0; }

  // Summed tokens per expert over the window.
  std::vector<double> window_load() const;
  std::span<const int64_t> last_step() const;

  // A placement from the window load with the schedule's redundancy (the
  // caller owns moving the weights); it becomes the current placement.
  const ExpertPlacement& rebalance(const EplbConfig& topology);
  void set_placement(ExpertPlacement placement);
  const std::optional<ExpertPlacement>& placement() const { return placement_; }

  // moe_lb of the current placement over the window and over the last step;
  // 1.0 before any step or placement.
  double window_moe_lb() const;
  double last_step_moe_lb() const;

 private:
  int32_t num_experts_;
  EplbSchedule schedule_;
  std::vector<int64_t> ring_;  // window_steps x num_experts
  std::vector<int64_t> sum_;   // exact per-expert sum of the rows in the window
  int32_t head_ = 0;           // row the next step is written to
  int32_t fill_ = 0;
  int64_t steps_ = 0;
  std::optional<ExpertPlacement> placement_;
};

}  // namespace deepinfer::moe
