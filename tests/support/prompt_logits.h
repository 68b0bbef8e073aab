// Test support: last-position logits of one prompt, run straight through
// ModelRunner from a hand-made StepPlan (one sequence, one step, no scheduler), for tests
// that compare a model's logits with reference data.
#pragma once

#include <vector>

#include "backend/backend.h"
#include "kv/kv_storage.h"
#include "model/model_loader.h"
#include "runner/model_runner.h"
#include "sched/step_plan.h"

namespace deepinfer::testing {

// A one-sequence plan over pages 0, 1, ...: tokens [start, start + len) of
// `tokens`, with a greedy sampling row (logits copied) for the last one when
// `sample`.
inline StepPlan single_sequence_plan(const std::vector<int32_t>& tokens, int32_t start, int32_t len, int32_t page,
                                     bool sample) {
  StepPlan plan;
  plan.page_size = page;
  plan.seqs.push_back({1, start, len, 0, 0, sample ? 1 : 0});
  for (int32_t i = start; i < start + len; ++i) {
    plan.tokens.push_back(TokenSource::host(tokens[static_cast<size_t>(i)]));
  }
  if (sample) {
    PlannedRow row{0, len - 1, {}};
    row.sampling.params.temperature = 0.0f;
    row.sampling.copy_logits = true;
    plan.rows.push_back(row);
  }
  GroupPages& g = plan.groups.emplace_back();
  const int32_t pages = (start + len + page - 1) / page;
  for (int32_t i = 0; i < pages; ++i) g.pages.push_back(i);
  g.indptr.push_back(pages);
  g.first_pos.push_back(0);
  return plan;
}

inline std::vector<float> prompt_logits(Model& model, Backend& backend, const std::vector<int32_t>& tokens) {
  const int32_t page = 16;
  const auto n = static_cast<int32_t>(tokens.size());
  KvStorage kv(backend, model.kv_spec(page, DType::F32), n / page + 1);
  ModelRunner runner(model, backend, kv, {n, 1});
  const StepResults res = runner.wait(runner.launch(single_sequence_plan(tokens, 0, n, page, true)));
  return std::vector<float>(res.logits.begin(), res.logits.end());
}

inline std::vector<float> prompt_logits(LoadedModel& loaded, Backend& backend, const std::vector<int32_t>& tokens) {
  return prompt_logits(loaded.model(), backend, tokens);
}

}  // namespace deepinfer::testing
