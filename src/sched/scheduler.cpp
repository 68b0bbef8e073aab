#include "sched/scheduler.h"

#include <algorithm>
#include <unordered_set>

#include "core/error.h"
#include "sched/request.h"

namespace deepinfer {

Scheduler::Scheduler(SchedulerConfig config, KvCacheManager& kv)
    : config_(config), kv_(kv), capacity_(config.capacity, kv), planner_(config.planner) {}

void Scheduler::add(Request* request) {
  const int64_t need = kv_.max_blocks(request->num_tokens() + 1);
  DI_CHECK(need + config_.capacity.watermark_blocks <= kv_.pool().num_blocks(),
           "request of {} tokens can never fit the KV cache of {} blocks", request->num_tokens(),
           kv_.pool().num_blocks());
  request->state = RequestState::Waiting;
  waiting_.push_back(request);
}

int64_t Scheduler::pending_prompt_tokens() const {
  int64_t n = 0;
  // A waiting request counts at least one token: it has work to do even when
  // all of its prompt is cached.
  for (const Request* r : waiting_) n += std::max<int64_t>(1, r->num_tokens() - r->num_computed_tokens);
  for (const Request* r : running_) {
    const int64_t left = r->total_tokens() - r->num_draft_tokens() - r->num_computed_tokens;
    if (left > 1) n += left;
  }
  return n;
}

bool Scheduler::has_decodes() const {
  return std::any_of(running_.begin(), running_.end(), [](const Request* r) {
    return r->total_tokens() - r->num_draft_tokens() - r->num_computed_tokens <= 1;
  });
}

ScheduledBatch Scheduler::schedule(bool prefill) {
  CapacityDecision d = capacity_.run(running_, waiting_, prefill);
  const auto now = Clock::now();
  for (Request* r : d.admitted) {
    if (r->timings.first_scheduled == Clock::time_point{}) r->timings.first_scheduled = now;
  }
  running_ = std::move(d.running);
  ScheduledBatch batch = planner_.plan(running_, prefill);
  batch.preempted = std::move(d.preempted);
  // Drafts the step does not verify (budget) are dropped: a request's drafts
  // are exactly what its next step verifies.
  std::unordered_set<const Request*> scheduled;
  for (const ScheduledSeq& s : batch.seqs) {
    s.request->draft_ids.resize(static_cast<size_t>(s.num_draft_tokens));
    scheduled.insert(s.request);
  }
  for (Request* r : running_) {
    if (!r->verifying && !scheduled.contains(r)) r->draft_ids.clear();
  }
  return batch;
}

void Scheduler::commit(const ScheduledBatch& batch) {
  for (const ScheduledSeq& s : batch.seqs) {
    Request& r = *s.request;
    if (s.num_draft_tokens > 0) {
      // Only the known token's K/V counts as computed until the drafts are
      // verified; the drafts' slots are written but not committed (nor cached).
      r.verifying = true;
      r.num_computed_tokens = s.start + s.num_tokens - s.num_draft_tokens;
    } else {
      r.num_computed_tokens = s.start + s.num_tokens;
    }
    kv_.commit(r.id(), r.tokens(), r.num_computed_tokens, r.cache_salt());
  }
}

void Scheduler::accept_drafts(Request& request) {
  DI_CHECK(request.verifying, "request {} has no drafts being verified", request.id());
  request.verifying = false;
  request.draft_ids.clear();
  // The accepted drafts and the token after them are outputs now; every token
  // but the newest has its K/V in the cache (rejected drafts' slots are
  // simply overwritten later).
  request.num_computed_tokens = request.num_tokens() - 1;
  kv_.commit(request.id(), request.tokens(), request.num_computed_tokens, request.cache_salt());
}

void Scheduler::finish(Request* request, std::optional<uint64_t> hold_until_step) {
  auto it = std::find(running_.begin(), running_.end(), request);
  if (it != running_.end()) running_.erase(it);
  auto wt = std::find(waiting_.begin(), waiting_.end(), request);
  if (wt != waiting_.end()) waiting_.erase(wt);
  request->inflight.clear();
  request->draft_ids.clear();
  request->verifying = false;
  request->num_computed_tokens = 0;
  if (hold_until_step) {
    kv_.free_after_step(request->id(), *hold_until_step);
  } else {
    kv_.free(request->id());
  }
}

}  // namespace deepinfer
