// CapacityScheduler: the first scheduling stage. Decides which requests hold
// KV memory for their next work: every running request gets the pages its
// next tokens need, preempting the lowest-priority running requests (by
// recompute) when the pool runs dry — never failing a request; then waiting
// requests are admitted first-come-first-served while their whole remaining
// prompt fits, reusing prefix-cache hits. The pages themselves are the
// KvCacheManager's.
#pragma once

#include <cstdint>
#include <deque>
#include <vector>

#include "kv/kv_cache_manager.h"
#include "sched/scheduled_batch.h"

namespace deepinfer {

struct CapacityConfig {
  int32_t max_num_seqs = 256;
  // Admission keeps this many blocks free for the decodes of running requests.
  int32_t watermark_blocks = 1;
  // Slots a running request reserves past its next tokens when the pool
  // allows (a proposer that writes KV ahead: MTP's draft chain).
  int32_t lookahead_slots = 0;
};

class CapacityScheduler {
 public:
  CapacityScheduler(CapacityConfig config, KvCacheManager& kv) : config_(config), kv_(kv) {}

  // `running` is in priority order; `waiting` is consumed from the front.
  // Preempted requests are pushed to the front of `waiting`. Without
  // `admit_waiting`, nobody is admitted (a data-parallel group's decode step).
  CapacityDecision run(const std::vector<Request*>& running, std::deque<Request*>& waiting,
                       bool admit_waiting = true);

  // Frees a request's pages now and resets its progress (abort, preemption).
  void release(Request& request);

 private:
  bool admit(Request& request);
  void preempt(Request& request);

  CapacityConfig config_;
  KvCacheManager& kv_;
};

}  // namespace deepinfer
