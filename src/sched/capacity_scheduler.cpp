#include "sched/capacity_scheduler.h"

#include "sched/request.h"

namespace deepinfer {

void CapacityScheduler::release(Request& request) {
  kv_.free(request.id());
  request.num_computed_tokens = 0;
}

void CapacityScheduler::preempt(Request& request) {
  // Pages go back to the pool at once, even with a step in flight that still
  // writes them: the backend runs steps in order on one stream, so a later
  // step reusing them writes after it. Tokens in flight are dropped (their
  // results are ignored by generation) and recomputed after readmission.
  release(request);
  request.inflight.clear();
  request.draft_ids.clear();
  request.verifying = false;
  ++request.generation;
  request.state = RequestState::Preempted;
  ++request.num_preemptions;
}

bool CapacityScheduler::admit(Request& request) {
  const std::vector<int32_t> tokens = request.all_tokens();
  const auto cached = kv_.admit(request.id(), tokens, request.cache_salt(), config_.watermark_blocks,
                                request.params().cache_ttl.value_or(0));
  if (!cached) return false;
  request.num_computed_tokens = *cached;
  if (request.num_preemptions == 0) request.num_cached_prompt_tokens = *cached;
  return true;
}

CapacityDecision CapacityScheduler::run(const std::vector<Request*>& running, std::deque<Request*>& waiting,
                                        bool admit_waiting) {
  CapacityDecision d;
  d.running.assign(running.begin(), running.end());
  // Each running request needs room for every token it has not computed yet
  // (one for a decode; already allocated for a prompt being chunked).
  for (size_t i = 0; i < d.running.size(); ++i) {
    Request* r = d.running[i];
    // The lookahead is optional: without room for it, the tokens alone.
    auto fits = [&] {
      const int32_t computed = r->num_computed_tokens, wanted = r->total_tokens() - computed;
      return (config_.lookahead_slots > 0 && kv_.allocate_slots(r->id(), computed, wanted, config_.lookahead_slots)) ||
             kv_.allocate_slots(r->id(), computed, wanted, 0);
    };
    while (!fits()) {
      // Drafts are an option, not a need: drop them before preempting anyone.
      if (!r->draft_ids.empty()) {
        r->draft_ids.clear();
        continue;
      }
      Request* victim = d.running.back();
      d.running.pop_back();
      preempt(*victim);
      d.preempted.push_back(victim);
      if (victim == r) break;
    }
  }
  // Preempted requests go back first, oldest first.
  for (auto it = d.preempted.rbegin(); it != d.preempted.rend(); ++it) waiting.push_front(*it);
  if (!d.preempted.empty()) return d;  // memory is tight: admit nobody this step
  if (!admit_waiting) return d;

  // First come, first served, except that a request still loading its
  // prefix from a KV tier lets the ones behind it pass.
  for (auto it = waiting.begin(); it != waiting.end() && static_cast<int32_t>(d.running.size()) < config_.max_num_seqs;) {
    Request* r = *it;
    if (r->kv_loading) {
      ++it;
      continue;
    }
    if (!admit(*r)) break;
    it = waiting.erase(it);
    r->state = RequestState::Running;
    d.running.push_back(r);
    d.admitted.push_back(r);
  }
  return d;
}

}  // namespace deepinfer
