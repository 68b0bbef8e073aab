#include "moe/expert_load_stats.h"

#include <limits>

#include "core/error.h"

namespace deepinfer::moe {

void EplbSchedule::validate() const {
  DI_CHECK(window_steps >= 1 && window_steps <= (1 << 20), "EPLB schedule: window of {} steps (valid: 1..{})",
           window_steps, 1 << 20);
  DI_CHECK(interval_steps >= 1, "EPLB schedule: re-placement interval must be >= 1 step, got {}", interval_steps);
  DI_CHECK(redundant_slots_per_rank >= 0, "EPLB schedule: redundant slots per rank must be >= 0, got {}",
           redundant_slots_per_rank);
}

ExpertLoadStats::ExpertLoadStats(int32_t num_experts, EplbSchedule schedule)
    : num_experts_(num_experts), schedule_(schedule) {
  schedule_.validate();
  DI_CHECK(num_experts >= 1 && num_experts <= (1 << 16), "ExpertLoadStats: {} experts (valid: 1..{})", num_experts,
           1 << 16);
  DI_CHECK(static_cast<int64_t>(num_experts) * schedule_.window_steps <= (int64_t{1} << 28),
           "ExpertLoadStats: window of {} steps x {} experts is too large", schedule_.window_steps, num_experts);
  ring_.assign(static_cast<size_t>(num_experts) * schedule_.window_steps, 0);
  sum_.assign(num_experts, 0);
}

bool ExpertLoadStats::record_step(std::span<const int64_t> counts) {
  DI_CHECK(counts.size() == static_cast<size_t>(num_experts_), "ExpertLoadStats: step has {} counts, expected {}",
           counts.size(), num_experts_);
  // A window sum must not overflow even with every step at the cap.
  const int64_t cap = std::numeric_limits<int64_t>::max() / 2 / schedule_.window_steps;
  for (size_t e = 0; e < counts.size(); ++e) {
    DI_CHECK(counts[e] >= 0 && counts[e] <= cap, "ExpertLoadStats: expert {} count {} out of range", e, counts[e]);
  }
  int64_t* row = ring_.data() + static_cast<size_t>(head_) * num_experts_;
  for (int32_t e = 0; e < num_experts_; ++e) {
    sum_[e] += counts[e] - row[e];
    row[e] = counts[e];
  }
  head_ = (head_ + 1) % schedule_.window_steps;
  if (fill_ < schedule_.window_steps) ++fill_;
  ++steps_;
  return replacement_due();
}

std::vector<double> ExpertLoadStats::window_load() const {
  return std::vector<double>(sum_.begin(), sum_.end());
}

std::span<const int64_t> ExpertLoadStats::last_step() const {
  DI_CHECK(steps_ > 0, "ExpertLoadStats: no step recorded yet");
  const int32_t last = (head_ + schedule_.window_steps - 1) % schedule_.window_steps;
  return {ring_.data() + static_cast<size_t>(last) * num_experts_, static_cast<size_t>(num_experts_)};
}

const ExpertPlacement& ExpertLoadStats::rebalance(const EplbConfig& topology) {
  EplbConfig config = topology;
  config.redundant_slots_per_rank = schedule_.redundant_slots_per_rank;
  const std::vector<double> load = window_load();
  placement_ = place_experts(load, config);
  return *placement_;
}

void ExpertLoadStats::set_placement(ExpertPlacement placement) {
  DI_CHECK(placement.num_logical() == num_experts_, "ExpertLoadStats: placement is for {} experts, stats for {}",
           placement.num_logical(), num_experts_);
  placement_ = std::move(placement);
}

double ExpertLoadStats::window_moe_lb() const {
  if (!placement_ || steps_ == 0) return 1.0;
  const std::vector<double> load = window_load();
  return moe_lb(load, *placement_);
}

double ExpertLoadStats::last_step_moe_lb() const {
  if (!placement_ || steps_ == 0) return 1.0;
  std::span<const int64_t> row = last_step();
  const std::vector<double> load(row.begin(), row.end());
  return moe_lb(load, *placement_);
}

}  // namespace deepinfer::moe
