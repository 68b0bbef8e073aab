// CapacityScheduler: the first scheduling stage. Decides which requests hold
// KV memory for their next work: every running request gets the blocks its
// next token needs, preempting the lowest-priority running requests (by
// recompute) when the pool runs dry — never failing a request; then waiting
// requests are admitted first-come-first-served while their whole remaining
// prompt fits, reusing prefix-cache hits.
#pragma once

#include <cstdint>
#include <deque>
#include <vector>

#include "kv/block_pool.h"
#include "kv/prefix_cache.h"
#include "sched/scheduled_batch.h"

namespace deepinfer {

struct CapacityConfig {
  int32_t block_size = 16;
  int32_t max_num_seqs = 256;
  // Admission keeps this many blocks free for the decodes of running requests.
  int32_t watermark_blocks = 1;
};

class CapacityScheduler {
 public:
  CapacityScheduler(CapacityConfig config, BlockPool& pool, PrefixCache* prefix_cache)
      : config_(config), pool_(pool), prefix_cache_(prefix_cache) {}

  // `running` is in priority order; `waiting` is consumed from the front.
  // Preempted requests are pushed to the front of `waiting`.
  CapacityDecision run(const std::vector<Request*>& running, std::deque<Request*>& waiting);

  // Frees every block of a request (finish, abort, preemption), last block first
  // so shared prefix blocks stay cached longest.
  void release(Request& request);
  // Detaches a request's blocks without freeing them, in the order release()
  // would free them; the caller returns them to the pool later.
  std::vector<int32_t> detach(Request& request);

  int32_t blocks_needed(int32_t num_tokens) const {
    return (num_tokens + config_.block_size - 1) / config_.block_size;
  }

 private:
  bool grow(Request& request, int32_t num_tokens);
  bool admit(Request& request);
  void preempt(Request& request);

  CapacityConfig config_;
  BlockPool& pool_;
  PrefixCache* prefix_cache_;
};

}  // namespace deepinfer
