#include "sched/batch_planner.h"

#include <algorithm>

#include "sched/request.h"

namespace deepinfer {

ScheduledBatch BatchPlanner::plan(const std::vector<Request*>& running, bool prompt_chunks) const {
  ScheduledBatch batch;
  int32_t budget = config_.max_num_batched_tokens;
  double time_left = config_.step_time_budget_s;
  auto add = [&](Request* r, int32_t q) {
    const int32_t start = r->num_computed_tokens;
    batch.seqs.push_back({r, start, q, start + q == r->total_tokens() ? 1 : 0, 0});
    batch.num_tokens += q;
    batch.num_prompt_tokens += q;
    budget -= q;
  };
  // Tokens a request computes next, drafts aside.
  auto remaining = [](const Request* r) { return r->total_tokens() - r->num_draft_tokens() - r->num_computed_tokens; };
  // Decodes: a single remaining token, then the drafts the budget allows,
  // each with its own sampling row.
  for (Request* r : running) {
    if (budget <= 0) break;
    if (!r->schedulable()) continue;
    if (remaining(r) == 1) {
      const int32_t drafts = std::min(r->num_draft_tokens(), budget - 1);
      const int32_t start = r->num_computed_tokens;
      batch.seqs.push_back({r, start, 1 + drafts, 1 + drafts, drafts});
      batch.num_tokens += 1 + drafts;
      budget -= 1 + drafts;
      if (config_.cost_model) time_left -= config_.cost_model->cost(1 + drafts, r->num_computed_tokens);
    }
  }
  // Prompt chunks (first admission, chunked continuation, or recompute after preemption).
  for (Request* r : running) {
    if (budget <= 0 || !prompt_chunks) break;
    if (!r->schedulable()) continue;
    if (remaining(r) <= 1) continue;
    const int32_t remaining = r->total_tokens() - r->num_computed_tokens;
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
