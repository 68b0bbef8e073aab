#include "sched/scheduler.h"

#include <algorithm>

#include "core/error.h"
#include "sched/request.h"

namespace deepinfer {

Scheduler::Scheduler(SchedulerConfig config, BlockPool& pool, PrefixCache* prefix_cache)
    : config_(config),
      pool_(pool),
      prefix_cache_(prefix_cache),
      capacity_(config.capacity, pool, prefix_cache),
      planner_(config.planner) {}

void Scheduler::add(Request* request) {
  DI_CHECK(capacity_.blocks_needed(request->num_tokens() + 1) + config_.capacity.watermark_blocks <=
               pool_.num_blocks(),
           "request of {} tokens can never fit the KV cache of {} blocks", request->num_tokens(),
           pool_.num_blocks());
  request->state = RequestState::Waiting;
  waiting_.push_back(request);
}

ScheduledBatch Scheduler::schedule() {
  CapacityDecision d = capacity_.run(running_, waiting_);
  const auto now = Clock::now();
  for (Request* r : d.admitted) {
    if (r->timings.first_scheduled == Clock::time_point{}) r->timings.first_scheduled = now;
  }
  running_ = std::move(d.running);
  ScheduledBatch batch = planner_.plan(running_);
  batch.preempted = std::move(d.preempted);
  return batch;
}

void Scheduler::register_full_blocks(Request& r) {
  if (!prefix_cache_) return;
  const int32_t bs = config_.capacity.block_size;
  // Only blocks whose token ids are all known on the host (not in flight).
  const int32_t known = std::min(r.num_computed_tokens, r.num_tokens());
  const int32_t full = std::min<int32_t>(known / bs, static_cast<int32_t>(r.block_ids.size()));
  if (full <= r.num_registered_blocks) return;
  if (static_cast<int32_t>(r.block_hashes.size()) < full) {
    std::vector<int32_t> tokens = r.all_tokens();
    r.block_hashes = PrefixCache::compute_block_hashes(
        std::span(tokens).first(static_cast<size_t>(full) * bs), bs, r.cache_salt());
  }
  for (int32_t i = r.num_registered_blocks; i < full; ++i) {
    std::vector<int32_t> block_tokens(bs);
    for (int32_t j = 0; j < bs; ++j) block_tokens[j] = r.token_at(i * bs + j);
    if (i > 0 && r.block_ids[i - 1] == Request::kReleasedBlock) continue;  // broken chain: unmatchable anyway
    const int32_t parent = i == 0 ? PrefixCache::kNoParent : r.block_ids[i - 1];
    if (!prefix_cache_->is_cached(r.block_ids[i])) {
      prefix_cache_->insert(r.block_hashes[i], r.block_ids[i], block_tokens, parent, r.cache_salt());
    }
  }
  r.num_registered_blocks = full;
}

void Scheduler::release_out_of_window_blocks(Request& r) {
  const int32_t bs = config_.capacity.block_size;
  const int32_t window = config_.sliding_window;
  // The next query sits at position num_computed_tokens and sees keys from
  // num_computed_tokens - window + 1 on; whole blocks before that are dead.
  const int32_t first_needed = r.num_computed_tokens - window + 1;
  const int32_t dead = std::min<int32_t>(std::max(first_needed, 0) / bs, static_cast<int32_t>(r.block_ids.size()));
  for (int32_t b = r.num_released_blocks; b < dead; ++b) {
    pool_.release(r.block_ids[b]);
    r.block_ids[b] = Request::kReleasedBlock;
  }
  r.num_released_blocks = std::max(r.num_released_blocks, dead);
}

void Scheduler::commit(const ScheduledBatch& batch) {
  for (const ScheduledSeq& s : batch.seqs) {
    Request& r = *s.request;
    r.num_computed_tokens = s.start + s.num_tokens;
    register_full_blocks(r);
    if (config_.sliding_window > 0) release_out_of_window_blocks(r);
  }
}

void Scheduler::finish(Request* request, std::optional<uint64_t> hold_until_step) {
  auto it = std::find(running_.begin(), running_.end(), request);
  if (it != running_.end()) running_.erase(it);
  auto wt = std::find(waiting_.begin(), waiting_.end(), request);
  if (wt != waiting_.end()) waiting_.erase(wt);
  request->num_inflight_tokens = 0;
  if (!hold_until_step) {
    capacity_.release(*request);
    return;
  }
  std::vector<int32_t> blocks = capacity_.detach(*request);
  if (!blocks.empty()) deferred_.push_back({*hold_until_step, std::move(blocks)});
}

void Scheduler::release_deferred(uint64_t completed_step) {
  auto keep = std::stable_partition(deferred_.begin(), deferred_.end(),
                                    [&](const DeferredBlocks& d) { return d.step > completed_step; });
  for (auto it = keep; it != deferred_.end(); ++it) pool_.release(it->blocks);
  deferred_.erase(keep, deferred_.end());
}

size_t Scheduler::num_deferred_blocks() const {
  size_t n = 0;
  for (const DeferredBlocks& d : deferred_) n += d.blocks.size();
  return n;
}

}  // namespace deepinfer
