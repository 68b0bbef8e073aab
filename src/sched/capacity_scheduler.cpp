#include "sched/capacity_scheduler.h"

#include <algorithm>

#include "sched/request.h"

namespace deepinfer {

std::vector<int32_t> CapacityScheduler::detach(Request& request) {
  std::vector<int32_t> reversed;
  for (auto it = request.block_ids.rbegin(); it != request.block_ids.rend(); ++it) {
    if (*it != Request::kReleasedBlock) reversed.push_back(*it);
  }
  request.block_ids.clear();
  request.num_computed_tokens = 0;
  request.num_registered_blocks = 0;
  request.num_released_blocks = 0;
  return reversed;
}

void CapacityScheduler::release(Request& request) { pool_.release(detach(request)); }

bool CapacityScheduler::grow(Request& request, int32_t num_tokens) {
  const int32_t need = blocks_needed(num_tokens) - static_cast<int32_t>(request.block_ids.size());
  if (need <= 0) return true;
  auto blocks = pool_.allocate(need);
  if (!blocks) return false;
  request.block_ids.insert(request.block_ids.end(), blocks->begin(), blocks->end());
  return true;
}

void CapacityScheduler::preempt(Request& request) {
  // Blocks go back to the pool at once, even with a step in flight that still
  // writes them: the backend runs steps in order on one stream, so a later
  // step reusing them writes after it. A token in flight is dropped (its
  // result is ignored by generation) and recomputed after readmission.
  release(request);
  request.num_inflight_tokens = 0;
  ++request.generation;
  request.state = RequestState::Preempted;
  ++request.num_preemptions;
}

bool CapacityScheduler::admit(Request& request) {
  const int32_t total = request.num_tokens();
  std::vector<int32_t> hits;
  if (prefix_cache_ && request.block_ids.empty()) {
    std::vector<int32_t> tokens = request.all_tokens();
    request.block_hashes = PrefixCache::compute_block_hashes(tokens, config_.block_size, request.cache_salt());
    // At least the last token must be computed to produce logits.
    const size_t usable = std::min<size_t>(request.block_hashes.size(), (total - 1) / config_.block_size);
    hits = prefix_cache_->lookup(std::span(request.block_hashes).first(usable), tokens, request.cache_salt());
  }
  const int32_t need = blocks_needed(total) - static_cast<int32_t>(hits.size());
  // Blocks with refcount 0 that we are about to ref are counted as free by the pool.
  int32_t free_after_refs = pool_.num_free();
  for (int32_t b : hits) free_after_refs -= pool_.refcount(b) == 0;
  if (need + config_.watermark_blocks > free_after_refs) return false;
  if (prefix_cache_) prefix_cache_->record_query(total, static_cast<int64_t>(hits.size()) * config_.block_size);
  for (int32_t b : hits) pool_.ref(b);
  request.block_ids = hits;
  request.num_computed_tokens = static_cast<int32_t>(hits.size()) * config_.block_size;
  request.num_registered_blocks = static_cast<int32_t>(hits.size());
  if (request.num_preemptions == 0) request.num_cached_prompt_tokens = request.num_computed_tokens;
  const bool ok = grow(request, total);
  (void)ok;  // cannot fail: checked against num_free above
  return true;
}

CapacityDecision CapacityScheduler::run(const std::vector<Request*>& running,
                                        std::deque<Request*>& waiting) {
  CapacityDecision d;
  d.running.assign(running.begin(), running.end());
  // Each running request needs room for every token it has not computed yet
  // (one for a decode; already allocated for a prompt being chunked).
  for (size_t i = 0; i < d.running.size(); ++i) {
    Request* r = d.running[i];
    while (!grow(*r, r->total_tokens())) {
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

  while (!waiting.empty() && static_cast<int32_t>(d.running.size()) < config_.max_num_seqs) {
    Request* r = waiting.front();
    if (!admit(*r)) break;
    waiting.pop_front();
    r->state = RequestState::Running;
    d.running.push_back(r);
    d.admitted.push_back(r);
  }
  return d;
}

}  // namespace deepinfer
