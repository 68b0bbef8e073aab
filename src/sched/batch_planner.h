// BatchPlanner: the second scheduling stage. Given the requests that hold KV
// memory, decides how many tokens each computes this step under the token
// budget: decodes first (one token each), then prompt chunks first-come-
// first-served. A prompt chunk's size is the largest that the step's time
// budget allows according to the fitted cost model, or the fixed token
// budget when no model has been fitted.
#pragma once

#include <optional>

#include "sched/cost_model.h"
#include "sched/scheduled_batch.h"

namespace deepinfer {

struct PlannerConfig {
  int32_t max_num_batched_tokens = 2048;  // token budget per step
  std::optional<StepCostModel> cost_model;
  double step_time_budget_s = 0.25;  // used with the cost model
};

class BatchPlanner {
 public:
  explicit BatchPlanner(PlannerConfig config) : config_(std::move(config)) {}

  // `running` in priority order (from the capacity stage). Without
  // prompt_chunks, decodes only (a data-parallel group's decode step).
  ScheduledBatch plan(const std::vector<Request*>& running, bool prompt_chunks = true) const;

  const PlannerConfig& config() const { return config_; }

 private:
  PlannerConfig config_;
};

}  // namespace deepinfer
