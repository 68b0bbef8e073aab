// Test support: last-position logits of one prompt, run straight through
// ModelRunner (one sequence, one step, no scheduler), for tests
// that compare a model's logits with reference data.
#pragma once

#include <vector>

#include "backend/backend.h"
#include "kv/kv_storage.h"
#include "model/model_loader.h"
#include "runner/model_runner.h"
#include "sched/request.h"

namespace deepinfer::testing {

inline std::vector<float> prompt_logits(LoadedModel& loaded, Backend& backend, const std::vector<int32_t>& tokens) {
  const int32_t page = 16;
  const int32_t pages = static_cast<int32_t>(tokens.size()) / page + 1;
  KvStorage kv(backend, loaded.model().kv_spec(page, DType::F32), pages);
  ModelRunner runner(loaded.model(), backend, kv, {static_cast<int32_t>(tokens.size()), 1});
  Request r(1, tokens, SamplingParams{}, 0);
  for (int32_t i = 0; i < pages; ++i) r.block_ids.push_back(i);
  ScheduledBatch batch;
  batch.seqs.push_back({&r, 0, static_cast<int32_t>(tokens.size()), true});
  batch.num_tokens = static_cast<int32_t>(tokens.size());
  RowSampling row;
  row.params.temperature = 0.0f;
  row.copy_logits = true;
  const StepResults res = runner.wait(runner.launch(batch, std::span(&row, 1)));
  return std::vector<float>(res.logits.begin(), res.logits.end());
}

}  // namespace deepinfer::testing
