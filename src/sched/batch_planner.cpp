#include "sched/batch_planner.h"

#include <algorithm>

#include "sched/request.h"

namespace deepinfer {

ScheduledBatch BatchPlanner::plan(const std::vector<Request*>& running) const {
  ScheduledBatch batch;
  int32_t budget = config_.max_num_batched_tokens;
  double time_left = config_.step_time_budget_s;
  auto add = [&](Request* r, int32_t q) {
    const int32_t start = r->num_computed_tokens;
    batch.seqs.push_back({r, start, q, start + q == r->total_tokens() ? 1 : 0});
    batch.num_tokens += q;
    budget -= q;
  };
  // Decodes: a single remaining token.
  for (Request* r : running) {
    if (budget <= 0) break;
    if (!r->schedulable()) continue;
    if (r->total_tokens() - r->num_computed_tokens == 1) {
      add(r, 1);
      if (config_.cost_model) time_left -= config_.cost_model->cost(1, r->num_computed_tokens);
    }
  }
  // Prompt chunks (first admission, chunked continuation, or recompute after preemption).
  for (Request* r : running) {
    if (budget <= 0) break;
    if (!r->schedulable()) continue;
    const int32_t remaining = r->total_tokens() - r->num_computed_tokens;
    if (remaining <= 1) continue;
    int32_t q = std::min(remaining, budget);
    if (config_.cost_model) {
      // Always make progress, even when decodes used up the time budget.
      q = std::min(q, config_.cost_model->max_chunk(r->num_computed_tokens, std::max(time_left, 0.0)));
      time_left -= config_.cost_model->cost(q, r->num_computed_tokens);
    }
    q = std::min(q, StepCostModel::kMaxChunk);
    add(r, q);
  }
  return batch;
}

}  // namespace deepinfer
