// Turns the scheduler's decision into a StepPlan: pure host code, reading the
// requests and the KV cache manager's page tables and writing plain data.
#pragma once

#include <functional>

#include "kv/kv_cache_manager.h"
#include "sched/scheduled_batch.h"
#include "sched/step_plan.h"

namespace deepinfer {

// The one place a sampling row's parameters come from: request r's
// parameters for the token it samples `offset` rows into this step (after
// its outputs and the tokens it has in flight).
RowSampling sampling_row(const Request& r, int32_t offset);

// Called once per sampling row; the engine adds what only it knows (the
// request's device-side penalty state) to sampling_row().
using RowSamplingFn = std::function<RowSampling(const Request& r, int32_t offset)>;

// Throws deepinfer::Error when the batch and the page tables disagree (a
// token neither known nor in flight, pages missing for a position, a window
// that released pages a query still reads).
StepPlan build_step_plan(const ScheduledBatch& batch, const KvCacheManager& kv, const RowSamplingFn& sampling);

// Appends to every group of plan.groups the pages request_id's attention
// reads for query positions [start, kv_len) (its KV tables must cover them).
void add_sequence_pages(StepPlan& plan, const KvCacheManager& kv, uint64_t request_id, int32_t start, int32_t kv_len);

}  // namespace deepinfer
